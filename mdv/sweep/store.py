"""The cell store: result files written atomically, per-cell locks, stale temp files and locks of dead
processes, unreadable files moved aside, and the machine description each record carries.

A reader globbing ``<results_dir>/cells/*.json`` sees either no file or a complete one whenever a writer is
killed; two sweeps on one folder never compute one cell (``flock``, released by the kernel when its process
dies).
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import re
import socket
from pathlib import Path
from typing import Any, Optional

from mdv._fs import ensure_writable_dir
from mdv.errors import InvalidInputError
from mdv.machine import describe
from mdv.sweep.grid import Cell

log = logging.getLogger(__name__)


SCHEMA = "mdv.cell/1"


# ----------------------------------------------------------------------------------- result files
def cells_dir(results_dir: str | os.PathLike[str]) -> Path:
    """``<results_dir>/cells``."""
    return Path(results_dir) / "cells"


def cell_path(results_dir: str | os.PathLike[str], cell_id: str) -> Path:
    """``<results_dir>/cells/<cell_id>.json``."""
    return cells_dir(results_dir) / f"{cell_id}.json"


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN / infinite float replaced by None, so the file is strict JSON (NaN is
    written as ``null``; readers map null back to NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname() or "localhost")
# `.<name>.<pid>@<host>.tmp` (also the older `.<name>.<pid>.tmp`): temp files of write_json_atomic and
# the write probes of check_writable_dir
_TEMP_RE = re.compile(r"^\.(?P<stem>.+)\.(?P<pid>\d+)(?:@(?P<host>[A-Za-z0-9._-]+))?\.tmp$")
_LOCK_SUFFIX = ".lock"


def _owner() -> str:
    """``<pid>@<host>``: who writes a temp file or holds a lock."""
    return f"{os.getpid()}@{_HOST}"


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host may still be running (our own pid and unknowns count as
    alive: only a provably dead writer's files are removed)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, owned by someone else
        return True
    return True


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON (:func:`json_safe`) to ``path`` atomically: a temp file in the same
    folder (``.<name>.<pid>@<host>.tmp``, which no reader globbing ``*.json`` picks up), flushed and
    fsynced, then ``os.replace``.  A process killed before the replace leaves only the temp file
    (:func:`remove_stale_temp_files` removes it once the process is dead); after it, the whole file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{_owner()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(json_safe(obj), f, indent=1, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    try:  # make the rename durable too (best effort: not every platform can open a directory)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def remove_stale_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temp files (``.<name>.<pid>[@<host>].tmp``) in ``folder`` whose writer was a process of
    this host that is no longer alive -- what a write killed before its ``os.replace`` leaves behind.
    Temp files of live processes and of other hosts (a shared filesystem) are left alone.  -> removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP_RE.match(entry.name)
        if m is None or (m["host"] is not None and m["host"] != _HOST) or _pid_alive(int(m["pid"])):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove the stale temp file %s: %s", entry.path, e.strerror or e)
    if removed:
        log.warning("removed %d temp file(s) left by interrupted writes of dead processes: %s", len(removed),
                    ", ".join(p.name for p in removed))
    return removed


def read_cell(path: Path) -> Optional[dict[str, Any]]:
    """The parsed cell file, or None when it is absent, unreadable, truncated, not a regular file or not
    ``mdv.cell/1``."""
    if not os.path.isfile(path):  # never open a FIFO or a folder
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    return data


def cell_done(results_dir: str | os.PathLike[str], cell: Cell) -> bool:
    """True when the cell's file exists, parses, belongs to this cell and has status ``ok``."""
    data = read_cell(cell_path(results_dir, cell.cell_id))
    return bool(data) and data.get("status") == "ok" and data.get("cell_id") == cell.cell_id


# ----------------------------------------------------------------------------------- per-cell locks
try:
    import fcntl as _fcntl
except ImportError:  # not POSIX: no locks (see the module docstring)
    _fcntl = None  # type: ignore[assignment]
_LOCKS_WORK = _fcntl is not None


class CellLock:
    """An exclusive lock on one cell (:func:`lock_cell`); ``release()`` removes the lock file.  ``fd`` is
    None when locks are unavailable here (a no-op lock)."""

    def __init__(self, path: Path, fd: Optional[int]):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:  # unlink while holding the lock: a waiter that opened this inode sees it is gone, retries
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "CellLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_path(results_dir: str | os.PathLike[str], cell_id: str) -> Path:
    """``<results_dir>/cells/.<cell_id>.lock``."""
    return cells_dir(results_dir) / f".{cell_id}{_LOCK_SUFFIX}"


