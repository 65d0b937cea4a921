"""Bad input to the verifiers and the oracle: a clear ValueError (mdv's InvalidInputError) naming the
argument, never a silently wrong result -- blocks, draft counts and model outputs.  Unknown names, K / L
below 1, vocabulary mismatches and sampling settings: ``tests/test_bad_input_matrix.py``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import mdv
from mdv.errors import InvalidInputError
from mdv.models import CallableLM
from mdv.oracle import exact_law
from mdv.oracle.montecarlo import sample_blocks
from mdv.verify import Block
from tests.conftest import toy_pair


def _block(K: int = 1, L: int = 2, V: int = 3) -> Block:
    target, draft = toy_pair(V, 0)
    return sample_blocks(target, draft, K, L, 1, generator=torch.Generator().manual_seed(0))


def test_single_draft_method_refuses_several_drafts() -> None:
    target, draft = toy_pair(2, 0)
    with pytest.raises(InvalidInputError, match="single-draft"):
        exact_law("bv", target, draft, 2, 1, 2)
    with pytest.raises(InvalidInputError, match="single-draft"):
        mdv.get_verifier("sd").step(_block(K=2))


def test_block_shape_and_probability_checks() -> None:
    good = _block()
    verifier = mdv.get_verifier("bv")
    cases = {
        "p must have shape": Block(good.tokens, good.q, good.p[:, :, :-1]),
        "same vocabulary": Block(good.tokens, good.q, torch.cat([good.p, good.p[..., :1]], -1)),
        "q must have shape": Block(good.tokens, good.q[:, :, :1], good.p),
        "sum to 1": Block(good.tokens, good.q, good.p * 0.9),
        "NaN": Block(good.tokens, good.q.clone().fill_(float("nan")), good.p),
        "float64": Block(good.tokens, good.q.float(), good.p),
        "tokens must lie in": Block(good.tokens + 10, good.q, good.p),
        "L \\(draft length\\)": Block(good.tokens[:, :, :0], good.q[:, :, :0], good.p[:, :, :1]),
    }
    for match, block in cases.items():
        with pytest.raises(InvalidInputError, match=match):
            verifier.step(block)


def test_draft_token_with_zero_draft_probability() -> None:
    good = _block()
    q = good.q.clone()
    q[0, 0, 0] = 0.0
    q[0, 0, 0, (int(good.tokens[0, 0, 0]) + 1) % 3] = 1.0
    with pytest.raises(InvalidInputError, match="q = 0"):
        mdv.get_verifier("sd").step(Block(good.tokens, q, good.p))


def test_callable_model_checks_its_outputs() -> None:
    bad_sum = CallableLM(lambda prefix: np.array([0.5, 0.6]), 2)
    with pytest.raises(InvalidInputError, match="summing to 1"):
        bad_sum.probs(())
    nan = CallableLM(lambda prefix: np.array([np.nan, 1.0]), 2)
    with pytest.raises(InvalidInputError, match="finite"):
        nan.probs(())
    wrong_len = CallableLM(lambda prefix: np.array([1.0]), 2)
    with pytest.raises(InvalidInputError, match="vocab_size=2"):
        wrong_len.probs(())
