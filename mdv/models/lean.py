"""A lean decoder forward for Llama-family models: the same math as transformers' layers, far fewer calls.

On a CPU, a decode pass of the default target (30 layers) spends ~20 ms outside its matrix products:
transformers' per-layer modules issue ~200 small torch operations per layer (views, casts, a rotary
``cat`` per head tensor, mask building), and ``DynamicCache`` re-concatenates every layer's keys and
values at every step (~8 ms of ``cat`` per pass at 128 cached tokens).  :class:`LeanSession` runs the
model's own weights and modules through a short loop instead.  Per layer, with x the residual stream
[R, n, d], H query heads, G = H / H_kv, D the head size and ``cos``, ``sin`` transformers' rotary
tables for the pass (computed once by the model's own ``rotary_emb``):

    a = RMSNorm₁(x);   q, k, v = a·W_qᵀ, a·W_kᵀ, a·W_vᵀ        (the model's nn.Linear forwards)
    q, k ← q·cos + swap(q)·sin±,  with swap(z) = [z₂, z₁] and sin± = [-sin₁, sin₂]
    K[:, :, S:S+n], V[:, :, S:S+n] ← k, v                       (a preallocated cache, written in place)
    o = softmax(q·Kᵀ/√D + mask)·V                               (one ``scaled_dot_product_attention``)
    x ← x + o·W_oᵀ;   b = RMSNorm₂(x);   x ← x + (silu(b·W_gᵀ) ⊙ b·W_uᵀ)·W_dᵀ

``swap(z)·sin±`` equals transformers' ``rotate_half(z)·sin`` bit for bit (a sign moved between factors),
and the norms are one fused ``rms_norm`` with the modules' weights (the same bits in float32), so a lean pass
differs from transformers' only in the attention kernel's summation order (measured: p within float32 rounding, see ``tests/test_lean_forward.py``).
For n = 1 the G query heads of each key/value head are attention rows of one head (transformers'
``pack_gqa``); for n > 1 a causal (or token-tree) boolean mask over the cache is passed.

The linears are called through each module's ``forward``, so :class:`~mdv.models.panels.PanelPacks` and
:class:`~mdv.models.packed.LinearPacks` apply unchanged (enter them on the same model).  On PanelPacks the
siblings that read one input (q, k, v; gate, up) run as one kernel call on their fused stream
(:func:`~mdv.models.panels.sibling_product`; the same bits as three or two calls), and when every layer is
on fused panels the whole layer runs in one C call instead (:mod:`mdv.models.lean_layer`; the torch loop,
``LeanSession._torch_layers``, is its reference, equal up to float32 rounding).

The cache is one tensor [layers, 2, R, H_kv, capacity, D]; the session operations are views and slices
of it: ``crop`` sets the length, ``keep`` takes a row view, ``fork`` copies the filled prefix k times,
``keep_nodes`` moves the kept tree path in one ``index_select`` over every layer.  Capacity doubles when
a pass needs more.

:func:`lean_support` says whether a model can run lean (a ``LlamaForCausalLM``-shaped decoder: pre-norm
RMSNorm layers, SiLU gated MLP, rotary attention over the full context); :class:`LeanModel` is an
:class:`~mdv.models.hf.HFModel` whose ``new_session()`` is a :class:`LeanSession` (its ``forward`` and
``next_logprobs``, used by the oracle, stay transformers' own).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.models.hf import HFModel, decoder_stack
from mdv.models.lean_layer import LayerPlan, layer_plan, run_layers
from mdv.models.panels import SIBLING_GROUPS, sibling_product
from mdv.models.session import CacheSessionBase, check_tree_start
from mdv.models.tree import TokenTree

#: decoder layer classes whose forward is exactly the pre-norm Llama layer this module reproduces
LEAN_LAYERS = ("LlamaDecoderLayer",)
_QKV, _GATE_UP = SIBLING_GROUPS
#: cached tokens a fresh session has room for before it first grows (doubling)
_INITIAL_CAPACITY = 256


def lean_support(model: Any) -> str | None:
    """None when ``model`` (a transformers causal LM) can run the lean forward, else why not (one line)."""
    name = type(model).__name__
    try:
        dec = decoder_stack(model, "the lean forward")
    except InvalidInputError as exc:
        return str(exc)
    why = lean_layer_support(dec, getattr(model, "config", None), name)
    if why is not None:
        return why
    if not hasattr(dec, "embed_tokens"):
        return f"the lean forward needs the decoder's embed_tokens; {name} has none"
    if getattr(model, "lm_head", None) is None:
        return f"the lean forward needs an lm_head; {name} has none"
    return None


def lean_layer_support(dec: Any, cfg: Any = None, name: str | None = None) -> str | None:
    """None when the decoder stack ``dec`` (``layers``, ``rotary_emb``; ``cfg`` its config, default
    ``dec.config``) can run the lean forward's layer loop, else why not (one line, naming ``name``)."""
    cfg = getattr(dec, "config", None) if cfg is None else cfg
    name = type(dec).__name__ if name is None else name
    layers = list(getattr(dec, "layers", None) or [])
    if not layers or any(type(layer).__name__ not in LEAN_LAYERS for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers})
        return f"the lean forward runs {', '.join(LEAN_LAYERS)} decoders; {name} has {', '.join(kinds) or 'no layers'}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the lean forward needs a SiLU MLP; {name} uses {cfg.hidden_act!r}"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return f"the lean forward does not split linears (pretraining_tp={cfg.pretraining_tp})"
    if not hasattr(dec, "rotary_emb"):
        return f"the lean forward needs the decoder's rotary_emb; {name} has none"
    if getattr(cfg, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return f"the lean forward computes attention like sdpa/eager; {name} is set to {cfg._attn_implementation!r}"
    return None


def check_lean(model: Any) -> None:
    """One :class:`InvalidInputError` when ``model`` cannot run the lean forward (:func:`lean_support`)."""
    why = lean_support(model)
    if why is not None:
        raise InvalidInputError(f"{why}; run it on transformers' own forward instead (models.forward=hf)")


def _rms_norm(norm: torch.nn.Module, x: Tensor) -> Tensor:
    """transformers' ``LlamaRMSNorm(x) = w · x / sqrt(mean(x²) + ε)`` as one fused op in float32 (the same
    bits as the module's five, checked in the tests); other dtypes take the module (it upcasts)."""
    w = norm.weight
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, norm.variance_epsilon)
    return norm(x)


