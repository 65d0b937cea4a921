"""The sweep's typed Hydra schema (``run_schema``): names as enums, one dataclass per config group, and
:func:`validate`, which checks a whole :class:`RunConfig` before any work starts.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from mdv.errors import InvalidInputError
from mdv.paired.config import PairedConfig
from mdv.theory import TheoryConfig

_log = logging.getLogger(__name__)


DATA_SOURCES = ("auto", "hub", "offline", "package", "stand-in")
DTYPES = ("float32", "float64", "bfloat16", "float16")


# ----------------------------------------------------------------------------------- names (enums)
def _method_enum() -> type[Enum]:
    from mdv.verify.registry import VERIFIERS

    members = ["ar", *VERIFIERS]
    enum = Enum("Method", [(m, m) for m in members], type=str, module=__name__, qualname="Method")
    enum.__doc__ = ("Methods a sweep can run: the autoregressive baseline and every registered verifier, plug-ins"
                    " included (built from mdv.verify.registry when the schema is imported).")
    return enum


#: Methods a sweep can run: ``ar`` and every name in :data:`mdv.verify.registry.VERIFIERS`.
Method = _method_enum()


def method_names(kind: str = "all") -> list[str]:
    """The method lists of ``mdv/conf/method`` (``names: ${mdv_methods:<kind>}``), from the registry:
    ``all`` -- ``ar`` and every verifier; ``lossless`` -- ``ar`` and the verifiers whose output follows the
    target's law; ``multi_draft`` -- ``ar``, ``sd`` (the K = 1 reference) and the multi-draft verifiers."""
    from mdv.verify.registry import VERIFIERS

    keep = {"all": lambda c: True, "lossless": lambda c: c.lossless,
            "multi_draft": lambda c: c.multi_draft or c.name == "sd"}
    if kind not in keep:
        raise InvalidInputError(f"${{mdv_methods:{kind}}}: unknown method list {kind!r}; use one of {', '.join(keep)}")
    return ["ar"] + [name for name, cls in VERIFIERS.items() if keep[kind](cls)]


def drafter_names(kind: str = "all") -> list[str]:
    """``mdv/conf/drafter/all.yaml`` (``names: ${mdv_drafters:all}``): every registered drafter."""
    from mdv.drafters.registry import DRAFTERS

    if kind != "all":
        raise InvalidInputError(f"${{mdv_drafters:{kind}}}: unknown drafter list {kind!r}; use all")
    return list(DRAFTERS)


def _register_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("mdv_methods"):
        OmegaConf.register_new_resolver("mdv_methods", method_names)
    if not OmegaConf.has_resolver("mdv_drafters"):
        OmegaConf.register_new_resolver("mdv_drafters", drafter_names)


_register_resolver()


class DatasetName(str, Enum):
    """Datasets of :mod:`mdv.data` (hub loader + offline package source or an honest stand-in)."""

    gsm8k = "gsm8k"
    humaneval = "humaneval"
    mgsm = "mgsm"
    lm1b = "lm1b"
    alpaca = "alpaca"


class LinearsKind(str, Enum):
    """What runs the pair's linear layers."""

    plain = "plain"    # torch's own nn.Linear (its sgemm)
    panels = "panels"  # weight panels and mdv's kernel (mdv.models.panels): float32 on an AVX2 CPU, ~2x faster passes
    auto = "auto"      # panels where their kernel builds and runs here (float32, CPU, AVX2, a C compiler), else plain


class ForwardKind(str, Enum):
    """What runs the pair's decoder passes in the engine's sessions."""

    hf = "hf"      # transformers' own forward and DynamicCache (mdv.models.hf)
    lean = "lean"  # mdv's lean decoder forward over the same modules (mdv.models.lean): Llama-like decoders
    auto = "auto"  # lean for the pairs known to be Llama decoders (models.kind default, tiny_random), else hf


