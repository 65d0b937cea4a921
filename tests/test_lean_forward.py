"""The lean decoder forward (mdv.models.lean): every session operation gives transformers' probabilities
(to float32 rounding), the decoding methods stay lossless on it (T = 0 equals AR greedy, with plain and
panel linears), and a model it cannot run gets one clear error."""
from __future__ import annotations

import pytest
import torch

from mdv.errors import InvalidInputError
from mdv.models.hf import HFModel
from mdv.models.lean import LeanModel, LeanSession, _rms_norm, lean_support
from mdv.models.tree import build_tree
from tests.test_packed_linears import LOSSLESS_CASES, assert_t0_equals_ar_greedy

# float32 passes of a 2-layer model: the attention kernels' summation orders differ by a few ulps
TOL = 1e-6


@pytest.fixture(scope="module")
def tiny_pair():
    from mdv.models.tiny_random import build_tiny_random_pair

    return build_tiny_random_pair(vocab_size=96, seed=3, hidden_size=48, num_layers=2)


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.double(), -1)


def _both(tiny_pair):
    target = tiny_pair[0]
    return target.new_session(), LeanModel.of(target).new_session()


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert (_probs(a) - _probs(b)).abs().max().item() < TOL


@torch.inference_mode()
def test_rows_fork_keep_crop_equal_transformers(tiny_pair) -> None:
    hf, lean = _both(tiny_pair)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 96, (37,), generator=gen).tolist()
    hf.prefill(prompt), lean.prefill(prompt)
    for n in (1, 5, 2):
        x = torch.randint(0, 96, (1, n), generator=gen)
        _check(hf.extend(x), lean.extend(x))
    for s in (hf, lean):
        s.fork(3)
    x = torch.randint(0, 96, (3, 4), generator=gen)
    _check(hf.extend(x), lean.extend(x))
    for s in (hf, lean):
        s.keep(2)
        s.crop(s.length - 3)
    x = torch.randint(0, 96, (1, 3), generator=gen)
    _check(hf.extend(x), lean.extend(x))
    assert lean.length == hf.length == 37 + 8 + 4 - 3 + 3 and lean.rows == 1


@torch.inference_mode()
def test_a_tree_and_its_kept_path_equal_transformers(tiny_pair) -> None:
    hf, lean = _both(tiny_pair)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 96, (20,), generator=gen).tolist()
    hf.prefill(prompt), lean.prefill(prompt)
    drafts = torch.randint(0, 96, (3, 4), generator=gen)
    drafts[1, :2] = drafts[0, :2]  # shared prefix: a real tree
    tree = build_tree([7], drafts)
    _check(hf.extend_tree(tree), lean.extend_tree(tree))
    path = tree.path(1, 3)  # not the first nodes: keep_nodes must move the path's keys and values
    assert path != list(range(len(path)))
    hf.keep_nodes(path), lean.keep_nodes(path)
    assert lean.length == hf.length
    x = torch.randint(0, 96, (1, 2), generator=gen)
    _check(hf.extend(x), lean.extend(x))
    # and a fresh full pass over the committed tokens agrees with the incremental one
    committed = prompt + [tree.ids[j] for j in path] + x[0].tolist()
    fresh = tiny_pair[0].next_logprobs([committed[:-1], committed])  # [2, V] log p
    lean.crop(lean.length - 1)
    step = lean.extend(x[:, 1:])[0, -1]
    assert (torch.exp(fresh[1]) - _probs(step)).abs().max().item() < TOL


@torch.inference_mode()
def test_the_cache_grows_past_its_first_capacity(tiny_pair) -> None:
    hf, lean = _both(tiny_pair)
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 96, (250,), generator=gen).tolist()
    hf.prefill(prompt), lean.prefill(prompt)
    first = lean.capacity
    x = torch.randint(0, 96, (1, 9), generator=gen)
    _check(hf.extend(x), lean.extend(x))
    assert lean.capacity > first >= 250


@torch.inference_mode()
def test_recorded_features_equal_transformers(tiny_pair) -> None:
    hf, lean = _both(tiny_pair)
    for s in (hf, lean):
        s.record_features = True
        s.prefill([1, 4, 9, 16, 25])
        s.extend(torch.tensor([[3, 5]]))
    assert hf.last_features is not None and lean.last_features is not None
    assert lean.last_features.shape == hf.last_features.shape == (1, 2, 48)
    assert torch.allclose(lean.last_features, hf.last_features, atol=1e-5, rtol=1e-5)
    lean.record_features = False
    lean.extend(torch.tensor([[2]]))
    assert lean.last_features is None


