"""Timing side by side: every contender once per repeat, in a rotated order after a warm-up, so a change
of machine load hits all of them; ratios formed within one repeat, reported as median and range.
"""
from __future__ import annotations

import math
import statistics
import time
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