class ModelKind(str, Enum):
    """How the target/draft pair is obtained."""

    default = "default"          # embedded SmolLM2-135M-Instruct + trained draft (offline assets)
    tiny_random = "tiny_random"  # tiny random Llama pair built in code (tests, CI)
    assets = "assets"            # two GGUF assets of mdv.assets (e.g. the optional Qwen2.5-Coder pair)
    hub = "hub"                  # hub ids / local folders / .gguf paths via HFModel.from_pretrained


class LoggerKind(str, Enum):
    """Experiment tracking backend (:mod:`mdv.tracking`)."""

    none = "none"
    wandb = "wandb"


class Task(str, Enum):
    """What ``mdv run`` (``python -m experiments.run``) does: a sweep of real-model cells, the paired measurement alone
    (:mod:`mdv.paired`), or the exact theory tables."""

    sweep = "sweep"
    theory = "theory"
    paired = "paired"


@dataclass
class MethodGroup:
    """``mdv/conf/method/*``: the methods of the grid (``ar`` = the autoregressive baseline)."""

    names: list[Method] = field(default_factory=lambda: list(Method))

    def __post_init__(self) -> None:
        # `${mdv_methods:...}` (conf/method/all.yaml) resolves to plain strings: make them members too
        self.names = [n if isinstance(n, Method) else Method(n) for n in self.names]


@dataclass
class DrafterGroup:
    """``mdv/conf/drafter/*``: the drafters (:mod:`mdv.drafters`) crossed with every speculative method; AR
    cells do not depend on them.  options: per drafter name, the keyword options of its class (the
    ``model`` drafter takes none)."""

    names: list[str] = field(default_factory=lambda: ["model"])
    options: dict[str, Any] = field(default_factory=lambda: {"ngram": {"n_max": 3, "n_min": 2},
                                                             "layerskip": {"depth": 8}})


@dataclass
class DatasetGroup:
    """``mdv/conf/dataset/*``: datasets, prompts per dataset, and where the prompts come from.

    source: ``auto`` (the hub unless ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` is set, else the offline
    source: a registry package or an honestly named stand-in), ``hub``, ``offline``, ``package`` or
    ``stand-in`` (see :func:`mdv.data.load_prompts`).  loader / formatter: ``module:function`` import paths of
    ``load_prompts(name, n, source) -> PromptSet`` and ``format_prompt(prompt, tokenizer) -> list[int]``
    (a custom loader can bring its own data).
    """

    names: list[DatasetName] = field(default_factory=lambda: list(DatasetName))
    n_prompts: int = 3
    source: str = "auto"
    loader: str = "mdv.data:load_prompts"
    formatter: str = "mdv.data:format_prompt"


@dataclass
class SamplingGroup:
    """``mdv/conf/sampling/*``: one sampling transform applied identically to target and draft."""

    temperatures: list[float] = field(default_factory=lambda: [0.4])
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    max_new_tokens: int = 32


@dataclass
class SweepGroup:
    """``mdv/conf/sweep/*``: the K (drafts) x L (draft length) x seed axes of the grid."""

    K: list[int] = field(default_factory=lambda: [3])
    L: list[int] = field(default_factory=lambda: [4])
    seeds: list[int] = field(default_factory=lambda: [0])


@dataclass
class ModelsGroup:
    """``mdv/conf/models/*``: the target/draft pair.

    name: the short identity recorded as ``config.models`` in every cell (AR baselines pair with
    methods on it).  target / draft: asset names (``assets``), hub ids, local folders or .gguf paths
    (``hub``).  device: null = CUDA when available, else CPU.  The ``tiny_random`` fields build the
    tiny pair (deterministic from ``seed``).  linears: ``panels`` runs the pair's linears on weight panels
    (:mod:`mdv.models.panels`) for the whole process: the same law up to float32 rounding, faster passes.
    draft_panel_dtype: with ``linears=panels``, ``float16`` holds the draft's panels in float16 (half its bytes
    per step), ``int8`` in int8 with a scale per output column (a quarter); lossless, since q stays the exact
    law of the draft tokens; the target's stay float32.
    forward: ``lean`` runs the decoding sessions on :mod:`mdv.models.lean` (Llama-like decoders; the same law
    up to float32 rounding, less per-layer overhead), ``hf`` on transformers' forward.  ``auto`` (linears and
    forward): the fast path where it runs here, else the plain one; :func:`resolve_auto_models` picks before
    anything is labelled or loaded, so cell ids and records name what ran.
    """

    kind: ModelKind = ModelKind.default
    name: str = "default"
    target: Optional[str] = None
    draft: Optional[str] = None
    dtype: str = "float32"
    device: Optional[str] = None
    seed: int = 0
    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 2
    logit_scale: float = 30.0
    draft_noise: float = 0.3
    linears: LinearsKind = LinearsKind.plain
    draft_panel_dtype: str = "float32"
    forward: ForwardKind = ForwardKind.hf


