"""The lean forward's fast path: each decoder layer in one C call on PanelPacks' panels.

A torch loop over a Llama layer (:mod:`mdv.models.lean`) issues ~40 small operations, ~0.35-0.5 ms per layer
on a CPU at decode sizes (measured on the default target at n = 1: 14.6 ms of a 52 ms pass outside the
panel products).  ``kernels/lean_layer.c`` runs the same math (its docstring) around the panel products:
RMSNorm, the fused q|k|v product, rotary, the cache write, attention (one query at a time, or from 40
queries per key/value head on as panel products over the packed keys and values: :func:`attention_mode`),
the output product, RMSNorm, the fused gate|up product, SiLU·up, the down product and both residual adds.
It is used when every layer of the model is on :class:`~mdv.models.panels.PanelPacks` with its sibling
groups fused (float32, float16 or int8 panels), the input is float32 on the CPU and no gradient is needed;
otherwise the torch loop runs (the reference, equal up to float32 rounding: ``tests/test_lean_layer.py``).

Measured on the default target at 1 thread (interleaved with the torch loop on the same panels): a pass of
1 new token 48 -> 35 ms, 5 tokens 63-72 -> 55, 13 tokens 96-100 -> 86-88; the float16 draft's step 3.9-4.3 ->
2.7-3.0 ms.  Against a float64 pass the C layers' p is within 1.2e-6 to 7.4e-6, as transformers' own float32
pass (2.6e-6 to 5.9e-6).

:func:`layer_plan` reads the layers' panels once per PanelPacks block (cached on the session by the identity
of the packs); :func:`run_layers` runs a pass.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.models.panels import PANEL, SIBLING_GROUPS, _version_of, load_kernel_library

_QKV, _GATE_UP = SIBLING_GROUPS
#: LeanWeights.weight_kind of each panel dtype (lean_layer.c's WEIGHTS_*)
_WEIGHT_KINDS = {torch.float32: 0, torch.float16: 1, torch.int8: 2}


class LeanWeights(ctypes.Structure):
    """``LeanWeights`` of lean_layer.c: one layer's panels, biases and shapes."""

    _fields_ = [("ln1", ctypes.c_void_p), ("ln2", ctypes.c_void_p), ("eps", ctypes.c_float),
                ("qkv", ctypes.c_void_p), ("qkv_b", ctypes.c_void_p), ("qkv_n", ctypes.c_int),
                ("o", ctypes.c_void_p), ("o_b", ctypes.c_void_p), ("o_n", ctypes.c_int),
                ("gu", ctypes.c_void_p), ("gu_b", ctypes.c_void_p), ("gu_n", ctypes.c_int),
                ("down", ctypes.c_void_p), ("down_b", ctypes.c_void_p), ("down_n", ctypes.c_int),
                ("weight_kind", ctypes.c_int), ("k_off", ctypes.c_int), ("v_off", ctypes.c_int), ("up_off", ctypes.c_int),
                ("d", ctypes.c_int), ("H", ctypes.c_int), ("Hkv", ctypes.c_int), ("D", ctypes.c_int),
                ("ffn", ctypes.c_int), ("scale", ctypes.c_float)]


class LeanPass(ctypes.Structure):
    """``LeanPass`` of lean_layer.c: what a pass's layers share."""

    _fields_ = [("R", ctypes.c_int), ("n", ctypes.c_int), ("S", ctypes.c_int),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("mask", ctypes.c_void_p),
                ("row_stride", ctypes.c_long), ("head_stride", ctypes.c_long),
                ("work", ctypes.c_void_p), ("threads", ctypes.c_int)]


def _kernel() -> Any:
    lib = load_kernel_library()
    fn = lib.lean_layer
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(LeanWeights), ctypes.POINTER(LeanPass), ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    work = lib.lean_layer_work_floats
    work.argtypes = [ctypes.c_int] * 13
    work.restype = ctypes.c_long
    return fn, work


