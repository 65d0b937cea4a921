"""The experiment runner: expand a grid into cells, run each cell once, write one result file per cell.

A **cell** is one (dataset, method, K, L, temperature, top-k, top-p, max_new_tokens, seed, n_prompts,
models) combination.  :func:`expand_grid` turns a :class:`RunConfig` (lists of methods, datasets, K, L,
temperatures, seeds) into cells:

* ``method="ar"`` (the autoregressive baseline) does not depend on K or L: one AR cell per
  (dataset, temperature, seed), with ``K = L = None``;
* single-draft verifiers (``sd``, ``bv``, ``gbv``) run at K = 1 whatever ``sweep.K`` says, so the K axis
  collapses to one cell for them (e.g. ``paper_table``'s K = 3 means K = 3 for multi-draft methods);
* cells are ordered dataset -> temperature -> seed -> method -> K -> L, so a method's cell runs next to
  its AR baseline on the same machine state (speedup is measured "in the same run").

:func:`run_sweep` runs the cells.  For each one it

1. **skips** the cell when ``<results_dir>/cells/<cell_id>.json`` exists with ``"status": "ok"``
   (resume: a finished cell is never recomputed or overwritten; a failed, missing or unreadable one
   is run again; temp files left by an interrupted write are ignored);
2. otherwise calls :func:`mdv.engine.generate` on each prompt of the dataset (the first prompt is a
   timing warm-up: analysis excludes it from speedups, not from block efficiency) and
3. writes the cell file **atomically** (temp file in the same folder + fsync + ``os.replace``), in the
   result-file contract ``mdv.cell/1`` (see :func:`cell_record`).

Any exception inside a cell is recorded in its file (``"status": "failed"``, ``"error"``) and the sweep
goes on.  Everything that can be checked before the first cell runs is: the grid values
(:func:`validate`), that the results folder is writable, that every dataset of a pending cell loads,
and that the models exist -- each failure is one :class:`~mdv.errors.MdvError` with a fix.  Models are
loaded once per process (:func:`load_models` caches them) and only when some cell is pending.

Model sets (``models.kind``): ``default`` (the embedded SmolLM2-135M-Instruct target + mdv's trained
draft, :mod:`mdv.models.default_pair`), ``tiny_random`` (a tiny random Llama pair built here, for tests
and CI, with :class:`TinyTokenizer`), ``assets`` (a GGUF pair from :mod:`mdv.assets`, e.g. the optional
Qwen2.5-Coder 1.5B/0.5B) and ``hub`` (hub ids or local folders, for users with the hub).

>>> from mdv.sweep import RunConfig, expand_grid
>>> cfg = RunConfig()
>>> cfg.method.names = ["ar", "sd"]; cfg.dataset.names = ["humaneval"]
>>> [c.cell_id.rsplit("__", 1)[0] for c in expand_grid(cfg)]
['humaneval__ar__T0.4__s0', 'humaneval__sd__K1_L4_T0.4__s0']
"""
from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import hashlib
import importlib
import json
import logging
import math
import os
import platform
import string
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from mdv.errors import InvalidInputError, MdvError, MissingAssetError
from mdv.theory import TheoryConfig

log = logging.getLogger(__name__)

SCHEMA = "mdv.cell/1"
WARMUP_PROMPTS = 1
DATA_SOURCES = ("auto", "hub", "offline", "package", "stand-in")
DTYPES = ("float32", "float64", "bfloat16", "float16")


# ----------------------------------------------------------------------------------- names (enums)
class Method(str, Enum):
    """Methods a sweep can run: the autoregressive baseline and every registered verifier."""

    ar = "ar"
    sd = "sd"
    spectr = "spectr"
    bv = "bv"
    gbv = "gbv"
    spectr_gbv = "spectr_gbv"
    mdbv = "mdbv"


class DatasetName(str, Enum):
    """Datasets of :mod:`mdv.data` (hub loader + offline package source or an honest stand-in)."""

    gsm8k = "gsm8k"
    humaneval = "humaneval"
    mgsm = "mgsm"
    lm1b = "lm1b"
    alpaca = "alpaca"


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
    """What ``experiments/run.py`` does: a sweep of real-model cells, or the exact theory tables."""

    sweep = "sweep"
    theory = "theory"


# ----------------------------------------------------------------------------------- typed schema
@dataclass
class MethodGroup:
    """``conf/method/*``: the methods of the grid (``ar`` = the autoregressive baseline)."""

    names: list[Method] = field(default_factory=lambda: list(Method))


