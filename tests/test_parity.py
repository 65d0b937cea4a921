"""The fast vectorised sampler of every verifier makes exactly the decisions of its slow scalar
reference on the same random draws (the pattern of vLLM's rejection-sampler tests), and its exact
law is a probability law over the outcomes the sampler can produce."""
from __future__ import annotations

import pytest
import torch

import mdv
from mdv.models.sampling import SamplingConfig
from mdv.oracle.montecarlo import sample_blocks
from mdv.verify import Uniforms
from tests.conftest import ALL_METHODS, toy_pair

SETTINGS = [  # (V, L, temperature, zeros)
    (2, 3, 1.0, False), (5, 3, 1.0, True), (5, 2, 0.0, False), (30, 2, 0.7, True), (3, 1, 1.3, False)]


def _blocks(method: str, V: int, L: int, temperature: float, zeros: bool, seed: int, B: int):
    K = (1, 2, 4)[seed % 3] if mdv.VERIFIERS[method].multi_draft else 1
    target, draft = toy_pair(V, seed, zeros=zeros)
    gen = torch.Generator().manual_seed(seed)
    block = sample_blocks(target, draft, K, L, B, sampling=SamplingConfig(temperature), generator=gen)
    return block, Uniforms.draw(B, K, L, gen)


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"V{s[0]}-L{s[1]}-T{s[2]}{'-zeros' if s[3] else ''}")
def test_sample_matches_reference_on_same_draws(method: str, setting) -> None:
    V, L, temperature, zeros = setting
    verifier = mdv.get_verifier(method)
    for seed in range(3):
        block, uniforms = _blocks(method, V, L, temperature, zeros, seed, B=60)
        fast = verifier.sample(block.validate(), uniforms, verifier.initial_state())
        slow = verifier.reference(block, uniforms, verifier.initial_state())
        assert torch.equal(fast.tau, slow.tau), f"{method}: tau differs"
        assert torch.equal(fast.sel, slow.sel), f"{method}: kept draft differs"
        assert torch.equal(fast.token, slow.token), f"{method}: extra token differs"
        assert ((fast.tau >= 0) & (fast.tau <= L)).all() and ((fast.token >= 0) & (fast.token < V)).all()


@pytest.mark.parametrize("method", ALL_METHODS)
def test_law_is_a_probability_law(method: str) -> None:
    verifier = mdv.get_verifier(method)
    for setting in SETTINGS:
        block, _ = _blocks(method, *setting, seed=1, B=40)
        branches = verifier.law(block, verifier.initial_state())
        total = torch.stack([br.prob for br in branches]).sum(0)
        assert torch.allclose(total, torch.ones_like(total), atol=1e-12)
        for br in branches:
            assert torch.isfinite(br.prob).all() and (br.prob >= 0).all() and (br.prob <= 1 + 1e-12).all()
            live = br.prob > 0
            assert torch.allclose(br.next_dist[live].sum(-1), torch.ones(int(live.sum()), dtype=torch.float64))
            assert (br.next_dist >= 0).all() and torch.isfinite(br.next_dist).all()