def test_outside_inference_mode_the_logits_are_ordinary_tensors(tiny_pair) -> None:
    lean = LeanModel.of(tiny_pair[0]).new_session()
    lean.prefill([1, 2, 3])
    out = lean.extend(torch.tensor([[4, 5]]))
    assert not out.is_inference()
    with torch.inference_mode():
        ref = tiny_pair[0].new_session()
        ref.prefill([1, 2, 3])
        _check(ref.extend(torch.tensor([[4, 5]])), out)
    out.mul_(2)  # an in-place op on the result is allowed
    lean.fork(2)  # the cache (an inference tensor) still takes every operation
    lean.keep(1)
    assert lean.extend(torch.tensor([[6]])).shape == (1, 1, 96)


def test_fused_rms_norm_has_the_modules_bits(tiny_pair) -> None:
    norm = tiny_pair[0].model.model.layers[0].input_layernorm
    x = torch.randn(3, 7, 48, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(_rms_norm(norm, x), norm(x))


@pytest.mark.parametrize("method,K,target_pass", LOSSLESS_CASES)
def test_lean_pair_keeps_t0_equal_to_ar_greedy(tiny_pair, method: str, K: int, target_pass: str) -> None:
    from contextlib import nullcontext

    target, draft, tok = tiny_pair
    lean_pair = (LeanModel.of(target), LeanModel.of(draft), tok)
    assert_t0_equals_ar_greedy(lean_pair, method, K, 4, target_pass, nullcontext())


@pytest.mark.parametrize("method,K,target_pass", LOSSLESS_CASES)
def test_lean_pair_on_panels_keeps_t0_equal_to_ar_greedy(tiny_pair, method: str, K: int, target_pass: str) -> None:
    from mdv.models.packed import PacksTogether
    from mdv.models.panels import PanelPacks, panel_kernel_status

    ok, why = panel_kernel_status()
    if not ok:
        pytest.skip(why)
    target, draft, tok = tiny_pair
    lean_pair = (LeanModel.of(target), LeanModel.of(draft), tok)
    assert_t0_equals_ar_greedy(lean_pair, method, K, 4, target_pass,
                               PacksTogether(PanelPacks(target.model), PanelPacks(draft.model)))


@torch.inference_mode()
def test_lean_on_panels_equals_transformers_on_panels(tiny_pair) -> None:
    from mdv.models.panels import PanelPacks, panel_kernel_status

    ok, why = panel_kernel_status()
    if not ok:
        pytest.skip(why)
    hf, lean = _both(tiny_pair)
    with PanelPacks(tiny_pair[0].model):
        hf.prefill([1, 2, 3, 4]), lean.prefill([1, 2, 3, 4])
        x = torch.tensor([[5, 6, 7]])
        _check(hf.extend(x), lean.extend(x))


def test_the_session_keeps_the_protocols_errors(tiny_pair) -> None:
    lean = LeanModel.of(tiny_pair[0]).new_session()
    assert isinstance(lean, LeanSession) and lean.supports_tree
    lean.prefill([1, 2, 3])
    with pytest.raises(InvalidInputError, match="shape"):
        lean.extend(torch.tensor([1, 2]))
    with pytest.raises(InvalidInputError, match="crop"):
        lean.crop(9)
    with pytest.raises(InvalidInputError, match="keep_nodes"):
        lean.keep_nodes([0])
    with pytest.raises(InvalidInputError, match="token ids"):
        lean.extend(torch.tensor([[500]]))
    lean.fork(2)
    with pytest.raises(InvalidInputError, match="single row"):
        lean.extend_tree(build_tree([1], torch.tensor([[2, 3]])))


def test_a_model_it_cannot_run_gets_one_clear_error() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=64))
    why = lean_support(gpt2)
    assert why is not None and "GPT2LMHeadModel" in why
    with pytest.raises(InvalidInputError, match="models.forward=hf"):
        LeanModel(gpt2)
    from mdv.models.tiny_random import build_tiny_random_pair

    target = build_tiny_random_pair(vocab_size=32, seed=0, hidden_size=16)[0].model
    target.config.hidden_act = "gelu"
    with pytest.raises(InvalidInputError, match="SiLU"):
        LeanModel(target)


def test_of_shares_the_module_and_is_idempotent(tiny_pair) -> None:
    target = tiny_pair[0]
    lean = LeanModel.of(target)
    assert lean.model is target.model and lean.tokenizer is target.tokenizer
    assert LeanModel.of(lean) is lean and isinstance(lean, HFModel)
    assert "LeanModel(" in repr(lean)
