"""Benchmarks that compare side by side (the engine of ``experiments/bench``, issue 5).

    config.py      the typed schema (``mdv/conf/bench.yaml``) and validate
    timing.py      interleaved repeats, spreads, ratios within a repeat
    records.py     the environment, printed tables, goals, ``bench_<name>.json``
    pairs.py       the model pairs and prompts the benchmarks run on
    verifier.py target_pass.py pass_limit.py draft_step.py e2e.py hf_compare.py oracle.py memory.py paired.py
    audit.py
                   one benchmark each
    runner.py      run(): the selected benchmarks in order
    report.py      the bench report (Markdown and plots) from the records

Six benchmarks, each a function ``run_<name>(cfg, ...) -> dict`` that prints a table and returns a
JSON-able record (``experiments/bench`` writes it to ``bench_<name>.json`` under the Hydra output folder):

* ``verifier``    -- the fast path (:meth:`Verifier.sample`) of every verifier on synthetic float64 p / q
  over a V x K x L grid: ms per call and as a fraction of one decode step of the default target,
  measured in the same run; also ``spectr_gbv`` and ``mdbv`` relative to ``spectr``.  Runs on CUDA when
  present.
* ``target_pass`` -- the verification pass of K drafts of length L on the default target: the engine's
  token tree (one row, every shared prefix once, keep the selected path) and its K-row fallback (fork the
  cache, one batched pass, keep the selected row), each against the single-draft pass.
* ``pass_limit`` -- the target's cached pass over n new tokens against its physical limit, max(weight bytes
  / read bandwidth, n x FLOPs per token / GEMM peak), bandwidth and peak measured in the same run.
* ``draft_step`` -- one drafting iteration (K blocks of L cached steps) with the draft's panels in float32,
  float16 and int8 side by side, against L x panel bytes / read bandwidth, and how far each rounding moves
  the draft's law (total variation to float32's).
* ``e2e``         -- AR and every method on a model pair over prompts from :mod:`mdv.data`: tokens/s,
  speedup over AR, block efficiency and the draft / target / verify time split.
* ``hf_compare`` -- mdv against Hugging Face ``generate`` on the same pair, prompts and L: plain sampling,
  assisted generation, prompt lookup and early exit against mdv's ar and sd with the matching drafter.
* ``oracle``      -- exact enumeration and the LPs at their largest supported sizes (seconds each), and
  Monte-Carlo trials per second of every fast verifier (what the statistical tests run).
* ``memory``      -- peak resident memory of a pair at large K, L, and growth (RSS, live tensors) over a
  long run of prompts.
* ``paired``      -- one fresh paired measurement (:mod:`mdv.paired`) at the issue's setting: wall time,
  contexts per second, the share of time per part.

Every comparison is **interleaved** after a warm-up: in each repeat every contender runs once (in a
rotated order), so a change of machine load hits all of them; each ratio is formed within one repeat
and reported as its median and range (min, max) over the repeats.  Every record carries the
environment (CPU, threads, torch version, dtype, device, load average).  Speed is never asserted here:
each goal of the issue is reported as met / missed next to the measured figure.
"""
from mdv.bench.config import (AuditBench, BenchConfig, Benchmark, BlockSource, E2EBench, HFCompareBench, MemoryBench, OracleBench, PairKind,
                              PairedBench, PassLimitBench, TargetPassBench, TinyPair, VerifierBench, validate)
from mdv.bench.e2e import interleaved_generations, run_e2e
from mdv.bench.hf_compare import run_hf_compare
from mdv.bench.memory import rss_trend, run_memory
from mdv.bench.oracle import largest_size, run_oracle
from mdv.bench.paired import run_paired_bench, run_paired_benchmark
from mdv.bench.pass_limit import run_pass_limit
from mdv.bench.pairs import load_pair, load_target_model, prompt_ids
from mdv.bench.records import SCHEMA, environment, print_table, write_json
from mdv.bench.audit import run_audit_bench
from mdv.bench.runner import run
from mdv.bench.target_pass import run_target_pass
from mdv.bench.timing import interleaved, rotated, spread, time_call
from mdv.bench.synthetic import synthetic_block
from mdv.bench.verifier import decode_step_times, real_blocks, run_verifier

__all__ = [
    "SCHEMA", "AuditBench", "Benchmark", "BenchConfig", "BlockSource", "E2EBench", "HFCompareBench", "MemoryBench", "OracleBench", "PairKind",
    "PairedBench", "PassLimitBench",
    "TargetPassBench", "TinyPair", "VerifierBench", "decode_step_times", "environment", "interleaved",
    "interleaved_generations", "largest_size", "load_pair", "load_target_model", "print_table", "prompt_ids", "real_blocks",
    "rotated", "rss_trend", "run", "run_audit_bench", "run_e2e", "run_hf_compare", "run_memory", "run_oracle", "run_paired_bench", "run_paired_benchmark",
    "run_pass_limit", "run_target_pass", "run_verifier", "spread", "synthetic_block", "time_call", "validate", "write_json",
]
