"""Verifier.acceptance_law, the law of tau alone: every override equals the base class's marginal of the
full outcome law (sum of branch probabilities per tau), on random blocks with zeros, shared prefixes and
target adjustments carried from a previous step."""
from __future__ import annotations

import pytest
import torch

from mdv.verify.base import Block, Verifier
from mdv.verify.registry import VERIFIERS


def random_block(B: int, K: int, L: int, V: int, seed: int, zeros: float = 0.0, share: bool = False) -> Block:
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, K, L, V, generator=g, dtype=torch.float64) ** 3
    p = torch.rand(B, K, L + 1, V, generator=g, dtype=torch.float64) ** 3
    if zeros:
        q = q * (torch.rand(q.shape, generator=g, dtype=torch.float64) > zeros)
        p = p * (torch.rand(p.shape, generator=g, dtype=torch.float64) > zeros)
        q[..., 0] += 1e-3
        p[..., 0] += 1e-3
    q = q / q.sum(-1, keepdim=True)
    p = p / p.sum(-1, keepdim=True)
    q[:, :, 0] = q[:, :1, 0]  # every draft starts from the same context: one first law
    p[:, :, 0] = p[:, :1, 0]
    if share and K > 1 and L > 1:  # draft 1 will repeat draft 0's first token: same laws after it
        q[:, 1, 1] = q[:, 0, 1]
        p[:, 1, :2] = p[:, 0, :2]
    tokens = torch.stack([torch.multinomial(q[b, k], 1, generator=g).squeeze(-1)
                          for b in range(B) for k in range(K)]).view(B, K, L)  # drafted tokens have q > 0
    if share and K > 1 and L > 1:  # a shared tree prefix
        tokens[:, 1, 0] = tokens[:, 0, 0]
    block = Block(tokens, q, p)
    block.validate()
    return block


CASES = [(B, K, L, V, zeros, share) for B, K, L, V, zeros, share in [
    (1, 1, 1, 5, 0.0, False), (2, 1, 3, 7, 0.3, False), (1, 2, 2, 6, 0.0, True), (3, 3, 2, 5, 0.4, True),
    (1, 3, 4, 9, 0.2, False), (2, 4, 3, 4, 0.0, True), (1, 2, 5, 8, 0.5, True)]]


@pytest.mark.parametrize("method", list(VERIFIERS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_acceptance_law_is_the_marginal_of_law(method: str, case: int) -> None:
    B, K, L, V, zeros, share = CASES[case]
    cls = VERIFIERS[method]
    if not cls.multi_draft:
        K, share = 1, False
    block = random_block(B, K, L, V, seed=100 + case, zeros=zeros, share=share)
    v = cls()
    fast = v.acceptance_law(block, v.initial_state())  # [B, L+1]
    slow = Verifier.acceptance_law(v, block, v.initial_state())
    assert fast.shape == (B, L + 1)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)
    torch.testing.assert_close(fast.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", [m for m, c in VERIFIERS.items() if c.stateful])
def test_acceptance_law_with_a_carried_target_adjustment(method: str) -> None:
    cls = VERIFIERS[method]
    K = 3 if cls.multi_draft else 1
    g = torch.Generator().manual_seed(5)
    seen = 0
    for seed in range(12):
        v = cls()
        v.step(random_block(1, K, 3, 6, seed=seed, zeros=0.2), g)
        if v.state is None or v.state == v.initial_state():
            continue
        seen += 1
        block = random_block(1, K, 3, 6, seed=50 + seed, zeros=0.2, share=True)
        torch.testing.assert_close(v.acceptance_law(block, v.state), Verifier.acceptance_law(v, block, v.state),
                                   atol=1e-12, rtol=0)
    assert seen >= 3  # the adjustment is exercised, not only the fresh state


@pytest.mark.parametrize("method", [m for m, c in VERIFIERS.items() if c.multi_draft])
@pytest.mark.parametrize("case", [2, 3, 4, 5, 6])
def test_acceptance_laws_upto_K_and_the_drafts_in_sequence_flag(method: str, case: int) -> None:
    """The one-pass override equals the default (acceptance_law of each K' prefix of the drafts), and for a
    verifier flagged drafts_in_sequence both equal the K-draft run's law stopped after draft K' (read from
    the exits of its branches)."""
    B, K, L, V, zeros, share = CASES[case]
    block = random_block(B, K, L, V, seed=200 + case, zeros=zeros, share=share)
    v = VERIFIERS[method]()
    fast = v.acceptance_laws_upto_K(block, v.initial_state())  # [B, K, L+1]
    slow = Verifier.acceptance_laws_upto_K(v, block, v.initial_state())
    assert fast.shape == (B, K, L + 1)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=0)
    # the K'-prefix laws against the full law of the K-draft run, read by exits (mdbv records them)
    if VERIFIERS[method].drafts_in_sequence:
        for k in range(1, K + 1):
            stopped = torch.zeros(B, L + 1, dtype=torch.float64)
            for br in v.law(block, v.initial_state()):
                done = [e for e in br.exits[:k] if e >= 0]
                stopped[:, max(done)] += br.prob
            torch.testing.assert_close(fast[:, k - 1], stopped, atol=1e-12, rtol=0)
