"""Linear layers on panel-packed weights: a target pass that reads its weights at the memory bandwidth.

MKL's sgemm runs the few-row products of a decode step (M = 1) or a verification pass (M = L + 1,
K·L + 1) far below both machine limits: on the default target at M = 9 the 49,152-row head streams its
113 MB at 3–4 GB/s against 16 GB/s of read bandwidth (``experiments.bench benchmarks=[pass_limit]``).
Here every weight W [N, K] is repacked once into panels of 16 output columns,

    P[p, k, c] = W[16 p + c, k]            P: [ceil(N / 16), K, 16]   (zero columns pad the last panel)

and a small C kernel (``kernels/panel_linear.c``, AVX2 + FMA, OpenMP over panels at torch's thread
count) computes ``y[m, 16 p + c] = sum_k x[m, k] P[p, k, c] (+ b)`` with a 6 x 16 block of y in registers
(the BLIS micro-kernel shape; Goto & van de Geijn, "Anatomy of high-performance matrix multiplication",
ACM TOMS 2008).  For M <= 6 each panel crosses memory once, so a pass costs about its weight bytes over
the bandwidth whatever M; one pack serves every M (unlike MKL's packs, one per M, ~5x the weights each)
and holds as many bytes as the weights.  The rows are independent, so y equals ``F.linear`` up to float32
rounding (sums over k in order; on random weights its error against a float64 product is below MKL's).
On a CPU with AVX-512F the same library runs an AVX-512 kernel (a block of up to 16 rows in registers, so
a panel crosses memory once for n <= 16; same bits as the AVX2 kernel, :func:`panel_isa` chooses).
:class:`PanelPacks` keeps all its panels in one arena on transparent huge pages
(:mod:`mdv.models.hugepages`: no TLB miss every 4 KiB of the stream).

The kernel is compiled on first use with ``gcc`` (``$CC``) into ``$MDV_CACHE/kernels`` (one file per
source and flags; written to a temporary name and renamed, so concurrent processes never see half a
file).  It needs an x86-64 CPU with AVX2 and FMA and a C compiler; :func:`panel_kernel_status` says
whether this machine has them, and :class:`PanelPacks` fails with that reason otherwise.

Use (float32 CPU models only)::

    panels = PanelPacks(model)   # packs every nn.Linear once (~1 s on 538 MB)
    with panels:                 # the model's linears run on the panels inside
        ...
    panels.free()

Outside ``torch.no_grad`` / ``inference_mode`` with a tensor that needs gradients, a layer takes
``F.linear`` (the reference); a weight changed in place after packing raises an error instead of giving
stale results.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time
import types
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from mdv._cbuild import CompileError, build_library, c_compiler
from mdv.errors import InvalidInputError
from mdv.models.hugepages import HugePageArena
from mdv.models.packed import LinearForwards, check_float32_cpu, float32_cpu_linears

PANEL = 16  # output columns per panel: two AVX2 registers of float32, or one AVX-512 register
#: the C sources of mdv's kernel library: the panel products, and the lean forward's decoder layer
#: (mdv.models.lean), which calls them; compiled together into one shared library
_SOURCES = tuple(Path(__file__).with_name("kernels") / name for name in ("panel_linear.c", "lean_layer.c"))
_FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
#: the weight dtypes a panel pack can hold: float32 (the weights as they are), float16 (half the bytes to
#: stream; the same bits as float32 panels for weights that are float16 values already, e.g. a draft shipped
#: in float16, and rounded to float16 otherwise) or int8 (a quarter of the bytes: each output column
#: quantised symmetrically with its own float32 scale, :func:`pack_panels`; for a draft only, whose proposal
#: law is whatever it computes)
PANEL_DTYPES = (torch.float32, torch.float16, torch.int8)
_KERNEL_NAMES = {torch.float32: "panel_linear", torch.float16: "panel_linear_f16", torch.int8: "panel_linear_i8"}
#: extra 16-byte lines an int8 panel carries after its K weight lines: its 16 float32 column scales (64 bytes)
INT8_SCALE_LINES = 4
#: sibling linears of one parent that read the same input in Llama-style decoders (attention's q, k, v; the
#: MLP's gate and up): PanelPacks packs each group as one panel stream, so a caller that knows they share
#: their input (the lean forward) runs them in one kernel call (:func:`sibling_product`); each layer keeps
#: its own forward on its slice of the stream
SIBLING_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _cpu_has_avx2_fma() -> bool:
    try:
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")  # torch's AVX2 level includes FMA
    except Exception:  # older torch: read the flags
        try:
            flags = Path("/proc/cpuinfo").read_text().split()
        except OSError:
            return False
        return "avx2" in flags and "fma" in flags and "f16c" in flags


def panel_kernel_status() -> tuple[bool, str]:
    """(True, "") when the panel kernel can be built and run here, else (False, why and what to do)."""
    if not _cpu_has_avx2_fma():
        return False, "the panel kernel needs an x86-64 CPU with AVX2 and FMA, which this machine lacks; run without panels"
    if c_compiler() is None:
        return False, (f"the panel kernel is compiled on first use, but no C compiler was found"
                       f" ({os.environ.get('CC', 'gcc')!r} is not on PATH): install gcc or set CC, or run without panels")
    return True, ""


@functools.lru_cache(maxsize=1)
def load_kernel_library() -> ctypes.CDLL:
    """mdv's compiled kernel library (compiled on first use, module docstring), or one clear
    :class:`InvalidInputError` saying why it cannot be."""
    ok, why = panel_kernel_status()
    if not ok:
        raise InvalidInputError(why)
    cc = c_compiler()
    assert cc is not None
    try:
        so = build_library("mdv_kernels", _SOURCES, _FLAGS, cc)
    except CompileError as exc:
        raise InvalidInputError(f"compiling the panel kernel with {cc} failed ({exc});"
                                " run without panels, or set CC to a compiler that accepts -mavx2 -mfma -mf16c -fopenmp") from None
    return ctypes.CDLL(str(so))


@functools.lru_cache(maxsize=1)
def load_panel_kernel() -> dict[torch.dtype, Any]:
    """The compiled kernel's functions by panel weight dtype (``panel_linear`` for float32 panels,
    ``panel_linear_f16`` for float16 ones, ``panel_linear_i8`` for int8 ones), or one clear
    :class:`InvalidInputError` saying why they cannot be."""
    lib = load_kernel_library()
    kernels: dict[torch.dtype, Any] = {}
    for dtype, name in _KERNEL_NAMES.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        fn.restype = ctypes.c_int
        kernels[dtype] = fn
    return kernels


#: the panel kernel's instruction sets (kernels/panel_linear.c's PANEL_ISA_*): "auto" runs the AVX-512 kernel
#: where the CPU has AVX-512F and the AVX2 one elsewhere; the two give the same bits (tests/test_panel_linears.py)
PANEL_ISAS = ("auto", "avx2", "avx512")


_isa_request = ["auto"]  # the last request panel_isa passed to the library (this process's setting)


def panel_isa(request: str | None = None) -> str:
    """The kernel the panel products run now, "avx2" or "avx512"; with ``request`` (one of :data:`PANEL_ISAS`)
    it is set first, for every later product in this process (benchmarks time the two side by side, tests
    compare their bits).  One clear error for an unknown name, or for "avx512" on a CPU without AVX-512F."""
    fn = load_kernel_library().panel_isa
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    if request is not None and request not in PANEL_ISAS:
        raise InvalidInputError(f"panel_isa must be one of {', '.join(PANEL_ISAS)}; got {request!r}")
    got = fn(-1 if request is None else PANEL_ISAS.index(request))
    if got < 0:
        raise InvalidInputError("panel_isa='avx512' needs a CPU with AVX-512F, which this machine lacks;"
                                " use 'auto' or 'avx2'")
    if request is not None:
        _isa_request[0] = request
    return PANEL_ISAS[got]


@contextlib.contextmanager
def forced_panel_isa(request: str) -> Iterator[str]:
    """``with forced_panel_isa("avx2") as isa:`` runs the products on that kernel, then restores the
    setting before."""
    before = _isa_request[0]
    try:
        yield panel_isa(request)
    finally:
        panel_isa(before)


def check_panel_dtype(dtype: Any) -> torch.dtype:
    """``dtype`` when panels can hold it (:data:`PANEL_DTYPES`), else one clear error."""
    if dtype not in PANEL_DTYPES:
        raise InvalidInputError(f"panels hold float32, float16 or int8 weights; got dtype={dtype!r}")
    return dtype


def packed_nbytes(weight: Tensor, dtype: torch.dtype) -> int:
    """The bytes :func:`pack_panels` gives ``weight`` [N, K] in ``dtype``, without packing it:
    ceil(N/16) panels of K lines (K + 4 for int8: the scales) of 16 values."""
    n, k = weight.shape
    lines = k + (INT8_SCALE_LINES if check_panel_dtype(dtype) is torch.int8 else 0)
    return -(-n // PANEL) * lines * PANEL * torch.empty((), dtype=dtype).element_size()


def pack_panels(weight: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """weight [N, K] -> panels [ceil(N/16), K, 16] with P[p, k, c] = W[16p + c, k] (zeros past row N), held
    in ``dtype`` (float32, or float16: half the bytes, :data:`PANEL_DTYPES`).

    int8: each row n of W is quantised symmetrically, s_n = max_k |W[n, k]| / 127 (1 for a zero row) and
    W8[n, k] = round(W[n, k] / s_n) in [-127, 127], and the panels are [ceil(N/16), K + 4, 16] int8 whose last
    4 lines hold the panel's 16 scales as float32 bytes (``kernels/panel_linear.c``): the product is
    s_n · Σ_k x_k W8[n, k], i.e. ``F.linear`` with the weight :func:`panel_weight` (within 1/254 of max |W[n]|
    per entry)."""
    n, k = weight.shape
    pad = -n % PANEL
    int8 = check_panel_dtype(dtype) is torch.int8
    w = weight.detach().to(torch.float32 if int8 else dtype)  # int8: quantised below, from float32
    if pad:
        w = torch.cat([w, w.new_zeros(pad, k)])
    if not int8:
        return w.reshape(-1, PANEL, k).transpose(1, 2).contiguous()  # [N'/16, K, 16]
    scale = w.abs().amax(dim=1) / 127.0  # [N'] per output column
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    w8 = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # [N', K]
    lines = w8.reshape(-1, PANEL, k).transpose(1, 2)  # [N'/16, K, 16]
    scale_lines = scale.reshape(-1, PANEL).contiguous().view(torch.int8).reshape(-1, INT8_SCALE_LINES, PANEL)
    return torch.cat([lines, scale_lines], dim=1).contiguous()  # [N'/16, K + 4, 16]


def panel_weight(panels: Tensor, out_features: int) -> Tensor:
    """The float32 weight [out_features, K] that ``panels`` multiply by (the inverse of :func:`pack_panels`;
    for int8 panels the dequantised s_n · W8[n, k])."""
    if panels.dtype is torch.int8:
        lines = panels[:, :-INT8_SCALE_LINES]  # [P, K, 16]
        scale = panels[:, -INT8_SCALE_LINES:].contiguous().view(torch.float32).reshape(-1)  # [P*16]
        w = lines.transpose(1, 2).reshape(-1, lines.shape[1]).to(torch.float32) * scale[:, None]
    else:
        w = panels.transpose(1, 2).reshape(-1, panels.shape[1]).to(torch.float32)
    return w[:out_features]


def panel_linear(x: Tensor, panels: Tensor, bias: Tensor | None, out_features: int) -> Tensor:
    """``F.linear(x, W, b)`` on the panels of W (module docstring).

    x: [..., K] float32 on the CPU; panels: [N'/16, K, 16] float32 or float16, or [N'/16, K + 4, 16] int8
    (:func:`pack_panels`); bias: [N'] float32 (padded like the panels) or None.  -> [..., out_features]
    float32."""
    kernel = load_panel_kernel()[panels.dtype]
    lead = x.shape[:-1]
    k = x.shape[-1]
    n_pad = panels.shape[0] * PANEL
    x2 = x.reshape(-1, k).contiguous()  # [M, K]
    rows = x2.shape[0]
    y = torch.empty(rows, n_pad, dtype=torch.float32)  # [M, N']
    rc = kernel(x2.data_ptr(), panels.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                rows, n_pad, k, torch.get_num_threads())
    if rc != 0:  # pack_panels always pads to whole panels; this is a bug, not bad input
        raise RuntimeError(f"panel_linear kernel refused N = {n_pad} (not a multiple of {PANEL})")
    if n_pad != out_features:
        y = y[:, :out_features]
    return y.reshape(*lead, out_features)


def _version_of(t: Tensor) -> int | None:
    """t's in-place version counter (None for an inference tensor, which has none)."""
    try:
        return int(t._version)
    except RuntimeError:
        return None


def panel_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """The layers of ``model`` PanelPacks runs on panels, with the name of each one's weight: every
    ``nn.Linear`` (``weight``), and every module whose class names a weight in ``panel_weight`` and computes
    ``F.linear(x, that weight)`` in its method ``project`` (the draft's vocabulary-subset head)."""
    out: list[tuple[torch.nn.Module, str]] = []
    for m in model.modules():
        if type(m) is torch.nn.Linear:
            out.append((m, "weight"))
        elif isinstance(getattr(type(m), "panel_weight", None), str) and callable(getattr(m, "project", None)):
            out.append((m, type(m).panel_weight))
    return out


def panel_dtype_of(model: torch.nn.Module) -> torch.dtype | None:
    """The weight dtype of the panels ``model``'s linears run on now (an open :class:`PanelPacks` block on it),
    or None where they run on their own weights.  A drafter that brings linears of its own (``eagle``) packs them
    in the dtype the run gives its draft."""
    for m, _ in panel_layers(model):
        panels = m.__dict__.get("_mdv_panels")
        if panels is not None:
            return panels.dtype
    return None


def _panel_product(self: torch.nn.Module, x: Tensor) -> Tensor:
    """The replaced ``forward`` of an nn.Linear / ``project`` of a subset head: x · Wᵀ (+ b) on the panels."""
    weight = getattr(self, self._mdv_panel_weight)
    bias = getattr(self, "bias", None) if self._mdv_panel_weight == "weight" else None
    if self._mdv_panel_version is not None and _version_of(weight) != self._mdv_panel_version:
        raise InvalidInputError("a packed linear's weight changed after packing (in-place update): its panels are"
                                " stale; leave the PanelPacks block and build new PanelPacks")
    if (x.dtype != torch.float32 or x.device.type != "cpu"
            or torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return F.linear(x, weight, bias)
    return panel_linear(x, self._mdv_panels, self._mdv_panel_bias, weight.shape[0])


def _sibling_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module, tuple[str, ...], list[torch.nn.Linear]]]:
    """(parent, names, layers) for every :data:`SIBLING_GROUPS` group whose members are all ``nn.Linear``
    children of one parent with the same input width, biases on all or none, and weights shared with no
    other layer."""
    counts: dict[int, int] = {}
    for m, attr in panel_layers(model):
        counts[id(getattr(m, attr))] = counts.get(id(getattr(m, attr)), 0) + 1
    out = []
    for parent in model.modules():
        for names in SIBLING_GROUPS:
            layers = [getattr(parent, n, None) for n in names]
            if not all(type(m) is torch.nn.Linear for m in layers):
                continue
            if (len({m.in_features for m in layers}) == 1 and len({m.bias is None for m in layers}) == 1
                    and all(counts[id(m.weight)] == 1 for m in layers)):
                out.append((parent, names, layers))
    return out


