"""Compiling mdv's small C libraries on first use, once per source and flags, safely across processes.

A library is built with ``gcc`` (or ``$CC``) into ``$MDV_CACHE/kernels/<stem>-<sha>.so``, the sha over its
sources, the compiler and the flags; it is written to a temporary name and renamed, so a concurrent process
sees either no file or the whole file, never half of one.  Users: the panel products and the lean layer
(:mod:`mdv.models.panels`), the selected-draft law's sweeps (:mod:`mdv.verify.native`).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence


class CompileError(RuntimeError):
    """The compiler ran and failed; the message is its first line of output."""


def c_compiler() -> str | None:
    """The C compiler's path (``$CC``, default gcc), or None when it is not on PATH."""
    return shutil.which(os.environ.get("CC", "gcc"))


def library_path(stem: str, sources: Sequence[Path], flags: Sequence[str], cc: str) -> Path:
    from mdv.assets.cache import cache_dir

    key = hashlib.sha256(b"".join(src.read_bytes() for src in sources) + " ".join((cc, *flags)).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{stem}-{key}.so"


def build_library(stem: str, sources: Sequence[Path], flags: Sequence[str], cc: str) -> Path:
    """The compiled library's path, compiling it first if no process has yet; :class:`CompileError` if the
    compiler fails (nothing is left behind then)."""
    so = library_path(stem, sources, flags, cc)
    if not so.exists():
        so.parent.mkdir(parents=True, exist_ok=True)
        tmp = so.with_name(f"{so.name}.{os.getpid()}.tmp")
        proc = subprocess.run([cc, *flags, *map(str, sources), "-o", str(tmp)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            first = (proc.stderr or proc.stdout).strip().splitlines()
            raise CompileError(first[0] if first else "no output")
        os.replace(tmp, so)  # atomic: another process sees the old file or the whole new one
    return so