#: the C layers' attention (lean_layer.c's ATTENTION_*): "tiled" packs each key/value head's keys and values as
#: panels and runs the scores and the weighted values as panel products; "per_query" runs one query at a time
#: (its reference); "auto" the tiled one where a key/value head has >= 40 queries (G·n; n >= 14 on the default
#: target), the per-query one below, where packing costs more than it saves.  A 1-token pass always runs per
#: query.  The two agree up to float32 rounding (tests/test_lean_layer.py).
ATTENTIONS = ("auto", "tiled", "per_query")


def attention_mode(request: str | None = None) -> str:
    """The attention mode of the C layers (:data:`ATTENTIONS`); with ``request`` it is set first, for every
    later pass in this process.  One clear error for an unknown name."""
    fn = load_kernel_library().lean_attention_mode
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    if request is not None and request not in ATTENTIONS:
        raise InvalidInputError(f"attention must be one of {', '.join(ATTENTIONS)}; got {request!r}")
    return ATTENTIONS[fn(-1 if request is None else ATTENTIONS.index(request))]


@contextlib.contextmanager
def forced_attention(request: str) -> Iterator[str]:
    """``with forced_attention("per_query"):`` runs the C layers' attention that way, then restores the mode."""
    before = attention_mode()
    try:
        yield attention_mode(request)
    finally:
        attention_mode(before)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class LayerPlan:
    """The C structs of every layer of one PanelPacks block, the tensors they point into, and the weights
    whose in-place version must not change (a changed weight means stale panels: the torch loop then runs
    and the layer's own forward raises)."""

    def __init__(self, key: tuple[int, ...], weights: list[LeanWeights], keep: list[Any], watched: list[tuple[Tensor, int]],
                 shapes: dict[str, int]):
        self.key, self.weights, self._keep, self.watched, self.shapes = key, weights, keep, watched, shapes
        self.kernel, self.work_floats = _kernel()

    def fresh(self) -> bool:
        return all(_version_of(w) == v for w, v in self.watched)


def _plan_key(layers: Sequence[torch.nn.Module]) -> tuple[int, ...] | None:
    """Identity of the panels every layer runs on (None when some layer is not fully on fused panels)."""
    key = []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        sa, sm = attn.__dict__.get("_mdv_siblings"), mlp.__dict__.get("_mdv_siblings")
        if not sa or _QKV not in sa or not sm or _GATE_UP not in sm:
            return None
        o, down = attn.o_proj.__dict__.get("_mdv_panels"), mlp.down_proj.__dict__.get("_mdv_panels")
        if o is None or down is None:
            return None
        key += [id(sa[_QKV][0]), id(sm[_GATE_UP][0]), id(o), id(down)]
    return tuple(key)


