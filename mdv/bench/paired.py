"""The ``paired`` benchmark (``experiments/bench benchmarks=[paired]``): wall time, contexts
per second and the share of time in trajectories, draft, target and each verifier's law.

The issue's setting: 5 datasets x 10 prompts x 64 generated tokens (a context every 4), K_max = 4,
L_max = 8, all six verifiers; goal: at most 6 minutes on 2 cores.  Physical limits stated next to the
figures: every context costs one K_max-row draft of L_max steps and one target tree pass of up to
K_max·L_max + 1 nodes, and every trajectory token off the drafts' paths one AR target step (the rest reuse
the tree pass's laws, :mod:`mdv.paired.trajectory`).
"""
from __future__ import annotations

import time
from typing import Any
import tempfile
from pathlib import Path

from mdv.bench.config import PairedBench, TinyPair
from mdv.bench.records import bench_record, goal_record, print_goals, print_table


def run_paired_bench(cfg: PairedBench, *, threads: int = 1, tiny: Any = None) -> dict[str, Any]:
    """Run it into a temporary folder; -> the summary dict (wall, contexts/s, shares, the goal)."""
    from mdv.paired.analysis import collect
    from mdv.paired.config import PairedConfig
    from mdv.paired.measure import run_paired
    from mdv.paired.records import load_records
    from mdv.sweep import RunConfig

    run = RunConfig()
    run.name, run.progress, run.threads = "bench_paired", True, threads
    run.models.kind = cfg.pair
    if cfg.pair == "tiny_random" and tiny is not None:
        run.models.vocab_size, run.models.hidden_size = tiny.vocab_size, tiny.hidden_size
        run.models.num_layers, run.models.seed = tiny.num_layers, tiny.seed
    run.sampling.temperatures = [cfg.temperature]
    run.paired = PairedConfig(enabled=True, datasets=list(cfg.datasets), n_prompts=cfg.n_prompts, n_tokens=cfg.n_tokens,
                              stride=cfg.stride, K_max=cfg.K_max, L_max=cfg.L_max, calibrate=False,
                              workers=cfg.workers, methods=list(cfg.methods))
    run.dataset.names = list(cfg.datasets)
    with tempfile.TemporaryDirectory(prefix="mdv-bench-paired-") as tmp:
        run.results_dir = str(Path(tmp) / "res")
        t0 = time.perf_counter()
        report = run_paired(run)
        wall = time.perf_counter() - t0
        records = load_records(run.results_dir)
        data = collect(records)[0]
    traj_tokens = sum(len(r["trajectory"]["tokens"]) for r in records)
    traj_steps = sum(r["trajectory"].get("target_steps", len(r["trajectory"]["tokens"])) for r in records)
    t = data.timing
    measured = t.get("wall_s", wall)  # summed over records (over processes when workers > 1)
    laws = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith("laws/")}
    parts = {"trajectory": t.get("trajectory_s", 0.0), "prefill": t.get("prefill_s", 0.0),
             "draft": t.get("draft_s", 0.0), "target": t.get("target_s", 0.0), "optimum": t.get("optimum_s", 0.0),
             **{f"law/{m}": v for m, v in laws.items()}}
    return {"wall_seconds": wall, "contexts": data.n, "prompts": data.n_prompts, "records_failed": len(report.failed),
            "contexts_per_second": data.n / wall, "seconds_per_context": wall / data.n,
            "share": {k: v / measured for k, v in parts.items()}, "seconds": parts,
            "trajectory_tokens": traj_tokens, "trajectory_target_steps": traj_steps,
            "goal": {"goal": f"paired run <= {cfg.goal_seconds:g} s", "value": wall, "limit": cfg.goal_seconds,
                     "met": wall <= cfg.goal_seconds}}


def run_paired_benchmark(cfg: PairedBench, threads: int, tiny: TinyPair) -> dict[str, Any]:
    """``paired``: :func:`run_paired_bench`, printed as a table with its goal."""
    t0 = time.perf_counter()
    res = run_paired_bench(cfg, threads=threads, tiny=tiny)
    (print_table(f"paired measurement: {res['contexts']} contexts, {res['prompts']} prompts, K_max={cfg.K_max},"
                      f" L_max={cfg.L_max}, {cfg.workers} process(es)", ["part", "seconds", "share"],
                      [[k, f"{v:.1f}", f"{res['share'][k]:.1%}"] for k, v in res["seconds"].items()]))
    print(f"  {res['contexts_per_second']:.2f} contexts/s, {res['seconds_per_context']:.2f} s per context;"
          f" trajectories: {res['trajectory_target_steps']} target steps for {res['trajectory_tokens']} tokens"
          " (the rest read from the tree passes)", flush=True)
    goal = goal_record(res["goal"]["goal"], res["wall_seconds"], cfg.goal_seconds, unit=" s",
                 why="each context: a K_max-row draft of L_max steps + one tree pass of up to K_max·L_max+1 nodes;"
                     " each trajectory token off the drafts' paths: one AR target step")
    print_goals([goal])
    return bench_record("paired", cfg, "cpu", "float32", res, {"contexts_per_second": res["contexts_per_second"]}, [goal],
                   wall_seconds=time.perf_counter() - t0)
