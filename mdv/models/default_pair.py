"""The embedded default pair: SmolLM2-135M-Instruct (target) and a small draft trained by mdv.

The target is the GGUF file of the ``smollm2-135m-instruct`` asset (``python -m mdv.assets fetch
smollm2-135m-instruct``).  The draft is a :class:`transformers.LlamaForCausalLM` with the target's
hidden size, tokenizer and vocabulary (49,152) and only a few decoder layers.  Its token embedding
and (tied) output head are the target's own, copied in at load time from the target file, so the
repository ships only the trained decoder layers and the final norm (``mdv/assets_data/``, fp16
safetensors + a JSON config).  ``experiments/train_draft.py`` (``conf/train_draft.yaml``) is the
recipe that produced them.

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
from mdv.errors import MissingAssetError

TARGET_ASSET = "smollm2-135m-instruct"
DATA_DIR = Path(__file__).resolve().parent.parent / "assets_data"
DRAFT_NAME = "smollm2-135m-instruct-draft"
#: Parameters the draft takes from the target at load time (never shipped).
SHARED_FROM_TARGET = ("model.embed_tokens.weight", "lm_head.weight")


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
    """The draft parameters that the recipe trains and ships: everything except the shared ones."""
    return {k: v.detach() for k, v in draft.state_dict().items() if k not in SHARED_FROM_TARGET}


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


def load_draft(target: Any, name: str = DRAFT_NAME, data_dir: Path | None = None) -> Any:
    """Build the shipped draft ``name`` around a loaded ``target`` (embedding and head copied from it).

    Raises :class:`~mdv.errors.MissingAssetError` when the shipped files are absent or do not match
    their recorded sha256, or when they were trained for another target file.
    """
    from safetensors.torch import load_file

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
    draft = make_draft(target, int(cfg["num_hidden_layers"]), init_layers=None)
    state = load_file(str(wpath))
    dtype = next(target.parameters()).dtype
    missing, unexpected = draft.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if k not in SHARED_FROM_TARGET]
    if missing or unexpected:
        raise MissingAssetError(
            f"{wpath.name} does not fit the draft architecture (missing {missing}, unexpected {unexpected});"
            " regenerate it with `python experiments/train_draft.py`")
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


def load_default_pair(dtype: torch.dtype = torch.float32) -> tuple[Any, Any, Any]:
    """Load the embedded default pair offline: ``(target, draft, tokenizer)``.

    ``target`` and ``draft`` are raw transformers ``LlamaForCausalLM`` models (eval mode, ``dtype``)
    sharing ``tokenizer`` (SmolLM2's 49,152-token BPE, with its chat template).  Wrap them in
    :class:`mdv.models.HFModel` for :func:`mdv.generate`.  Raises
    :class:`~mdv.errors.MissingAssetError` naming ``python -m mdv.assets fetch smollm2-135m-instruct``
    when the target file is absent or corrupt.
    """
    target, tokenizer = load_target(torch.float32)
    draft = load_draft(target)
    if dtype != torch.float32:
        target, draft = target.to(dtype), draft.to(dtype)
    return target.eval(), draft.eval(), tokenizer