def sibling_product(parent: torch.nn.Module, names: tuple[str, ...], x: Tensor) -> tuple[Tensor, ...] | None:
    """``(x · W₁ᵀ, x · W₂ᵀ, ...)`` for the sibling linears ``names`` of ``parent`` in one kernel call on their
    fused panels, when PanelPacks holds them as a group (:data:`SIBLING_GROUPS`) and ``x`` takes the panel
    path; else None (the caller runs each layer's own forward).  The stream is the members' own panels one
    after the other (each padded to whole panels), so the outputs, column slices of one product, equal the
    members' own panel products bit for bit."""
    groups = parent.__dict__.get("_mdv_siblings")
    group = groups.get(names) if groups else None
    if group is None or x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled() and x.requires_grad:
        return None
    panels, bias, layers, padded, widths = group
    for m in layers:
        if m._mdv_panel_version is not None and _version_of(m.weight) != m._mdv_panel_version:
            return None  # the member's own forward raises the stale-weight error
        if m.weight.requires_grad and torch.is_grad_enabled():
            return None
    y = panel_linear(x, panels, bias, panels.shape[0] * PANEL).split(padded, -1)
    return tuple(t if w == n else t[..., :n] for t, w, n in zip(y, padded, widths))


class PanelPacks(LinearForwards):
    """Every ``nn.Linear`` of ``model`` (and subset head, :func:`panel_layers`) on panel-packed weights;
    ``with panels:`` runs the model's linears on them (module docstring).  A weight shared by several layers
    (a tied head) is packed once.

    ``dtype``: the panels' weight dtype, float32 (default: the model's own products), float16 (half the
    bytes per pass; exact for float16-valued weights, rounded otherwise) or int8 (a quarter of the bytes, one
    scale per output column, :func:`pack_panels`).  The last two are for a draft, whose proposal law is
    whatever it computes, not for a target, whose law must stay its own.  ``huge_pages``: the panels' one
    arena on transparent huge pages (default; :mod:`mdv.models.hugepages`) or on ordinary pages (the
    ``pass_limit`` benchmark's comparison).

    Sibling linears that read one input (:data:`SIBLING_GROUPS`: q, k, v; gate, up) are packed as one stream
    whose slices are the members' panels (no extra memory); :func:`sibling_product` runs a group in one call.

    Attributes: ``linears`` (how many layers), ``pack_bytes`` (the memory the panels hold), ``weight_bytes``
    (the distinct packed weights), ``pack_seconds``, ``dtype``, ``sibling_groups`` (how many groups)."""

    _attrs = ("_mdv_panels", "_mdv_panel_bias", "_mdv_panel_version", "_mdv_panel_weight")

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.float32, huge_pages: bool = True):
        super().__init__()
        self.dtype = check_panel_dtype(dtype)
        float32_cpu_linears(model)  # at least one nn.Linear (no MKL needed: the kernel is mdv's own)
        layers = panel_layers(model)
        check_float32_cpu([getattr(m, a) for m, a in layers])  # the subset heads too
        load_panel_kernel()  # compile (or fail) now, not in the middle of a pass
        t0 = time.perf_counter()
        by_weight: dict[int, Tensor] = {}
        member_bias: dict[int, Tensor] = {}
        #: parent module -> {names: (fused panels, fused bias or None, member layers, member widths padded to
        #: whole panels, member widths)}
        self._siblings: dict[torch.nn.Module, dict[tuple[str, ...], Any]] = {}
        groups = list(_sibling_groups(model))
        in_groups = {id(m.weight) for _, _, group in groups for m in group}
        singles = {id(getattr(m, a)): getattr(m, a) for m, a in layers if id(getattr(m, a)) not in in_groups}
        # every panel in one huge-page arena (mdv.models.hugepages: the pass streams them all)
        arena = HugePageArena(huge_pages=huge_pages, nbytes=HugePageArena.bytes_for(
            [sum(packed_nbytes(m.weight, self.dtype) for m in group) for _, _, group in groups]
            + [packed_nbytes(w, self.dtype) for w in singles.values()]))
        with torch.no_grad():
            for parent, names, group in groups:  # one stream per group; members get slices
                own = [pack_panels(m.weight, self.dtype) for m in group]
                fused = arena.take((sum(p.shape[0] for p in own), *own[0].shape[1:]), self.dtype)
                torch.cat(own, out=fused)  # [sum of members' panels, K, 16]
                fused_bias = None
                if group[0].bias is not None:  # each member's bias padded like its panels
                    fused_bias = torch.zeros(fused.shape[0] * PANEL)
                start = 0
                for m, p in zip(group, own):
                    stop = start + p.shape[0]
                    by_weight[id(m.weight)] = fused[start:stop]
                    if fused_bias is not None:
                        fused_bias[start * PANEL:start * PANEL + m.out_features] = m.bias.detach()
                        member_bias[id(m)] = fused_bias[start * PANEL:stop * PANEL]
                    start = stop
                self._siblings.setdefault(parent, {})[names] = (
                    fused, fused_bias, group, [p.shape[0] * PANEL for p in own], [m.out_features for m in group])
            for m, attr in layers:
                weight = getattr(m, attr)
                panels = by_weight.get(id(weight))
                if panels is None:
                    packed = pack_panels(weight, self.dtype)
                    panels = by_weight[id(weight)] = arena.take(packed.shape, self.dtype)
                    panels.copy_(packed)
                bias = member_bias.get(id(m))
                if bias is None and attr == "weight" and m.bias is not None:
                    bias = torch.zeros(panels.shape[0] * PANEL)
                    bias[:weight.shape[0]] = m.bias.detach()
                self._packs.append((m, (panels, bias, _version_of(weight), attr)))
        self.pack_seconds = time.perf_counter() - t0
        self.linears = len(layers)
        self.sibling_groups = sum(len(g) for g in self._siblings.values())
        distinct = {id(getattr(m, a)): getattr(m, a) for m, a in layers}
        self.weight_bytes = sum(w.numel() * w.element_size() for w in distinct.values())
        self.pack_bytes = sum(p.numel() * p.element_size() for p in by_weight.values())

    def _method(self, m: torch.nn.Module) -> str:
        return "forward" if type(m) is torch.nn.Linear else "project"

    def __enter__(self) -> "PanelPacks":
        super().__enter__()
        for parent, groups in self._siblings.items():
            parent._mdv_siblings = groups
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for parent in self._siblings:
            parent.__dict__.pop("_mdv_siblings", None)

    def free(self) -> None:
        super().free()
        self._siblings = {}

    def _install(self, m: torch.nn.Module, pack: Any) -> None:
        m._mdv_panels, m._mdv_panel_bias, m._mdv_panel_version, m._mdv_panel_weight = pack
        setattr(m, self._method(m), types.MethodType(_panel_product, m))

    def __repr__(self) -> str:
        return (f"PanelPacks(linears={self.linears}, dtype={str(self.dtype).removeprefix('torch.')},"
                f" pack_bytes={self.pack_bytes / 1e6:.3g} MB for {self.weight_bytes / 1e6:.3g} MB of weights)")
