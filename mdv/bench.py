"""Benchmarks that compare side by side (the engine of ``experiments/bench``, issue 5).

Five benchmarks, each a function ``run_<name>(cfg, ...) -> dict`` that prints a table and returns a
JSON-able record (``experiments/bench`` writes it to ``bench_<name>.json`` under the Hydra output folder):

* ``verifier``    -- the fast path (:meth:`Verifier.sample`) of every verifier on synthetic float64 p / q
  over a V x K x L grid: ms per call and as a fraction of one decode step of the default target,
  measured in the same run; also ``spectr_gbv`` and ``mdbv`` relative to ``spectr``.  Runs on CUDA when
  present.
* ``target_pass`` -- the verification pass of K drafts of length L on the default target: the engine's
  token tree (one row, every shared prefix once, keep the selected path) and its K-row fallback (fork the
  cache, one batched pass, keep the selected row), each against the single-draft pass.
* ``e2e``         -- AR and every method on a model pair over prompts from :mod:`mdv.data`: tokens/s,
  speedup over AR, block efficiency and the draft / target / verify time split.
* ``oracle``      -- exact enumeration and the LPs at their largest supported sizes (seconds each), and
  Monte-Carlo trials per second of every fast verifier (what the statistical tests run).
* ``memory``      -- peak resident memory of a pair at large K, L, and growth (RSS, live tensors) over a
  long run of prompts.

Every comparison is **interleaved** after a warm-up: in each repeat every contender runs once (in a
rotated order), so a change of machine load hits all of them; each ratio is formed within one repeat
and reported as its median and range (min, max) over the repeats.  Every record carries the
environment (CPU, threads, torch version, dtype, device, load average).  Speed is never asserted here:
each goal of the issue is reported as met / missed next to the measured figure.
"""
from __future__ import annotations

import datetime as _dt
import enum
import functools
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from mdv.errors import InvalidInputError, UnknownNameError, unknown_name
from mdv.models.tree import build_tree
from mdv.paired.bench import PairedBench, run_paired_bench

# 2: target_pass "tree" times the engine's token-tree pass (extend_tree + keep_nodes + crop), in 1 a
# benchmark-only forward pass with a crop; memory reads RSS after a gc.collect() per prompt, in 1 without
SCHEMA = "mdv.bench/2"
MODEL_DTYPES = ("float32", "bfloat16", "float16", "float64")
ALL_METHODS = ["sd", "bv", "gbv", "spectr", "spectr_gbv", "mdbv"]
#: Used when :mod:`mdv.data` cannot provide prompts (or ``datasets: []``).
FIXED_PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in three sentences.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "A farmer has 17 sheep and buys 5 more, then sells 8. How many sheep does he have? Think step by step.",
    "List five tips for writing clear technical documentation.",
    "Translate to French: The weather is lovely today and we are going to the park.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "What are the main differences between TCP and UDP?",
    "Write a haiku about autumn leaves.",
    "Describe how a hash table works to a beginner programmer.",
]


# ====================================================================================== config
class Benchmark(str, enum.Enum):
    """The benchmarks ``experiments/bench`` can run (``benchmarks: [...]``)."""

    verifier = "verifier"
    target_pass = "target_pass"
    e2e = "e2e"
    oracle = "oracle"
    memory = "memory"
    paired = "paired"


class PairKind(str, enum.Enum):
    """``default``: SmolLM2-135M-Instruct + the shipped draft (:mod:`mdv.models.default_pair`);
    ``tiny_random``: a tiny random Llama pair built in code (tests, smoke runs; its numbers mean nothing)."""

    default = "default"
    tiny_random = "tiny_random"


@dataclass
class VerifierBench:
    """``verifier``: V x K x L grid of synthetic blocks; single-draft methods run at K = 1 only."""

    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    vocab_sizes: list[int] = field(default_factory=lambda: [1000, 32000, 49152, 151936])
    K: list[int] = field(default_factory=lambda: [1, 4, 8])
    L: list[int] = field(default_factory=lambda: [4, 8, 12])
    repeats: int = 3
    warmup: int = 1
    #: independent uniform draws per cell; a timed call runs all of them and reports the mean per draw
    #: (the lazy spectr_gbv / mdbv paths cost more when drafts are rejected: one draw is not representative)
    draws: int = 8
    #: None = CUDA when available, else CPU (the verifiers and the target step run there).
    device: Optional[str] = None
    #: Time one decode step of the target in every repeat (the default target needs its file).
    target_step: bool = True
    #: whose target's decode step is the yardstick (tiny_random only for smoke runs).
    step_pair: PairKind = PairKind.default
    #: tokens in the target's KV cache when its decode step is timed, and calls per repeat (median).
    step_context: int = 128
    step_calls: int = 3
    #: std of the synthetic logits (larger = peakier laws) and of the target's deviation from the draft.
    logit_scale: float = 3.0
    target_noise: float = 1.0
    seed: int = 0
    #: the cell of the issue's goal: every verifier <= 5% of a target step there (spectr <= 10%).
    goal_V: int = 49152
    goal_K: int = 4
    goal_L: int = 8


@dataclass
class TargetPassBench:
    """``target_pass``: K drafts of length L after a ``context``-token prompt on the target."""

    pair: PairKind = PairKind.default
    K: int = 4
    L: int = 8
    context: int = 256
    #: leading tokens every draft shares (i.i.d. drafts often agree on their first tokens).
    shared: int = 0
    repeats: int = 5
    warmup: int = 1
    seed: int = 0
    #: goal: the K-draft pass costs at most this many single-draft passes.
    goal_ratio: float = 2.0


