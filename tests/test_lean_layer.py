"""The lean forward's C layers (mdv.models.lean_layer, kernels/lean_layer.c) against the torch loop they
replace (the reference) on the same panels and against a float64 pass: every session operation (rows, fork,
keep, crop, a token tree, cache growth), float32, float16 and int8 panels, head sizes off the 8-wide path (12), on
it (16) and on the 64-column value blocks with a remainder (72), the tiled attention against the per-query
one, and the fallbacks (a stale weight, a model not on fused panels)."""
from __future__ import annotations

import copy

import pytest
import torch

import mdv.models.lean as lean_mod
from mdv.errors import InvalidInputError
from mdv.models import panels
from mdv.models.lean import LeanModel
from mdv.models.lean_layer import ATTENTIONS, attention_mode, forced_attention
from mdv.models.panels import PanelPacks, forced_panel_isa, panel_kernel_status
from mdv.models.tree import build_tree

pytestmark = pytest.mark.skipif(not panel_kernel_status()[0], reason=panel_kernel_status()[1] or "available")

# The C layers and the torch loop are two float32 computations (other summation orders, exp within 1 ulp):
# each is off the float64 pass by float32 rounding, which grows with the model (max |dp| 1e-6 at width 48,
# 4e-6 at 288 for transformers' own float32 pass).  They must stay within ERROR_RATIO times that pass's own
# error (measured: 0.8-2.1); a wrong mask, rotary or cache position moves p by orders of magnitude more.
ERROR_RATIO = 3.0


@pytest.fixture(scope="module", params=[48, 64, 288], ids=["head_dim12", "head_dim16", "head_dim72"])
def target(request):
    from mdv.models.tiny_random import build_tiny_random_pair

    return build_tiny_random_pair(vocab_size=96, seed=5, hidden_size=request.param, num_layers=2)[0]


@pytest.fixture(scope="module")
def float64_pass(target):
    """The session script's p from a float64 copy of ``target`` (torch loop, no panels), and how far the
    plain float32 pass is from it (max |dp|)."""
    exact_model = copy.deepcopy(target)
    exact_model.model.double()
    exact = _run(LeanModel.of(exact_model), _session_script)
    plain = _run(LeanModel.of(target), _session_script)
    return exact, _max_diff(plain, exact)


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b))
    assert torch.equal(a[-1], b[-1])  # same length and rows
    return max((x - y).abs().max().item() for x, y in zip(a[:-1], b[:-1]))


def _torch_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean_mod, "layer_plan", lambda *a: None)


def _run(lean: LeanModel, script) -> list[torch.Tensor]:
    s = lean.new_session()
    with torch.inference_mode():
        return [torch.softmax(out.double(), -1) for out in script(s)] + [torch.tensor([s.length, s.rows])]