@dataclass
class LoggerGroup:
    """``mdv/conf/logger/*``: experiment tracking (:mod:`mdv.tracking`); off unless ``logger=wandb``.

    mode: null = ``$WANDB_MODE`` if set, else ``offline`` (sync later with ``wandb sync``).
    dir: null = ``$WANDB_DIR`` if set, else the results folder.  group: null = the experiment name.
    """

    kind: LoggerKind = LoggerKind.none
    project: str = "mdv"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    mode: Optional[str] = None
    dir: Optional[str] = None


@dataclass
class RunConfig:
    """The whole config of ``mdv run`` (Hydra schema ``run_schema``, ``mdv/conf/config.yaml``).

    name: the experiment name; results_dir defaults to ``outputs/<name>`` so a rerun resumes.
    threads: ``torch.set_num_threads`` (null: torch's default).  progress: tqdm bars.
    theory: the grid of ``experiment=theory`` (:class:`mdv.theory.TheoryConfig`).
    paired: the paired measurement (:class:`mdv.paired.config.PairedConfig`): ``task=paired``, or after the
    sweep's cells with ``paired.enabled=true``.
    """

    name: str = "smoke"
    task: Task = Task.sweep
    results_dir: str = "outputs/${name}"
    threads: Optional[int] = None
    progress: bool = True
    method: MethodGroup = field(default_factory=MethodGroup)
    drafter: DrafterGroup = field(default_factory=DrafterGroup)
    models: ModelsGroup = field(default_factory=ModelsGroup)
    dataset: DatasetGroup = field(default_factory=DatasetGroup)
    sampling: SamplingGroup = field(default_factory=SamplingGroup)
    sweep: SweepGroup = field(default_factory=SweepGroup)
    logger: LoggerGroup = field(default_factory=LoggerGroup)
    theory: TheoryConfig = field(default_factory=TheoryConfig)
    paired: PairedConfig = field(default_factory=PairedConfig)


def enum_value(x: Any) -> Any:
    """An enum member's value (configs hold members or plain strings; both compare as the string)."""
    return x.value if isinstance(x, Enum) else x


# ----------------------------------------------------------------------------------- validation
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: the draft's panel dtypes (models.draft_panel_dtype, e2e.draft_panel_dtype): float32, float16 (half the
#: bytes), int8 (a quarter, one scale per output column; mdv.models.panels.pack_panels)
DRAFT_PANEL_DTYPES = ("float32", "float16", "int8")
#: what each adds to the pair's label (models_label): a sweep never pairs cells run on other draft code
_DRAFT_PANEL_LABELS = {"float32": "", "float16": "+draft_f16", "int8": "+draft_i8"}
_LLAMA_KINDS = ("default", "tiny_random")  # pairs whose target and draft are LlamaForCausalLM by construction


