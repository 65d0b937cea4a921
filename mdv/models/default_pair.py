"""The embedded default pair: SmolLM2-135M-Instruct (target) and a small draft trained by mdv.

The target is the GGUF file of the ``smollm2-135m-instruct`` asset (``python -m mdv.assets fetch
smollm2-135m-instruct``).  The draft is a :class:`transformers.LlamaForCausalLM` with the target's
hidden size, tokenizer and vocabulary (49,152) and only a few decoder layers.  Its token embedding
and (tied) output head are the target's own, copied in at load time from the target file, so the
repository ships only the trained decoder layers and the final norm (``mdv/assets_data/``, fp16
safetensors + a JSON config).  ``experiments/train_draft.py`` (``mdv/conf/train_draft.yaml``) is the
recipe that produced them.

On a CPU the 49,152-row output head costs most of a draft step, so by default the draft's head keeps
only the rows of a vocabulary subset (the ids listed in ``<name>.head_ids.json``, chosen by the recipe
from token frequencies of its training text; see :class:`SubsetHead`).  The draft still returns
full-vocabulary logits, ``-inf`` outside the subset: its proposal law q is 0 there, which every
verifier handles, and the output law stays the target's.  ``load_default_pair(draft_head="full")``
loads the full-head draft for comparison.

>>> from mdv.models.default_pair import load_default_pair          # doctest: +SKIP
>>> target, draft, tok = load_default_pair()                       # doctest: +SKIP
>>> from mdv.models import HFModel                                  # doctest: +SKIP
>>> t, d = HFModel(target, tok), HFModel(draft, tok)               # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch

from mdv import assets
from mdv.errors import MissingAssetError, unknown_name

TARGET_ASSET = "smollm2-135m-instruct"
DATA_DIR = Path(__file__).resolve().parent.parent / "assets_data"
DRAFT_NAME = "smollm2-135m-instruct-draft"
#: Parameters the draft takes from the target at load time (never shipped).
SHARED_FROM_TARGET = ("model.embed_tokens.weight", "lm_head.weight")
#: The draft heads load_draft can build: the head restricted to the shipped vocabulary subset, or the full head.
DRAFT_HEADS = ("subset", "full")
#: Format of the shipped id-list file (``head_ids_path``).
HEAD_IDS_FORMAT = 1


class SubsetHead(torch.nn.Module):
    """An output head over the vocabulary subset ``ids`` that returns full-width logits.

    ``rows`` are the rows ``ids`` of a full head ``weight`` [V, d] (a copy); ``forward(h [..., d])`` computes
    ``h @ rows.T`` and scatters it into a ``[..., V]`` tensor filled with ``-inf``, so the logits equal the
    full head's on ``ids`` (up to floating-point summation order) and are ``-inf`` elsewhere.  A model
    whose ``lm_head`` is a SubsetHead keeps its vocabulary width for every caller (HFModel, sessions, the
    engine); its sampling law is 0 outside ``ids``.  The module has no ``weight`` attribute on purpose:
    code that reads ``get_output_embeddings().weight`` for the vocabulary width falls back to the config.
    """

    def __init__(self, weight: torch.Tensor, ids: Sequence[int] | torch.Tensor, vocab_size: int | None = None):
        super().__init__()
        idx = torch.as_tensor(ids, dtype=torch.long, device=weight.device).flatten()
        V = int(weight.shape[0]) if vocab_size is None else int(vocab_size)
        if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= min(V, int(weight.shape[0])):
            raise ValueError(f"subset ids must be non-empty and lie in [0, {V})")
        if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise ValueError("subset ids must be strictly increasing")
        self.vocab_size = V
        self.register_buffer("ids", idx.clone())
        self.rows = torch.nn.Parameter(weight.detach()[idx].clone(), requires_grad=False)

    #: mdv.models.panels runs ``project`` on panels of this weight (PanelPacks of the draft)
    panel_weight = "rows"

    @property
    def subset_size(self) -> int:
        return int(self.ids.numel())

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """The subset logits ``hidden · rowsᵀ`` [..., subset_size]."""
        return torch.nn.functional.linear(hidden, self.rows)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.project(hidden)
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, sub)

    def extra_repr(self) -> str:
        return f"in_features={self.rows.shape[1]}, subset={self.subset_size}, vocab_size={self.vocab_size}"


def draft_description(draft: Any) -> str:
    """``"<DRAFT_NAME> (<n> layers, <head> head, mdv)"``: names the head (subset rows or full), so results
    made with different heads never share a name (speed differs; exactness does not)."""
    head = getattr(draft, "lm_head", None)
    rows = f"{head.subset_size}-token subset" if isinstance(head, SubsetHead) else "full-vocabulary"
    return f"{DRAFT_NAME} ({draft.config.num_hidden_layers} layers, {rows} head, mdv)"


def restrict_head(draft: Any, ids: Sequence[int] | torch.Tensor, weight: torch.Tensor | None = None) -> Any:
    """Replace ``draft.lm_head`` (in place) by a :class:`SubsetHead` over ``ids`` (rows of ``weight``,
    default the draft's current head) and untie it from the embedding; returns ``draft``."""
    if weight is None:
        weight = draft.get_output_embeddings().weight
    V = int(draft.config.vocab_size)
    draft.lm_head = SubsetHead(weight, ids, V)
    draft.config.tie_word_embeddings = False  # nothing may re-tie lm_head.weight to the embedding
    draft.config.head_vocab_size = draft.lm_head.subset_size
    return draft


def draft_config_path(name: str = DRAFT_NAME, data_dir: Path | None = None) -> Path:
    """The JSON config of a shipped draft."""
    return (data_dir or DATA_DIR) / f"{name}.json"


def draft_weights_path(name: str = DRAFT_NAME, data_dir: Path | None = None) -> Path:
    """The safetensors file of a shipped draft (its trained layers and final norm)."""
    return (data_dir or DATA_DIR) / f"{name}.safetensors"


def load_target(dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load the default target (``LlamaForCausalLM``, eval mode) and its tokenizer from the verified GGUF.

    GGUF weights are dequantised to float32 (transformers' GGUF path computes in float32); other
    dtypes are reached by a cast after loading.  Raises :class:`~mdv.errors.MissingAssetError` with
    the fetch command when the file is absent or corrupt.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers import logging as hf_logging

    gguf = assets.path(TARGET_ASSET)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the GGUF loader's float32 notice is expected here
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    if dtype != torch.float32:
        model = model.to(dtype)
    return model.eval(), tokenizer


def make_draft(target: Any, num_layers: int, init_layers: Sequence[int] | None = None,
               seed: int = 0) -> Any:
    """A ``LlamaForCausalLM`` draft for ``target``: same config except ``num_layers`` decoder layers.

    The embedding, the tied output head and the final norm are copies of the target's.  Decoder
    layer i is a copy of target layer ``init_layers[i]`` (or randomly initialised, seeded, when
    ``init_layers`` is None).  The result is in the target's dtype, in eval mode.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg_dict = target.config.to_dict()
    for k in ("quantization_config", "_name_or_path", "architectures", "num_hidden_layers", "layer_types"):
        cfg_dict.pop(k, None)
    cfg = LlamaConfig(**cfg_dict, num_hidden_layers=int(num_layers))
    cfg.tie_word_embeddings = True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = LlamaForCausalLM(cfg)
    dtype = next(target.parameters()).dtype
    draft = draft.to(dtype)
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
        if init_layers is not None:
            if len(init_layers) != num_layers:
                raise ValueError(f"init_layers has {len(init_layers)} entries for {num_layers} layers")
            for i, j in enumerate(init_layers):
                draft.model.layers[i].load_state_dict(target.model.layers[int(j)].state_dict())
    draft.tie_weights()
    out = target.get_output_embeddings().weight
    if not torch.equal(draft.get_output_embeddings().weight, out):
        # An untied target head (not SmolLM2) is copied separately.
        draft.config.tie_word_embeddings = False
        draft.lm_head = torch.nn.Linear(out.shape[1], out.shape[0], bias=False, dtype=out.dtype)
        with torch.no_grad():
            draft.lm_head.weight.copy_(out)
    if getattr(target, "generation_config", None) is not None:
        draft.generation_config = target.generation_config
    return draft.eval()


def trained_state(draft: Any) -> dict[str, torch.Tensor]:
    """The draft parameters that the recipe trains and ships: everything except the shared ones (the
    embedding and the output head, whole or restricted to a subset)."""
    return {k: v.detach() for k, v in draft.state_dict().items()
            if k not in SHARED_FROM_TARGET and not k.startswith("lm_head.")}


def head_ids_path(name: str = DRAFT_NAME, data_dir: Path | None = None) -> Path:
    """The default file name of a draft's head vocabulary subset (the id list)."""
    return (data_dir or DATA_DIR) / f"{name}.head_ids.json"


def write_head_ids(path: Path, ids: Sequence[int], vocab_size: int, meta: dict[str, Any] | None = None) -> str:
    """Write a head vocabulary subset (sorted unique ids) as JSON; return the file's sha256."""
    ids = sorted({int(i) for i in ids})
    if not ids or ids[0] < 0 or ids[-1] >= vocab_size:
        raise ValueError(f"head subset ids must be non-empty and lie in [0, {vocab_size})")
    head = {"format": HEAD_IDS_FORMAT, "vocab_size": int(vocab_size), "size": len(ids), **(meta or {})}
    body = json.dumps(head, indent=2)[:-2]  # the metadata readable, the ids on one line
    path.write_text(body + ',\n  "ids": ' + json.dumps(ids, separators=(",", ":")) + "\n}\n")
    os.chmod(path, 0o644)
    return sha256_bytes(path)


def read_head_ids(path: Path, vocab_size: int | None = None, size: int | None = None) -> list[int]:
    """The ids of a head-subset file, validated (sorted, unique, in range, ``size`` of them when given).
    Raises ValueError when the file does not hold such a list."""
    d = json.loads(path.read_text())
    if not isinstance(d, dict) or d.get("format") != HEAD_IDS_FORMAT or not isinstance(d.get("ids"), list):
        raise ValueError(f"not a head-subset file of format {HEAD_IDS_FORMAT}")
    ids = d["ids"]
    V = int(d.get("vocab_size", 0)) if vocab_size is None else int(vocab_size)
    if d.get("vocab_size") != V:
        raise ValueError(f"it is for vocabulary size {d.get('vocab_size')}, the model has {V}")
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("'ids' must be a non-empty list of integers")
    if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0 or ids[-1] >= V:
        raise ValueError(f"'ids' must be strictly increasing and lie in [0, {V})")
    if size is not None and len(ids) != size:
        raise ValueError(f"it holds {len(ids)} ids, the draft config records head_vocab_size={size}")
    return ids


def sha256_bytes(p: Path) -> str:
    """sha256 of a file."""
    return hashlib.sha256(p.read_bytes()).hexdigest()


def save_draft(draft: Any, meta: dict[str, Any], name: str = DRAFT_NAME, data_dir: Path | None = None,
               dtype: torch.dtype = torch.float16) -> tuple[Path, Path]:
    """Write the draft's trained tensors (``dtype``) as safetensors and its JSON config; return both paths."""
    from safetensors.torch import save_file

    wpath, cpath = draft_weights_path(name, data_dir), draft_config_path(name, data_dir)
    wpath.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(dtype).contiguous().clone() for k, v in trained_state(draft).items()}
    save_file(state, str(wpath), metadata={"format": "pt", "mdv_draft": name})
    os.chmod(wpath, 0o644)  # safetensors writes 0600; the file is shipped in the repository
    cfg = {
        "format": 1,
        "name": name,
        "architecture": "LlamaForCausalLM",
        "num_hidden_layers": int(draft.config.num_hidden_layers),
        "target_asset": TARGET_ASSET,
        "target_sha256": assets.get_asset(TARGET_ASSET).sha256,
        "shared_from_target": list(SHARED_FROM_TARGET),
        "weights_file": wpath.name,
        "weights_sha256": sha256_bytes(wpath),
        "weights_dtype": str(dtype).removeprefix("torch."),
        "num_shipped_parameters": int(sum(v.numel() for v in state.values())),
        **meta,
    }
    cpath.write_text(json.dumps(cfg, indent=2) + "\n")
    return wpath, cpath


def load_draft(target: Any, name: str = DRAFT_NAME, data_dir: Path | None = None, head: str = "subset") -> Any:
    """Build the shipped draft ``name`` around a loaded ``target`` (embedding and head copied from it).

    ``head="subset"`` (default) restricts the output head to the vocabulary subset named by the draft
    config (``head_vocab_subset``; a :class:`SubsetHead`: full-width logits, ``-inf`` outside the
    subset); ``head="full"`` keeps the target's whole head.  Raises
    :class:`~mdv.errors.MissingAssetError` when the shipped files (weights, id list) are absent or do
    not match their recorded sha256, when they were trained for another target file, or when
    ``head="subset"`` and the config names no subset.
    """
    from safetensors.torch import load_file

    if head not in DRAFT_HEADS:
        raise unknown_name("draft head", head, DRAFT_HEADS)
    cpath, wpath = draft_config_path(name, data_dir), draft_weights_path(name, data_dir)
    if not cpath.is_file() or not wpath.is_file():
        raise MissingAssetError(
            f"the shipped draft {name!r} is missing ({cpath} / {wpath}); it is part of the repository —"
            " restore it from git, or regenerate it with `python experiments/train_draft.py`")
    fix = "restore it from git or regenerate it with `python experiments/train_draft.py`"
    try:
        cfg = json.loads(cpath.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MissingAssetError(f"{cpath} cannot be read ({type(err).__name__}: {err}); {fix}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("num_hidden_layers"), int) or cfg["num_hidden_layers"] < 1:
        raise MissingAssetError(f"{cpath} is not a draft config (no integer 'num_hidden_layers' >= 1); {fix}")
    if sha256_bytes(wpath) != cfg.get("weights_sha256"):
        raise MissingAssetError(
            f"{wpath} does not match the sha256 recorded in {cpath.name}; restore it from git or regenerate"
            " it with `python experiments/train_draft.py`")
    want = assets.get_asset(cfg.get("target_asset", TARGET_ASSET)).sha256
    if cfg.get("target_sha256") != want:
        raise MissingAssetError(
            f"draft {name!r} was trained for target sha256 {cfg.get('target_sha256')}, but the registry pins"
            f" {want}; regenerate it with `python experiments/train_draft.py`")
    ids_path = None
    if head == "subset":
        fname = cfg.get("head_vocab_subset")
        if not isinstance(fname, str) or not fname:
            raise MissingAssetError(
                f"{cpath.name} names no head vocabulary subset ('head_vocab_subset'); load the full head with"
                " head='full' (load_default_pair(draft_head='full')), or compute the subset with"
                " `python experiments/train_draft.py head_subset_only=true`")
        ids_path = cpath.parent / fname
        if not ids_path.is_file():
            raise MissingAssetError(f"the draft's head vocabulary subset {ids_path} is missing; {fix}")
        if sha256_bytes(ids_path) != cfg.get("head_vocab_subset_sha256"):
            raise MissingAssetError(f"{ids_path} does not match the sha256 recorded in {cpath.name}; {fix}")
    draft = make_draft(target, int(cfg["num_hidden_layers"]), init_layers=None)
    state = load_file(str(wpath))
    dtype = next(target.parameters()).dtype
    missing, unexpected = draft.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if k not in SHARED_FROM_TARGET]
    if missing or unexpected:
        raise MissingAssetError(
            f"{wpath.name} does not fit the draft architecture (missing {missing}, unexpected {unexpected});"
            " regenerate it with `python experiments/train_draft.py`")
    if ids_path is not None:
        V = int(target.get_output_embeddings().weight.shape[0])
        size = cfg.get("head_vocab_size")
        try:
            ids = read_head_ids(ids_path, V, size if isinstance(size, int) else None)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise MissingAssetError(f"{ids_path} is not a valid head vocabulary subset ({err}); {fix}") from None
        restrict_head(draft, ids, target.get_output_embeddings().weight)
    return draft.eval()


def default_pair_available() -> tuple[bool, str]:
    """``(True, "")`` when the target file and the shipped draft are present, else ``(False, reason)``."""
    try:
        assets.path(TARGET_ASSET)
    except MissingAssetError as e:
        return False, str(e)
    if not draft_weights_path().is_file() or not draft_config_path().is_file():
        return False, f"the shipped draft files are missing under {DATA_DIR}"
    return True, ""


def load_default_pair(dtype: torch.dtype = torch.float32, draft_head: str = "subset") -> tuple[Any, Any, Any]:
    """Load the embedded default pair offline: ``(target, draft, tokenizer)``.

    ``draft_head="subset"`` (default): the draft's output head covers only the shipped vocabulary
    subset (full-width logits, ``-inf`` elsewhere: a cheaper draft step, still exact verification);
    ``"full"``: the draft with the target's whole 49,152-row head.

    ``target`` and ``draft`` are raw transformers ``LlamaForCausalLM`` models (eval mode, ``dtype``)
    sharing ``tokenizer`` (SmolLM2's 49,152-token BPE, with its chat template).  Wrap them in
    :class:`mdv.models.HFModel` for :func:`mdv.generate`.  Raises
    :class:`~mdv.errors.MissingAssetError` naming ``python -m mdv.assets fetch smollm2-135m-instruct``
    when the target file is absent or corrupt.
    """
    target, tokenizer = load_target(torch.float32)
    draft = load_draft(target, head=draft_head)
    if dtype != torch.float32:
        target, draft = target.to(dtype), draft.to(dtype)
    return target.eval(), draft.eval(), tokenizer