def _session_script(s):
    gen = torch.Generator().manual_seed(0)
    s.prefill(torch.randint(0, 96, (30,), generator=gen).tolist())
    yield s.extend(torch.randint(0, 96, (1, 1), generator=gen))
    yield s.extend(torch.randint(0, 96, (1, 5), generator=gen))  # causal mask
    s.fork(3)
    yield s.extend(torch.randint(0, 96, (3, 1), generator=gen))  # rows
    yield s.extend(torch.randint(0, 96, (3, 2), generator=gen))
    s.keep(1)  # a strided row view of the cache
    s.crop(s.length - 2)
    yield s.extend(torch.randint(0, 96, (1, 3), generator=gen))
    drafts = torch.randint(0, 96, (3, 3), generator=gen)
    drafts[1, :2] = drafts[0, :2]
    tree = build_tree([7], drafts)
    yield s.extend_tree(tree)  # a tree mask
    s.keep_nodes(tree.path(1, 2))
    yield s.extend(torch.randint(0, 96, (1, 1), generator=gen))
    yield s.extend(torch.randint(0, 96, (1, 240), generator=gen))  # past the first capacity (256)
    yield s.extend(torch.randint(0, 96, (1, 1), generator=gen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_c_layers_equal_the_torch_loop_on_every_session_operation(target, float64_pass, dtype,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    exact, float32_error = float64_pass
    lean = LeanModel.of(target)
    with PanelPacks(target.model, dtype=dtype):
        calls: list[int] = []
        real = panels.panel_linear
        monkeypatch.setattr(panels, "panel_linear", lambda x, *a: calls.append(1) or real(x, *a))
        fast = _run(lean, _session_script)
        assert len(calls) == 10  # only the head's product runs from Python: every layer ran in C
        _torch_loop(monkeypatch)
        ref = _run(lean, _session_script)
    assert 0 < float32_error < 1e-4
    assert _max_diff(fast, ref) <= ERROR_RATIO * float32_error
    if dtype == torch.float32:  # float16 / int8 panels hold rounded weights: only the loop on them is their reference
        assert _max_diff(fast, exact) <= ERROR_RATIO * float32_error


@pytest.mark.parametrize("attention", ["auto", "tiled", "per_query"])
def test_two_threads_give_the_c_layers_the_same_bits(target, attention: str) -> None:
    """Attention items are split across OpenMP threads, each with its own scratch (the tiled attention's query
    blocks do not depend on the thread count), and the panel products split by panels: at 2 threads every
    logit equals the 1-thread one bit for bit."""
    lean = LeanModel.of(target)
    threads = torch.get_num_threads()
    with PanelPacks(target.model), forced_attention(attention):
        try:
            out = []
            for n in (1, 2):
                torch.set_num_threads(n)
                assert torch.get_num_threads() == n  # run_layers hands the kernels torch's count
                out.append(_run(lean, _session_script))
        finally:
            torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*out))


def test_the_c_layers_write_the_cache_the_torch_loop_reads(target, float64_pass, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill in C, continue on the torch loop: the C layers' keys and values are the torch loop's."""
    lean = LeanModel.of(target)
    prompt = list(range(3, 40))
    with PanelPacks(target.model), torch.inference_mode():
        s = lean.new_session()
        s.prefill(prompt)
        _torch_loop(monkeypatch)
        mixed = s.extend(torch.tensor([[5, 6]]))
        r = lean.new_session()
        r.prefill(prompt)
        ref = r.extend(torch.tensor([[5, 6]]))
    diff = (torch.softmax(mixed.double(), -1) - torch.softmax(ref.double(), -1)).abs().max().item()
    assert diff <= ERROR_RATIO * float64_pass[1]


def test_the_attention_exp_is_within_two_ulp_of_exp_and_zero_for_masked_keys() -> None:
    """exp8 (lean_layer.c) on 200k points across float32's exp range: relative error <= 2 ulp of float32
    against a float64 exp (measured max 1.19e-7, one ulp); exp(-inf) and exp below -87.34 are 0."""
    import ctypes

    fn = panels.load_kernel_library().lean_exp
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int], None
    gen = torch.Generator().manual_seed(0)
    z = torch.cat([torch.rand(200_000, generator=gen) * 175 - 87, torch.tensor([0.0, 1.0, -1.0, 88.0])])
    out = z.clone()
    fn(out.data_ptr(), out.numel())
    exact = z.double().exp()
    rel = ((out.double() - exact).abs() / exact).max().item()
    assert rel <= 2 * 2.0 ** -23, rel
    tail = torch.tensor([-float("inf"), -88.0, -100.0, -1e30, -float("inf"), 0.0, 0.0])  # not a multiple of 8
    fn(tail.data_ptr(), tail.numel())
    assert tail[:5].eq(0).all() and tail[5:].eq(1).all()


@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_the_tiled_attention_equals_the_per_query_one_and_the_torch_loop(target, float64_pass, isa: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiled attention (keys and values as panels, the scores and weighted values as panel products) against
    its reference, the per-query attention, and the torch loop, on every session operation (causal and tree
    masks, rows, a 240-token pass), on both panel kernels (where the CPU has AVX-512 the auto kernel's softmax
    runs 16 lanes wide).  Both are float32 computations: each within ERROR_RATIO of float32's own error."""
    float32_error = float64_pass[1]
    lean = LeanModel.of(target)
    with PanelPacks(target.model), forced_panel_isa(isa):
        with forced_attention("tiled") as mode:
            assert mode == attention_mode() == "tiled"
            tiled = _run(lean, _session_script)
        with forced_attention("per_query"):
            per_query = _run(lean, _session_script)
        _torch_loop(monkeypatch)
        ref = _run(lean, _session_script)
    assert attention_mode() == "auto"  # restored
    assert _max_diff(tiled, per_query) <= ERROR_RATIO * float32_error
    assert _max_diff(tiled, ref) <= ERROR_RATIO * float32_error
    assert _max_diff(tiled, per_query) > 0  # two different computations ran (other summation orders)


def test_an_unknown_attention_mode_is_one_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="attention must be one of auto, tiled, per_query"):
        attention_mode("flash")
    assert attention_mode() == "auto" and ATTENTIONS[0] == "auto"


def test_the_16_lane_exp_gives_the_8_lane_exp_bits() -> None:
    """exp16 (the tiled attention's AVX-512 softmax) is exp8's operations on 16 lanes: the same bits, masked and
    saturated lanes included, on a length that leaves a tail."""
    import ctypes

    lib = panels.load_kernel_library()
    f8, f16 = lib.lean_exp, lib.lean_exp16
    f8.argtypes, f8.restype = [ctypes.c_void_p, ctypes.c_int], None
    f16.argtypes, f16.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    gen = torch.Generator().manual_seed(1)
    z = torch.cat([torch.rand(100_003, generator=gen) * 200 - 100,
                   torch.tensor([-float("inf"), float("inf"), -87.3365, 88.3763, 0.0, -0.0, 1e-30])])
    a, b = z.clone(), z.clone()
    f8(a.data_ptr(), a.numel())
    if f16(b.data_ptr(), b.numel()) < 0:
        pytest.skip("this CPU has no AVX-512F: exp16 never runs here")
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_stale_weight_leaves_the_c_layers_and_is_refused(target) -> None:
    lean = LeanModel.of(target)
    pp = PanelPacks(target.model)
    layer = target.model.model.layers[1]
    with pp, torch.no_grad():
        s = lean.new_session()
        s.prefill([1, 2, 3])
        assert s._c_plan is not None
        layer.mlp.up_proj.weight.mul_(1.0)  # an in-place update bumps the version: the panels are stale
        with pytest.raises(InvalidInputError, match="stale"):
            s.extend(torch.tensor([[4]]))
    pp.free()


def test_without_fused_panels_the_torch_loop_runs(target, monkeypatch: pytest.MonkeyPatch) -> None:
    lean = LeanModel.of(target)
    monkeypatch.setattr(panels, "SIBLING_GROUPS", ())  # no sibling groups: no fused streams to run in C
    monkeypatch.setattr(panels, "_sibling_groups", lambda model: [])
    with PanelPacks(target.model), torch.inference_mode():
        s = lean.new_session()
        s.prefill([1, 2, 3])
        assert s._c_plan is None
    s = lean.new_session()  # no panels at all
    with torch.inference_mode():
        s.prefill([1, 2, 3])
    assert s._c_plan is None