@dataclass
class E2EBench:
    """``e2e``: AR and every (method, K, L) on the pair, per temperature, interleaved per prompt.

    The first prompt is a warm-up (excluded from timing, kept in block efficiency).  Generation never
    stops at EOS (``eos_token_id=[]``), so every run produces ``max_new_tokens`` tokens and time ratios
    are throughput ratios.  ``n_prompts`` counts all prompts (round robin over the datasets, warm-up included);
    the issue's full setting (10 per dataset + 1): ``e2e.n_prompts=51 e2e.max_new_tokens=64
    e2e.temperatures=[0,0.4] e2e.datasets=[gsm8k,humaneval,mgsm,lm1b,alpaca]``.
    """

    pair: PairKind = PairKind.default
    #: mdv.data dataset names; [] (or mdv.data unavailable) = the fixed prompt list of mdv.bench.
    datasets: list[str] = field(default_factory=lambda: ["gsm8k"])
    n_prompts: int = 3
    max_new_tokens: int = 32
    temperatures: list[float] = field(default_factory=lambda: [0.4])
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    K: list[int] = field(default_factory=lambda: [1, 3])
    L: list[int] = field(default_factory=lambda: [2, 4, 8])
    seed: int = 0
    #: goals at goal_temperature: the best setting >= goal_best x AR, sd at its best L >= goal_sd x AR.
    goal_temperature: float = 0.4
    goal_best: float = 2.0
    goal_sd: float = 1.5


@dataclass
class OracleBench:
    """``oracle``: exact enumeration / LPs at the largest (K <= max_K, L <= max_L) each supports per V,
    and Monte-Carlo trials per second at (mc_V, mc_K, mc_L)."""

    vocab_sizes: list[int] = field(default_factory=lambda: [3, 4, 5])
    max_K: int = 3
    max_L: int = 3
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    #: ``exact_law`` (several iterations, n_tokens = L + 1) only where V^(K·L) <= this.
    exact_law_max_tuples: int = 4096
    lp_kinds: list[str] = field(default_factory=lambda: ["valid", "greedy"])
    time_limit_s: float = 30.0
    mc_V: int = 4
    mc_K: int = 3
    mc_L: int = 3
    mc_trials: int = 200_000
    mc_repeats: int = 3
    mc_goal: float = 200_000.0
    seed: int = 0


@dataclass
class MemoryBench:
    """``memory``: ``n_prompts`` generations at (K, L) with ``method``; RSS and live tensors per prompt."""

    pair: PairKind = PairKind.default
    method: str = "mdbv"
    K: int = 8
    L: int = 12
    temperature: float = 0.4
    n_prompts: int = 100
    max_new_tokens: int = 8
    datasets: list[str] = field(default_factory=lambda: ["gsm8k"])
    #: prompts before the baseline RSS is taken (allocator and caches settle).
    warmup_prompts: int = 5
    #: count live tensors (a gc scan) every this many prompts (0 = never).
    tensor_count_every: int = 10
    seed: int = 0


@dataclass
class TinyPair:
    """The ``tiny_random`` pair (see :func:`mdv.models.tiny_random.build_tiny_random_pair`)."""

    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 2
    seed: int = 0


@dataclass
class BenchConfig:
    """Schema of ``conf/bench.yaml``."""

    #: every benchmark but ``paired`` (a full paired run, ~10-20 min on 2 cores): ``benchmarks=[paired]`` runs it
    benchmarks: list[Benchmark] = field(default_factory=lambda: [b for b in Benchmark if b != Benchmark.paired])
    #: torch intra-op threads (the machine's cores by default in conf/bench.yaml).
    threads: int = 2
    #: weights dtype of the models (float32, bfloat16, float16, float64); verification is float64 always.
    dtype: str = "float32"
    verifier: VerifierBench = field(default_factory=VerifierBench)
    target_pass: TargetPassBench = field(default_factory=TargetPassBench)
    e2e: E2EBench = field(default_factory=E2EBench)
    oracle: OracleBench = field(default_factory=OracleBench)
    memory: MemoryBench = field(default_factory=MemoryBench)
    paired: PairedBench = field(default_factory=PairedBench)
    tiny: TinyPair = field(default_factory=TinyPair)


