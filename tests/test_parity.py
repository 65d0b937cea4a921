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


#: select_gbv's reference enumerates the m next tokens of the survivors (V^m tuples at every prefix): on the
#: large-vocabulary setting it runs with at most this many drafts (its own tests cover K <= 4 at V <= 5).
REFERENCE_ENUMERATES = {"select_gbv": 2}


def _blocks(method: str, V: int, L: int, temperature: float, zeros: bool, seed: int, B: int):
    K = (1, 2, 4)[seed % 3] if mdv.VERIFIERS[method].multi_draft else 1
    if V > 8 and method in REFERENCE_ENUMERATES:
        K = min(K, REFERENCE_ENUMERATES[method])
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


# ------------------------------------------------------------------ single-instance fast paths
# The engine verifies one instance at a time (B = 1), and there ``spectr_gbv`` (from LAZY_MIN_V tokens on)
# and ``mdbv`` take a lazy path: only the tests the outcome needs, in cheaper arithmetic.  It must make
# exactly the decisions of the vectorised path, including coins placed exactly at h (or one ulp away).

def _at_h(coins: torch.Tensor, h: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """coins moved onto h, or one ulp either side of it, at about 70% of the tests."""
    m = torch.rand(coins.shape, generator=gen, dtype=torch.float64)
    up = torch.nextafter(h, torch.full_like(h, 2.0))
    down = torch.nextafter(h, torch.full_like(h, -1.0))
    out = torch.where(m < 0.3, h, torch.where(m < 0.5, up, torch.where(m < 0.7, down, coins)))
    return out.clamp(0.0, 1.0 - 2.0 ** -53)


def _large_blocks(gen: torch.Generator):
    """Groups of synthetic blocks (as the verifier benchmark's) over a few thousand tokens: as drawn, with
    a shared prefix, with target = draft along the drafts, and at T = 0 (one-hot rows; target argmax =
    the drafted token, or the target's own argmax)."""
    from mdv.bench import synthetic_block
    from mdv.verify import Block
    for V, K, L in ((300, 3, 4), (2048, 4, 5), (2048, 2, 1), (4096, 1, 6), (4096, 5, 3)):
        block = synthetic_block(V, K, L, generator=gen)
        tok, q, p = block.tokens.clone(), block.q.clone(), block.p.clone()
        if K > 1:  # draft 1 repeats draft 0's first tokens (same rows along the shared prefix)
            n = L // 2 + 1
            tok[:, 1, :n], q[:, 1, :n], p[:, 1, :n + 1] = tok[:, 0, :n], q[:, 0, :n], p[:, 0, :n + 1]
        p_same = p.clone()
        p_same[:, :, :L] = q  # the target equals the draft along the drafts
        one_hot = lambda t: torch.nn.functional.one_hot(t, V).to(torch.float64)  # noqa: E731
        greedy_p = one_hot(p.argmax(-1))
        yield [block, Block(tok, q, p), Block(tok, q, p_same),
               Block(tok, one_hot(tok), torch.cat([one_hot(tok), greedy_p[:, :, L:]], 2)),
               Block(tok, one_hot(tok), greedy_p)]


def test_spectr_gbv_lazy_path_matches_vectorised_scan(monkeypatch) -> None:
    from mdv.verify import spectr_gbv
    from mdv.verify.spectr_gbv import SpecTrGBV, longest_shared_prefix
    gen = torch.Generator().manual_seed(11)
    v = SpecTrGBV()

    def check(block, uniforms):
        h, dists = SpecTrGBV.h_and_dists(block)
        for coins in (uniforms.coins, torch.zeros_like(uniforms.coins), _at_h(uniforms.coins, h, gen)):
            u = Uniforms(coins, uniforms.draws)
            ref = SpecTrGBV.scan(h, dists, longest_shared_prefix(block.tokens), u)
            for b in range(block.B):
                out = v.sample(block.select(b), u.select(b))
                assert (int(out.tau[0]), int(out.sel[0]), int(out.token[0])) == \
                    (int(ref.tau[b]), int(ref.sel[b]), int(ref.token[b]))

    for group in _large_blocks(gen):
        for block in group:
            assert block.validate().V >= spectr_gbv.LAZY_MIN_V
            for _ in range(3):
                check(block, Uniforms.draw(1, block.K, block.L, gen))
    # tiny vocabularies (zeros, T = 0) through the lazy path as well
    monkeypatch.setattr(spectr_gbv, "LAZY_MIN_V", 1)
    for V, L, temperature, zeros in SETTINGS:
        for seed in range(3):
            block, uniforms = _blocks("spectr_gbv", V, L, temperature, zeros, seed, B=20)
            check(block.validate(), uniforms)


def test_mdbv_single_instance_path_matches_vectorised() -> None:
    """Consecutive iterations (so the target adjustment is exercised): the single-instance path and the
    vectorised path (the instance in a batch of two) give the same outcome, exits included."""
    from mdv.verify.mdbv import MultiDraftBlockVerification, draft_h
    gen = torch.Generator().manual_seed(12)
    v = MultiDraftBlockVerification()

    def at_h(block, uniforms, state):
        """coins of instance 0 at (or one ulp from) the h of each draft along the actual chain"""
        p_eff = v.effective_target(block, state)
        coins, levels = uniforms.coins.clone(), []
        for k in range(block.K):
            coins[0, k] = _at_h(coins[0, k], draft_h(block, p_eff, k, levels)[0], gen)
            out = v.sample(block, Uniforms(coins, uniforms.draws), state)
            e = int(out.exits[0, k])
            if e == block.L:
                break
            levels = levels + [(k, torch.tensor([e]))]
        return Uniforms(coins, uniforms.draws)

    def run(blocks):
        state = v.initial_state()
        for i, block in enumerate(blocks):
            u = Uniforms.draw(1, block.K, block.L, gen)
            if i % 2:
                u = at_h(block, u, state)
            one = v.sample(block, u, state)
            pair = v.sample(Block(block.tokens.repeat(2, 1, 1), block.q.repeat(2, 1, 1, 1), block.p.repeat(2, 1, 1, 1)),
                            Uniforms(u.coins.repeat(2, 1, 1), u.draws.repeat(2, 1)), state)
            for field in ("tau", "sel", "token", "exits"):
                assert torch.equal(getattr(one, field)[0], getattr(pair, field)[0]), field
            state = v.advance(state, block, one)

    from mdv.verify import Block
    for group in _large_blocks(gen):
        run([b.validate() for b in group])
    for V, L, temperature, zeros in SETTINGS:
        for seed in range(3):
            block, _ = _blocks("mdbv", V, L, temperature, zeros, seed, B=6)
            run([block.select(b) for b in range(block.B)])