def resolve_auto_models(m: ModelsGroup) -> list[str]:
    """Replace ``models.linears=auto`` / ``models.forward=auto`` in ``m`` by what runs on this machine; return
    one line per choice (for the log).

    linears: ``panels`` when the pair is float32 on the CPU and the panel kernel builds and loads here (it
    is compiled now, once per machine: ~0.3 s), else ``plain``; a ``draft_panel_dtype`` of float16 or int8 asked for
    alongside falls back to float32 with it.  forward: ``lean`` for the default and the tiny pair (Llama
    decoders by construction), ``hf`` for a pair of your own (``models.forward=lean`` runs any Llama pair;
    the lean forward refuses other decoders with one clear error).  Settings other than ``auto`` are kept.
    """
    notes: list[str] = []
    if LinearsKind(enum_value(m.linears)) == LinearsKind.auto:
        why = ""
        if m.dtype != "float32" or (m.device or "cpu") != "cpu":
            why = f"dtype={m.dtype}, device={m.device}: panels run float32 on the CPU"
        else:
            from mdv.models.panels import load_kernel_library

            try:
                load_kernel_library()
            except InvalidInputError as exc:
                why = str(exc)
        m.linears = LinearsKind.plain if why else LinearsKind.panels
        notes.append("models.linears=auto: " + (f"plain ({why})" if why else "panels (the panel kernel runs here)"))
        if why and m.draft_panel_dtype != "float32":
            m.draft_panel_dtype = "float32"
            notes.append("models.draft_panel_dtype: float32 (no panels)")
    if ForwardKind(enum_value(m.forward)) == ForwardKind.auto:
        kind = str(enum_value(m.kind))
        m.forward = ForwardKind.lean if kind in _LLAMA_KINDS else ForwardKind.hf
        notes.append(f"models.forward=auto: {enum_value(m.forward)} (models.kind={kind}"
                     + ("" if kind in _LLAMA_KINDS else "; models.forward=lean runs a Llama pair of your own") + ")")
    return notes


