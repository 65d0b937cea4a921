"""Linear layers on MKL-packed weights: a faster CPU target pass for the small batches speculative decoding uses.

A pass over n new tokens multiplies the [M, d_in] activations (M = rows x n) by every [d_out, d_in] linear
weight.  For the small M of a decode step (1) or a verification pass (L + 1, K·L + 1) MKL's general
product spends most of its time re-blocking the weight on every call: on the default target 81% of an
n = 9 pass is ``aten::mm`` and a [9 x 576] · [576 x 1536] product runs at half the GEMM peak.
``cblas_sgemm_pack`` does that re-blocking once, for one M (exposed by torch as
``torch.ops.mkl._mkl_reorder_linear_weight`` / ``torch.ops.mkl._mkl_linear``, the kernels torch's
inductor uses for frozen CPU linears).  A pack serves only the M it was made for, so a pass with M rows
is padded to the next packed size of a ladder ``sizes``::

    M' = min{m in sizes : m >= M},    y = (pad(x, M') · W_pack(M'))[:M] + b

The rows of a linear map are independent, so the first M rows are x · Wᵀ + b up to float32 rounding (the
kernel sums in another order: max |Δp| ~ 1e-6 on the default target); zero rows cost compute but no
weight traffic, and a pass is bandwidth-bound at these M.  M above every size, or a pass under autograd,
takes ``F.linear`` (the reference).  The packs cost memory: on the default target 2.7 GB per size, 5.1x its
538 MB of weights (MKL's packed layout; small layers have a floor of ~8 MB each).

Use (float32 CPU models only)::

    packs = LinearPacks(model, sizes=(1, 9, 33))   # packs every nn.Linear once (~1 s per size on 538 MB)
    with packs:                                     # the model's linears run on the packs inside
        ...
    packs.free()

The model's module tree, parameters and ``state_dict`` are untouched: inside the block each linear's
``forward`` is an instance attribute (removed on exit).
"""
from __future__ import annotations

import math
import time
import types
from abc import ABC, abstractmethod
from contextlib import ExitStack
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from mdv.errors import InvalidInputError


def mkl_packing_available() -> bool:
    """True when this torch build has MKL and its packed-GEMM linear ops."""
    return (bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear")
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight"))


def check_float32_cpu(weights: Sequence[Tensor]) -> None:
    """One clear error unless every weight is float32 on the CPU (the only weights either kind of pack serves)."""
    bad = {(str(w.dtype).removeprefix("torch."), w.device.type) for w in weights} - {("float32", "cpu")}
    if bad:
        raise InvalidInputError(f"packed linears are for float32 models on the CPU; this model has linears in"
                                f" {sorted(bad)}: run without packing, or load it in float32 on the CPU")


def float32_cpu_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``nn.Linear`` layers of ``model``, or one clear error when it has none or they are not float32 on
    the CPU."""
    mods = [m for m in model.modules() if type(m) is torch.nn.Linear]
    if not mods:
        raise InvalidInputError(f"{type(model).__name__} has no nn.Linear layers to pack")
    check_float32_cpu([m.weight for m in mods])
    return mods


def check_packable(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``nn.Linear`` layers of ``model``, or one clear error when MKL cannot pack them (no MKL, none,
    or not float32 on the CPU)."""
    if not mkl_packing_available():
        raise InvalidInputError("packed linears need a torch build with MKL (torch.backends.mkl.is_available()"
                                " is False here); run without packing")
    return float32_cpu_linears(model)


def check_pack_sizes(sizes: Any) -> tuple[int, ...]:
    """The ladder of packed batch sizes, sorted and deduplicated; one clear error for anything else."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) == 0:
        raise InvalidInputError(f"pack sizes must be a non-empty list of integers >= 1 (e.g. [1, 9, 33]); got {sizes!r}")
    out = set()
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise InvalidInputError(f"pack sizes must be integers >= 1 (rows x new tokens of a pass); got {sizes!r}")
        out.add(int(s))
    return tuple(sorted(out))


def padded_size(rows: int, sizes: Sequence[int]) -> int | None:
    """The smallest packed size >= rows (``sizes`` sorted), or None when rows exceeds them all."""
    for s in sizes:
        if s >= rows:
            return s
    return None


def _mkl_linear(x: Tensor, pack: Tensor, weight: Tensor, bias: Tensor | None, size: int) -> Tensor:
    """MKL's packed sgemm: x [size, d_in] · the pack of weight [d_out, d_in] (+ bias) -> [size, d_out]."""
    return torch.ops.mkl._mkl_linear(x, pack, weight, bias, size)


def rung_for(rows: int, rungs: Sequence[int]) -> int:
    """The rows to pack for a pass of ``rows``: the smallest rung at or above it, else ``rows`` itself.
    Rungs skip the sizes at which MKL's packed sgemm is slow: measured on this project's CPU (torch 2.13,
    1 thread, default target) packs for 3 and 5-7 rows run 1.0-1.7x the plain pass, for 4 and from 8 up
    0.55-0.76x (``experiments.bench benchmarks=[pass_limit] pass_limit.packed=true``)."""
    return min((r for r in rungs if r >= rows), default=rows)


def packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None, packs: dict[int, Tensor],
                  sizes: Sequence[int]) -> Tensor:
    """``F.linear(x, weight, bias)`` through the pack of the next size >= the rows of x (module docstring).

    x: [..., d_in]; weight: [d_out, d_in]; packs: size -> the weight packed for that many rows.
    -> [..., d_out]."""
    lead = x.shape[:-1]
    rows = math.prod(lead)
    size = padded_size(rows, sizes)
    if size is None or torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return F.linear(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1])  # [M, d_in]
    if size > rows:
        x2 = F.pad(x2, (0, 0, 0, size - rows))  # [M', d_in], zero rows
    y = _mkl_linear(x2.contiguous(), packs[size], weight, bias, size)  # [M', d_out]
    return y[:rows].reshape(*lead, y.shape[-1])


