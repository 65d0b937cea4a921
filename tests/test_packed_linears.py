"""mdv.models.packed: linears on MKL-packed weights equal F.linear (the reference) on the same inputs, a
packed target keeps every lossless method's T = 0 output equal to AR greedy, the model is left as it was,
and bad input gets one clear error."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from mdv.errors import InvalidInputError
from mdv.models import packed
from mdv.models.packed import LinearPacks, check_pack_sizes, packed_linear, padded_size, rung_for

pytestmark = pytest.mark.skipif(not packed.mkl_packing_available(), reason="this torch build has no MKL")


@pytest.fixture(scope="module")
def tiny_pair():
    from mdv.models.tiny_random import build_tiny_random_pair

    return build_tiny_random_pair(vocab_size=96, seed=3, hidden_size=48, num_layers=2)


@pytest.fixture()
def mkl_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The padded sizes of every packed product (so a test can tell the packed path from the fallback)."""
    calls: list[int] = []
    real = packed._mkl_linear

    def counting(x, pack, weight, bias, size):
        calls.append(size)
        return real(x, pack, weight, bias, size)

    monkeypatch.setattr(packed, "_mkl_linear", counting)
    return calls


def test_padded_size_is_the_next_packed_size_or_none() -> None:
    sizes = check_pack_sizes([9, 1, 33, 9])
    assert sizes == (1, 9, 33)
    assert [padded_size(m, sizes) for m in (1, 2, 8, 9, 10, 33, 34)] == [1, 9, 9, 9, 33, 33, None]
    assert [rung_for(m, [1, 4, 8]) for m in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 4, 4, 4, 8, 8, 9, 33]


@pytest.mark.parametrize("shape", [(1, 48), (4, 48), (7, 48), (9, 48), (2, 3, 48), (3, 3, 48), (40, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_f_linear(shape: tuple[int, ...], bias: bool, mkl_calls: list[int]) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(80, 48, generator=gen)
    b = torch.randn(80, generator=gen) if bias else None
    x = torch.randn(*shape, generator=gen)
    sizes = (1, 4, 9)
    packs = {s: torch.ops.mkl._mkl_reorder_linear_weight(w, s) for s in sizes}
    rows = int(torch.tensor(shape[:-1]).prod())
    with torch.inference_mode():
        got = packed_linear(x, w, b, packs, sizes)
    ref = F.linear(x, w, b)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # rows <= 9 go through the pack of the next size (padded with zero rows); 40 rows fall back to F.linear
    assert mkl_calls == ([padded_size(rows, sizes)] if rows <= 9 else [])


def test_autograd_takes_the_reference(mkl_calls: list[int]) -> None:
    w = torch.randn(16, 8, requires_grad=True)
    packs = {4: torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), 4)}
    x = torch.randn(4, 8)
    packed_linear(x, w, None, packs, (4,)).sum().backward()
    assert mkl_calls == [] and w.grad is not None


def extend_probs(model, tokens: list[int], n_new: int) -> torch.Tensor:
    s = model.new_session()
    with torch.inference_mode():
        s.prefill(tokens[:-n_new])
        return torch.softmax(s.extend(torch.tensor([tokens[-n_new:]]))[0].double(), -1)  # [n_new, V]


def test_packed_target_pass_equals_the_plain_pass(tiny_pair, mkl_calls: list[int]) -> None:
    target = tiny_pair[0]
    model = target.model
    keys = list(model.state_dict())
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, target.vocab_size, (20,), generator=gen).tolist()
    packs = LinearPacks(model, [1, 4, 9])
    assert packs.linears == len(linears) and packs.pack_bytes > 0 and packs.weight_bytes > 0
    for n_new in (1, 3, 4, 5, 9, 12):
        plain = extend_probs(target, tokens, n_new)
        mkl_calls.clear()
        with packs:
            assert all("forward" in m.__dict__ for m in linears)
            got = extend_probs(target, tokens, n_new)
        assert (got - plain).abs().max() < 1e-6
        # prefill of 20 - n_new >= 8 tokens: packed only when it fits the ladder; the new tokens always are
        assert (padded_size(n_new, packs.sizes) in mkl_calls) == (n_new <= 9)
        assert all("forward" not in m.__dict__ and not hasattr(m, "_mdv_packs") for m in linears)
    assert list(model.state_dict()) == keys
    packs.free()
    with pytest.raises(InvalidInputError, match="freed"):
        packs.__enter__()


#: (method, K, target pass) of the T = 0 losslessness tests of packed and panel linears
LOSSLESS_CASES = [("sd", 1, "rows"), ("bv", 1, "rows"), ("spectr", 3, "tree"), ("mdbv", 2, "rows")]


def assert_t0_equals_ar_greedy(pair, method: str, K: int, L: int, target_pass: str, linears: Any) -> None:
    """``method`` at T = 0 with the target's linears inside ``linears`` (a with-block) emits AR greedy's tokens."""
    from mdv.engine import generate

    target, draft, _ = pair
    prompt = [1, 5, 9, 13]
    ar = generate(target, None, prompt, "ar", temperature=0.0, max_new_tokens=24, eos_token_id=[]).tokens
    with linears:
        got = generate(target, draft, prompt, method, K=K, L=L, temperature=0.0, max_new_tokens=24, eos_token_id=[],
                       target_pass=target_pass).tokens
    assert got == ar


@pytest.mark.parametrize("method,K,target_pass", LOSSLESS_CASES)
def test_packed_target_keeps_t0_equal_to_ar_greedy(tiny_pair, method: str, K: int, target_pass: str) -> None:
    L = 4
    assert_t0_equals_ar_greedy(tiny_pair, method, K, L, target_pass,
                               LinearPacks(tiny_pair[0].model, [1, L + 1, K * L + 1, K * (L + 1)]))


def test_bad_input_gets_one_clear_error(tiny_pair) -> None:
    model = tiny_pair[0].model
    for bad in ([], [0], ["9"], "9", [True], None):
        with pytest.raises(InvalidInputError, match="pack sizes"):
            LinearPacks(model, bad)
    half = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.bfloat16))
    with pytest.raises(InvalidInputError, match="float32 models on the CPU"):
        LinearPacks(half, [1])
    with pytest.raises(InvalidInputError, match="no nn.Linear"):
        LinearPacks(torch.nn.Sequential(torch.nn.ReLU()), [1])
    packs = LinearPacks(model, [1])
    with packs:
        with pytest.raises(InvalidInputError, match="do not nest"):
            packs.__enter__()
        with pytest.raises(InvalidInputError, match="another LinearPacks or PanelPacks block"):
            LinearPacks(model, [2]).__enter__()
    packs.free()