def validate(cfg: RunConfig) -> None:
    """Check the grid values; raise :class:`~mdv.errors.InvalidInputError` naming the config key.  First
    resolves ``models.linears`` / ``models.forward`` = ``auto`` in place (:func:`resolve_auto_models`), the
    one step the sweep and the paired measurement (with its calibration and speed check) pass before they label
    or load the pair."""
    from mdv.engine import valid_methods

    for note in resolve_auto_models(cfg.models):
        _log.info(note)

    methods = [enum_value(m) for m in cfg.method.names]
    valid = valid_methods()
    if not methods:
        raise InvalidInputError("method.names is empty; choose e.g. method=all or method=sd")
    bad = [m for m in methods if m not in valid]
    if bad:
        raise InvalidInputError(f"unknown method(s) {bad}; valid methods are: {', '.join(valid)}")
    if not cfg.dataset.names:
        raise InvalidInputError("dataset.names is empty; choose e.g. dataset=all or dataset=humaneval")
    from mdv.drafters.registry import get_drafter

    if not cfg.drafter.names:
        raise InvalidInputError("drafter.names is empty; choose e.g. drafter=model or drafter=all")
    for name in cfg.drafter.names:  # names and options checked before any model is loaded
        get_drafter(name, **drafter_options(cfg, name))
    for key, values in (("sweep.K", cfg.sweep.K), ("sweep.L", cfg.sweep.L)):
        if not values or any(not _is_int(v) or v < 1 for v in values):
            raise InvalidInputError(f"{key} must be a non-empty list of integers >= 1; got {list(values)}"
                                    f" (e.g. {key}=[1,2,3])")
    if not cfg.sweep.seeds or any(not _is_int(s) for s in cfg.sweep.seeds):
        raise InvalidInputError(f"sweep.seeds must be a non-empty list of integers; got {list(cfg.sweep.seeds)}")
    temps = cfg.sampling.temperatures
    if not temps or any(not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0
                        for t in temps):
        raise InvalidInputError(f"sampling.temperatures must be a non-empty list of finite numbers >= 0"
                                f" (0 = greedy); got {list(temps)}")
    top_p = cfg.sampling.top_p
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise InvalidInputError(f"sampling.top_p must lie in (0, 1] (null = off); got {top_p}")
    top_k = cfg.sampling.top_k
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise InvalidInputError(f"sampling.top_k must be null or an integer >= 0 (0 = off); got {top_k}")
    if not _is_int(cfg.sampling.max_new_tokens) or cfg.sampling.max_new_tokens < 1:
        raise InvalidInputError(f"sampling.max_new_tokens must be an integer >= 1; got {cfg.sampling.max_new_tokens}")
    if not _is_int(cfg.dataset.n_prompts) or cfg.dataset.n_prompts < 1:
        raise InvalidInputError(f"dataset.n_prompts must be an integer >= 1; got {cfg.dataset.n_prompts}")
    if cfg.dataset.source not in DATA_SOURCES:
        raise InvalidInputError(f"dataset.source must be one of {', '.join(DATA_SOURCES)}; got {cfg.dataset.source!r}")
    if cfg.models.dtype not in DTYPES:
        raise InvalidInputError(f"models.dtype must be one of {', '.join(DTYPES)}; got {cfg.models.dtype!r}")
    if LinearsKind(enum_value(cfg.models.linears)) == LinearsKind.panels:
        if cfg.models.dtype != "float32" or (cfg.models.device or "cpu") != "cpu":
            raise InvalidInputError(f"models.linears=panels runs float32 models on the CPU; got dtype={cfg.models.dtype},"
                                    f" device={cfg.models.device}: set models.dtype=float32 models.device=cpu, or"
                                    " models.linears=plain")
        from mdv.models.panels import panel_kernel_status

        ok, why = panel_kernel_status()
        if not ok:
            raise InvalidInputError(f"models.linears=panels: {why} (models.linears=plain)")
    dpd = cfg.models.draft_panel_dtype
    if dpd not in DRAFT_PANEL_DTYPES:
        raise InvalidInputError(f"models.draft_panel_dtype must be one of {', '.join(DRAFT_PANEL_DTYPES)}; got {dpd!r}")
    if dpd != "float32" and LinearsKind(enum_value(cfg.models.linears)) != LinearsKind.panels:
        raise InvalidInputError(f"models.draft_panel_dtype={dpd} holds the draft's panels in {dpd}: set models.linears=panels")
    if cfg.threads is not None and (not _is_int(cfg.threads) or cfg.threads < 1):
        raise InvalidInputError(f"threads must be null or an integer >= 1; got {cfg.threads}")
    kind = ModelKind(enum_value(cfg.models.kind))
    if kind in (ModelKind.assets, ModelKind.hub) and (not cfg.models.target or not cfg.models.draft):
        raise InvalidInputError(f"models.kind={kind.value} needs models.target and models.draft"
                                f" (got target={cfg.models.target!r}, draft={cfg.models.draft!r})")


def models_label(m: ModelsGroup) -> str:
    """The pair's identity in cell ids and records: ``models.name``, with ``+panels`` when the pair's linears
    run on weight panels and ``+lean`` when its passes run on the lean forward (so a resumed sweep never pairs
    an AR cell's time with a cell's on other code)."""
    label = str(m.name)
    if LinearsKind(enum_value(m.linears)) == LinearsKind.panels:
        label += "+panels" + _DRAFT_PANEL_LABELS[getattr(m, "draft_panel_dtype", "float32")]
    if ForwardKind(enum_value(getattr(m, "forward", ForwardKind.hf))) == ForwardKind.lean:
        label += "+lean"
    return label


def drafter_options(cfg: RunConfig, name: str) -> dict[str, Any]:
    """The options of drafter ``name`` in ``cfg`` (``drafter.options.<name>``; none for ``model``)."""
    return dict(cfg.drafter.options.get(name) or {}) if name != "model" else {}


def to_run_config(cfg: Any) -> RunConfig:
    """A composed Hydra/OmegaConf config -> :class:`RunConfig` (already a RunConfig: returned as is)."""
    if isinstance(cfg, RunConfig):
        return cfg
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, RunConfig):
        raise InvalidInputError(f"expected a config with the run_schema; got {type(obj).__name__}")
    return obj
