"""The ``memory`` benchmark: peak resident memory of a pair at large K, L, and growth (RSS, live tensors) over a
long run of prompts.
"""
from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Optional, Sequence

import torch

from mdv.bench.config import MemoryBench, TinyPair
from mdv.bench.pairs import pair_for, pair_identity, prompt_ids, torch_device
from mdv.bench.records import bench_record, fmt_number, goal_record, print_goals, print_table


def _rss_bytes() -> tuple[int | None, int | None]:
    """(current RSS, peak RSS since the last reset) in bytes, from /proc/self/status (None elsewhere)."""
    cur = peak = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    if peak is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return cur, peak


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def live_tensors() -> int:
    """Number of live torch tensors reachable by the garbage collector (after a collection)."""
    import warnings

    gc.collect()
    n = 0
    with warnings.catch_warnings():  # isinstance() on some deprecated torch objects warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor):
                    n += 1
            except ReferenceError:  # pragma: no cover - weak proxies
                pass
    return n


def rss_trend(rss_mib: Sequence[float]) -> tuple[float, float]:
    """(growth, slope) of an RSS trace in MiB: the median of its last quarter minus the median of its first
    quarter (single readings swing by tens of MiB with the allocator; a leak moves the median), and the
    least-squares slope in MiB per prompt.  NaN when the trace is too short."""
    n = len(rss_mib)
    if n < 2:
        return float("nan"), float("nan")
    q = max(1, n // 4)
    growth = statistics.median(rss_mib[-q:]) - statistics.median(rss_mib[:q])
    xs = range(n)
    mx, my = statistics.fmean(xs), statistics.fmean(rss_mib)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, rss_mib)) / sum((x - mx) ** 2 for x in xs)
    return growth, slope


def run_memory(cfg: MemoryBench, pair: tuple[Any, Any, Any] | None = None, tiny: TinyPair | None = None,
               device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``memory`` benchmark."""
    from mdv.engine import generate

    t_start = time.perf_counter()
    dev = torch_device(device)
    pair = pair_for("memory", cfg, pair, tiny, dev, dtype)
    if isinstance(pair, dict):  # the pair's files are absent: the skipped record
        return pair
    target, draft, tok = pair
    prompts, label = prompt_ids(tok, cfg.datasets, cfg.n_prompts, cfg.seed)
    gc.collect()
    before, _ = _rss_bytes()
    reset_ok = _reset_peak_rss()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    rss: list[int | None] = []
    tensors: list[tuple[int, int]] = []
    for i, ids in enumerate(prompts):
        generate(target, draft, ids, cfg.method, K=cfg.K, L=cfg.L, temperature=cfg.temperature,
                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + i, eos_token_id=[])
        gc.collect()  # cyclic garbage waiting for a collection is not a leak: read RSS without it
        rss.append(_rss_bytes()[0])
        if (i + 1) % 10 == 0 and rss[-1]:
            print(f"  prompt {i + 1}/{len(prompts)}: RSS {rss[-1] / 2 ** 20:.0f} MiB", flush=True)
        if cfg.tensor_count_every and (i + 1 == cfg.warmup_prompts or (i + 1) % cfg.tensor_count_every == 0
                                       or i + 1 == len(prompts)):
            tensors.append((i + 1, live_tensors()))
    _, peak = _rss_bytes()
    mib = 1 / 2 ** 20
    w = cfg.warmup_prompts
    base = rss[w - 1] if w >= 1 else before
    tail = [x * mib for x in rss[w:] if x is not None]
    growth, slope = rss_trend(tail)
    after_warm = [n for i, n in tensors if i >= w]
    tensor_growth = (after_warm[-1] - after_warm[0]) if len(after_warm) >= 2 else None
    res = {"method": cfg.method, "K": cfg.K, "L": cfg.L, "n_prompts": len(prompts), "prompts": label,
           "rss_before_mib": before * mib if before else None,
           "peak_rss_mib": peak * mib if peak else None, "peak_is_since_start_of_run": reset_ok,
           "rss_after_warmup_mib": base * mib if base else None, "rss_end_mib": tail[-1] if tail else None,
           "rss_endpoint_growth_mib": (tail[-1] - base * mib) if tail and base else None,
           "rss_growth_mib": growth, "rss_slope_mib_per_prompt": slope,
           "rss_mib_per_prompt": [x * mib if x else None for x in rss], "live_tensors": tensors,
           "live_tensor_growth": tensor_growth}
    if dev.type == "cuda":
        res["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated(dev) * mib
    print_table(f"memory: {cfg.method} K={cfg.K} L={cfg.L}, {len(prompts)} prompts x {cfg.max_new_tokens} tokens"
                f" ({target.name} + {draft.name})", ["figure", "value"],
                [["peak RSS (MiB)" + ("" if reset_ok else " (process lifetime: VmHWM reset not permitted)"),
                  fmt_number(res["peak_rss_mib"], 5)],
                 ["RSS before the run (MiB)", fmt_number(res["rss_before_mib"], 5)],
                 [f"RSS growth after prompt {w}: median of the last quarter - median of the first (MiB)",
                  fmt_number(growth, 3)],
                 ["RSS slope, least squares (MiB / prompt)", fmt_number(slope, 3)],
                 ["RSS after the warm-up -> at the end (MiB)",
                  f"{fmt_number(res['rss_after_warmup_mib'], 5)} -> {fmt_number(res['rss_end_mib'], 5)}"],
                 ["live tensors (prompt: count)", ", ".join(f"{i}: {n}" for i, n in tensors) or "-"]])
    goals = [goal_record(f"no RSS growth over {len(prompts)} prompts (median RSS, last vs first quarter after the warm-up)",
                   growth, max(16.0, 0.01 * (base or 0) * mib), unit=" MiB",
                   why="limit: max(16 MiB, 1% of RSS): single readings swing with the allocator, a leak moves the median")]
    if tensor_growth is not None:
        goals.append(goal_record("no growth in live tensors", float(tensor_growth), 0.0))
    print_goals(goals)
    return bench_record("memory", cfg, str(dev), str(target.dtype).removeprefix("torch."), res,
                   {"target": target.name, "draft": draft.name, "pair_files": pair_identity(cfg.pair)}, goals,
                   wall_seconds=time.perf_counter() - t_start)
