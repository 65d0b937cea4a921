"""The paired measurement's trajectory (mdv.paired.trajectory): the tokens of mdv.generate's AR run, with
the laws a tree pass already holds reused, and its stops where generate stops."""
from __future__ import annotations

import pytest
import torch

import mdv
from mdv.models.sampling import SamplingConfig
from mdv.paired.config import PairedConfig
from mdv.paired.measure import ContextProbe, contexts_of, measure_prompt
from mdv.paired.trajectory import TreeTrajectory
from mdv.models.tiny_random import build_tiny_random_pair

PROMPT = [1, 7, 3, 12, 5]


@pytest.fixture(scope="module")
def close_pair():
    # a draft close to the target: most trajectory tokens lie on a draft path (the reuse path is exercised)
    target, draft, _ = build_tiny_random_pair(32, 3, draft_noise=0.02)
    return target, draft


def _run(target, draft, *, n_tokens: int, stride: int, seed: int, T: float = 1.0, K: int = 3, L: int = 4,
         eos=frozenset(), ctx=None) -> tuple[TreeTrajectory, list[int]]:
    """The measure_prompt loop by hand: measure a context, advance `stride` tokens with its tree laws."""
    sampling = SamplingConfig(T, None, None)
    probe = ContextProbe(target, draft, PROMPT, sampling, seed=seed + 99)
    traj = TreeTrajectory(probe.tgt, PROMPT, sampling, seed=seed, max_new_tokens=n_tokens, eos=eos, ctx=ctx)
    offsets = []
    while True:
        offsets.append(len(traj.tokens))
        m = probe.measure(PROMPT + traj.tokens, K, L, ["sd"])
        traj.advance(stride, m.block.tokens[0], m.block.p[0])
        if traj.stopped:
            return traj, offsets


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("stride", [1, 3, 6])
def test_trajectory_is_the_ar_generation_of_its_seed(close_pair, seed: int, stride: int) -> None:
    target, draft = close_pair
    traj, offsets = _run(target, draft, n_tokens=24, stride=stride, seed=seed)
    ar = mdv.generate(target, None, PROMPT, "ar", temperature=1.0, max_new_tokens=24, seed=seed, eos_token_id=[])
    assert traj.tokens == ar.tokens
    assert offsets == contexts_of(24, stride)
    # every token's law came from the tree or from one target call, never both, never neither
    assert traj.reused + traj.target_steps == 24
    if stride > 1:
        assert traj.reused > 24 / stride  # beyond the context's own first law: draft paths were followed
        assert traj.target_steps < ar.stats["target_calls"]


def test_without_drafts_every_token_is_a_target_step(close_pair) -> None:
    target, _ = close_pair
    from mdv.models.session import open_session

    tgt = open_session(target)
    tgt.prefill(PROMPT[:-1])
    traj = TreeTrajectory(tgt, PROMPT, SamplingConfig(0.7, None, None), seed=5, max_new_tokens=10,
                          eos=frozenset(), ctx=None)
    traj.advance(4)
    traj.advance(10)
    ar = mdv.generate(target, None, PROMPT, "ar", temperature=0.7, max_new_tokens=10, seed=5, eos_token_id=[])
    assert traj.tokens == ar.tokens and traj.target_steps == 10 and traj.reused == 0 and traj.stopped


def test_stops_at_eos_like_generate(close_pair) -> None:
    target, draft = close_pair
    full = mdv.generate(target, None, PROMPT, "ar", temperature=1.0, max_new_tokens=30, seed=4, eos_token_id=[])
    eos_tok = full.tokens[9]  # a token the trajectory emits: generate stops at its first occurrence
    first = full.tokens.index(eos_tok)
    traj, offsets = _run(target, draft, n_tokens=30, stride=4, seed=4, eos=frozenset([eos_tok]))
    ar = mdv.generate(target, None, PROMPT, "ar", temperature=1.0, max_new_tokens=30, seed=4, eos_token_id=eos_tok)
    assert traj.tokens == ar.tokens == full.tokens[:first + 1]
    assert offsets == contexts_of(len(traj.tokens), 4)


def test_stops_at_the_model_context_like_generate(close_pair) -> None:
    target, draft = close_pair
    ctx = len(PROMPT) + 9
    ar = mdv.generate(target, None, PROMPT, "ar", temperature=1.0, max_new_tokens=30, seed=8, eos_token_id=[])
    traj, offsets = _run(target, draft, n_tokens=30, stride=3, seed=8, ctx=ctx, L=2)
    assert traj.tokens == ar.tokens[:9]
    # generate stops with len(prompt + out) = ctx: no context is measured at j = 9
    assert offsets == contexts_of(9, 3) == [0, 3, 6]


def test_measure_prompt_records_the_reuse(close_pair) -> None:
    target, draft = close_pair
    cfg = PairedConfig(enabled=True, n_tokens=12, stride=4, K_max=2, L_max=3, methods=["sd", "spectr"])
    body = measure_prompt(target, draft, PROMPT, cfg, temperature=1.0, top_k=None, top_p=None, seed=11)
    t = body["trajectory"]
    ar = mdv.generate(target, None, PROMPT, "ar", temperature=1.0, max_new_tokens=12, seed=11)
    assert t["tokens"] == ar.tokens
    assert t["target_steps"] + t["reused_laws"] == len(t["tokens"])
    assert [c["offset"] for c in body["contexts"]] == contexts_of(len(t["tokens"]), 4)
    assert body["timing"]["trajectory_s"] > 0
    assert torch.tensor(body["contexts"][0]["drafts"]).shape == (2, 3)