def _packed_forward(self: torch.nn.Linear, x: Tensor) -> Tensor:
    return packed_linear(x, self.weight, self.bias, self._mdv_packs, self._mdv_pack_sizes)


class LinearForwards(ABC):
    """The shared life cycle of prepared ``nn.Linear`` weights: ``with obj:`` gives each prepared layer its
    own ``forward`` (an instance attribute, removed on exit), ``free()`` drops what was prepared.

    Subclasses fill ``self._packs`` with (layer, what was prepared for it) and define ``_install`` (set the
    layer's method named by ``_method`` -- ``forward`` unless overridden -- and the attributes in ``_attrs``)."""

    _attrs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._packs: list[tuple[torch.nn.Module, Any]] = []
        self._active = False

    @abstractmethod
    def _install(self, m: torch.nn.Module, pack: Any) -> None:
        """Give ``m`` its replaced method and the attributes it reads."""

    def _method(self, m: torch.nn.Module) -> str:
        """The name of the method of ``m`` that the block replaces."""
        return "forward"

    def __enter__(self) -> "LinearForwards":
        if self._active:
            raise InvalidInputError(f"these {type(self).__name__} are already in use (their blocks do not nest)")
        if not self._packs:
            raise InvalidInputError(f"these packs were freed; build new {type(self).__name__}")
        for m, _ in self._packs:
            if self._method(m) in m.__dict__:
                raise InvalidInputError(f"a linear of this model already has its own {self._method(m)} ({type(m).__name__});"
                                        " another LinearPacks or PanelPacks block is open on it")
        for m, pack in self._packs:
            self._install(m, pack)
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        for m, _ in self._packs:
            for attr in (self._method(m), *self._attrs):
                m.__dict__.pop(attr, None)
        self._active = False

    def free(self) -> None:
        """Drop the packs (their memory); the object cannot be entered again."""
        if self._active:
            self.__exit__()
        self._packs = []


class LinearPacks(LinearForwards):
    """Every ``nn.Linear`` of ``model`` packed for each batch size of ``sizes``; ``with packs:`` runs the
    model's linears on them (module docstring).

    Attributes: ``sizes`` (the sorted ladder), ``linears`` (how many layers were packed), ``pack_bytes``
    (the memory the packs hold), ``weight_bytes`` (the packed layers' own weights), ``pack_seconds``."""

    _attrs = ("_mdv_packs", "_mdv_pack_sizes")

    def __init__(self, model: torch.nn.Module, sizes: Sequence[int]):
        super().__init__()
        self.sizes = check_pack_sizes(sizes)
        mods = check_packable(model)
        t0 = time.perf_counter()
        with torch.no_grad():
            for m in mods:
                w = m.weight.detach()
                self._packs.append((m, {s: torch.ops.mkl._mkl_reorder_linear_weight(w, s) for s in self.sizes}))
        self.pack_seconds = time.perf_counter() - t0
        self.linears = len(mods)
        self.weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in mods)
        self.pack_bytes = sum(p.numel() * p.element_size() for _, d in self._packs for p in d.values())

    def _install(self, m: torch.nn.Linear, pack: Any) -> None:
        m._mdv_packs, m._mdv_pack_sizes = pack, self.sizes
        m.forward = types.MethodType(_packed_forward, m)

    def __repr__(self) -> str:
        return (f"LinearPacks(sizes={list(self.sizes)}, linears={self.linears}, pack_bytes={self.pack_bytes / 1e6:.3g} MB"
                f" for {self.weight_bytes / 1e6:.3g} MB of weights)")


class PacksTogether:
    """Several packs entered and left together (``with obj:``); ``free()`` frees them all."""

    def __init__(self, *packs: Any):
        self.packs = packs
        self._stack: ExitStack | None = None

    def __enter__(self) -> "PacksTogether":
        self._stack = ExitStack()
        for p in self.packs:
            self._stack.enter_context(p)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def free(self) -> None:
        for p in self.packs:
            p.free()
