"""``layerskip``: the target's own first ``depth`` decoder layers, then its final norm and output head
(self-speculative decoding, no training; Elhoushi et al. 2024, "LayerSkip", and Zhang et al. 2024,
"Draft & Verify", draft with a shallow exit of the target).

The draft law is ``q(. | c) = T(softmax(W_head · norm(h_depth(c))))``, ``h_depth`` the hidden state
after layer ``depth`` of the target at the last position of c, T the sampling transform.  The drafting
model is a *view* of the target that shares every weight (no copy; its own config says ``depth``
layers, so its KV cache holds ``depth`` layers); it then drafts exactly as the ``model`` drafter does,
with its own cache.  :meth:`LayerSkipDrafter.reference_law` instead runs the *full* target with
``output_hidden_states`` and applies norm and head to ``hidden_states[depth]``: the same law computed
another way.  Needs a transformers decoder with ``get_decoder().layers`` and ``.norm`` (Llama, Qwen,
Mistral, SmolLM, ...), wrapped in :class:`~mdv.models.hf.HFModel`.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import Tensor

from mdv.drafters.model import ModelDrafter
from mdv.drafters.registry import register_drafter
from mdv.errors import InvalidInputError
from mdv.models.sampling import SamplingConfig


def _decoder(model: Any) -> Any:
    """The decoder stack (with ``.layers`` and ``.norm``) of a transformers causal LM, or an error."""
    from mdv.models.hf import decoder_stack

    return decoder_stack(model, "drafter 'layerskip'")


def truncated_view(model: Any, depth: int) -> Any:
    """A shallow copy of the transformers causal LM ``model`` whose decoder runs only its first ``depth``
    layers; every parameter is shared with ``model``, the config is a copy with ``depth`` layers."""
    dec = _decoder(model)
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = depth
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:depth]
    dec_view = copy.copy(dec)
    dec_view._modules = dict(dec._modules)  # a module's children live in _modules: copy the dict, not them
    dec_view.layers = torch.nn.ModuleList(list(dec.layers)[:depth])
    dec_view.config = cfg
    view = copy.copy(model)
    view._modules = {name: (dec_view if child is dec else child) for name, child in model._modules.items()}
    view.config = cfg
    if not any(child is dec_view for child in view._modules.values()):
        raise InvalidInputError(f"drafter 'layerskip': the decoder of {type(model).__name__} is not a direct child"
                                " module; this architecture is not supported")
    return view


@register_drafter
class LayerSkipDrafter(ModelDrafter):
    """Draft with the target's first ``depth`` layers + its final norm and head (module docstring)."""

    name = "layerskip"

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int):
            raise InvalidInputError(f"layerskip drafter: depth must be an integer; got {depth!r}")
        self.depth = depth
        self.target: Any = None

    def options(self) -> dict[str, Any]:
        return {"depth": self.depth}

    def draft_model(self, target: Any, draft: Any) -> Any:
        from mdv.models.hf import HFModel

        if not isinstance(target, HFModel):
            raise InvalidInputError(f"drafter 'layerskip' needs the target as an mdv.models.HFModel (a transformers"
                                    f" model); got {type(target).__name__}")
        layers = len(_decoder(target.model).layers)
        if layers < 2:
            raise InvalidInputError(f"drafter 'layerskip' needs a target with at least 2 layers (a shallower exit to"
                                    f" draft with); this one has {layers}")
        if not 1 <= self.depth < layers:
            raise InvalidInputError(f"layerskip drafter: depth={self.depth} is outside [1, {layers}) for this target"
                                    f" ({layers} layers); choose 1 <= depth <= {layers - 1}")
        self.target = target
        return HFModel(truncated_view(target.model, self.depth), target.tokenizer,
                       name=f"{target.name} (first {self.depth} of {layers} layers)")

    @torch.inference_mode()
    def reference_law(self, context: Sequence[int], sampling: SamplingConfig,
                      committed: int | None = None) -> Tensor:
        model = self.target.model
        ids = torch.tensor([list(map(int, context))], dtype=torch.long, device=self.target.device)
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[self.depth]
        logits = model.get_output_embeddings()(_decoder(model).norm(hidden[:, -1]))  # [1, V]
        return sampling.probs(logits[0])
