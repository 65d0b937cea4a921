"""Timing side by side: every contender once per repeat, in a rotated order after a warm-up, so a change
of machine load hits all of them; ratios formed within one repeat, reported as median and range.
"""
from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """Median and range of ``values`` (NaN entries dropped): {"median", "min", "max", "n"}."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def sync_for(device: torch.device | str) -> Callable[[], None]:
    """What to call before reading a clock: a CUDA synchronize on GPUs, nothing on the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def time_call(fn: Callable[[], Any], sync: Callable[[], None] | None = None) -> float:
    """Wall seconds of one ``fn()`` call (``sync`` before and after, e.g. CUDA)."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - t0


#: The last-level cache size assumed where the OS does not tell it (sysfs): above most server parts' L3.
DEFAULT_LLC_BYTES = 64 << 20


def last_level_cache_bytes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size of the CPU's largest cache level in bytes, from Linux's sysfs (``index*/level`` and
    ``size``, e.g. ``32768K``); DEFAULT_LLC_BYTES where it cannot be read (other OSes, containers)."""
    best_level, best = 0, 0
    try:
        for entry in sorted(Path(root).glob("index*")):
            level = int((entry / "level").read_text().strip())
            text = (entry / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * scale
            if (level, size) > (best_level, best):
                best_level, best = level, size
    except (OSError, ValueError):
        return DEFAULT_LLC_BYTES
    return best or DEFAULT_LLC_BYTES


class CacheEvictor:
    """Evicts the CPU's caches before a timed call: writes once over a buffer twice the last-level cache.

    Why: a probe timed right after its twin (the same code on the same data) finds its weights, rows and
    code in the cache, but in a decode loop every phase follows one that streamed the other model's
    weights through it.  Measured on the default pair's fast path (2-core AMD EPYC, 32 MiB L3): the
    draft's propose of 3 blocks of 4 tokens 15.2 ms after its twin, 15.7-15.9 after a flush or a target
    pass; ``spectr``'s verification (K = 3, L = 4) 3.0 ms against 3.4-3.6.  ``nbytes``: the buffer
    (default twice :func:`last_level_cache_bytes`); a call costs one pass over it (~4-8 ms for 64 MiB)."""

    def __init__(self, nbytes: int | None = None) -> None:
        self.nbytes = int(nbytes) if nbytes is not None else 2 * last_level_cache_bytes()
        self._buf = torch.zeros(max(self.nbytes // 4, 1), dtype=torch.int32)

    def __call__(self) -> None:
        self._buf.add_(1)  # read and write every line: the cache then holds the buffer, nothing timed


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                sync: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Seconds per call of every function, interleaved: ``warmup`` untimed rounds, then ``repeats``
    rounds in which each function runs once, in an order rotated by one per round.  -> name -> [repeats]."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for n in order:
            out[n].append(time_call(fns[n], sync))
    return out


def ratios_of(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-repeat ratios num[i] / den[i] (NaN where den[i] is not positive)."""
    return [a / b if b > 0 else float("nan") for a, b in zip(num, den)]


def rotated(cells: Sequence[Any], i: int) -> list[Any]:
    """The cells in the order of round i: rotated left by i (mod the count)."""
    s = i % len(cells)
    return list(cells[s:]) + list(cells[:s])
