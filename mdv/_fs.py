"""Small filesystem checks shared by the commands that write results."""
from __future__ import annotations

import os
from pathlib import Path


def ensure_writable_dir(folder: str | os.PathLike[str]) -> Path:
    """Create ``folder`` (and parents) and prove it is writable by creating and removing a probe file.
    Raises the ``OSError`` that stops it (callers turn it into their one-line error)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
    return path