def try_lock(path: Path) -> Optional[CellLock]:
    """Take the flock on ``path`` without waiting: a :class:`CellLock`, or None when a live process holds
    it.  A lock file left by a dead process is not held (the kernel released it) and is taken over."""
    global _LOCKS_WORK
    if not _LOCKS_WORK:
        return CellLock(path, None)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as e:  # e.g. ENOLCK / EOPNOTSUPP on a filesystem without locks
            os.close(fd)
            _LOCKS_WORK = False
            log.warning("cannot lock %s (%s): running without per-cell locks; do not run two sweeps on this"
                        " results folder at once", path, e.strerror or e)
            return CellLock(path, None)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{_owner()}\n".encode())
            return CellLock(path, fd)
        os.close(fd)  # its holder released and removed it between our open and flock: try again


def lock_cell(results_dir: str | os.PathLike[str], cell_id: str) -> Optional[CellLock]:
    """Lock cell ``cell_id`` of ``results_dir`` for this process: a :class:`CellLock` (release it when the
    cell file is written), or None when another live process holds the lock."""
    return try_lock(lock_path(results_dir, cell_id))


def remove_stale_locks(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the lock files in ``folder`` that no live process holds (left by killed sweeps)."""
    removed: list[Path] = []
    if not _LOCKS_WORK:
        return removed
    try:
        entries = [e for e in os.scandir(folder) if e.name.startswith(".") and e.name.endswith(_LOCK_SUFFIX)]
    except OSError:
        return removed
    for entry in entries:
        lock = try_lock(Path(entry.path))
        if lock is not None and lock.fd is not None:
            lock.release()
            removed.append(Path(entry.path))
    return removed


def _quarantine(path: Path, reason: str) -> Path:
    """Move ``path`` aside to ``<name>.corrupt-<UTC time>`` (never over another file); -> the new path."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    dest = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while os.path.lexists(dest):
        dest = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.rename(path, dest)
    log.warning("cell file %s %s; moved it aside to %s (kept, not overwritten) and computing the cell again",
                path, reason, dest.name)
    return dest


def check_existing(path: Path, cell: Cell, *, announce: bool = True) -> tuple[str, Optional[Path]]:
    """What is at ``path`` before cell ``cell`` is (re)computed there:

    * ``("free", None)``: nothing;
    * ``("done", None)``: a finished record of this cell (keep it; do not compute);
    * ``("retry", None)``: a failed record of this cell, to be replaced (logged when ``announce``);
    * ``("free", moved)``: something else -- unparseable, truncated, not ``mdv.cell/1``, another cell's
      record, not a regular file -- now moved aside to ``moved`` (:func:`_quarantine`, a warning).
    """
    if not os.path.lexists(path):
        return "free", None
    if path.is_symlink() or not path.is_file():
        return "free", _quarantine(path, "is not a regular file")
    data = read_cell(path)
    if data is None:
        return "free", _quarantine(path, "does not parse as an mdv.cell/1 record (truncated or corrupt)")
    if data.get("cell_id") != cell.cell_id:
        return "free", _quarantine(path, f"belongs to another cell ({data.get('cell_id')!r})")
    status = data.get("status")
    if status == "ok":
        return "done", None
    if status == "failed":
        if announce:
            err = str(data.get("error") or "").splitlines()
            log.info("cell %s: retrying it; its failed record (%s) will be replaced", cell.cell_id,
                     err[0] if err else "no error message")
        return "retry", None
    return "free", _quarantine(path, f"has an unknown status {status!r}")


def check_writable_dir(path: str | os.PathLike[str], key: str = "results_dir") -> Path:
    """Create ``path`` (and parents) and prove it is writable with a probe file; raise
    :class:`~mdv.errors.InvalidInputError` naming the config ``key`` and the fix otherwise."""
    try:
        return ensure_writable_dir(path)
    except OSError as e:
        raise InvalidInputError(
            f"{key} {str(path)!r} is not writable ({e.strerror or e}); pass a writable folder,"
            f" e.g. {key}=/tmp/mdv-results") from None


def prepare_results_dir(results_dir: str | os.PathLike[str]) -> Path:
    """Create ``<results_dir>/cells`` and prove both are writable (:func:`check_writable_dir`)."""
    check_writable_dir(results_dir)
    check_writable_dir(cells_dir(results_dir), "results_dir/cells")
    return Path(results_dir)




def environment(dtype: str, device: str) -> dict[str, Any]:
    """A cell's ``environment`` block (contract ``mdv.cell/1``): CPU with its logical cores, threads, library
    versions, dtype, device, timestamp (from :func:`mdv.machine.describe`)."""
    d = describe(device, dtype)
    return {"cpu": f"{d['cpu']} ({d['logical_cores']} logical cores)", "torch": d["torch"],
            "transformers": d["transformers"], "mdv": d["mdv"], "python": d["python"], "threads": d["threads"],
            "dtype": dtype, "device": d["device"], "timestamp": d["timestamp"]}