@dataclass
class DatasetGroup:
    """``conf/dataset/*``: datasets, prompts per dataset, and where the prompts come from.

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
    """``conf/sampling/*``: one sampling transform applied identically to target and draft."""

    temperatures: list[float] = field(default_factory=lambda: [0.4])
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    max_new_tokens: int = 32


@dataclass
class SweepGroup:
    """``conf/sweep/*``: the K (drafts) x L (draft length) x seed axes of the grid."""

    K: list[int] = field(default_factory=lambda: [3])
    L: list[int] = field(default_factory=lambda: [4])
    seeds: list[int] = field(default_factory=lambda: [0])


@dataclass
class ModelsGroup:
    """``conf/models/*``: the target/draft pair.

    name: the short identity recorded as ``config.models`` in every cell (AR baselines pair with
    methods on it).  target / draft: asset names (``assets``), hub ids, local folders or .gguf paths
    (``hub``).  device: null = CUDA when available, else CPU.  The ``tiny_random`` fields build the
    tiny pair (deterministic from ``seed``).
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


@dataclass
class LoggerGroup:
    """``conf/logger/*``: experiment tracking (:mod:`mdv.tracking`); off unless ``logger=wandb``.

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
    """The whole config of ``experiments/run.py`` (Hydra schema ``run_schema``, ``conf/config.yaml``).

    name: the experiment name; results_dir defaults to ``outputs/<name>`` so a rerun resumes.
    threads: ``torch.set_num_threads`` (null: torch's default).  progress: tqdm bars.
    theory: the grid of ``experiment=theory`` (:class:`mdv.theory.TheoryConfig`).
    """

    name: str = "smoke"
    task: Task = Task.sweep
    results_dir: str = "outputs/${name}"
    threads: Optional[int] = None
    progress: bool = True
    method: MethodGroup = field(default_factory=MethodGroup)
    models: ModelsGroup = field(default_factory=ModelsGroup)
    dataset: DatasetGroup = field(default_factory=DatasetGroup)
    sampling: SamplingGroup = field(default_factory=SamplingGroup)
    sweep: SweepGroup = field(default_factory=SweepGroup)
    logger: LoggerGroup = field(default_factory=LoggerGroup)
    theory: TheoryConfig = field(default_factory=TheoryConfig)


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Enum) else x


# ----------------------------------------------------------------------------------- validation
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate(cfg: RunConfig) -> None:
    """Check the grid values; raise :class:`~mdv.errors.InvalidInputError` naming the config key."""
    from mdv.verify.registry import VERIFIERS

    methods = [_value(m) for m in cfg.method.names]
    valid_methods = ["ar", *VERIFIERS]
    if not methods:
        raise InvalidInputError("method.names is empty; choose e.g. method=all or method=sd")
    bad = [m for m in methods if m not in valid_methods]
    if bad:
        raise InvalidInputError(f"unknown method(s) {bad}; valid methods are: {', '.join(valid_methods)}")
    if not cfg.dataset.names:
        raise InvalidInputError("dataset.names is empty; choose e.g. dataset=all or dataset=humaneval")
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
    if cfg.threads is not None and (not _is_int(cfg.threads) or cfg.threads < 1):
        raise InvalidInputError(f"threads must be null or an integer >= 1; got {cfg.threads}")
    kind = ModelKind(_value(cfg.models.kind))
    if kind in (ModelKind.assets, ModelKind.hub) and (not cfg.models.target or not cfg.models.draft):
        raise InvalidInputError(f"models.kind={kind.value} needs models.target and models.draft"
                                f" (got target={cfg.models.target!r}, draft={cfg.models.draft!r})")


# ----------------------------------------------------------------------------------- cells
def _fmt_num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Cell:
    """One point of the grid.  ``K`` and ``L`` are None for ``method="ar"``."""

    dataset: str
    method: str
    K: Optional[int]
    L: Optional[int]
    temperature: float
    top_k: Optional[int]
    top_p: Optional[float]
    max_new_tokens: int
    seed: int
    n_prompts: int
    models: str
    dataset_source: str = "auto"
    warmup_prompts: int = WARMUP_PROMPTS

    def config(self) -> dict[str, Any]:
        """The ``config`` block of the cell file (the contract's keys, plus warmup_prompts and
        dataset_source)."""
        return {
            "method": self.method, "K": self.K, "L": self.L, "temperature": float(self.temperature),
            "top_k": self.top_k, "top_p": None if self.top_p is None else float(self.top_p),
            "max_new_tokens": self.max_new_tokens, "seed": self.seed, "dataset": self.dataset,
            "n_prompts": self.n_prompts, "models": self.models, "warmup_prompts": self.warmup_prompts,
            "dataset_source": self.dataset_source,
        }

    @property
    def config_hash(self) -> str:
        """First 8 hex digits of the sha256 of the canonical JSON of :meth:`config`."""
        blob = json.dumps(self.config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:8]

    @property
    def cell_id(self) -> str:
        """Readable slug + short hash, e.g. ``humaneval__sd__K1_L4_T0.4__s0__a1b2c3d4``."""
        t = f"T{_fmt_num(self.temperature)}"
        if self.top_k:
            t += f"_k{self.top_k}"
        if self.top_p is not None and self.top_p < 1:
            t += f"_p{_fmt_num(self.top_p)}"
        shape = t if self.method == "ar" else f"K{self.K}_L{self.L}_{t}"
        return f"{self.dataset}__{self.method}__{shape}__s{self.seed}__{self.config_hash}"


def expand_grid(cfg: RunConfig) -> list[Cell]:
    """All cells of ``cfg`` in run order (see the module docstring); duplicates removed."""
    from mdv.verify.registry import VERIFIERS

    cells: list[Cell] = []
    seen: set[str] = set()
    s = cfg.sampling
    for dataset in cfg.dataset.names:
        for T in s.temperatures:
            for seed in cfg.sweep.seeds:
                for method in (_value(m) for m in cfg.method.names):
                    if method == "ar":
                        shapes: list[tuple[Optional[int], Optional[int]]] = [(None, None)]
                    else:
                        ks = sorted(set(cfg.sweep.K)) if VERIFIERS[method].multi_draft else [1]
                        shapes = [(k, l) for k in ks for l in cfg.sweep.L]
                    for K, L in shapes:
                        cell = Cell(dataset=_value(dataset), method=method, K=K, L=L, temperature=float(T),
                                    top_k=s.top_k, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                                    seed=int(seed), n_prompts=cfg.dataset.n_prompts, models=cfg.models.name,
                                    dataset_source=cfg.dataset.source)
                        if cell.cell_id not in seen:
                            seen.add(cell.cell_id)
                            cells.append(cell)
    return cells


def prompt_seed(seed: int, prompt_index: int) -> int:
    """The generation seed of prompt ``prompt_index`` in a cell with seed ``seed`` (AR and every method
    use the same one, so paired prompts see the same seed)."""
    return int(seed) * 1_000_003 + int(prompt_index)


# ----------------------------------------------------------------------------------- result files
def cells_dir(results_dir: str | os.PathLike[str]) -> Path:
    """``<results_dir>/cells``."""
    return Path(results_dir) / "cells"


def cell_path(results_dir: str | os.PathLike[str], cell_id: str) -> Path:
    """``<results_dir>/cells/<cell_id>.json``."""
    return cells_dir(results_dir) / f"{cell_id}.json"


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN / infinite float replaced by None, so the file is strict JSON (NaN is
    written as ``null``; readers map null back to NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON (:func:`json_safe`) to ``path`` atomically: a temp file in the same
    folder (``.<name>.<pid>.tmp``, which no reader globbing ``*.json`` picks up), flushed and fsynced,
    then ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(json_safe(obj), f, indent=1, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    try:  # make the rename durable too (best effort: not every platform can open a directory)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def read_cell(path: Path) -> Optional[dict[str, Any]]:
    """The parsed cell file, or None when it is absent, unreadable, truncated or not ``mdv.cell/1``."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    return data


def cell_done(results_dir: str | os.PathLike[str], cell: Cell) -> bool:
    """True when the cell's file exists, parses, belongs to this cell and has status ``ok``."""
    data = read_cell(cell_path(results_dir, cell.cell_id))
    return bool(data) and data.get("status") == "ok" and data.get("cell_id") == cell.cell_id


def check_writable_dir(path: str | os.PathLike[str], key: str = "results_dir") -> Path:
    """Create ``path`` (and parents) and prove it is writable with a probe file; raise
    :class:`~mdv.errors.InvalidInputError` naming the config ``key`` and the fix otherwise."""
    folder = Path(path)
    probe = folder / f".write-probe.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "w") as f:
            f.write("ok")
        probe.unlink()
    except OSError as e:
        raise InvalidInputError(
            f"{key} {str(path)!r} is not writable ({e.strerror or e}); pass a writable folder,"
            f" e.g. {key}=/tmp/mdv-results") from None
    return folder


def prepare_results_dir(results_dir: str | os.PathLike[str]) -> Path:
    """Create ``<results_dir>/cells`` and prove both are writable (:func:`check_writable_dir`)."""
    check_writable_dir(results_dir)
    check_writable_dir(cells_dir(results_dir), "results_dir/cells")
    return Path(results_dir)


_ENV: dict[str, Any] | None = None


def environment(dtype: str, device: str) -> dict[str, Any]:
    """The ``environment`` block: CPU, threads, library versions, dtype, device, timestamp."""
    global _ENV
    import torch

    if _ENV is None:
        import transformers

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
        _ENV = {"cpu": f"{cpu} ({os.cpu_count()} logical cores)", "torch": torch.__version__,
                "transformers": transformers.__version__, "mdv": mdv.__version__,
                "python": platform.python_version()}
    if device.startswith("cuda") and torch.cuda.is_available():
        dev = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    else:
        dev = device
    return {**_ENV, "threads": torch.get_num_threads(), "dtype": dtype, "device": dev,
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


# ----------------------------------------------------------------------------------- models
class TinyTokenizer:
    """A trivial tokenizer-like object for the tiny random pair: bytes -> ids, no learned merges.

    ids 0/1/2 are pad/BOS/EOS; every byte b of the UTF-8 text maps to ``3 + b % (vocab_size - 3)``.
    ``decode`` shows id i >= 3 as a printable character (the mapping is not invertible: the tiny model
    is random, so its "text" carries no meaning anyway).  Offers ``encode``, ``__call__``, ``decode``
    and ``apply_chat_template`` (``role: content`` lines), with ``chat_template = None``.
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    chat_template = None
    name_or_path = "mdv-tiny-random"
    _ALPHABET = string.ascii_letters + string.digits + string.punctuation + " "

    def __init__(self, vocab_size: int = 64):
        if vocab_size < 4:
            raise InvalidInputError(f"TinyTokenizer needs vocab_size >= 4; got {vocab_size}")
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        ids = [3 + b % (self.vocab_size - 3) for b in str(text).encode("utf-8")]
        return ([self.bos_token_id] if add_special_tokens else []) + ids

    def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True, **_: Any) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < 3:
                if not skip_special_tokens:
                    out.append(("<pad>", "<s>", "</s>")[i])
                continue
            out.append(self._ALPHABET[(i - 3) % len(self._ALPHABET)])
        return "".join(out)

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = True, **_: Any) -> Any:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "assistant: "
        return self.encode(text) if tokenize else text


def build_tiny_random_pair(vocab_size: int = 64, seed: int = 0, *, hidden_size: int = 32, num_layers: int = 2,
                           logit_scale: float = 30.0, draft_noise: float = 0.3, context: int = 4096,
                           dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, TinyTokenizer]:
    """A tiny random Llama target and a draft = target + Gaussian noise (``draft_noise`` x each tensor's
    std), deterministic from ``seed``; the output head is scaled by ``logit_scale`` so next-token laws
    are peaked (drafts are accepted often, not always).  -> (target HFModel, draft HFModel, tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mdv.models.hf import HFModel

    tok = TinyTokenizer(vocab_size)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=context, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(logit_scale)
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1:
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
                p.add_(draft_noise * p.std() * noise)
    target, draft = target.to(device), draft.to(device)
    name = f"tiny-random-llama(V={vocab_size},d={hidden_size},layers={num_layers},seed={seed})"
    return (HFModel(target, tok, name=f"{name} target"),
            HFModel(draft, tok, name=f"{name} draft (target + noise {draft_noise:g})"), tok)


@dataclass
class LoadedModels:
    """A loaded pair: ``target``/``draft`` LanguageModels, the shared tokenizer, their recorded names."""

    target: Any
    draft: Any
    tokenizer: Any
    target_name: str
    draft_name: str
    dtype: str
    device: str


_MODELS: dict[str, LoadedModels] = {}


def _models_key(m: ModelsGroup) -> str:
    d = dataclasses.asdict(m)
    return json.dumps({k: _value(v) for k, v in d.items()}, sort_keys=True)


def check_models_available(m: ModelsGroup) -> None:
    """Raise :class:`~mdv.errors.MissingAssetError` (with the fetch command) when local model files of
    ``m`` are absent; cheap (no loading)."""
    kind = ModelKind(_value(m.kind))
    if kind == ModelKind.default:
        from mdv.models.default_pair import default_pair_available

        ok, reason = default_pair_available()
        if not ok:
            raise MissingAssetError(f"the default model pair is unavailable: {reason}")
    elif kind == ModelKind.assets:
        from mdv import assets

        for role, name in (("target", m.target), ("draft", m.draft)):
            assets.path(str(name))  # raises MissingAssetError naming `python -m mdv.assets fetch ...`


def load_models(m: ModelsGroup) -> LoadedModels:
    """Load (once per process: cached on the config) the pair described by ``m``."""
    key = _models_key(m)
    if key in _MODELS:
        return _MODELS[key]
    import torch

    from mdv.models.hf import HFModel, default_device

    kind = ModelKind(_value(m.kind))
    dtype = getattr(torch, m.dtype)
    device = torch.device(m.device) if m.device else default_device()
    check_models_available(m)
    if kind == ModelKind.tiny_random:
        target, draft, tok = build_tiny_random_pair(m.vocab_size, m.seed, hidden_size=m.hidden_size,
                                                    num_layers=m.num_layers, logit_scale=m.logit_scale,
                                                    draft_noise=m.draft_noise, dtype=m.dtype, device=str(device))
    elif kind == ModelKind.default:
        from mdv.models import default_pair

        t, d, tok = default_pair.load_default_pair(dtype)
        t, d = t.to(device), d.to(device)
        target = HFModel(t, tok, name=f"SmolLM2-135M-Instruct (GGUF Q4_1 asset {default_pair.TARGET_ASSET})")
        draft = HFModel(d, tok, name=f"{default_pair.DRAFT_NAME} ({d.config.num_hidden_layers} layers, mdv)")
    else:
        if kind == ModelKind.assets:
            from mdv import assets

            tpath, dpath = str(assets.path(str(m.target))), str(assets.path(str(m.draft)))
        else:
            tpath, dpath = str(m.target), str(m.draft)
        target = HFModel.from_pretrained(tpath, dtype=dtype, device=device)
        draft = HFModel.from_pretrained(dpath, dtype=dtype, device=device, load_tokenizer=False)
        target.name, draft.name = str(m.target), str(m.draft)
        tok = target.tokenizer
    loaded = LoadedModels(target, draft, tok, str(target.name), str(draft.name), m.dtype, str(device))
    _MODELS[key] = loaded
    return loaded


# ----------------------------------------------------------------------------------- datasets
def import_callable(spec: str, what: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function; a clear error when it does not resolve."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise InvalidInputError(f"{what} must look like 'package.module:function'; got {spec!r}")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise InvalidInputError(f"{what} {spec!r}: cannot import {mod_name!r} ({e})") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise InvalidInputError(f"{what} {spec!r}: {mod_name} has no function {attr!r}")
    return fn


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_prompt_set(loader: Callable[..., Any], name: str, n: int, source: str) -> Any:
    """``loader(name, n, source=source)``; any non-mdv failure becomes a one-line
    :class:`~mdv.errors.MissingAssetError` naming the dataset."""
    try:
        ps = loader(name, n, source=source)
    except MdvError:
        raise
    except Exception as e:  # e.g. the hub is unreachable offline
        raise MissingAssetError(
            f"dataset {name!r} (source={source}) is unavailable: {type(e).__name__}: {_first_line(e)};"
            " fetch its offline source (`python -m mdv.assets fetch`) or choose dataset.source=auto") from None
    for attr in ("name", "label", "source", "size", "prompts"):
        if not hasattr(ps, attr):
            raise InvalidInputError(f"the dataset loader returned {type(ps).__name__} without {attr!r}")
    if len(ps.prompts) == 0:
        raise MissingAssetError(f"dataset {name!r} (source={source}) has no prompts")
    return ps


def _prompt_id(prompt: Any, dataset: str, index: int) -> str:
    for attr in ("id", "prompt_id", "task_id"):
        v = prompt.get(attr) if isinstance(prompt, dict) else getattr(prompt, attr, None)
        if v is not None:
            return str(v)
    return f"{dataset}/{index}"


# ----------------------------------------------------------------------------------- running
def _tqdm(progress: bool, **kw: Any) -> Any:
    from tqdm import tqdm

    return tqdm(disable=not progress, dynamic_ncols=True, **kw)


def _safe_decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    if tokenizer is None or not hasattr(tokenizer, "decode"):
        return ""
    try:
        return str(tokenizer.decode(list(tokens), skip_special_tokens=True))
    except Exception:  # decoding is for reading only; a tokenizer quirk must not fail the cell
        return ""


def run_cell(cell: Cell, models: LoadedModels, prompt_set: Any, prompt_ids: list[list[int]],
             progress: bool = False) -> tuple[list[dict[str, Any]], float]:
    """Generate on every prompt of ``prompt_set`` for ``cell``.  -> (generations, wall seconds)."""
    from mdv.engine import generate

    gens: list[dict[str, Any]] = []
    start = time.perf_counter()
    draft = None if cell.method == "ar" else models.draft
    bar = _tqdm(progress, total=len(prompt_ids), desc=f"  {cell.method} prompts", leave=False, position=1)
    try:
        for i, ids in enumerate(prompt_ids):
            res = generate(models.target, draft, ids, cell.method, K=cell.K or 1, L=cell.L or 1,
                           temperature=cell.temperature, top_k=cell.top_k, top_p=cell.top_p,
                           max_new_tokens=cell.max_new_tokens, seed=prompt_seed(cell.seed, i))
            gens.append({"prompt_index": i, "prompt_id": _prompt_id(prompt_set.prompts[i], cell.dataset, i),
                         "stats": res.stats, "text": _safe_decode(models.tokenizer, res.tokens)})
            bar.update(1)
    finally:
        bar.close()
    return gens, time.perf_counter() - start


def dataset_block(prompt_set: Any) -> dict[str, Any]:
    """The ``dataset`` block of a cell file, from a PromptSet: name (the honest short name of the data
    actually loaded), label, source, size, plus ``PromptSet.record()`` extras when offered (requested
    key, total, selection, prompt ids)."""
    extra = prompt_set.record() if callable(getattr(prompt_set, "record", None)) else {}
    return {**extra, "name": str(prompt_set.name), "label": str(prompt_set.label),
            "source": str(prompt_set.source), "size": int(prompt_set.size)}


def cell_record(cell: Cell, *, status: str, error: Optional[str], dataset: dict[str, Any],
                models: dict[str, str], env: dict[str, Any], generations: list[dict[str, Any]],
                wall_seconds: float) -> dict[str, Any]:
    """A cell file's content (schema ``mdv.cell/1``)."""
    from mdv.metrics import aggregate

    summary = aggregate([g["stats"] for g in generations]) if status == "ok" else {}
    return {"schema": SCHEMA, "cell_id": cell.cell_id, "status": status, "error": error,
            "config": cell.config(), "dataset": dataset, "models": models, "environment": env,
            "generations": generations, "summary": summary, "wall_seconds": float(wall_seconds)}


@dataclass
class SweepReport:
    """What :func:`run_sweep` did: cell ids by outcome, and its wall time."""

    results_dir: Path
    cells: list[str]
    skipped: list[str]
    ok: list[str]
    failed: list[str]
    wall_seconds: float

    def line(self) -> str:
        return (f"{len(self.cells)} cells: {len(self.ok)} run, {len(self.skipped)} already done (skipped),"
                f" {len(self.failed)} failed; {self.wall_seconds:.1f} s; results in {self.results_dir}/cells")


def run_sweep(cfg: RunConfig, tracker: Any = None, *, loader: Callable[..., Any] | None = None,
              formatter: Callable[..., Any] | None = None) -> SweepReport:
    """Run every pending cell of ``cfg`` and write its file (see the module docstring).

    tracker: an :class:`mdv.tracking.Tracker` (None: no tracking).  loader / formatter: override
    ``cfg.dataset.loader`` / ``cfg.dataset.formatter``.  Raises an :class:`~mdv.errors.MdvError` before
    any cell runs when the grid, the results folder, a dataset or the models are unusable.
    """
    import torch

    from mdv.tracking import NullTracker

    t0 = time.perf_counter()
    validate(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    tracker = tracker or NullTracker()
    results_dir = prepare_results_dir(cfg.results_dir)
    cells = expand_grid(cfg)
    done = {c.cell_id for c in cells if cell_done(results_dir, c)}
    pending = [c for c in cells if c.cell_id not in done]

    # --- everything that can fail without running a cell, before the first one runs
    prompt_sets: dict[str, Any] = {}
    models: LoadedModels | None = None
    if pending:
        loader = loader or import_callable(cfg.dataset.loader, "dataset.loader")
        formatter = formatter or import_callable(cfg.dataset.formatter, "dataset.formatter")
        for name in dict.fromkeys(c.dataset for c in pending):
            prompt_sets[name] = load_prompt_set(loader, name, cfg.dataset.n_prompts, cfg.dataset.source)
        check_models_available(cfg.models)
        log.info("loading models (%s)", cfg.models.name)
        models = load_models(cfg.models)
    formatted: dict[str, list[list[int]]] = {}

    tracker.start(cfg, cells)
    skipped, ok, failed = [], [], []
    bar = _tqdm(cfg.progress, total=len(cells), desc=f"{cfg.name} cells", position=0)
    try:
        for cell in cells:
            path = cell_path(results_dir, cell.cell_id)
            if cell.cell_id in done:
                skipped.append(cell.cell_id)
                record = read_cell(path)
                if record is not None:
                    tracker.log_cell(record, resumed=True)
                bar.update(1)
                continue
            assert models is not None
            bar.set_postfix_str(cell.cell_id.rsplit("__", 1)[0])
            ps = prompt_sets[cell.dataset]
            env = environment(models.dtype, models.device)
            gens: list[dict[str, Any]] = []
            wall, error = 0.0, None
            try:
                if cell.dataset not in formatted:
                    formatted[cell.dataset] = [list(map(int, formatter(p, models.tokenizer)))
                                               for p in ps.prompts[:cell.n_prompts]]
                gens, wall = run_cell(cell, models, ps, formatted[cell.dataset][:cell.n_prompts], cfg.progress)
            except Exception as e:  # recorded; the sweep goes on
                error = f"{type(e).__name__}: {e}"
                log.warning("cell %s failed: %s", cell.cell_id, error.splitlines()[0] if error else "")
                log.debug("traceback of cell %s", cell.cell_id, exc_info=True)  # hydra.verbose=mdv.sweep
            record = cell_record(cell, status="ok" if error is None else "failed", error=error,
                                 dataset=dataset_block(ps), models={"target": models.target_name,
                                                                    "draft": models.draft_name},
                                 env=env, generations=gens if error is None else [], wall_seconds=wall)
            write_json_atomic(path, record)
            (ok if error is None else failed).append(cell.cell_id)
            tracker.log_cell(record, resumed=False)
            be = record["summary"].get("block_efficiency_mean", float("nan")) if error is None else float("nan")
            msg = f"{cell.cell_id}: " + (f"block efficiency {be:.2f}, {wall:.1f} s" if error is None
                                         else f"FAILED ({error.splitlines()[0]})")
            if cfg.progress:
                bar.write(msg)
            else:
                log.info(msg)
            bar.update(1)
    finally:
        bar.close()
        records = [r for c in cells if (r := read_cell(cell_path(results_dir, c.cell_id))) is not None]
        tracker.finish(records)
    return SweepReport(results_dir, [c.cell_id for c in cells], skipped, ok, failed, time.perf_counter() - t0)


def to_run_config(cfg: Any) -> RunConfig:
    """A composed Hydra/OmegaConf config -> :class:`RunConfig` (already a RunConfig: returned as is)."""
    if isinstance(cfg, RunConfig):
        return cfg
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, RunConfig):
        raise InvalidInputError(f"expected a config with the run_schema; got {type(obj).__name__}")
    return obj


def reset_model_cache() -> None:
    """Forget the models loaded by :func:`load_models` (tests; freeing memory between sweeps)."""
    _MODELS.clear()


__all__ = [
    "Cell", "DatasetGroup", "DatasetName", "LoadedModels", "LoggerGroup", "LoggerKind", "Method", "MethodGroup",
    "ModelKind", "ModelsGroup", "RunConfig", "SamplingGroup", "SweepGroup", "SweepReport", "Task", "TinyTokenizer",
    "build_tiny_random_pair", "cell_done", "cell_path", "cell_record", "expand_grid", "load_models", "prepare_results_dir",
    "read_cell", "run_sweep", "to_run_config", "validate", "write_json_atomic",
]
