"""The benchmark driver behind ``experiments/bench``: the selected benchmarks in order, each record written to
``bench_<name>.json`` as soon as it is done.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mdv.bench.audit import run_audit_bench
from mdv.bench.config import BenchConfig, Benchmark, PairKind, validate
from mdv.bench.draft_step import run_draft_step
from mdv.bench.e2e import run_e2e
from mdv.bench.hf_compare import run_hf_compare
from mdv.bench.memory import run_memory
from mdv.bench.oracle import run_oracle
from mdv.bench.paired import run_paired_benchmark
from mdv.bench.pass_limit import run_pass_limit
from mdv.bench.pairs import load_target_model, torch_device
from mdv.bench.records import environment, write_json
from mdv.bench.target_pass import run_target_pass
from mdv.bench.verifier import run_verifier


def run(cfg: BenchConfig, out_dir: Path | str) -> dict[str, dict[str, Any]]:
    """Run the selected benchmarks in order; write ``bench_<name>.json`` under ``out_dir`` after each one.
    -> name -> record."""
    validate(cfg)
    torch.set_num_threads(int(cfg.threads))
    out = Path(out_dir)
    records: dict[str, dict[str, Any]] = {}
    for b in cfg.benchmarks:
        name = Benchmark(b).value
        print(f"\n== benchmark {name} (threads={torch.get_num_threads()}, dtype={cfg.dtype}, load average"
              f" {environment()['loadavg_1_5_15']}) ==", flush=True)
        if name == "verifier":
            target = None
            if cfg.verifier.target_step and PairKind(cfg.verifier.step_pair) == PairKind.tiny_random:
                target = load_target_model(torch_device(cfg.verifier.device), PairKind.tiny_random, cfg.tiny, cfg.dtype)
            rec = run_verifier(cfg.verifier, target, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "target_pass":
            rec = run_target_pass(cfg.target_pass, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "e2e":
            rec = run_e2e(cfg.e2e, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "oracle":
            rec = run_oracle(cfg.oracle)
        elif name == "audit":
            rec = run_audit_bench(cfg.audit)
        elif name == "hf_compare":
            rec = run_hf_compare(cfg.hf_compare, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "pass_limit":
            rec = run_pass_limit(cfg.pass_limit, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "draft_step":
            rec = run_draft_step(cfg.draft_step, tiny=cfg.tiny)
        elif name == "paired":
            rec = run_paired_benchmark(cfg.paired, threads=int(cfg.threads), tiny=cfg.tiny)
        else:
            rec = run_memory(cfg.memory, tiny=cfg.tiny, dtype=cfg.dtype)
        records[name] = rec
        path = write_json(out / f"bench_{name}.json", rec)
        print(f"  -> {path}", flush=True)
    return records
