"""mdv.models.panels: linears on panel-packed weights equal F.linear (the reference) and a float64 product on
the same inputs, the same at 1 and 2 threads to the bit, a panel-packed target keeps every lossless method's
T = 0 output equal to AR greedy, the model is left as it was, and bad input gets one clear error."""
from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from mdv.errors import InvalidInputError
from mdv.models import panels
from mdv.models.packed import PacksTogether
from mdv.models.panels import INT8_SCALE_LINES, PANEL, PanelPacks, pack_panels, panel_kernel_status, panel_linear, panel_weight

from tests.test_packed_linears import LOSSLESS_CASES, assert_t0_equals_ar_greedy, extend_probs, tiny_pair  # noqa: F401

pytestmark = pytest.mark.skipif(not panel_kernel_status()[0], reason=panel_kernel_status()[1] or "available")


@pytest.fixture()
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every product that ran on the kernel (so a test can tell it from the F.linear fallback)."""
    calls: list[int] = []
    real = panels.panel_linear

    def counting(x, pan, bias, out_features):
        calls.append(x.reshape(-1, x.shape[-1]).shape[0])
        return real(x, pan, bias, out_features)

    monkeypatch.setattr(panels, "panel_linear", counting)
    return calls


def _panels_and_bias(w: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    pan = pack_panels(w)
    if b is None:
        return pan, None
    bias = torch.zeros(pan.shape[0] * PANEL)
    bias[:b.numel()] = b
    return pan, bias


def test_pack_panels_layout_and_zero_padding() -> None:
    w = torch.arange(40 * 3, dtype=torch.float32).reshape(40, 3)  # N = 40: 3 panels, the last one 8 columns short
    pan = pack_panels(w)
    assert pan.shape == (3, 3, PANEL) and pan.is_contiguous()
    for p in range(3):
        for k in range(3):
            for c in range(PANEL):
                n = PANEL * p + c
                assert pan[p, k, c] == (w[n, k] if n < 40 else 0.0)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 12, 13, 40])
@pytest.mark.parametrize("n_out,k_in,bias", [(16, 48, False), (40, 7, True), (96, 48, True), (80, 1, False), (48, 150, True)])
def test_panel_linear_equals_f_linear_and_a_float64_product(rows: int, n_out: int, k_in: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n_out + k_in)
    w = torch.randn(n_out, k_in, generator=gen)
    b = torch.randn(n_out, generator=gen) if bias else None
    x = torch.randn(rows, k_in, generator=gen)
    pan, pb = _panels_and_bias(w, b)
    with torch.inference_mode():
        got = panel_linear(x, pan, pb, n_out)
    ref = F.linear(x, w, b)
    assert got.shape == ref.shape == (rows, n_out)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    exact = x.double() @ w.double().t() + (0 if b is None else b.double())
    # float32 sums of k_in products: |error| <= k_in * eps * sum |x w| (a loose, always-true bound)
    bound = k_in * 2 ** -23 * ((x.double().abs() @ w.double().abs().t()) + (0 if b is None else b.double().abs()))
    assert bool(((got.double() - exact).abs() <= bound + 1e-30).all())


def test_panel_linear_keeps_leading_dims_and_takes_strided_input() -> None:
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(40, 24, generator=gen)
    x = torch.randn(3, 24, 5, generator=gen).transpose(1, 2)  # [3, 5, 24], not contiguous
    pan, _ = _panels_and_bias(w, None)
    got = panel_linear(x, pan, None, 40)
    assert got.shape == (3, 5, 40)
    torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_one_and_two_threads_give_the_same_bits() -> None:
    # each output column belongs to one panel and one thread, summed in the same order: no reduction across threads
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(160, 64, generator=gen)
    x = torch.randn(9, 64, generator=gen)
    pan, _ = _panels_and_bias(w, None)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = panel_linear(x, pan, None, 160)
        torch.set_num_threads(2)
        two = panel_linear(x, pan, None, 160)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def _cpu_has_avx512f() -> bool:
    try:
        return "avx512f" in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_the_avx512_and_avx2_kernels_give_the_same_bits(dtype: torch.dtype) -> None:
    # every row count from 0 to 40 (one block, several blocks in k-chunks, pairs of panels, the split tail rows), K below, at and
    # across the 64-line chunks, with and without bias, at 1 and 2 threads: the AVX-512 kernel keeps every row's
    # summation order, so the products are equal to the bit (kernels/panel_linear.c)
    if not _cpu_has_avx512f():
        with pytest.raises(InvalidInputError, match="AVX-512F"):
            panels.panel_isa("avx512")
        assert panels.panel_isa() == "avx2"
        return
    assert panels.panel_isa() == "avx512"  # the default where the CPU has it
    gen = torch.Generator().manual_seed(11)
    before = torch.get_num_threads()
    try:
        # 3 panels (a pair of panels and a lone one) and 4 (two pairs): the next-panel prefetch runs
        for n_out, k_in in itertools.product((48, 64), (1, 7, 64, 150)):
            w = torch.randn(n_out, k_in, generator=gen)
            pan = pack_panels(w, dtype)
            _, pb = _panels_and_bias(w, torch.randn(n_out, generator=gen))
            x = torch.randn(40, k_in, generator=gen)
            for rows in range(41):
                for bias in (None, pb):
                    for threads in (1, 2):
                        torch.set_num_threads(threads)
                        with panels.forced_panel_isa("avx2") as isa:
                            assert isa == "avx2"
                            ref = panel_linear(x[:rows], pan, bias, n_out)
                        got = panel_linear(x[:rows], pan, bias, n_out)
                        assert torch.equal(got, ref), (n_out, k_in, rows, bias is not None, threads)
    finally:
        torch.set_num_threads(before)
    assert panels.panel_isa() == "avx512"  # the context restored the setting


def test_panel_isa_refuses_an_unknown_name() -> None:
    with pytest.raises(InvalidInputError, match="panel_isa must be one of auto, avx2, avx512; got 'sse'"):
        panels.panel_isa("sse")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_packed_nbytes_is_what_pack_panels_gives(dtype: torch.dtype) -> None:
    for n, k in [(16, 3), (40, 7), (1, 1), (33, 64)]:
        pan = pack_panels(torch.randn(n, k), dtype)
        assert panels.packed_nbytes(torch.empty(n, k), dtype) == pan.numel() * pan.element_size(), (n, k)


def test_panel_packs_hold_every_panel_in_one_arena(tiny_pair) -> None:
    # one mapping for the whole pack (mdv.models.hugepages), every panel on a 64-byte line, values unchanged
    target = tiny_pair[0].model
    packs = PanelPacks(target)
    try:
        held = [pan for _, (pan, _, _, _) in packs._packs]
        assert len({pan.untyped_storage().data_ptr() for pan in held}) == 1
        assert all(pan.data_ptr() % 64 == 0 for pan in held)
        for m, (pan, _, _, attr) in packs._packs:
            weight = getattr(m, attr)
            assert torch.equal(pan, pack_panels(weight)), type(m).__name__
    finally:
        packs.free()


def test_panel_target_pass_equals_the_plain_pass(tiny_pair, kernel_calls: list[int]) -> None:
    target = tiny_pair[0]
    model = target.model
    keys = list(model.state_dict())
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, target.vocab_size, (20,), generator=gen).tolist()
    pp = PanelPacks(model)
    assert pp.linears == len(linears) and pp.pack_bytes >= pp.weight_bytes > 0
    for n_new in (1, 3, 5, 6, 7, 9, 12):
        plain = extend_probs(target, tokens, n_new)
        kernel_calls.clear()
        with pp:
            assert all("forward" in m.__dict__ for m in linears)
            got = extend_probs(target, tokens, n_new)
        assert (got - plain).abs().max() < 1e-6
        assert len(kernel_calls) == 2 * len(linears) and kernel_calls[-1] == n_new  # every linear of prefill and pass
        assert all("forward" not in m.__dict__ and not hasattr(m, "_mdv_panels") for m in linears)
    assert list(model.state_dict()) == keys
    pp.free()
    with pytest.raises(InvalidInputError, match="freed"):
        pp.__enter__()


def test_a_tied_weight_is_packed_once() -> None:
    emb = torch.nn.Embedding(64, 32)
    head = torch.nn.Linear(32, 64, bias=False)
    head.weight = emb.weight  # tied, as in the default target
    other = torch.nn.Linear(32, 32)
    pp = PanelPacks(torch.nn.ModuleList([emb, head, other]))
    assert pp.linears == 2
    assert pp.weight_bytes == (64 * 32 + 32 * 32) * 4 == pp.pack_bytes  # N = 64 and 32: whole panels, no padding


def test_a_subset_head_runs_its_projection_on_panels(kernel_calls: list[int]) -> None:
    from mdv.models.default_pair import SubsetHead

    gen = torch.Generator().manual_seed(11)
    full = torch.randn(100, 32, generator=gen)
    ids = [0, 3, 4, 17, 50, 51, 52, 99, 7 + 80]
    ids = sorted(set(ids))
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), SubsetHead(full, ids))
    x = torch.randn(2, 5, 32, generator=gen)
    with torch.inference_mode():
        plain = model(x)
        pp = PanelPacks(model)
        assert pp.linears == 2 and pp.weight_bytes == (32 * 32 + len(ids) * 32) * 4
        with pp:
            got = model(x)
        assert "project" not in model[1].__dict__
    assert kernel_calls == [10, 10]  # the linear and the head's projection, 2 x 5 rows each
    finite = torch.isfinite(plain)
    assert torch.equal(finite, torch.isfinite(got)) and int(finite[0, 0].sum()) == len(ids)  # -inf off the subset
    torch.testing.assert_close(got[finite], plain[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method,K,target_pass", LOSSLESS_CASES)
def test_panel_target_and_draft_keep_t0_equal_to_ar_greedy(tiny_pair, method: str, K: int, target_pass: str) -> None:
    both = PacksTogether(PanelPacks(tiny_pair[0].model), PanelPacks(tiny_pair[1].model))
    assert_t0_equals_ar_greedy(tiny_pair, method, K, 4, target_pass, both)
    both.free()


def test_autograd_and_other_dtypes_take_the_reference(kernel_calls: list[int]) -> None:
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8)
    with PanelPacks(torch.nn.Sequential(lin)):
        lin(x).sum().backward()  # grad enabled and the weight needs grad: F.linear
        assert kernel_calls == [] and lin.weight.grad is not None
        with torch.no_grad():
            torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert kernel_calls == [4]


def test_panels_need_no_mkl(tiny_pair, monkeypatch: pytest.MonkeyPatch) -> None:
    from mdv.models import packed

    monkeypatch.setattr(packed, "mkl_packing_available", lambda: False)  # a torch build without MKL
    with pytest.raises(InvalidInputError, match="need a torch build with MKL"):
        packed.LinearPacks(tiny_pair[0].model, [1])
    pp = PanelPacks(tiny_pair[0].model)
    assert pp.linears > 0
    pp.free()


def test_a_weight_changed_after_packing_is_refused() -> None:
    lin = torch.nn.Linear(8, 16)
    pp = PanelPacks(torch.nn.Sequential(lin))
    with torch.no_grad():
        lin.weight.mul_(2.0)
        with pp, pytest.raises(InvalidInputError, match="stale"):
            lin(torch.randn(2, 8))


def test_bad_input_gets_one_clear_error(tiny_pair, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    model = tiny_pair[0].model
    with pytest.raises(InvalidInputError, match="float32 models on the CPU"):
        PanelPacks(torch.nn.Sequential(torch.nn.Linear(4, 4).half()))
    with pytest.raises(InvalidInputError, match="no nn.Linear"):
        PanelPacks(torch.nn.Sequential(torch.nn.ReLU()))
    pp = PanelPacks(model)
    with pp:
        with pytest.raises(InvalidInputError, match="do not nest"):
            pp.__enter__()
        with pytest.raises(InvalidInputError, match="another LinearPacks or PanelPacks block"):
            PanelPacks(model).__enter__()
    pp.free()
    # no compiler, and a compiler that fails: one line each, naming the fix (a fresh cache: nothing prebuilt)
    monkeypatch.setenv("MDV_CACHE", str(tmp_path))
    panels.load_panel_kernel.cache_clear()
    panels.load_kernel_library.cache_clear()
    try:
        monkeypatch.setenv("CC", "mdv-no-such-compiler")
        assert panel_kernel_status()[0] is False
        with pytest.raises(InvalidInputError, match="no C compiler was found.*set CC"):
            PanelPacks(model)
        monkeypatch.setenv("CC", "false")  # exists, exits 1 and writes nothing
        with pytest.raises(InvalidInputError, match="compiling the panel kernel with .*false failed"):
            PanelPacks(model)
        assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.tmp"))
    finally:
        panels.load_panel_kernel.cache_clear()
        panels.load_kernel_library.cache_clear()


def test_two_processes_compiling_at_once_both_get_a_whole_kernel(tmp_path) -> None:
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F
        from mdv.models.panels import pack_panels, panel_linear
        w = torch.randn(48, 32); x = torch.randn(3, 32)
        torch.testing.assert_close(panel_linear(x, pack_panels(w), None, 48), F.linear(x, w), rtol=1e-5, atol=1e-5)
        print("ok")
    """)
    env = {**__import__("os").environ, "MDV_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o[0].strip() for o in outs] == ["ok", "ok"]
    assert len(list(tmp_path.rglob("*.so"))) == 1 and not list(tmp_path.rglob("*.tmp"))


# ---------------------------------------------------------------------------------- float16 panels
@pytest.mark.parametrize("rows", [1, 3, 6, 7, 13])
@pytest.mark.parametrize("bias", [True, False])
def test_float16_panels_of_float16_values_give_the_float32_panels_bits(rows: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(40, 33, generator=gen).half().float()  # float16 values held in float32
    b = torch.randn(40, generator=gen) if bias else None
    x = torch.randn(rows, 33, generator=gen)
    _, pb = _panels_and_bias(w, b)
    p32, p16 = pack_panels(w), pack_panels(w, torch.float16)
    assert p16.dtype == torch.float16 and p16.shape == p32.shape and p16.nbytes * 2 == p32.nbytes
    assert torch.equal(p16.float(), p32)
    assert torch.equal(panel_linear(x, p16, pb, 40), panel_linear(x, p32, pb, 40))


def test_float16_panels_of_other_weights_are_the_product_with_rounded_weights() -> None:
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(48, 64, generator=gen), torch.randn(5, 64, generator=gen)
    got = panel_linear(x, pack_panels(w, torch.float16), None, 48)
    torch.testing.assert_close(got, F.linear(x, w.half().float()), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, F.linear(x, w), rtol=1e-6, atol=1e-6)  # the weights were rounded


def test_a_draft_on_float16_panels_keeps_t0_equal_to_ar_greedy(tiny_pair) -> None:
    """The draft's law is whatever it computes, and q is recorded exactly: rounding its weights keeps every
    method lossless (the target stays on float32 panels)."""
    target, draft, _ = tiny_pair
    packs = PanelPacks(draft.model, dtype=torch.float16)
    assert packs.dtype == torch.float16 and packs.pack_bytes * 2 == PanelPacks(draft.model).pack_bytes
    assert "dtype=float16" in repr(packs)
    for method, K, target_pass in (("sd", 1, "rows"), ("spectr", 3, "tree")):
        assert_t0_equals_ar_greedy(tiny_pair, method, K, 4, target_pass,
                                   PacksTogether(PanelPacks(target.model), PanelPacks(draft.model, dtype=torch.float16)))


# ---------------------------------------------------------------------------------- int8 panels
def test_int8_panels_hold_the_rounded_values_and_their_column_scales() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 33, generator=gen)
    w[7] = 0.0  # a zero row: scale 1, no division by zero
    p8 = pack_panels(w, torch.int8)
    assert p8.dtype == torch.int8 and p8.shape == (3, 33 + INT8_SCALE_LINES, PANEL)
    assert p8.nbytes == 3 * PANEL * (33 + 4)  # a byte a weight, 4 bytes a column's scale
    deq = panel_weight(p8, 40)
    scale = w.abs().amax(dim=1) / 127
    scale[7] = 1.0
    # by hand: round to the nearest multiple of the row's scale; the largest entry keeps its magnitude
    torch.testing.assert_close(deq, torch.round(w / scale[:, None]) * scale[:, None], rtol=0, atol=0)
    assert ((deq - w).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all()
    assert torch.equal(deq.abs().amax(dim=1)[scale != 1], w.abs().amax(dim=1)[scale != 1])
    assert torch.equal(deq[7], torch.zeros(33))
    assert torch.equal(panel_weight(pack_panels(w), 40), w)  # float32 panels: the weight itself


@pytest.mark.parametrize("rows", [1, 2, 3, 6, 7, 13])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_panels_are_the_product_with_the_dequantised_weight(rows: int, bias: bool) -> None:
    """y = s_n * sum_k x_k W8[n, k] + b_n: against a float64 product with the dequantised weight, within
    float32 rounding of the sums (rows 1-2 take the split accumulators, 3-6 one block, 7 and 13 several)."""
    gen = torch.Generator().manual_seed(10 + rows)
    w, x = torch.randn(40, 70, generator=gen), torch.randn(rows, 70, generator=gen)
    b = torch.randn(40, generator=gen) if bias else None
    _, pb = _panels_and_bias(w, b)
    p8 = pack_panels(w, torch.int8)
    got = panel_linear(x, p8, pb, 40)
    exact = x.double() @ panel_weight(p8, 40).double().T + (0 if b is None else b.double())
    scale = (x.double().abs() @ panel_weight(p8, 40).double().abs().T).max()  # the sums' magnitude
    assert (got.double() - exact).abs().max() <= 1e-6 * scale
    assert (got.double() - (x.double() @ w.double().T + (0 if b is None else b.double()))).abs().max() > 1e-4  # rounded


def test_a_draft_on_int8_panels_keeps_t0_equal_to_ar_greedy(tiny_pair) -> None:
    """As float16: the draft's law is whatever its int8 weights compute, recorded exactly as q."""
    target, draft, _ = tiny_pair
    packs = PanelPacks(draft.model, dtype=torch.int8)
    assert packs.dtype == torch.int8 and packs.pack_bytes < PanelPacks(draft.model).pack_bytes / 3
    assert "dtype=int8" in repr(packs)
    for method, K, target_pass in (("sd", 1, "rows"), ("spectr", 3, "tree")):
        assert_t0_equals_ar_greedy(tiny_pair, method, K, 4, target_pass,
                                   PacksTogether(PanelPacks(target.model), PanelPacks(draft.model, dtype=torch.int8)))


def test_panels_refuse_other_weight_dtypes(tiny_pair) -> None:
    with pytest.raises(InvalidInputError, match="panels hold float32, float16 or int8 weights; got dtype=torch.bfloat16"):
        PanelPacks(tiny_pair[1].model, dtype=torch.bfloat16)


class _Attention(torch.nn.Module):
    """q, k, v siblings of one parent, as in a Llama attention block (widths whole panels)."""

    def __init__(self, d: int, widths: tuple[int, int, int], bias: bool) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(d, w, bias=bias) for w in widths)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 7])
