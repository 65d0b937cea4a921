"""The ``e2e`` benchmark: AR and every method on a model pair over prompts from :mod:`mdv.data`: tokens/s,
speedup over AR, block efficiency and the draft / target / verify time split.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

from mdv.bench.config import E2EBench, TinyPair
from mdv.bench.pairs import pair_for, pair_identity, prompt_ids, torch_device
from mdv.bench.records import bench_record, fmt_number, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import ratios_of, rotated, spread




# ====================================================================================== e2e
def _e2e_cells(cfg: E2EBench) -> list[tuple[str, int | None, int | None, str | None]]:
    """(method, K, L, drafter) in run order: AR first (no K, L or drafter), then every drafter x method."""
    from mdv.verify.registry import VERIFIERS

    cells: list[tuple[str, int | None, int | None, str | None]] = [("ar", None, None, None)]
    for d in cfg.drafters:
        for m in cfg.methods:
            for K in (cfg.K if VERIFIERS[m].multi_draft else [1]):
                for L in cfg.L:
                    if (m, K, L, d) not in cells:
                        cells.append((m, K, L, d))
    return cells


def interleaved_generations(cells: Sequence[Any], prompts: Sequence[list[int]],
                            run_cell: Callable[[Any, int, list[int]], dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """Every cell on every prompt, prompt by prompt, the cell order rotated by one per prompt (so machine
    load drifts hit every cell alike).  run_cell(cell, i, prompt_ids) -> the generation's stats.
    -> cell -> stats per prompt, in prompt order (prompt 0 is the warm-up the callers leave out of timings)."""
    stats: dict[Any, list[dict[str, Any]]] = {c: [] for c in cells}
    for i, ids in enumerate(prompts):
        for cell in rotated(cells, i):
            stats[cell].append(run_cell(cell, i, ids))
    return stats


def run_e2e(cfg: E2EBench, pair: tuple[Any, Any, Any] | None = None, tiny: TinyPair | None = None,
            device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``e2e`` benchmark.  ``pair``: (target, draft, tokenizer) HFModels, else loaded from ``cfg.pair``."""
    from mdv.engine import generate

    t_start = time.perf_counter()
    dev = torch_device(device)
    pair = pair_for("e2e", cfg, pair, tiny, dev, dtype)
    if isinstance(pair, dict):  # the pair's files are absent: the skipped record
        return pair
    target, draft, tok = pair
    from mdv.drafters.registry import get_drafter

    for d in cfg.drafters:  # a drafter that cannot run on this pair fails here, before any generation
        get_drafter(d, **dict(cfg.drafter_options.get(d) or {})).bind(target, draft)
    prompts, label = prompt_ids(tok, cfg.datasets, cfg.n_prompts, cfg.seed)
    cells = _e2e_cells(cfg)
    results: list[dict[str, Any]] = []
    from tqdm import tqdm

    bar = tqdm(total=len(cfg.temperatures) * len(prompts) * len(cells), desc="e2e generations", unit="gen",
               dynamic_ncols=True, file=sys.stderr)
    for T in cfg.temperatures:
        def run_cell(cell: tuple, i: int, ids: list[int], T: float = T) -> dict[str, Any]:
            m, K, L, d = cell
            bar.set_postfix_str(f"T={T:g} prompt {i + 1}/{len(prompts)} {m} K={K or 1} L={L or 1} {d or ''}",
                                refresh=False)
            extra = {} if d is None else {"drafter": d, "drafter_options": dict(cfg.drafter_options.get(d) or {})}
            r = generate(target, draft if m != "ar" else None, ids, m, K=K or 1, L=L or 1, temperature=T,
                         max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + i, eos_token_id=[], **extra)
            bar.update()
            return r.stats

        stats = interleaved_generations(cells, prompts, run_cell)
        ar = stats[("ar", None, None, None)]
        for (m, K, L, d), st in stats.items():
            timed = st[1:]  # prompt 0 is the warm-up
            speed = ratios_of([a["decode_s"] for a in ar[1:]], [s["decode_s"] for s in timed])
            speed_e2e = ratios_of([a["total_s"] for a in ar[1:]], [s["total_s"] for s in timed])
            tokens = sum(s["new_tokens"] for s in st)
            calls = sum(s["target_calls"] for s in st)
            dec = sum(s["decode_s"] for s in timed)
            split = {k: (sum(s[f"{k}_s"] for s in timed) / dec if dec > 0 else float("nan"))
                     for k in ("draft", "target", "verify", "other")}
            results.append({"temperature": T, "method": m, "K": K, "L": L, "drafter": d,
                            "tokens_per_second": spread([s["tokens_per_second"] for s in timed]),
                            "speedup": spread(speed), "speedup_mean": statistics.fmean(speed) if speed else float("nan"),
                            "speedup_e2e": spread(speed_e2e),
                            "block_efficiency": tokens / calls if calls else float("nan"),
                            "time_split": split, "n_timed_prompts": len(timed)})
    bar.close()
    rows = [[r["temperature"], r["method"], r["drafter"] or "-", r["K"] or "-", r["L"] or "-",
             range_text(r["tokens_per_second"]),
             range_text(r["speedup"]), fmt_number(r["block_efficiency"]),
             " / ".join(f"{100 * r['time_split'][k]:.0f}%" if not math.isnan(r["time_split"][k]) else "-"
                        for k in ("draft", "target", "verify", "other"))] for r in results]
    print_table(f"end to end: {target.name} + {draft.name}; {len(prompts) - 1} timed prompts (+1 warm-up) x"
                f" {cfg.max_new_tokens} new tokens from {label}; decode speedup = AR decode s / method decode s per"
                " prompt, median [min, max]", ["T", "method", "drafter", "K", "L", "tokens/s", "speedup vs AR",
                                               "block eff.", "draft/target/verify/other"], rows)
    goals = []
    at = [r for r in results if r["temperature"] == cfg.goal_temperature and r["method"] != "ar"]
    if at:
        best = max(at, key=lambda r: r["speedup"]["median"] if r["speedup"]["n"] else -1.0)
        goals.append(goal_record(f"best method at T={cfg.goal_temperature:g} ({best['method']} K={best['K']} L={best['L']}"
                                 f" drafter {best['drafter']})"
                           f" >= {cfg.goal_best:g}x AR", best["speedup"]["median"], cfg.goal_best, at_most=False))
        sd = [r for r in at if r["method"] == "sd"]
        if sd:
            b = max(sd, key=lambda r: r["speedup"]["median"] if r["speedup"]["n"] else -1.0)
            goals.append(goal_record(f"sd at its best L (L={b['L']}, drafter {b['drafter']}) at T={cfg.goal_temperature:g} >= {cfg.goal_sd:g}x AR",
                               b["speedup"]["median"], cfg.goal_sd, at_most=False))
    print_goals(goals)
    return bench_record("e2e", cfg, str(dev), str(target.dtype).removeprefix("torch."), results,
                   {"target": target.name, "draft": draft.name, "prompts": label, "n_prompts": len(prompts),
                    "pair_files": pair_identity(cfg.pair)},
                   goals, wall_seconds=time.perf_counter() - t_start)
