"""Progress bars for long runs, safe in forked processes.

:func:`progress_bar` is the one tqdm bar of mdv's runs.  Importing this module (``import mdv`` does)
also registers :func:`_tqdm_lock_per_process` to run in every child of ``os.fork``: tqdm's default
lock (``tqdm.std.TqdmDefaultWriteLock``) holds a ``multiprocessing.RLock``, a semaphore in shared
memory that forked children share with their parent.  A child SIGKILLed while it holds that lock
(mid-refresh of a bar) never releases it, and every sibling and the parent then block forever at their
next bar; a thread lock held by another thread at the fork (tqdm's monitor thread) blocks the child the
same way.  A child with its own process-local lock has neither problem; the price is that bars of
concurrent forked processes may interleave on one terminal.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

__all__ = ["progress_bar"]


def progress_bar(progress: bool, **kw: Any) -> Any:
    """A tqdm bar, hidden when ``progress`` is false."""
    from tqdm import tqdm

    return tqdm(disable=not progress, dynamic_ncols=True, **kw)


def _tqdm_lock_per_process() -> None:
    """In a forked child: one fresh process-local lock for tqdm and every subclass that set its own."""
    std = sys.modules.get("tqdm.std")
    if std is None:  # tqdm not imported: nothing shared yet
        return
    fresh = threading.RLock()
    seen, todo = set(), [std.tqdm]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if "_lock" in vars(cls):
            cls._lock = fresh
        todo.extend(cls.__subclasses__())
    std.tqdm._lock = fresh


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_tqdm_lock_per_process)