def validate(cfg: BenchConfig) -> None:
    """Raise :class:`InvalidInputError` / ``UnknownNameError`` (one line) for values the schema's types
    cannot rule out."""
    from mdv.verify.registry import VERIFIERS

    for where, methods in (("verifier.methods", cfg.verifier.methods), ("e2e.methods", cfg.e2e.methods),
                           ("oracle.methods", cfg.oracle.methods), ("memory.method", [cfg.memory.method])):
        for m in methods:
            if m not in VERIFIERS:
                raise UnknownNameError(f"{where}: {unknown_name('method', m, list(VERIFIERS))}")
    if cfg.threads < 1:
        raise InvalidInputError(f"threads must be >= 1; got {cfg.threads}")
    if cfg.dtype not in MODEL_DTYPES:
        raise InvalidInputError(f"dtype must be one of {', '.join(MODEL_DTYPES)}; got {cfg.dtype!r}")
    checks = [("verifier.vocab_sizes", cfg.verifier.vocab_sizes, 2), ("verifier.K", cfg.verifier.K, 1),
              ("verifier.L", cfg.verifier.L, 1), ("e2e.K", cfg.e2e.K, 1), ("e2e.L", cfg.e2e.L, 1),
              ("oracle.vocab_sizes", cfg.oracle.vocab_sizes, 2)]
    for name, values, lo in checks:
        if not values or any(int(v) < lo for v in values):
            raise InvalidInputError(f"{name} must be a non-empty list of integers >= {lo}; got {list(values)}")
    for name, value, lo in (("verifier.repeats", cfg.verifier.repeats, 1), ("verifier.draws", cfg.verifier.draws, 1),
                            ("verifier.step_calls", cfg.verifier.step_calls, 1),
                            ("verifier.step_context", cfg.verifier.step_context, 1),
                            ("target_pass.K", cfg.target_pass.K, 1), ("target_pass.L", cfg.target_pass.L, 1),
                            ("target_pass.context", cfg.target_pass.context, 2), ("target_pass.repeats", cfg.target_pass.repeats, 1),
                            ("e2e.n_prompts", cfg.e2e.n_prompts, 2), ("e2e.max_new_tokens", cfg.e2e.max_new_tokens, 1),
                            ("oracle.mc_trials", cfg.oracle.mc_trials, 1), ("oracle.mc_repeats", cfg.oracle.mc_repeats, 1),
                            ("memory.n_prompts", cfg.memory.n_prompts, 2), ("memory.K", cfg.memory.K, 1),
                            ("memory.L", cfg.memory.L, 1), ("memory.max_new_tokens", cfg.memory.max_new_tokens, 1)):
        if int(value) < lo:
            raise InvalidInputError(f"{name} must be >= {lo}; got {value}")
    if not 0 <= cfg.target_pass.shared <= cfg.target_pass.L:
        raise InvalidInputError(f"target_pass.shared must lie in [0, L={cfg.target_pass.L}]; got {cfg.target_pass.shared}")
    if cfg.memory.warmup_prompts >= cfg.memory.n_prompts:
        raise InvalidInputError(f"memory.warmup_prompts ({cfg.memory.warmup_prompts}) must be below memory.n_prompts"
                                f" ({cfg.memory.n_prompts})")
    if any(t < 0 for t in cfg.e2e.temperatures) or not cfg.e2e.temperatures:
        raise InvalidInputError(f"e2e.temperatures must be a non-empty list of numbers >= 0; got {cfg.e2e.temperatures}")
    for k in cfg.oracle.lp_kinds:
        if k not in ("valid", "greedy"):
            raise UnknownNameError(f"oracle.lp_kinds: {unknown_name('LP kind', k, ['valid', 'greedy'])}")
    from mdv.data import DATASETS

    for where, names in (("e2e.datasets", cfg.e2e.datasets), ("memory.datasets", cfg.memory.datasets)):
        for name in names:  # a typo must not silently fall back to the fixed prompt list
            if name not in DATASETS:
                raise UnknownNameError(f"{where}: {unknown_name('dataset', name, list(DATASETS))}")