def test_siblings_share_one_stream_and_their_fused_product_has_each_members_bits(rows: int, bias: bool) -> None:
    torch.manual_seed(rows)
    attn = _Attention(40, (48, 20, 32), bias)  # k's 20 outputs pad to 2 panels
    pp = PanelPacks(attn)
    fused = pp._siblings[attn][panels.SIBLING_GROUPS[0]][0]
    assert pp.sibling_groups == 1 and pp.pack_bytes == 40 * 112 * 4  # the members' slices: no second copy
    x = torch.randn(rows, 40)
    with torch.inference_mode(), pp:
        members = [m._mdv_panels for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        assert [p.data_ptr() for p in members] == [fused.data_ptr() + i * 40 * PANEL * 4 for i in (0, 3, 5)]
        own = [m(x) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        got = panels.sibling_product(attn, panels.SIBLING_GROUPS[0], x)
        assert got is not None and all(torch.equal(g, o) for g, o in zip(got, own))
        assert panels.sibling_product(attn, panels.SIBLING_GROUPS[1], x) is None  # no gate/up here
        want = [F.linear(x.double(), m.weight.double(), None if m.bias is None else m.bias.double())
                for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
        assert all((g.double() - w).abs().max() < 1e-5 for g, w in zip(got, want))
    assert "_mdv_siblings" not in attn.__dict__  # left as it was
    assert panels.sibling_product(attn, panels.SIBLING_GROUPS[0], x) is None  # outside the block: the caller's forwards


def test_siblings_that_cannot_share_a_stream_are_packed_alone() -> None:
    tied = _Attention(32, (32, 32, 32), bias=False)
    tied.v_proj.weight = tied.k_proj.weight
    mixed = _Attention(32, (32, 32, 32), bias=False)
    mixed.k_proj = torch.nn.Linear(32, 32, bias=True)
    for attn in (tied, mixed):
        pp = PanelPacks(attn)
        assert pp.sibling_groups == 0
        with torch.inference_mode(), pp:
            assert panels.sibling_product(attn, panels.SIBLING_GROUPS[0], torch.randn(2, 32)) is None


def test_a_stale_sibling_falls_back_to_its_own_forward_which_refuses() -> None:
    attn = _Attention(32, (32, 16, 16), bias=False)
    pp = PanelPacks(attn)
    with torch.no_grad():
        attn.k_proj.weight.mul_(2.0)
        with pp:
            assert panels.sibling_product(attn, panels.SIBLING_GROUPS[0], torch.randn(2, 32)) is None
            with pytest.raises(InvalidInputError, match="stale"):
                attn.k_proj(torch.randn(2, 32))


def test_the_lean_forward_runs_siblings_in_one_call_with_the_same_bits(tiny_pair, kernel_calls: list[int],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from mdv.models.lean import LeanModel

    target = tiny_pair[0]
    lean = LeanModel.of(target)
    layers = target.model.config.num_hidden_layers
    tokens = torch.randint(0, target.vocab_size, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    pp = PanelPacks(target.model)
    assert pp.sibling_groups == 2 * layers
    monkeypatch.setattr("mdv.models.lean.layer_plan", lambda *a: None)  # the torch loop (not the C layers)

    def pass_logits() -> torch.Tensor:
        s = lean.new_session()
        s.prefill(tokens[:-3])
        kernel_calls.clear()
        return s.extend(torch.tensor([tokens[-3:]]))

    with pp:
        fused = pass_logits()
        assert len(kernel_calls) == 4 * layers + 1  # qkv, o, gate+up, down per layer, and the head
        monkeypatch.setattr("mdv.models.lean.sibling_product", lambda *a: None)  # every linear on its own
        alone = pass_logits()
        assert len(kernel_calls) == 7 * layers + 1
    assert torch.equal(fused, alone)
