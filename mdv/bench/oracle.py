"""The ``oracle`` benchmark: exact enumeration and the LPs at their largest supported sizes (seconds each), and
Monte-Carlo trials per second of every fast verifier (what the statistical tests run).
"""
from __future__ import annotations

import time
from typing import Any, Callable

from mdv.errors import InvalidInputError
from mdv.bench.config import OracleBench
from mdv.bench.records import bench_record, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import interleaved, spread, time_call


def largest_size(V: int, max_K: int, max_L: int, fits: Callable[[int, int], bool],
                 multi_draft: bool = True) -> tuple[int, int] | None:
    """The (K, L), K <= max_K and L <= max_L, with the most draft tuples V^(K·L) that ``fits`` (ties: the
    larger K); single-draft methods use K = 1.  None when nothing fits."""
    best: tuple[int, int, int] | None = None
    for K in (range(1, max_K + 1) if multi_draft else [1]):
        for L in range(1, max_L + 1):
            if fits(K, L):
                key = (V ** (K * L), K, L)
                if best is None or key > best:
                    best = key
    return (best[1], best[2]) if best else None


def run_oracle(cfg: OracleBench) -> dict[str, Any]:
    """The ``oracle`` benchmark: one timed run per (function, method, V) at its largest supported size, and
    Monte-Carlo throughput (:func:`mdv.oracle.montecarlo.sample_iterations`) at (mc_V, mc_K, mc_L)."""
    from mdv.oracle import enumerate as en
    from mdv.oracle import lp
    from mdv.oracle.montecarlo import sample_iterations
    from mdv.oracle.toy import random_toy_model
    from mdv.verify.registry import VERIFIERS

    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def pair(V: int):
        return (random_toy_model(V, 1000 + cfg.seed, zero_prob=0.2, name="target"),
                random_toy_model(V, 2000 + cfg.seed, zero_prob=0.2, name="draft"))

    def timed(kind: str, method: str, V: int, K: int, L: int, fn: Callable[[], Any]) -> None:
        sec = time_call(fn)
        rows.append({"function": kind, "method": method, "V": V, "K": K, "L": L, "tuples": V ** (K * L),
                     "seconds": sec})
        print(f"  {kind:15s} {method:10s} V={V} K={K} L={L} ({V ** (K * L)} tuples): {sec:.2f} s", flush=True)

    for V in cfg.vocab_sizes:
        t, d = pair(V)
        for m in cfg.methods:
            multi = VERIFIERS[m].multi_draft
            size = largest_size(V, cfg.max_K, cfg.max_L, lambda K, L: V ** (K * L) <= en.MAX_TUPLES, multi)
            if size:
                K, L = size
                timed("iteration_law", m, V, K, L, lambda: en.iteration_law(m, t, d, K, L))
            size = largest_size(V, cfg.max_K, cfg.max_L, lambda K, L: V ** (K * L) <= cfg.exact_law_max_tuples, multi)
            if size:
                K, L = size
                timed("exact_law", m, V, K, L, lambda: en.exact_law(m, t, d, K, L, L + 1))
        for kind in cfg.lp_kinds:
            def fits(K: int, L: int, kind: str = kind) -> bool:
                try:
                    lp._check_sizes(kind, V, K, L)
                    return True
                except InvalidInputError:
                    return False

            size = largest_size(V, cfg.max_K, cfg.max_L, fits)
            if size:
                K, L = size
                timed(f"lp_{kind}", "-", V, K, L, lambda: lp.lp_optimum(t, d, K, L, kind))
    # Monte-Carlo throughput, interleaved over methods
    t, d = pair(cfg.mc_V)
    mc_fns = {}
    for m in cfg.methods:
        K = cfg.mc_K if VERIFIERS[m].multi_draft else 1
        mc_fns[m] = (lambda m=m, K=K: sample_iterations(m, t, d, K, cfg.mc_L, cfg.mc_trials, seed=cfg.seed))
    mc_times = interleaved(mc_fns, cfg.mc_repeats, warmup=1)
    mc = [{"method": m, "V": cfg.mc_V, "K": cfg.mc_K if VERIFIERS[m].multi_draft else 1, "L": cfg.mc_L,
           "trials": cfg.mc_trials, "trials_per_second": spread([cfg.mc_trials / s for s in ts])}
          for m, ts in mc_times.items()]
    print_table("exact oracle at the largest supported sizes (one run each)",
                ["function", "method", "V", "K", "L", "tuples", "seconds"],
                [[r["function"], r["method"], r["V"], r["K"], r["L"], r["tuples"], r["seconds"]] for r in rows])
    print_table(f"Monte-Carlo throughput: sample_iterations, {cfg.mc_trials} trials per call,"
                f" median [min, max] over {cfg.mc_repeats} interleaved repeats", ["method", "V", "K", "L", "trials/s"],
                [[r["method"], r["V"], r["K"], r["L"], range_text(r["trials_per_second"])] for r in mc])
    slowest = max(rows, key=lambda r: r["seconds"]) if rows else None
    goals = []
    if slowest:
        goals.append(goal_record(f"slowest exact computation ({slowest['function']} {slowest['method']} V={slowest['V']}"
                           f" K={slowest['K']} L={slowest['L']}) <= {cfg.time_limit_s:g} s", slowest["seconds"],
                           cfg.time_limit_s, unit=" s"))
    for r in mc:
        goals.append(goal_record(f"{r['method']} Monte Carlo at V={r['V']}, K={r['K']}, L={r['L']} >= {cfg.mc_goal:g} trials/s",
                           r["trials_per_second"]["median"], cfg.mc_goal, at_most=False))
    print_goals(goals)
    return bench_record("oracle", cfg, "cpu", "float64", {"exact": rows, "monte_carlo": mc}, {}, goals,
                   wall_seconds=time.perf_counter() - t_start)