def layer_plan(layers: Sequence[torch.nn.Module], H: int, Hkv: int, D: int, scale: float,
               cached: LayerPlan | None) -> LayerPlan | None:
    """The plan for ``layers`` when all of them can run in C now (module docstring), else None; ``cached``
    is returned when it is for the same panels."""
    key = _plan_key(layers)
    if key is None:
        return None
    if cached is not None and cached.key == key:
        return cached if cached.fresh() else None
    weights: list[LeanWeights] = []
    keep: list[Any] = []
    watched: list[tuple[Tensor, int]] = []
    dtypes = set()
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, qkv_b, qkv_layers, qkv_pad, qkv_widths = attn._mdv_siblings[_QKV]
        gu, gu_b, gu_layers, gu_pad, gu_widths = mlp._mdv_siblings[_GATE_UP]
        o, down = attn.o_proj._mdv_panels, mlp.down_proj._mdv_panels
        ln1, ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        if (qkv_widths != [H * D, Hkv * D, Hkv * D] or ln1.dtype != torch.float32 or ln2.dtype != torch.float32
                or getattr(layer.input_layernorm, "variance_epsilon", None) is None
                or getattr(layer.post_attention_layernorm, "variance_epsilon", None) != layer.input_layernorm.variance_epsilon):
            return None
        dtypes |= {qkv.dtype, gu.dtype, o.dtype, down.dtype}
        for m in (*qkv_layers, *gu_layers, attn.o_proj, mlp.down_proj):
            version = m._mdv_panel_version
            if version is not None:
                watched.append((m.weight, version))
        o_b, down_b = attn.o_proj._mdv_panel_bias, mlp.down_proj._mdv_panel_bias
        ln1c, ln2c = ln1.detach().contiguous(), ln2.detach().contiguous()
        keep += [ln1c, ln2c]
        weights.append(LeanWeights(
            ln1=ln1c.data_ptr(), ln2=ln2c.data_ptr(), eps=float(layer.input_layernorm.variance_epsilon),
            qkv=qkv.data_ptr(), qkv_b=_ptr(qkv_b), qkv_n=qkv.shape[0] * PANEL,
            o=o.data_ptr(), o_b=_ptr(o_b), o_n=o.shape[0] * PANEL,
            gu=gu.data_ptr(), gu_b=_ptr(gu_b), gu_n=gu.shape[0] * PANEL,
            down=down.data_ptr(), down_b=_ptr(down_b), down_n=down.shape[0] * PANEL,
            weight_kind=_WEIGHT_KINDS[qkv.dtype], k_off=qkv_pad[0], v_off=qkv_pad[0] + qkv_pad[1], up_off=gu_pad[0],
            d=ln1.numel(), H=H, Hkv=Hkv, D=D, ffn=gu_widths[0], scale=scale))
    if len(dtypes) != 1:  # one panel dtype per model (PanelPacks packs a model in one dtype)
        return None
    w0 = weights[0]
    shapes = {"d": w0.d, "qkv_n": max(w.qkv_n for w in weights), "o_n": max(w.o_n for w in weights),
              "gu_n": max(w.gu_n for w in weights), "down_n": max(w.down_n for w in weights),
              "ffn": max(w.ffn for w in weights), "H": H, "Hkv": Hkv, "D": D}
    return LayerPlan(key, weights, keep, watched, shapes)


def run_layers(plan: LayerPlan, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv: Tensor, S: int) -> Tensor:
    """x [R, n, d] float32 -> the residual stream after every layer (x is updated in place); cos, sin
    [R, n, D]; mask None (n = 1) or bool [n, S + n]; kv the session's cache [layers, 2, R, H_kv, cap, D],
    whose positions S..S+n-1 get the pass's keys and values."""
    R, n, d = x.shape
    x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    m = None if mask is None else mask.to(torch.uint8).contiguous()
    threads = torch.get_num_threads()
    sh = plan.shapes
    work = torch.empty(plan.work_floats(R * n, sh["d"], sh["qkv_n"], sh["o_n"], sh["gu_n"], sh["down_n"], sh["H"], sh["D"],
                                        sh["ffn"], S + n, threads, R, sh["Hkv"]), dtype=torch.float32)
    step = LeanPass(R=R, n=n, S=S, cos=cos.data_ptr(), sin=sin.data_ptr(), mask=_ptr(m),
                    row_stride=kv.stride(2), head_stride=kv.stride(3), work=work.data_ptr(), threads=threads)
    assert kv.stride(4) == kv.shape[5] and kv.stride(5) == 1, "the cache's positions are contiguous rows of D"
    ref = ctypes.byref(step)
    xp = x.data_ptr()
    for i, w in enumerate(plan.weights):
        rc = plan.kernel(xp, ctypes.byref(w), ref, kv[i, 0].data_ptr(), kv[i, 1].data_ptr())
        if rc != 0:  # the plan checked every shape; this is a bug, not bad input
            raise RuntimeError(f"lean_layer refused layer {i} (code {rc})")
    return x