class LeanModel(HFModel):
    """An :class:`HFModel` whose decoding sessions run the lean forward (:class:`LeanSession`).

    ``LeanModel(model, tokenizer)`` like an HFModel, or :meth:`of` an existing HFModel (same torch
    module, no copy).  ``forward`` and ``next_logprobs`` (the exact oracle's full passes) are transformers'."""

    def __init__(self, model: Any, tokenizer: Any = None, name: str | None = None):
        super().__init__(model, tokenizer, name)
        check_lean(self.model)

    @classmethod
    def of(cls, hf: HFModel) -> "LeanModel":
        """The lean view of ``hf`` (sharing its module and tokenizer)."""
        if isinstance(hf, LeanModel):
            return hf
        return cls(hf.model, hf.tokenizer, name=hf.name)

    def new_session(self) -> "LeanSession":  # type: ignore[override]
        return LeanSession(self)

    def __repr__(self) -> str:
        return super().__repr__().replace("HFModel(", "LeanModel(", 1)


class LeanSession(CacheSessionBase):
    """One sequence decoded by a :class:`LeanModel` (a :class:`~mdv.models.session.DecodeSession` with
    token trees and feature recording, like :class:`~mdv.models.hf.HFSession`)."""

    supports_tree = True

    def __init__(self, lm: LeanModel):
        self.hf = lm
        self._setup(decoder_stack(lm.model, "the lean forward"), lm.config, lm.device, lm.dtype)
        self._lm_head = lm.model.lm_head

    def _setup(self, dec: Any, cfg: Any, device: torch.device, dtype: torch.dtype) -> None:
        """The layer loop's state for the decoder stack ``dec`` (its ``layers`` and ``rotary_emb``): an
        empty single-row cache."""
        self._dec = dec
        self._layers = list(dec.layers)
        attn = self._layers[0].self_attn
        self._heads = int(cfg.num_attention_heads)
        self._kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self._heads)
        self._head_dim = int(attn.head_dim)
        self._scale = float(attn.scaling)
        self._device = device
        self._dtype = dtype
        self._kv: Tensor | None = None  # [layers, 2, R, H_kv, capacity, D]
        self._rows = 1
        self._length = 0
        self._tree: TokenTree | None = None
        self._c_plan: LayerPlan | None = None  # the C layers' structs for the PanelPacks block in use
        #: as HFSession: every pass keeps the last decoder layer's output [R, n, d] in ``last_features``
        self.record_features = False
        self.last_features: Tensor | None = None

    # ------------------------------------------------------------------ state
    @property
    def capacity(self) -> int:
        """Cached tokens the cache has room for before it grows."""
        return 0 if self._kv is None else int(self._kv.shape[4])

    def _reserve(self, need: int) -> None:
        """Room for ``need`` cached tokens in every row (doubling; the filled prefix is copied)."""
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity, _INITIAL_CAPACITY)
        shape = (len(self._layers), 2, self._rows, self._kv_heads, cap, self._head_dim)
        kv = torch.empty(shape, dtype=self._dtype, device=self._device)
        if self._kv is not None and self._length:
            kv[..., :self._length, :] = self._kv[..., :self._length, :]
        self._kv = kv

    # ------------------------------------------------------------------ the forward pass
    def _forward(self, ids: Tensor, positions: Tensor, allowed: Tensor | None, last_only: bool) -> Tensor:
        """ids, positions: [R, n]; allowed: None (causal) or a boolean mask [1, 1, n, S + n] over the
        cache and the new tokens.  Writes the new keys and values at S..S+n-1 and returns logits [R, n', V]
        (n' = 1 with ``last_only``).  The cache lives in inference mode (written in place by every pass);
        a caller outside it gets ordinary tensors (copies)."""
        if torch.is_inference_mode_enabled():
            return self._pass(ids, positions, allowed, last_only)
        with torch.inference_mode():
            logits = self._pass(ids, positions, allowed, last_only)
        if self.last_features is not None:
            self.last_features = self.last_features.clone()
        return logits.clone()

    def _pass(self, ids: Tensor, positions: Tensor, allowed: Tensor | None, last_only: bool) -> Tensor:
        x = self._run_layers(self._dec.embed_tokens(ids), positions, allowed)  # [R, n, d]
        self.last_features = x if self.record_features else None
        h = _rms_norm(self._dec.norm, x[:, -1:] if last_only else x)
        return self._lm_head(h)

    def _run_layers(self, x: Tensor, positions: Tensor, allowed: Tensor | None) -> Tensor:
        """The decoder layers over the inputs x [R, n, d] at ``positions`` [R, n] (``allowed``: as
        :meth:`_forward`), through the cache -> the last layer's output [R, n, d]."""
        n = x.shape[1]
        S = self._length
        self._reserve(S + n)
        kv = self._kv
        assert kv is not None
        cos, sin = self._dec.rotary_emb(x, positions)  # [R, n, D]
        if n == 1:
            mask = None  # one query sees the whole cache
        elif allowed is None:  # new token i sees the cache and new tokens 0..i
            mask = torch.ones(n, S + n, dtype=torch.bool, device=self._device).tril_(S)
        else:
            mask = allowed[0, 0]  # [n, S + n]
        plan = None
        if x.dtype == torch.float32 and x.device.type == "cpu":  # every layer on fused panels: one C call each
            plan = self._c_plan = layer_plan(self._layers, self._heads, self._kv_heads, self._head_dim, self._scale,
                                             self._c_plan)
        if plan is not None:
            x = run_layers(plan, x, cos, sin, mask, kv, S)
        else:
            x = self._torch_layers(x, cos, sin, mask, kv, S)
        self._length = S + n
        return x

    def _torch_layers(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv: Tensor, S: int) -> Tensor:
        """The decoder layers as torch operations (the C layers' reference): x [R, n, d], cos and sin [R, n, D],
        mask None (n = 1) or bool [n, S + n]; writes the pass's keys and values into kv at S..S+n-1."""
        R, n, _ = x.shape
        H, Hkv, D = self._heads, self._kv_heads, self._head_dim
        G = H // Hkv
        half = D // 2
        # sin± = [-sin₁, sin₂] so that swap(z)·sin± == rotate_half(z)·sin (module docstring)
        sin_signed = torch.cat((-sin[..., :half], sin[..., half:]), -1).unsqueeze(2)  # [R, n, 1, D]
        cos = cos.unsqueeze(2)  # [R, n, 1, D]
        if mask is not None and G > 1:  # queries packed as G·n rows per key/value head (head-major within a group)
            mask = mask.repeat(G, 1)  # [G·n, S + n]
        for i, layer in enumerate(self._layers):
            attn, mlp = layer.self_attn, layer.mlp
            a = _rms_norm(layer.input_layernorm, x)
            qkv = sibling_product(attn, _QKV, a)  # one call on PanelPacks' fused stream, else None
            q, k, v = qkv if qkv is not None else (attn.q_proj.forward(a), attn.k_proj.forward(a), attn.v_proj.forward(a))
            q, k, v = q.view(R, n, H, D), k.view(R, n, Hkv, D), v.view(R, n, Hkv, D)
            q = q * cos + torch.cat((q[..., half:], q[..., :half]), -1) * sin_signed
            k = k * cos + torch.cat((k[..., half:], k[..., :half]), -1) * sin_signed
            keys, values = kv[i, 0], kv[i, 1]  # [R, H_kv, capacity, D]
            keys[:, :, S:S + n].copy_(k.transpose(1, 2))
            values[:, :, S:S + n].copy_(v.transpose(1, 2))
            # [R, n, H, D] -> [R, H_kv, G·n, D]: the G query heads of a key/value head as rows of one head
            qg = q.view(R, n, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(R, Hkv, G * n, D)
            o = F.scaled_dot_product_attention(qg, keys[:, :, :S + n], values[:, :, :S + n], attn_mask=mask,
                                               scale=self._scale)  # [R, H_kv, G·n, D]
            o = o.view(R, Hkv, G, n, D).permute(0, 3, 1, 2, 4).reshape(R, n, H * D)
            x = x + attn.o_proj.forward(o)
            b = _rms_norm(layer.post_attention_layernorm, x)
            gate_up = sibling_product(mlp, _GATE_UP, b)
            gate, up = gate_up if gate_up is not None else (mlp.gate_proj.forward(b), mlp.up_proj.forward(b))
            x = x + mlp.down_proj.forward(F.silu(gate) * up)
        return x

    # ------------------------------------------------------------------ DecodeSession
    def _positions(self, R: int, n: int) -> Tensor:
        return torch.arange(self._length, self._length + n, dtype=torch.long, device=self._device).expand(R, n)

    def prefill(self, tokens: Sequence[int]) -> None:
        """Process a prompt in the single row (no scores returned)."""
        ids = self._prompt_ids(tokens)
        if ids is not None:
            self._forward(ids.to(self._device), self._positions(1, ids.shape[1]), None, last_only=True)

    def extend(self, tokens: Tensor) -> Tensor:
        """tokens: [R, n] -> logits [R, n, V] after each new token."""
        self._check_extend(tokens)
        self.hf._check_ids(tokens)  # an embedding lookup out of range is a bare IndexError
        R, n = tokens.shape
        return self._forward(tokens.long().to(self._device), self._positions(R, n), None, last_only=False)

    def fork(self, k: int) -> None:
        """One row -> k identical rows (the filled prefix copied k times)."""
        self._check_fork(k)
        if k > 1 and self._kv is not None:
            old, S = self._kv, self._length
            shape = list(old.shape)
            shape[2] = k
            with torch.inference_mode():
                self._kv = torch.empty(shape, dtype=old.dtype, device=old.device)
                self._kv[..., :S, :] = old[:, :, :1, :, :S]
        self._rows = k

    def keep(self, row: int) -> None:
        """Keep one row (a view of the cache; no copy)."""
        self._check_keep(row)
        if self._rows > 1 and self._kv is not None:
            self._kv = self._kv[:, :, row:row + 1]
        self._rows = 1

    def crop(self, length: int) -> None:
        """Forget every token past ``length``; a pending token tree is dropped."""
        self._check_crop(length)
        self._tree = None
        self._length = length

    def extend_tree(self, tree: TokenTree) -> Tensor:
        """Score the nodes of ``tree`` in the single row -> logits [n, V] (as HFSession.extend_tree: each
        node sees the cache, its ancestors and itself, at position ``length + depth``)."""
        check_tree_start(self._rows, self._tree)
        ids = torch.tensor([tree.ids], dtype=torch.long)  # [1, n]
        self.hf._check_ids(ids)
        past = self._length
        pos = (past + torch.tensor(tree.depth, dtype=torch.long, device=self._device)).unsqueeze(0)  # [1, n]
        allowed = tree.attention_mask(past, self._device)  # [1, 1, n, past + n] bool
        logits = self._forward(ids.to(self._device), pos, allowed, last_only=False)[0]  # [n, V]
        self._length = past  # the nodes stay in the cache past `length` until keep_nodes / crop
        self._tree = tree
        return logits

    def keep_nodes(self, nodes: Sequence[int]) -> None:
        """Keep the cached prefix plus the tree nodes ``nodes`` (a path from the root), in that order."""
        if self._tree is None:
            raise InvalidInputError("keep_nodes() needs a tree scored by extend_tree() first")
        nodes = self._tree.check_path(nodes)
        past, keep = self._length, len(nodes)
        if nodes != list(range(keep)) and self._kv is not None:  # move the kept path right after the prefix
            idx = torch.tensor(nodes, dtype=torch.long, device=self._device) + past
            with torch.inference_mode():
                self._kv[..., past:past + keep, :] = self._kv.index_select(-2, idx)
        self._length = past + keep
        self._tree = None


class LeanLayerSession(LeanSession):
    """The lean forward's layer loop and KV cache over a decoder stack of someone's own, without token
    embeddings or a head: inputs are vectors x [R, n, d] and the output is the last layer's [R, n, d].  What a
    drafter with decoder layers of its own runs (``eagle``: one Llama layer over its fused inputs z_j, in place
    of transformers' forward and ``DynamicCache``); the same loop, the same C layers on PanelPacks, and
    ``fork``, ``keep`` and ``crop`` as :class:`LeanSession`.  ``dec``: a transformers base model (``layers``,
    ``rotary_emb``) that :func:`lean_layer_support` accepts."""

    supports_tree = False

    def __init__(self, dec: Any) -> None:  # no LeanModel: nothing to embed or score
        why = lean_layer_support(dec)
        if why is not None:
            raise InvalidInputError(why)
        param = next(dec.parameters())
        self._setup(dec, dec.config, param.device, param.dtype)

    def run(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [R, n, d] at ``positions`` [R, n] (the cache's length on: causal over the cache and the new
        inputs) -> the last layer's output [R, n, d]."""
        R, n = positions.shape
        if x.dim() != 3 or x.shape[:2] != (R, n) or R != self._rows or int(positions[0, 0]) != self._length:
            raise InvalidInputError(f"run() takes x [rows={self._rows}, n, d] at positions {self._length}.. ; got x"
                                    f" {tuple(x.shape)} at {int(positions[0, 0])}..")
        if torch.is_inference_mode_enabled():
            return self._run_layers(x, positions, None)
        with torch.inference_mode():
            return self._run_layers(x, positions, None).clone()
