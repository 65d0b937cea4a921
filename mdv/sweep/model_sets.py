"""The model sets a sweep runs on, loaded once per process.

Model sets (``models.kind``): ``default`` (the embedded SmolLM2-135M-Instruct target + mdv's trained
draft, :mod:`mdv.models.default_pair`), ``tiny_random`` (the tiny random Llama pair of tests and CI,
:mod:`mdv.models.tiny_random`), ``assets`` (a GGUF pair from :mod:`mdv.assets`, e.g. the optional
Qwen2.5-Coder 1.5B/0.5B) and ``hub`` (hub ids or local folders, for users with the hub).  With
``models.linears=panels`` the target's and the draft's linears run on weight panels (:mod:`mdv.models.panels`) while the
pair is loaded; with ``models.forward=lean`` both are :class:`~mdv.models.lean.LeanModel`\ s (the engine's
sessions run the lean decoder forward).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from mdv.errors import MissingAssetError
from mdv.sweep.config import ForwardKind, LinearsKind, ModelKind, ModelsGroup, enum_value
from mdv.models.tiny_random import build_tiny_random_pair


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
    #: the target's and the draft's PanelPacks, entered for the process's life (models.linears=panels)
    panels: list[Any] = dataclasses.field(default_factory=list)


_MODELS: dict[str, LoadedModels] = {}


def _models_key(m: ModelsGroup) -> str:
    d = dataclasses.asdict(m)
    return json.dumps({k: enum_value(v) for k, v in d.items()}, sort_keys=True)


def check_models_available(m: ModelsGroup) -> None:
    """Raise :class:`~mdv.errors.MissingAssetError` (with the fetch command) when local model files of
    ``m`` are absent; cheap (no loading)."""
    kind = ModelKind(enum_value(m.kind))
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

    kind = ModelKind(enum_value(m.kind))
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
        draft = HFModel(d, tok, name=default_pair.draft_description(d))
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
    panels = []
    if LinearsKind(enum_value(m.linears)) == LinearsKind.panels:
        from mdv.models.panels import PanelPacks

        for model, dtype in ((target, torch.float32), (draft, getattr(torch, m.draft_panel_dtype))):
            panels.append(PanelPacks(model.model, dtype=dtype).__enter__())  # left by reset_model_cache
            model.name = f"{model.name} [linears on {'float16 ' if dtype == torch.float16 else ''}weight panels]"
    if ForwardKind(enum_value(m.forward)) == ForwardKind.lean:
        from mdv.models.lean import LeanModel

        target, draft = LeanModel.of(target), LeanModel.of(draft)  # one clear error for a non-Llama pair
        for model in (target, draft):
            model.name = f"{model.name} [lean forward]"
    loaded = LoadedModels(target, draft, tok, str(target.name), str(draft.name), m.dtype, str(device), panels)
    _MODELS[key] = loaded
    return loaded


def reset_model_cache() -> None:
    """Forget the models loaded by :func:`load_models` (tests; freeing memory between sweeps)."""
    for loaded in _MODELS.values():
        for packs in loaded.panels:
            packs.free()
    _MODELS.clear()
