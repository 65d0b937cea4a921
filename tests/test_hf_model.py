"""HFModel on tiny randomly initialised float64 transformers: next_logprobs, the KV-cache session
operations (prefill, extend, fork, keep, crop) against fresh full-prefix forward passes, and loading
(local folder, unreachable hub ids; missing and corrupt files: ``tests/test_bad_input_matrix.py``)."""
from __future__ import annotations

import copy

import pytest
import torch

from mdv.errors import InvalidInputError, MissingAssetError
from mdv.models.hf import HFModel, HFSession
from mdv.models.session import PrefixSession, open_session

TOL = 1e-10


def tiny_llama(vocab_size: int = 32, seed: int = 0, *, scale: float = 30.0, hidden: int = 32, layers: int = 2,
               context: int = 128):
    """A randomly initialised float64 LlamaForCausalLM; ``scale`` multiplies the output head so the
    next-token laws are peaked rather than nearly uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=context, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def tiny_pair(vocab_size: int = 32, seed: int = 0, *, noise: float = 0.3, scale: float = 30.0,
              context: int = 128) -> tuple[HFModel, HFModel]:
    """(target, draft): the draft is the target with Gaussian noise (``noise`` x each tensor's std) on
    every weight, so they agree often but not always."""
    target = tiny_llama(vocab_size, seed, scale=scale, context=context)
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            if p.numel() > 1:
                p.add_(noise * p.std() * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return HFModel(target), HFModel(draft)


def full_logprobs(model: HFModel, seq: list[int]) -> torch.Tensor:
    """Fresh forward pass without cache: log-probs after every prefix of ``seq``.  -> [len(seq), V]"""
    with torch.no_grad():
        logits = model.model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
    return torch.log_softmax(logits.double(), -1)


@pytest.fixture(scope="module")
def model() -> HFModel:
    return HFModel(tiny_llama(24, seed=3))


def test_basic_attributes(model: HFModel) -> None:
    assert model.vocab_size == 24
    assert model.max_context == 128
    assert model.eos_token_id is None  # no tokenizer
    assert model.dtype == torch.float64 and model.device.type == "cpu"
    assert "vocab_size=24" in repr(model)


def test_next_logprobs_mixed_lengths(model: HFModel) -> None:
    prefixes = [(1,), (1, 2, 3), (4, 5), (1, 2), (7,), (3, 3, 3)]
    out = model.next_logprobs(prefixes)  # [6, V]
    assert out.shape == (6, 24) and out.dtype == torch.float64
    for i, pre in enumerate(prefixes):
        ref = full_logprobs(model, list(pre))[-1]
        assert torch.allclose(out[i], ref, atol=TOL, rtol=0)
    assert torch.allclose(out.exp().sum(-1), torch.ones(6, dtype=torch.float64))


def test_next_logprobs_rejects_bad_prefixes(model: HFModel) -> None:
    with pytest.raises(InvalidInputError, match="non-empty"):
        model.next_logprobs([(1,), ()])
    with pytest.raises(InvalidInputError, match="vocab_size=24"):
        model.next_logprobs([(1, 99)])


def test_session_fork_keep_crop_match_full_forward(model: HFModel) -> None:
    """Prefill, extend in one row, fork into 3 rows, extend each row differently, keep one row, crop,
    extend again: every returned logit row equals a fresh full-prefix pass."""
    s = model.new_session()
    assert isinstance(s, HFSession)
    prompt = [1, 4, 9, 2]
    s.prefill(prompt[:-1])
    assert (s.rows, s.length) == (1, 3)
    out = s.extend(torch.tensor([[prompt[-1], 5]]))  # [1, 2, V]
    ref = full_logprobs(model, prompt + [5])
    assert torch.allclose(torch.log_softmax(out[0].double(), -1), ref[-2:], atol=TOL, rtol=0)

    s.fork(3)
    branches = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 14, 15]])  # [3, 3]
    out = s.extend(branches)  # [3, 3, V]
    assert out.shape == (3, 3, 24) and (s.rows, s.length) == (3, 8)
    for k in range(3):
        ref = full_logprobs(model, prompt + [5] + branches[k].tolist())
        assert torch.allclose(torch.log_softmax(out[k].double(), -1), ref[-3:], atol=TOL, rtol=0)

    s.keep(1)
    s.crop(6)  # keep prompt + 5 + 10
    assert (s.rows, s.length) == (1, 6)
    out = s.extend(torch.tensor([[20, 21]]))
    ref = full_logprobs(model, prompt + [5, 10, 20, 21])
    assert torch.allclose(torch.log_softmax(out[0].double(), -1), ref[-2:], atol=TOL, rtol=0)

    s.crop(0)  # everything gone: the session starts afresh
    out = s.extend(torch.tensor([[3, 2]]))
    assert torch.allclose(torch.log_softmax(out[0].double(), -1), full_logprobs(model, [3, 2]), atol=TOL, rtol=0)


def test_session_fork_on_empty_cache(model: HFModel) -> None:
    """A one-token prompt prefills nothing; forking an empty cache then extending K rows works."""
    s = model.new_session()
    s.prefill([])
    s.fork(2)
    out = s.extend(torch.tensor([[6, 1], [6, 2]]))
    for k, tok in enumerate((1, 2)):
        ref = full_logprobs(model, [6, tok])
        assert torch.allclose(torch.log_softmax(out[k].double(), -1), ref, atol=TOL, rtol=0)
    s.keep(0)
    s.crop(1)
    out = s.extend(torch.tensor([[4]]))
    assert torch.allclose(torch.log_softmax(out[0].double(), -1), full_logprobs(model, [6, 4])[-1:], atol=TOL, rtol=0)


def test_session_rejects_misuse(model: HFModel) -> None:
    s = model.new_session()
    s.prefill([1, 2])
    with pytest.raises(InvalidInputError, match="rows"):
        s.extend(torch.tensor([[1], [2]]))
    with pytest.raises(InvalidInputError, match="crop"):
        s.crop(5)
    s.fork(2)
    with pytest.raises(InvalidInputError, match="single row"):
        s.fork(2)
    with pytest.raises(InvalidInputError, match="row 2"):
        s.keep(2)


def test_open_session_picks_kv_cache_or_prefix() -> None:
    from mdv.oracle import random_toy_model

    hf = HFModel(tiny_llama(8, seed=1))
    assert isinstance(open_session(hf), HFSession)
    toy = random_toy_model(5, seed=0)
    s = open_session(toy)
    assert isinstance(s, PrefixSession)
    s.prefill([1, 2])
    s.fork(2)
    out = s.extend(torch.tensor([[3, 4], [0, 1]]))  # [2, 2, V]
    assert torch.allclose(out[1, 1].exp(), toy.probs((1, 2, 0, 1)))
    s.keep(1)
    s.crop(3)
    assert s.length == 3
    with pytest.raises(InvalidInputError, match="LanguageModel"):
        open_session(object())


def test_wrapping_non_models_is_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="from_pretrained"):
        HFModel("gpt2")


# ---------------------------------------------------------------------------------- loading
def test_from_pretrained_local_folder(tmp_path) -> None:
    base = tiny_llama(16, seed=2)
    base.save_pretrained(tmp_path / "m")
    loaded = HFModel.from_pretrained(tmp_path / "m", dtype=torch.float64, device="cpu")
    assert loaded.vocab_size == 16 and loaded.dtype == torch.float64 and loaded.tokenizer is None
    a = loaded.next_logprobs([(1, 2, 3)])
    b = HFModel(base).next_logprobs([(1, 2, 3)])
    assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_from_pretrained_unreachable_hub_id(monkeypatch) -> None:
    """A hub id that cannot be fetched (offline) becomes a one-line MissingAssetError, no traceback chain."""
    import transformers

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nmore detail")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(MissingAssetError, match="could not load model 'someorg/somemodel'") as info:
        HFModel.from_pretrained("someorg/somemodel")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "\n" not in str(info.value)
