"""The ``audit`` benchmark: how fast the audit runs rules, and how fast it finds a known bias.

* Sampler throughput: every mdv verifier's vectorised sampler on the first-iteration blocks of every
  default-grid case (instances per second of the sampler alone, median and range over interleaved
  repeats); the harness's own rate (drawing blocks, checking and chaining outcomes) with a rule that costs
  nothing; the per-instance adapter (:class:`~mdv.audit.protocol.ScalarSampler`) on that same rule.
* Detection: :class:`~mdv.audit.rules.MoveMass` makes a lossless rule biased by exactly TV ``epsilon`` on
  one case; the whole default audit runs (``stop_on_bias``) and its wall time to the verdict is recorded
  (goal: found within ``goal_seconds``).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from mdv.audit import audit, load_specs
from mdv.audit.protocol import ScalarSampler, VerifierSampler
from mdv.audit.rules import MoveMass
from mdv.audit.run import Tally, build_table, run_batch
from mdv.bench.config import AuditBench
from mdv.bench.records import bench_record, goal_record, print_goals, print_table, range_text
from mdv.bench.timing import interleaved, spread
from mdv.verify.registry import get_verifier


def _reject_everything(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator):
    """A lossless rule that costs (almost) nothing: accept no draft token, emit one from the target."""
    N = tokens.shape[0]
    token = torch.multinomial(p[:, 0, 0], 1, generator=generator).squeeze(-1)
    z = torch.zeros(N, dtype=torch.long)
    return z, z, token


def _reject_one(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator):
    return 0, 0, int(torch.multinomial(p[0, 0], 1, generator=generator))


def run_audit_bench(cfg: AuditBench) -> dict[str, Any]:
    t_start = time.perf_counter()
    specs = load_specs(cfg.cases)
    g = torch.Generator().manual_seed(cfg.seed)
    rows: list[dict[str, Any]] = []
    for spec in specs:
        case = spec.build()
        table = build_table(case)
        tokens, path = table.draw_blocks(torch.zeros(cfg.instances, dtype=torch.long), case.K, case.L, g)
        q, p = table.q[path[:, :, :case.L]], table.p[path]
        fns = {}
        for m in cfg.methods:
            v = get_verifier(m)
            if case.K > 1 and not v.multi_draft:
                continue
            sampler = VerifierSampler(v)
            fns[m] = (lambda s=sampler: (s.reset(), s(tokens, q, p, torch.Generator().manual_seed(0))))
        times = interleaved(fns, cfg.repeats, warmup=1)
        for m, ts in times.items():
            rows.append({"case": case.name, "V": case.V, "K": case.K, "L": case.L, "method": m,
                         "instances_per_second": spread([cfg.instances / s for s in ts])})
    # the harness alone (a free rule) and the per-instance adapter on the same rule
    case = specs[0].build()
    table = build_table(case)

    def harness(rule: Any, n: int) -> int:
        tally = Tally.empty(case.V, case.n_tokens)
        run_batch(rule, case, table, n, torch.Generator().manual_seed(0), tally)
        return tally.instances

    n_scalar = max(1000, cfg.instances // 64)
    counts: dict[str, int] = {}

    def timed_run(name: str, rule: Any, n: int):
        def go():
            counts[name] = harness(rule, n)
        return go

    h_times = interleaved({"vectorised": timed_run("vectorised", _reject_everything, cfg.instances),
                           "scalar": timed_run("scalar", ScalarSampler(_reject_one), n_scalar)}, cfg.repeats, warmup=1)
    harness_rate = spread([counts["vectorised"] / s for s in h_times["vectorised"]])
    scalar_rate = spread([counts["scalar"] / s for s in h_times["scalar"]])
    # detection of a known bias within the whole default audit
    detection = []
    for base, name in zip(cfg.detection_rules, cfg.detection_cases):
        spec = next(s for s in specs if s.name == name)
        V = spec.V if spec.kind == "random" else len(spec.target or ())
        rule = MoveMass(base, cfg.epsilon, only=((V, spec.K, spec.L),))
        t0 = time.perf_counter()
        report = audit(rule, cases=cfg.cases, stop_on_bias=True, with_references=False, seed=cfg.seed)
        seconds = time.perf_counter() - t0
        hit = next((c for c in report.cases if c.name == name), None)
        detection.append({"rule": base, "perturbed_case": name, "epsilon": cfg.epsilon, "verdict": report.verdict,
                          "seconds": seconds, "sequences_on_perturbed_case": hit.sequences if hit else None,
                          "perturbed_case_status": hit.status if hit else None,
                          "cases_biased": [c.name for c in report.biased_cases]})
        print(f"  detection: {base} + TV {cfg.epsilon} on {name}: {report.verdict} in {seconds:.0f} s"
              f" ({hit.sequences if hit else '?'} sequences on that case)", flush=True)
    print_table(f"sampler throughput on the first-iteration blocks of each case ({cfg.instances} instances per call),"
                f" median [min, max] over {cfg.repeats} interleaved repeats", ["case", "method", "instances/s"],
                [[r["case"], r["method"], range_text(r["instances_per_second"])] for r in rows])
    print(f"  harness with a free rule: {range_text(harness_rate)} instances/s; per-instance adapter:"
          f" {range_text(scalar_rate)} instances/s ({harness_rate['median'] / scalar_rate['median']:.0f}x slower)")
    goals = [goal_record(f"harness (free rule) >= {cfg.goal_rate:g} instances/s", harness_rate["median"], cfg.goal_rate,
                         at_most=False)]
    by_method: dict[str, float] = {}
    for r in rows:
        by_method[r["method"]] = min(by_method.get(r["method"], float("inf")), r["instances_per_second"]["median"])
    for m, rate in by_method.items():
        goals.append(goal_record(f"{m} sampler, slowest case, >= {cfg.goal_rate:g} instances/s", rate, cfg.goal_rate,
                                 at_most=False))
    for d in detection:
        goal = goal_record(f"{d['rule']} biased by TV {d['epsilon']} on {d['perturbed_case']}: found within"
                           f" {cfg.goal_seconds:g} s", d["seconds"], cfg.goal_seconds, unit=" s")
        if d["verdict"] != "biased":
            goal.update(met=False, why=f"not found: the audit said {d['verdict']}")
        goals.append(goal)
    print_goals(goals)
    results = {"throughput": rows, "harness_instances_per_second": harness_rate,
               "scalar_instances_per_second": scalar_rate, "detection": detection}
    return bench_record("audit", cfg, "cpu", "float64", results,
                        {"scalar_slowdown": harness_rate["median"] / scalar_rate["median"]}, goals,
                        wall_seconds=time.perf_counter() - t_start)
