"""The asset cache on disk: where each asset lives, its hashes and verification stamps, the lookups
(:func:`path`, :func:`is_available`), and the lock and temporaries helpers that fetches share.

:func:`cache_dir` is ``$MDV_CACHE`` when set, else ``~/.cache/mdv``; :func:`_locked` holds an exclusive
``fcntl.flock``; :func:`_remove_temporaries` clears what a dead fetch left behind.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator, Sequence

from mdv.assets.catalog import Asset, get_asset
from mdv.errors import MissingAssetError

try:
    import fcntl
except ImportError:  # not POSIX: fetches are not serialised (one fetch at a time there)
    fcntl = None  # type: ignore[assignment]

_CHUNK = 1 << 20


def cache_dir() -> Path:
    """The asset cache: ``$MDV_CACHE`` when set, else ``~/.cache/mdv``."""
    env = os.environ.get("MDV_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mdv"


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
