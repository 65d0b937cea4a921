"""The benchmarks' typed schema (``mdv/conf/bench.yaml``): one dataclass per benchmark, :class:`BenchConfig`, and
:func:`validate`, which checks a whole config before any benchmark runs.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from mdv.errors import InvalidInputError, UnknownNameError, unknown_name


MODEL_DTYPES = ("float32", "bfloat16", "float16", "float64")
ALL_METHODS = ["sd", "bv", "gbv", "spectr", "spectr_gbv", "mdbv"]
#: The target code an e2e cell can run on (mdv.bench.e2e): torch's linears and transformers' forward ("plain"),
#: MKL packs, weight panels, the lean forward, the lean forward on the panels.
E2E_VARIANTS = ("plain", "packed", "panels", "lean", "lean+panels")


class Benchmark(str, enum.Enum):
    """The benchmarks ``experiments/bench`` can run (``benchmarks: [...]``)."""

    verifier = "verifier"
    target_pass = "target_pass"
    pass_limit = "pass_limit"
    draft_step = "draft_step"
    e2e = "e2e"
    oracle = "oracle"
    memory = "memory"
    paired = "paired"
    audit = "audit"
    hf_compare = "hf_compare"


class BlockSource(str, enum.Enum):
    """Where the ``verifier`` benchmark's blocks come from: ``synthetic`` (:func:`mdv.bench.synthetic.synthetic_block`,
    one per V, K, L) or ``real`` (drafted by a model pair's draft at dataset prompts and scored by its target)."""

    synthetic = "synthetic"
    real = "real"


class PairKind(str, enum.Enum):
    """``default``: SmolLM2-135M-Instruct + the shipped draft (:mod:`mdv.models.default_pair`);
    ``tiny_random``: a tiny random Llama pair built in code (tests, smoke runs; its numbers mean nothing)."""

    default = "default"
    tiny_random = "tiny_random"


@dataclass
class VerifierBench:
    """``verifier``: V x K x L grid of synthetic blocks, or K x L on real blocks of a model pair
    (``blocks=real``); single-draft methods run at K = 1 only."""

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
    #: ``real``: time every cell on blocks that ``step_pair``'s draft proposes (K_max drafts of L_max tokens, the
    #: first K and L of them per cell) at ``real_contexts`` prompts of ``real_datasets`` and its target scores in
    #: one tree pass at ``temperature`` (the paired measurement's draw); V is the pair's vocabulary, so
    #: ``vocab_sizes``, ``logit_scale`` and ``target_noise`` are not used.
    blocks: BlockSource = BlockSource.synthetic
    real_contexts: int = 8
    real_datasets: list[str] = field(default_factory=lambda: ["gsm8k", "humaneval", "mgsm", "lm1b", "alpaca"])
    temperature: float = 0.4


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
    """``e2e``: AR and every (method, K, L, drafter) on the pair, per temperature, interleaved per prompt.

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
    #: drafters (mdv.drafters) crossed with every (method, K, L); their options by name.
    drafters: list[str] = field(default_factory=lambda: ["model"])
    drafter_options: dict[str, Any] = field(default_factory=lambda: {"ngram": {"n_max": 3},
                                                                     "layerskip": {"depth": 8}})
    seed: int = 0
    #: also run every cell (AR included) with the target's linears on MKL packs (mdv.models.packed), side by side;
    #: a cell's largest pass is packed for the smallest rung at or above it (MKL's packed sgemm measured slow at
    #: 3 and 5-7 rows, fast at 4 and from 8 up: pass_limit packed=true); the last pack_cache sizes are kept
    packed: bool = False
    pack_rungs: list[int] = field(default_factory=lambda: [1, 4, 8])
    pack_cache: int = 2
    #: also run every cell (AR included) with the target's linears on 16-column weight panels (mdv.models.panels)
    panels: bool = False
    #: also run every cell (AR included) with target and draft on mdv's lean decoder forward (mdv.models.lean),
    #: on the panels when panels is true
    lean: bool = False
    #: the draft model's panel weights on the panel cells: float32, float16 (half the bytes per draft step;
    #: the shipped draft's layers are float16 values, its head rows are rounded) or int8 (a quarter, one scale
    #: per output column); the target stays float32
    draft_panel_dtype: str = "float32"
    #: the code every cell runs on, exactly these, in this order (E2E_VARIANTS), each against AR on the same code;
    #: [] = "plain" plus what packed / panels / lean ask for.  E.g. [lean+panels]: mdv's fast path alone, a third
    #: of the time of plain + panels + lean+panels (no "x / plain speed" columns without "plain")
    variants: list[str] = field(default_factory=list)
    #: goals at goal_temperature: the best setting >= goal_best x AR, sd at its best L >= goal_sd x AR.
    goal_temperature: float = 0.4
    goal_best: float = 2.0
    goal_sd: float = 1.6  # issue 21 (an earlier issue asked 1.5)


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


#: pass_limit.lean_compare's entries and what each changes in the lean pass on panels (PassLimitBench)
LEAN_COMPARISONS = {"avx2_kernel": "the AVX2 panel kernel", "small_pages": "its panels on 4 KiB pages",
                    "per_query_attention": "the per-query attention"}


@dataclass
class PassLimitBench:
    """``pass_limit``: the target's cached pass over n new tokens against max(weight bytes / read bandwidth,
    n x FLOPs per token / GEMM peak), bandwidth and peak measured in the same run, per thread count."""

    pair: PairKind = PairKind.default
    n: list[int] = field(default_factory=lambda: [1, 5, 9, 17, 33])
    threads: list[int] = field(default_factory=lambda: [1, 2])
    context: int = 128
    repeats: int = 5
    warmup: int = 1
    #: the read-bandwidth buffer (far above the caches) and the side of the square GEMM that gives the peak
    bandwidth_megabytes: int = 512
    gemm_size: int = 2048
    #: also time every n with the linears on MKL packs (mdv.models.packed), side by side; n is packed for the
    #: smallest of pack_rungs at or above it (padded), or for n itself above them
    packed: bool = False
    pack_rungs: list[int] = field(default_factory=lambda: [1, 4, 8])
    #: also time every n with the linears on 16-column weight panels (mdv.models.panels), side by side
    panels: bool = False
    #: also time every n on mdv's lean decoder forward (mdv.models.lean), on the panels when panels is true
    lean: bool = False
    #: also time the lean pass with one thing changed, interleaved with it, for each entry (needs panels and lean):
    #: "avx2_kernel" (the AVX2 panel kernel instead of the default, AVX-512 where the CPU has it;
    #: mdv.models.panels.panel_isa) or "small_pages" (a second pack of the panels on 4 KiB pages instead of huge
    #: pages; mdv.models.hugepages): each gives the ratio lean / lean with that change in the same run
    lean_compare: list[str] = field(default_factory=list)
    seed: int = 0
    #: goals: every pass within goal_ratio x its limit; the cached pass's p equal to a full pass within goal_prob_diff
    goal_ratio: float = 1.5
    goal_prob_diff: float = 1e-6


@dataclass
class DraftStepBench:
    """``draft_step``: one drafting iteration (K blocks of L cached steps, :func:`mdv.drafters.model.draft_blocks`)
    of the pair's draft on the lean forward, its panels in each of ``dtypes``, side by side, against
    L x panel bytes / read bandwidth; and how far each dtype's rounding moves the draft's law
    (:mod:`mdv.bench.draft_step`)."""

    pair: PairKind = PairKind.default
    dtypes: list[str] = field(default_factory=lambda: ["float32", "float16", "int8"])
    K: list[int] = field(default_factory=lambda: [1, 3])
    L: int = 4
    context: int = 128
    temperature: float = 0.4
    repeats: int = 9
    warmup: int = 1
    #: positions of one context at which each dtype's next-token law is compared with float32 panels' (T = 1)
    law_positions: int = 32
    bandwidth_megabytes: int = 512
    seed: int = 0


#: the contenders of ``hf_compare`` (mdv.bench.hf_compare)
HF_COMPARE_CONTENDERS = ("hf_plain", "hf_assistant", "hf_prompt_lookup", "hf_early_exit", "mdv_ar", "mdv_sd_model",
                         "mdv_sd_ngram", "mdv_sd_layerskip")


@dataclass
class HFCompareBench:
    """``hf_compare``: mdv against Hugging Face ``generate`` with the same target, draft, prompts and L
    (plain sampling, assisted generation, prompt lookup, early exit; mdv: ar and sd with the matching drafter),
    interleaved per prompt; the first prompt is a warm-up."""

    pair: PairKind = PairKind.default
    datasets: list[str] = field(default_factory=lambda: ["gsm8k", "humaneval"])
    n_prompts: int = 11
    max_new_tokens: int = 64
    temperature: float = 0.4
    L: int = 4
    #: prompt lookup's longest n-gram (HF max_matching_ngram_size; mdv ngram n_max) and the early-exit layer
    ngram_size: int = 2
    #: mdv ngram's shortest n-gram (HF's lookup always goes down to 1): a context whose suffix matches no
    #: earlier n-gram this long proposes nothing (on_miss="skip": one AR step, as HF on a miss)
    ngram_min: int = 2
    early_exit_depth: int = 8
    contenders: list[str] = field(default_factory=lambda: list(HF_COMPARE_CONTENDERS))
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
class PairedBench:
    """``paired``: one fresh paired run (nothing resumed) on the pair, timed."""

    pair: str = "default"  # default | tiny_random
    datasets: list[str] = field(default_factory=lambda: ["gsm8k", "humaneval", "mgsm", "lm1b", "alpaca"])
    n_prompts: int = 10
    n_tokens: int = 64
    stride: int = 4
    K_max: int = 4
    L_max: int = 8
    temperature: float = 0.4
    workers: int = 1
    #: the six verifiers the <= 6 min goal was set with (mpbv, added later, costs ~0.3 s more per context)
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    goal_seconds: float = 360.0


@dataclass
class AuditBench:
    """``audit``: sampler throughput per default-grid case, the harness's own rate, and the time the whole
    default audit takes to find a rule biased by TV ``epsilon`` on one case (``detection_rules[i]`` perturbed
    on ``detection_cases[i]``)."""

    cases: str = "default"
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    instances: int = 65536
    repeats: int = 3
    detection_rules: list[str] = field(default_factory=lambda: ["sd", "spectr"])
    detection_cases: list[str] = field(default_factory=lambda: ["iid-V2-K1-L3", "rand-V3-K4-L2"])
    epsilon: float = 0.005
    seed: int = 0
    goal_rate: float = 1e6
    goal_seconds: float = 600.0


@dataclass
class TinyPair:
    """The ``tiny_random`` pair (see :func:`mdv.models.tiny_random.build_tiny_random_pair`)."""

    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 2
    seed: int = 0


@dataclass
class BenchConfig:
    """Schema of ``mdv/conf/bench.yaml``."""

    #: every benchmark but ``paired`` (a full paired run, ~10-20 min on 2 cores), ``audit`` (~15 min) and
    #: ``hf_compare`` (~15 min): ``benchmarks=[paired]`` / ``[audit]`` / ``[hf_compare]`` runs them
    benchmarks: list[Benchmark] = field(
        default_factory=lambda: [b for b in Benchmark
                                 if b not in (Benchmark.paired, Benchmark.audit, Benchmark.hf_compare)])
    #: torch intra-op threads (the machine's cores by default in mdv/conf/bench.yaml).
    threads: int = 2
    #: weights dtype of the models (float32, bfloat16, float16, float64); verification is float64 always.
    dtype: str = "float32"
    verifier: VerifierBench = field(default_factory=VerifierBench)
    target_pass: TargetPassBench = field(default_factory=TargetPassBench)
    e2e: E2EBench = field(default_factory=E2EBench)
    oracle: OracleBench = field(default_factory=OracleBench)
    memory: MemoryBench = field(default_factory=MemoryBench)
    paired: PairedBench = field(default_factory=PairedBench)
    audit: AuditBench = field(default_factory=AuditBench)
    pass_limit: PassLimitBench = field(default_factory=PassLimitBench)
    draft_step: DraftStepBench = field(default_factory=DraftStepBench)
    hf_compare: HFCompareBench = field(default_factory=HFCompareBench)
    tiny: TinyPair = field(default_factory=TinyPair)


def check_draft_step(cfg: DraftStepBench) -> None:
    """One clear error for a ``draft_step`` setting the benchmark cannot run."""
    from mdv.sweep.config import DRAFT_PANEL_DTYPES

    if not cfg.dtypes or any(d not in DRAFT_PANEL_DTYPES for d in cfg.dtypes) or len(set(cfg.dtypes)) != len(cfg.dtypes):
        raise InvalidInputError(f"draft_step.dtypes must be distinct entries of {', '.join(DRAFT_PANEL_DTYPES)}; got {list(cfg.dtypes)}")
    if not cfg.K or any(int(k) < 1 for k in cfg.K):
        raise InvalidInputError(f"draft_step.K must list integers >= 1; got {list(cfg.K)}")
    if cfg.L < 1 or cfg.context < 1 or cfg.repeats < 1 or cfg.law_positions < 1:
        raise InvalidInputError("draft_step.L, context, repeats and law_positions must be >= 1; got"
                                f" L={cfg.L}, context={cfg.context}, repeats={cfg.repeats}, law_positions={cfg.law_positions}")


def e2e_variants(e2e: E2EBench) -> list[str]:
    """The code e2e's cells run on, in run order: ``e2e.variants``, else "plain", then "packed" (``packed``),
    "panels" (``panels``), then "lean+panels" or "lean" (``lean``, on the panels when ``panels``)."""
    if e2e.variants:
        return list(e2e.variants)
    return (["plain"] + (["packed"] if e2e.packed else []) + (["panels"] if e2e.panels else [])
            + ([("lean+panels" if e2e.panels else "lean")] if e2e.lean else []))


def e2e_needs(e2e: E2EBench, what: str) -> bool:
    """Whether some e2e cell runs on ``what``: "packed" (MKL packs), "panels" (weight panels) or "lean" (the
    lean forward), or "plain"."""
    if what == "panels":
        return any(v.endswith("panels") for v in e2e_variants(e2e))
    if what == "lean":
        return any(v.startswith("lean") for v in e2e_variants(e2e))
    return what in e2e_variants(e2e)


def check_e2e_variants(e2e: E2EBench) -> None:
    """One clear error for an unknown or repeated ``e2e.variants`` entry, or a flag (packed / panels / lean) that
    no listed variant uses (the list names the cells' code exactly, so the flag would silently do nothing)."""
    for v in e2e.variants:
        if v not in E2E_VARIANTS:
            raise UnknownNameError(f"e2e.variants: {unknown_name('variant', v, list(E2E_VARIANTS))}")
        if list(e2e.variants).count(v) > 1:
            raise InvalidInputError(f"e2e.variants lists {v!r} twice; got {list(e2e.variants)}")
    if e2e.variants:
        unused = [f"e2e.{flag}=true" for flag in ("packed", "panels", "lean")
                  if getattr(e2e, flag) and not e2e_needs(e2e, flag)]
        if unused:
            raise InvalidInputError(f"e2e.variants={list(e2e.variants)} names the cells' code exactly, and none of it"
                                    f" uses {', '.join(unused)}: add its variant or drop the flag")


def validate(cfg: BenchConfig) -> None:
    """Raise :class:`InvalidInputError` / ``UnknownNameError`` (one line) for values the schema's types
    cannot rule out."""
    from mdv.verify.registry import VERIFIERS

    for where, methods in (("verifier.methods", cfg.verifier.methods), ("e2e.methods", cfg.e2e.methods),
                           ("oracle.methods", cfg.oracle.methods), ("memory.method", [cfg.memory.method]),
                           ("audit.methods", cfg.audit.methods), ("paired.methods", cfg.paired.methods), ("audit.detection_rules", cfg.audit.detection_rules)):
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
                            ("verifier.real_contexts", cfg.verifier.real_contexts, 1),
                            ("target_pass.K", cfg.target_pass.K, 1), ("target_pass.L", cfg.target_pass.L, 1),
                            ("target_pass.context", cfg.target_pass.context, 2), ("target_pass.repeats", cfg.target_pass.repeats, 1),
                            ("e2e.n_prompts", cfg.e2e.n_prompts, 2), ("e2e.max_new_tokens", cfg.e2e.max_new_tokens, 1),
                            ("oracle.mc_trials", cfg.oracle.mc_trials, 1), ("oracle.mc_repeats", cfg.oracle.mc_repeats, 1),
                            ("memory.n_prompts", cfg.memory.n_prompts, 2), ("memory.K", cfg.memory.K, 1),
                            ("memory.L", cfg.memory.L, 1), ("memory.max_new_tokens", cfg.memory.max_new_tokens, 1)):
        if int(value) < lo:
            raise InvalidInputError(f"{name} must be >= {lo}; got {value}")
    if len(cfg.audit.detection_rules) != len(cfg.audit.detection_cases):
        raise InvalidInputError(f"audit.detection_rules and audit.detection_cases pair up and must have one length; got"
                                f" {len(cfg.audit.detection_rules)} and {len(cfg.audit.detection_cases)}")
    if cfg.audit.instances < 1 or cfg.audit.repeats < 1 or not 0 < cfg.audit.epsilon < 1:
        raise InvalidInputError("audit.instances and audit.repeats must be >= 1 and audit.epsilon in (0, 1); got"
                                f" {cfg.audit.instances}, {cfg.audit.repeats}, {cfg.audit.epsilon}")
    if not 0 <= cfg.target_pass.shared <= cfg.target_pass.L:
        raise InvalidInputError(f"target_pass.shared must lie in [0, L={cfg.target_pass.L}]; got {cfg.target_pass.shared}")
    if cfg.memory.warmup_prompts >= cfg.memory.n_prompts:
        raise InvalidInputError(f"memory.warmup_prompts ({cfg.memory.warmup_prompts}) must be below memory.n_prompts"
                                f" ({cfg.memory.n_prompts})")
    if any(t < 0 for t in cfg.e2e.temperatures) or not cfg.e2e.temperatures:
        raise InvalidInputError(f"e2e.temperatures must be a non-empty list of numbers >= 0; got {cfg.e2e.temperatures}")
    from mdv.drafters.registry import DRAFTERS, get_drafter

    if not cfg.e2e.drafters:
        raise InvalidInputError("e2e.drafters is empty; choose e.g. e2e.drafters=[model,ngram]")
    for name in cfg.e2e.drafters:  # names and options are checked here, before any model is loaded
        if name not in DRAFTERS:
            raise UnknownNameError(f"e2e.drafters: {unknown_name('drafter', name, list(DRAFTERS))}")
        get_drafter(name, **dict(cfg.e2e.drafter_options.get(name) or {}))
    e2e = cfg.e2e
    check_e2e_variants(e2e)
    from mdv.models.packed import check_pack_sizes, mkl_packing_available

    if cfg.pass_limit.packed:
        check_pack_sizes(list(cfg.pass_limit.pack_rungs))
    if e2e_needs(e2e, "packed"):
        check_pack_sizes(list(e2e.pack_rungs))
        if e2e.pack_cache < 1:
            raise InvalidInputError(f"e2e.pack_cache must be >= 1 (how many pack sizes stay built); got {e2e.pack_cache}")
    if (e2e_needs(e2e, "packed") or cfg.pass_limit.packed) and not mkl_packing_available():
        raise InvalidInputError("e2e.packed / pass_limit.packed need a torch build with MKL (torch.backends.mkl is not"
                                " available here); set them to false")
    draft_step = Benchmark.draft_step in [Benchmark(b) for b in cfg.benchmarks]
    e2e_panels = e2e_needs(e2e, "panels")
    if e2e_panels or cfg.pass_limit.panels or draft_step:
        from mdv.models.panels import panel_kernel_status

        ok, why = panel_kernel_status()
        if not ok and (e2e_panels or cfg.pass_limit.panels):
            raise InvalidInputError(f"e2e.panels / pass_limit.panels: {why} (set them to false)")
        if not ok:
            raise InvalidInputError(f"draft_step times the draft on weight panels: {why} (leave draft_step out of benchmarks)")
    check_draft_step(cfg.draft_step)
    pl = cfg.pass_limit
    if not pl.n or any(n < 1 for n in pl.n) or not pl.threads or any(t < 1 for t in pl.threads):
        raise InvalidInputError(f"pass_limit.n and pass_limit.threads must be non-empty lists of integers >= 1; got"
                                f" n={list(pl.n)}, threads={list(pl.threads)}")
    if pl.repeats < 1 or pl.bandwidth_megabytes < 1 or pl.gemm_size < 1:
        raise InvalidInputError("pass_limit.repeats, bandwidth_megabytes and gemm_size must be >= 1")
    compare = list(pl.lean_compare)
    if any(c not in LEAN_COMPARISONS for c in compare) or len(set(compare)) != len(compare):
        raise InvalidInputError(f"pass_limit.lean_compare must be distinct entries of {', '.join(LEAN_COMPARISONS)};"
                                f" got {compare}")
    if compare and not (pl.panels and pl.lean):
        raise InvalidInputError("pass_limit.lean_compare times variants of the lean pass on panels: it needs"
                                f" pass_limit.panels=true and pass_limit.lean=true (got panels={pl.panels}, lean={pl.lean})")
    hc = cfg.hf_compare
    for name in hc.contenders:
        if name not in HF_COMPARE_CONTENDERS:
            raise UnknownNameError(f"hf_compare.contenders: {unknown_name('contender', name, list(HF_COMPARE_CONTENDERS))}")
    if hc.n_prompts < 2 or hc.max_new_tokens < 1 or hc.L < 1 or hc.ngram_size < 1 or hc.early_exit_depth < 1:
        raise InvalidInputError("hf_compare: n_prompts must be >= 2 (the first warms up); max_new_tokens, L, ngram_size"
                                " and early_exit_depth >= 1")
    if not 1 <= hc.ngram_min <= hc.ngram_size:
        raise InvalidInputError(f"hf_compare: ngram_min={hc.ngram_min} must be in [1, ngram_size={hc.ngram_size}]")
    for k in cfg.oracle.lp_kinds:
        if k not in ("valid", "greedy"):
            raise UnknownNameError(f"oracle.lp_kinds: {unknown_name('LP kind', k, ['valid', 'greedy'])}")
    from mdv.data import DATASETS

    if not cfg.verifier.temperature >= 0:
        raise InvalidInputError(f"verifier.temperature must be a number >= 0; got {cfg.verifier.temperature}")
    for where, names in (("e2e.datasets", cfg.e2e.datasets), ("memory.datasets", cfg.memory.datasets),
                         ("verifier.real_datasets", cfg.verifier.real_datasets)):
        for name in names:  # a typo must not silently fall back to the fixed prompt list
            if name not in DATASETS:
                raise UnknownNameError(f"{where}: {unknown_name('dataset', name, list(DATASETS))}")