# ====================================================================================== helpers
def environment(device: str | torch.device = "cpu", dtype: str = "float64") -> dict[str, Any]:
    """CPU, threads, torch / transformers versions, dtype, device, load average, timestamp."""
    import mdv

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is a dependency
        tf_version = None
    dev = str(device)
    if dev.startswith("cuda") and torch.cuda.is_available():
        dev = f"{dev} ({torch.cuda.get_device_name(torch.device(dev))})"
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        load = None
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": tf_version, "dtype": dtype, "device": dev,
            "mdv": mdv.__version__, "python": platform.python_version(), "loadavg_1_5_15": load,
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def spread(values: Sequence[float]) -> dict[str, float | int]:
    """Median and range of ``values`` (NaN entries dropped): {"median", "min", "max", "n"}."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _sync_for(device: torch.device | str) -> Callable[[], None]:
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


def _ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    return [a / b if b > 0 else float("nan") for a, b in zip(num, den)]


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"
    return str(x)


def _range_str(s: dict[str, Any], digits: int = 3, pct: bool = False) -> str:
    if not s or not s.get("n"):
        return "-"
    f = (lambda v: f"{100 * v:.{max(digits - 1, 1)}g}%") if pct else (lambda v: _fmt(v, digits))
    return f"{f(s['median'])} [{f(s['min'])}, {f(s['max'])}]"


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Print (and return) a Markdown table."""
    cells = [[c if isinstance(c, str) else _fmt(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(columns)]
    lines = [f"\n### {title}", "| " + " | ".join(str(h).ljust(w) for h, w in zip(columns, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _jsonable(x: Any) -> Any:
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None  # strict JSON
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as strict JSON (NaN -> null) atomically (temp file + fsync + replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_jsonable(record), f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _record(name: str, cfg_section: Any, device: str, dtype: str, results: Any, summary: dict[str, Any],
            goals: list[dict[str, Any]], status: str = "ok", reason: str | None = None,
            wall_seconds: float | None = None) -> dict[str, Any]:
    return {"schema": SCHEMA, "benchmark": name, "status": status, "reason": reason,
            "config": asdict(cfg_section) if cfg_section is not None else {},
            "environment": environment(device, dtype), "results": results, "summary": summary, "goals": goals,
            "wall_seconds": wall_seconds, "note": "shared machine: see environment.loadavg_1_5_15"}


def _goal(name: str, value: float | None, limit: float, *, at_most: bool = True, unit: str = "",
          why: str | None = None) -> dict[str, Any]:
    """A goal verdict: met when value <= limit (``at_most``) or >= limit."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        met = None
    else:
        met = bool(value <= limit) if at_most else bool(value >= limit)
    return {"goal": name, "value": value, "limit": limit, "at_most": at_most, "unit": unit, "met": met,
            "why": why}


def _print_goals(goals: list[dict[str, Any]]) -> None:
    for g in goals:
        verdict = {True: "MET", False: "MISSED", None: "NOT MEASURED"}[g["met"]]
        op = "<=" if g["at_most"] else ">="
        print(f"  goal {g['goal']}: {_fmt(g['value'], 4)}{g['unit']} {op} {_fmt(g['limit'], 4)}{g['unit']} -> {verdict}"
              + (f" ({g['why']})" if g.get("why") else ""), flush=True)


def _skipped(name: str, cfg_section: Any, reason: str) -> dict[str, Any]:
    print(f"{name}: skipped -- {reason}", flush=True)
    return _record(name, cfg_section, "cpu", "-", [], {}, [], status="skipped", reason=reason)


def _device(device: Optional[str]) -> torch.device:
    from mdv.models.hf import default_device

    return torch.device(device) if device else default_device()


# ====================================================================================== models
def _default_target_available() -> tuple[bool, str]:
    from mdv import assets
    from mdv.errors import MissingAssetError
    from mdv.models.default_pair import TARGET_ASSET

    try:
        assets.path(TARGET_ASSET)
    except MissingAssetError as e:
        return False, str(e)
    return True, ""


def load_target_model(device: torch.device, pair: PairKind = PairKind.default, tiny: TinyPair | None = None,
                      dtype: str = "float32"):
    """The target as an :class:`~mdv.models.hf.HFModel` on ``device`` in ``dtype`` (default pair's target,
    or the tiny random one).  Raises MissingAssetError when the default target file is absent."""
    if PairKind(pair) == PairKind.tiny_random:
        return load_pair(device, pair, tiny, dtype)[0]
    from mdv.models.default_pair import load_target
    from mdv.models.hf import HFModel

    model, tok = load_target(torch.float32)
    return HFModel(model.to(device=device, dtype=getattr(torch, dtype)), tok,
                   name="SmolLM2-135M-Instruct (default target)")


def load_pair(device: torch.device, pair: PairKind = PairKind.default, tiny: TinyPair | None = None,
              dtype: str = "float32"):
    """(target, draft, tokenizer): HFModels on ``device`` in ``dtype``.  Raises MissingAssetError when the
    default pair is incomplete."""
    from mdv.models.hf import HFModel

    if PairKind(pair) == PairKind.tiny_random:
        from mdv.models.tiny_random import build_tiny_random_pair

        t = tiny or TinyPair()
        return build_tiny_random_pair(t.vocab_size, t.seed, hidden_size=t.hidden_size, num_layers=t.num_layers,
                                      dtype=dtype, device=str(device))
    from mdv.errors import MissingAssetError
    from mdv.models import default_pair

    ok, reason = default_pair.default_pair_available()
    if not ok:
        raise MissingAssetError(f"the default model pair is unavailable: {reason}")
    t, d, tok = default_pair.load_default_pair(getattr(torch, dtype))
    return (HFModel(t.to(device), tok, name="SmolLM2-135M-Instruct (default target)"),
            HFModel(d.to(device), tok, name=f"{default_pair.draft_description(d)} (default draft)"), tok)


def pair_identity(pair: PairKind) -> dict[str, Any]:
    """What identifies the pair's files: for the default pair, the draft's recorded sha256 and the target asset."""
    if PairKind(pair) != PairKind.default:
        return {"pair": PairKind(pair).value}
    from mdv.models import default_pair

    try:
        cfg = json.loads(default_pair.draft_config_path().read_text())
    except (OSError, ValueError):
        cfg = {}
    return {"pair": "default", "target_asset": default_pair.TARGET_ASSET, "draft": default_pair.DRAFT_NAME,
            "draft_weights_sha256": cfg.get("weights_sha256"), "draft_num_layers": cfg.get("num_hidden_layers"),
            "draft_head_vocab_size": cfg.get("head_vocab_size"),
            "draft_head_vocab_subset_sha256": cfg.get("head_vocab_subset_sha256")}


def _pair_available(pair: PairKind) -> tuple[bool, str]:
    if PairKind(pair) == PairKind.tiny_random:
        return True, ""
    from mdv.models.default_pair import default_pair_available

    return default_pair_available()


def prompt_ids(tokenizer: Any, datasets: Sequence[str], n: int, seed: int = 0) -> tuple[list[list[int]], str]:
    """``n`` prompts as token ids, cycling over ``datasets`` (mdv.data), or the fixed list when none is
    given or mdv.data cannot load one.  -> (ids, a label saying where they came from)."""
    out: list[list[int]] = []
    label = ""
    if datasets:
        try:
            from mdv.data import format_prompt, load_prompts

            per = max(1, math.ceil(n / len(datasets)))
            sets = [load_prompts(name, n=per, seed=seed) for name in datasets]
            label = ", ".join(f"{s.name} ({s.source}, {len(s.prompts)})" for s in sets)
            longest = max(len(s.prompts) for s in sets)
            for j in range(longest):  # round robin over the datasets
                out += [format_prompt(s.prompts[j], tokenizer) for s in sets if j < len(s.prompts)]
        except Exception as e:  # mdv.data missing, or a dataset unavailable offline
            out, label = [], f"fixed list (mdv.data failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    if not out:
        label = label or "fixed list (mdv.bench.FIXED_PROMPTS)"
        for text in FIXED_PROMPTS:
            ids = tokenizer.encode(text) if hasattr(tokenizer, "encode") else tokenizer(text)["input_ids"]
            out.append([int(x) for x in ids])
    texts_ids = [out[i % len(out)] for i in range(n)]  # fewer prompts than asked: cycle
    return texts_ids[:n], label


# ====================================================================================== verifier
def synthetic_block(V: int, K: int, L: int, *, generator: torch.Generator, device: torch.device | str = "cpu",
                    logit_scale: float = 3.0, target_noise: float = 1.0):
    """A :class:`~mdv.verify.base.Block` (B = 1) of K drafts of length L over V tokens in float64.

    q = softmax(logit_scale · z), p = softmax(logit_scale · z + target_noise · z') with standard normal
    z, z' (a target close to the draft, as for a trained pair); every draft token is sampled from its q
    row, so it has q > 0.  The first position's laws are shared by all drafts (one context), deeper ones
    differ per draft.  -> Block with tokens [1, K, L], q [1, K, L, V], p [1, K, L+1, V].
    """
    from mdv.verify.base import Block

    dev = torch.device(device)
    z = logit_scale * torch.randn((1, K, L + 1, V), generator=generator, dtype=torch.float64, device=dev)
    z[:, :, 0] = z[:, :1, 0]
    zp = z + target_noise * torch.randn((1, K, L + 1, V), generator=generator, dtype=torch.float64, device=dev)
    zp[:, :, 0] = zp[:, :1, 0]
    q = torch.softmax(z[:, :, :L], -1)
    p = torch.softmax(zp, -1)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=generator).reshape(1, K, L)
    return Block(tokens, q, p).validate()


def decode_step_times(target: Any, context: int, calls: int, sync: Callable[[], None], seed: int = 0) -> list[float]:
    """Seconds of ``calls`` single-token decode steps of ``target`` (HFModel) with ``context`` tokens in its
    KV cache (each step is rolled back, so all see the same cache)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (context + 1,), generator=gen).tolist()
    session = target.new_session()
    with torch.inference_mode():
        session.prefill(ids[:-1])
        x = torch.tensor([[ids[-1]]], device=session.device)

        def step() -> None:
            session.extend(x)
            session.crop(context)

        step()  # warm-up
        return [time_call(step, sync) for _ in range(calls)]


def run_verifier(cfg: VerifierBench, target: Any = None, tiny: TinyPair | None = None,
                 dtype: str = "float32") -> dict[str, Any]:
    """The ``verifier`` benchmark.  ``target``: an HFModel whose decode step is the yardstick (None: the
    default target is loaded when ``cfg.target_step`` and its file is present)."""
    from mdv.verify.base import Uniforms
    from mdv.verify.registry import VERIFIERS

    t_start = time.perf_counter()
    dev = _device(cfg.device)
    sync = _sync_for(dev)
    step_reason = None
    if cfg.target_step and target is None:
        ok, why = _default_target_available()
        if ok:
            target = load_target_model(dev, dtype=dtype)
        else:
            step_reason = f"default target unavailable: {why}"
    elif not cfg.target_step:
        step_reason = "verifier.target_step=false"
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    results: list[dict[str, Any]] = []
    step_all: list[float] = []
    with torch.inference_mode():
        for V in cfg.vocab_sizes:
            # every (K, L, method) cell of this V: one block per (K, L), built once
            cells = []
            for K in cfg.K:
                for L in cfg.L:
                    methods = [m for m in cfg.methods if VERIFIERS[m].multi_draft or K == 1]
                    if not methods:
                        continue
                    block = synthetic_block(V, K, L, generator=gen, device=dev, logit_scale=cfg.logit_scale,
                                            target_noise=cfg.target_noise)
                    unis = [Uniforms.draw(1, K, L, gen, device=dev) for _ in range(cfg.draws)]

                    def call(v: Any, b: Any = block, us: list[Any] = unis) -> None:
                        for u in us:
                            v.sample(b, u, v.initial_state())

                    for m in methods:
                        cells.append(((V, K, L, m), functools.partial(call, VERIFIERS[m]())))
            if not cells:
                continue
            fns = {key: fn for key, fn in cells}
            times: dict[Any, list[float]] = {key: [] for key in fns}
            steps: list[float] = []
            for r in range(cfg.warmup + cfg.repeats):
                # one round: the target step, then every cell once (order rotated per round)
                st = (statistics.median(decode_step_times(target, cfg.step_context, cfg.step_calls, sync, cfg.seed + r))
                      if target is not None else float("nan"))
                keys = list(fns)
                keys = keys[r % len(keys):] + keys[:r % len(keys)]
                for key in keys:
                    t = time_call(fns[key], sync)
                    if r >= cfg.warmup:
                        times[key].append(t)
                if r >= cfg.warmup:
                    steps.append(st)
            step_all += steps
            for (V_, K, L, m), ts in times.items():
                ts = [t / cfg.draws for t in ts]  # seconds per draw
                row = {"V": V_, "K": K, "L": L, "method": m, "ms": spread([1e3 * t for t in ts]),
                       "step_fraction": spread(_ratios(ts, steps)), "target_step_ms": spread([1e3 * s for s in steps])}
                ref = times.get((V_, K, L, "spectr"))
                if ref is not None and m != "spectr":
                    row["vs_spectr"] = spread(_ratios(ts, ref))
                results.append(row)
            del fns, cells, times
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    step_ms = spread([1e3 * s for s in step_all])
    rows = [[r["V"], r["K"], r["L"], r["method"], _range_str(r["ms"]), _range_str(r["step_fraction"], pct=True),
             _range_str(r.get("vs_spectr", {}))] for r in results]
    print_table(f"verifier fast path (sample) on {dev}; target decode step {_range_str(step_ms)} ms"
                f"{' (' + step_reason + ')' if step_reason else ''}; median [min, max] over {cfg.repeats} interleaved"
                f" repeats of the mean over {cfg.draws} uniform draws", ["V", "K", "L", "method", "ms/call", "of a target step", "x spectr"], rows)
    goals = []
    for m in cfg.methods:
        K = cfg.goal_K if VERIFIERS[m].multi_draft else 1
        hit = [r for r in results if (r["V"], r["K"], r["L"], r["method"]) == (cfg.goal_V, K, cfg.goal_L, m)]
        frac = hit[0]["step_fraction"]["median"] if hit and hit[0]["step_fraction"]["n"] else None
        limit = 0.10 if m == "spectr" else 0.05
        why = None if K == cfg.goal_K else f"single-draft: measured at K=1"
        if not hit:
            why = "goal cell not in the grid"
        elif frac is None:
            why = step_reason
        goals.append(_goal(f"{m} at V={cfg.goal_V}, K={K}, L={cfg.goal_L} costs <= {limit:.0%} of a target step",
                           frac, limit, why=why))
    vs_spectr = {}
    for m in ("spectr_gbv", "mdbv"):
        hit = [r for r in results if (r["V"], r["K"], r["L"], r["method"]) == (cfg.goal_V, cfg.goal_K, cfg.goal_L, m)]
        if hit and "vs_spectr" in hit[0]:
            vs_spectr[m] = hit[0]["vs_spectr"]
            print(f"  {m} / spectr at V={cfg.goal_V}, K={cfg.goal_K}, L={cfg.goal_L}: {_range_str(hit[0]['vs_spectr'])}")
    if "spectr_gbv" in vs_spectr:
        goals.append(_goal(f"paper's claim: spectr_gbv verification < 0.5x spectr's (V={cfg.goal_V}, K={cfg.goal_K},"
                           f" L={cfg.goal_L})", vs_spectr["spectr_gbv"]["median"], 0.5))
    _print_goals(goals)
    summary = {"target_step_ms": step_ms, "target_step_context": cfg.step_context, "target_step_reason": step_reason,
               "target": getattr(target, "name", None), "vs_spectr_at_goal_cell": vs_spectr}
    return _record("verifier", cfg, str(dev), "float64 (verifiers); float32 (target)", results, summary, goals,
                   wall_seconds=time.perf_counter() - t_start)


# ====================================================================================== target pass
def run_target_pass(cfg: TargetPassBench, target: Any = None, tiny: TinyPair | None = None,
                    device: Optional[str] = None, dtype: str = "float32") -> dict[str, Any]:
    """The ``target_pass`` benchmark (K drafts vs one draft on the target)."""
    t_start = time.perf_counter()
    dev = _device(device)
    if target is None:
        if PairKind(cfg.pair) == PairKind.default:
            ok, why = _default_target_available()
            if not ok:
                return _skipped("target_pass", cfg, f"default target unavailable: {why}")
        target = load_target_model(dev, cfg.pair, tiny, dtype)
    sync = _sync_for(dev)
    K, L, n0 = cfg.K, cfg.L, cfg.context
    gen = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(0, target.vocab_size, (n0 + 1,), generator=gen).tolist()
    drafts = torch.randint(0, target.vocab_size, (K, L), generator=gen)
    if cfg.shared:
        drafts[:, :cfg.shared] = drafts[:1, :cfg.shared]
    pending = prompt[-1]
    token_tree = build_tree([pending], drafts)
    single_in = torch.cat([torch.tensor([[pending]]), drafts[:1]], 1).to(dev)  # [1, L+1]
    rows_in = torch.cat([torch.full((K, 1), pending), drafts], 1).to(dev)  # [K, L+1]
    s = target.new_session()
    with torch.inference_mode():
        s.prefill(prompt[:-1])

        def single() -> Tensor:
            out = s.extend(single_in)
            s.crop(n0)
            return out

        def k_rows() -> Tensor:  # target_pass="rows": fork the cache, one batched pass, keep one row
            s.fork(K)
            out = s.extend(rows_in)
            s.keep(0)
            s.crop(n0)
            return out

        def tree() -> Tensor:  # what the engine does for K > 1: one row, keep the selected path
            out = s.extend_tree(token_tree)
            s.keep_nodes(token_tree.path(K - 1, L))  # the last draft's path: its keys and values move
            s.crop(n0)
            return out

        def fork_keep() -> None:  # the rows pass's cache bookkeeping alone (copies of the cached prefix)
            s.fork(K)
            s.keep(0)

        # the tree pass must score exactly what the K rows score
        ref, tr = k_rows(), tree()
        max_diff = float((tr[token_tree.node_of].float() - ref.float()).abs().max())
        times = interleaved({"single": single, "k_rows": k_rows, "tree": tree, "fork_keep": fork_keep}, cfg.repeats,
                            cfg.warmup, sync)
    res = {"K": K, "L": L, "context": n0, "shared": cfg.shared, "tree_nodes": token_tree.size,
           "k_rows_tokens": K * (L + 1), "single_tokens": L + 1,
           "ms": {k: spread([1e3 * t for t in v]) for k, v in times.items()},
           "k_rows_vs_single": spread(_ratios(times["k_rows"], times["single"])),
           "tree_vs_single": spread(_ratios(times["tree"], times["single"])),
           "tree_vs_k_rows": spread(_ratios(times["tree"], times["k_rows"])),
           "fork_keep_vs_single": spread(_ratios(times["fork_keep"], times["single"])),
           "tree_max_abs_logit_diff": max_diff}
    print_table(f"target verification pass, K={K}, L={L}, {n0} cached tokens, {cfg.shared} shared draft tokens"
                f" ({target.name}; {cfg.repeats} interleaved repeats)", ["pass", "tokens", "ms", "x single"],
                [["single draft", L + 1, _range_str(res["ms"]["single"]), "1"],
                 ["K full rows (target_pass=rows: fork + pass + keep)", K * (L + 1), _range_str(res["ms"]["k_rows"]),
                  _range_str(res["k_rows_vs_single"])],
                 ["token tree (target_pass=tree, the engine's default)", token_tree.size, _range_str(res["ms"]["tree"]),
                  _range_str(res["tree_vs_single"])],
                 ["(of K full rows: fork + keep of the cache alone)", 0, _range_str(res["ms"]["fork_keep"]),
                  _range_str(res["fork_keep_vs_single"])]])
    print(f"  tree vs K-row logits: max |diff| = {max_diff:.3g}", flush=True)
    goals = [_goal(f"K={K}, L={L} pass (engine, token tree) <= {cfg.goal_ratio:g}x the single-draft pass",
                   res["tree_vs_single"]["median"], cfg.goal_ratio),
             _goal(f"K={K}, L={L} pass (K full rows, target_pass=rows) <= {cfg.goal_ratio:g}x the single-draft pass",
                   res["k_rows_vs_single"]["median"], cfg.goal_ratio,
                   why="the fallback for targets whose attention takes no custom mask")]
    _print_goals(goals)
    return _record("target_pass", cfg, str(dev), str(target.dtype).removeprefix("torch."), res,
                   {"target": target.name}, goals, wall_seconds=time.perf_counter() - t_start)


# ====================================================================================== e2e
def _e2e_cells(cfg: E2EBench) -> list[tuple[str, int | None, int | None]]:
    from mdv.verify.registry import VERIFIERS

    cells: list[tuple[str, int | None, int | None]] = [("ar", None, None)]
    for m in cfg.methods:
        for K in (cfg.K if VERIFIERS[m].multi_draft else [1]):
            for L in cfg.L:
                if (m, K, L) not in cells:
                    cells.append((m, K, L))
    return cells


def rotated(cells: Sequence[Any], i: int) -> list[Any]:
    """The cells in the order of round i: rotated left by i (mod the count)."""
    s = i % len(cells)
    return list(cells[s:]) + list(cells[:s])


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
    dev = _device(device)
    if pair is None:
        ok, why = _pair_available(cfg.pair)
        if not ok:
            return _skipped("e2e", cfg, f"default pair unavailable: {why}")
        pair = load_pair(dev, cfg.pair, tiny, dtype)
    target, draft, tok = pair
    prompts, label = prompt_ids(tok, cfg.datasets, cfg.n_prompts, cfg.seed)
    cells = _e2e_cells(cfg)
    results: list[dict[str, Any]] = []
    from tqdm import tqdm

    bar = tqdm(total=len(cfg.temperatures) * len(prompts) * len(cells), desc="e2e generations", unit="gen",
               dynamic_ncols=True, file=sys.stderr)
    for T in cfg.temperatures:
        def run_cell(cell: tuple, i: int, ids: list[int], T: float = T) -> dict[str, Any]:
            m, K, L = cell
            bar.set_postfix_str(f"T={T:g} prompt {i + 1}/{len(prompts)} {m} K={K or 1} L={L or 1}", refresh=False)
            r = generate(target, draft if m != "ar" else None, ids, m, K=K or 1, L=L or 1, temperature=T,
                         max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + i, eos_token_id=[])
            bar.update()
            return r.stats

        stats = interleaved_generations(cells, prompts, run_cell)
        ar = stats[("ar", None, None)]
        for (m, K, L), st in stats.items():
            timed = st[1:]  # prompt 0 is the warm-up
            speed = _ratios([a["decode_s"] for a in ar[1:]], [s["decode_s"] for s in timed])
            speed_e2e = _ratios([a["total_s"] for a in ar[1:]], [s["total_s"] for s in timed])
            tokens = sum(s["new_tokens"] for s in st)
            calls = sum(s["target_calls"] for s in st)
            dec = sum(s["decode_s"] for s in timed)
            split = {k: (sum(s[f"{k}_s"] for s in timed) / dec if dec > 0 else float("nan"))
                     for k in ("draft", "target", "verify", "other")}
            results.append({"temperature": T, "method": m, "K": K, "L": L,
                            "tokens_per_second": spread([s["tokens_per_second"] for s in timed]),
                            "speedup": spread(speed), "speedup_mean": statistics.fmean(speed) if speed else float("nan"),
                            "speedup_e2e": spread(speed_e2e),
                            "block_efficiency": tokens / calls if calls else float("nan"),
                            "time_split": split, "n_timed_prompts": len(timed)})
    bar.close()
    rows = [[r["temperature"], r["method"], r["K"] or "-", r["L"] or "-", _range_str(r["tokens_per_second"]),
             _range_str(r["speedup"]), _fmt(r["block_efficiency"]),
             " / ".join(f"{100 * r['time_split'][k]:.0f}%" if not math.isnan(r["time_split"][k]) else "-"
                        for k in ("draft", "target", "verify", "other"))] for r in results]
    print_table(f"end to end: {target.name} + {draft.name}; {len(prompts) - 1} timed prompts (+1 warm-up) x"
                f" {cfg.max_new_tokens} new tokens from {label}; decode speedup = AR decode s / method decode s per"
                " prompt, median [min, max]", ["T", "method", "K", "L", "tokens/s", "speedup vs AR",
                                               "block eff.", "draft/target/verify/other"], rows)
    goals = []
    at = [r for r in results if r["temperature"] == cfg.goal_temperature and r["method"] != "ar"]
    if at:
        best = max(at, key=lambda r: r["speedup"]["median"] if r["speedup"]["n"] else -1.0)
        goals.append(_goal(f"best method at T={cfg.goal_temperature:g} ({best['method']} K={best['K']} L={best['L']})"
                           f" >= {cfg.goal_best:g}x AR", best["speedup"]["median"], cfg.goal_best, at_most=False))
        sd = [r for r in at if r["method"] == "sd"]
        if sd:
            b = max(sd, key=lambda r: r["speedup"]["median"] if r["speedup"]["n"] else -1.0)
            goals.append(_goal(f"sd at its best L (L={b['L']}) at T={cfg.goal_temperature:g} >= {cfg.goal_sd:g}x AR",
                               b["speedup"]["median"], cfg.goal_sd, at_most=False))
    _print_goals(goals)
    return _record("e2e", cfg, str(dev), str(target.dtype).removeprefix("torch."), results,
                   {"target": target.name, "draft": draft.name, "prompts": label, "n_prompts": len(prompts),
                    "pair_files": pair_identity(cfg.pair)},
                   goals, wall_seconds=time.perf_counter() - t_start)


# ====================================================================================== oracle
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
                [[r["method"], r["V"], r["K"], r["L"], _range_str(r["trials_per_second"])] for r in mc])
    slowest = max(rows, key=lambda r: r["seconds"]) if rows else None
    goals = []
    if slowest:
        goals.append(_goal(f"slowest exact computation ({slowest['function']} {slowest['method']} V={slowest['V']}"
                           f" K={slowest['K']} L={slowest['L']}) <= {cfg.time_limit_s:g} s", slowest["seconds"],
                           cfg.time_limit_s, unit=" s"))
    for r in mc:
        goals.append(_goal(f"{r['method']} Monte Carlo at V={r['V']}, K={r['K']}, L={r['L']} >= {cfg.mc_goal:g} trials/s",
                           r["trials_per_second"]["median"], cfg.mc_goal, at_most=False))
    _print_goals(goals)
    return _record("oracle", cfg, "cpu", "float64", {"exact": rows, "monte_carlo": mc}, {}, goals,
                   wall_seconds=time.perf_counter() - t_start)


# ====================================================================================== memory
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
    dev = _device(device)
    if pair is None:
        ok, why = _pair_available(cfg.pair)
        if not ok:
            return _skipped("memory", cfg, f"default pair unavailable: {why}")
        pair = load_pair(dev, cfg.pair, tiny, dtype)
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
                  _fmt(res["peak_rss_mib"], 5)],
                 ["RSS before the run (MiB)", _fmt(res["rss_before_mib"], 5)],
                 [f"RSS growth after prompt {w}: median of the last quarter - median of the first (MiB)",
                  _fmt(growth, 3)],
                 ["RSS slope, least squares (MiB / prompt)", _fmt(slope, 3)],
                 ["RSS after the warm-up -> at the end (MiB)",
                  f"{_fmt(res['rss_after_warmup_mib'], 5)} -> {_fmt(res['rss_end_mib'], 5)}"],
                 ["live tensors (prompt: count)", ", ".join(f"{i}: {n}" for i, n in tensors) or "-"]])
    goals = [_goal(f"no RSS growth over {len(prompts)} prompts (median RSS, last vs first quarter after the warm-up)",
                   growth, max(16.0, 0.01 * (base or 0) * mib), unit=" MiB",
                   why="limit: max(16 MiB, 1% of RSS): single readings swing with the allocator, a leak moves the median")]
    if tensor_growth is not None:
        goals.append(_goal("no growth in live tensors", float(tensor_growth), 0.0))
    _print_goals(goals)
    return _record("memory", cfg, str(dev), str(target.dtype).removeprefix("torch."), res,
                   {"target": target.name, "draft": draft.name, "pair_files": pair_identity(cfg.pair)}, goals,
                   wall_seconds=time.perf_counter() - t_start)


def run_paired_benchmark(cfg: PairedBench, threads: int, tiny: TinyPair) -> dict[str, Any]:
    """``paired``: :func:`mdv.paired.bench.run_paired_bench`, printed as a table with its goal."""
    t0 = time.perf_counter()
    res = run_paired_bench(cfg, threads=threads, tiny=tiny)
    (print_table(f"paired measurement: {res['contexts']} contexts, {res['prompts']} prompts, K_max={cfg.K_max},"
                      f" L_max={cfg.L_max}, {cfg.workers} process(es)", ["part", "seconds", "share"],
                      [[k, f"{v:.1f}", f"{res['share'][k]:.1%}"] for k, v in res["seconds"].items()]))
    print(f"  {res['contexts_per_second']:.2f} contexts/s, {res['seconds_per_context']:.2f} s per context;"
          f" trajectories: {res['trajectory_target_steps']} target steps for {res['trajectory_tokens']} tokens"
          " (the rest read from the tree passes)", flush=True)
    goal = _goal(res["goal"]["goal"], res["wall_seconds"], cfg.goal_seconds, unit=" s",
                 why="each context: a K_max-row draft of L_max steps + one tree pass of up to K_max·L_max+1 nodes;"
                     " each trajectory token off the drafts' paths: one AR target step")
    _print_goals([goal])
    return _record("paired", cfg, "cpu", "float32", res, {"contexts_per_second": res["contexts_per_second"]}, [goal],
                   wall_seconds=time.perf_counter() - t0)


# ====================================================================================== driver
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
                target = load_target_model(_device(cfg.verifier.device), PairKind.tiny_random, cfg.tiny, cfg.dtype)
            rec = run_verifier(cfg.verifier, target, dtype=cfg.dtype)
        elif name == "target_pass":
            rec = run_target_pass(cfg.target_pass, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "e2e":
            rec = run_e2e(cfg.e2e, tiny=cfg.tiny, dtype=cfg.dtype)
        elif name == "oracle":
            rec = run_oracle(cfg.oracle)
        elif name == "paired":
            rec = run_paired_benchmark(cfg.paired, threads=int(cfg.threads), tiny=cfg.tiny)
        else:
            rec = run_memory(cfg.memory, tiny=cfg.tiny, dtype=cfg.dtype)
        records[name] = rec
        path = write_json(out / f"bench_{name}.json", rec)
        print(f"  -> {path}", flush=True)
    return records


__all__ = ["Benchmark", "BenchConfig", "E2EBench", "MemoryBench", "OracleBench", "PairKind", "TargetPassBench",
           "TinyPair", "VerifierBench", "decode_step_times", "environment", "interleaved", "interleaved_generations", "rotated",
           "largest_size", "print_table", "prompt_ids", "run", "run_e2e", "run_memory", "run_oracle",
           "run_target_pass", "run_verifier", "spread", "synthetic_block", "time_call",
           "validate", "write_json"]
