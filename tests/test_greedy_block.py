"""Greedy block verification needs its target adjustment; mdbv is GBV at K = 1 and exact beyond."""
from __future__ import annotations

import pytest
import torch

import mdv
from mdv.oracle import exact_law, expected_accepted, iteration_law, target_law, total_variation
from mdv.verify import Uniforms
from mdv.oracle.montecarlo import sample_blocks
from tests.conftest import toy_pair


def _rounded(law: dict, n: int = 12) -> dict:
    return {k: round(v, n) for k, v in sorted(law.items())}


def test_bv_paper_example_with_adjustment(bv_paper_pair) -> None:
    target, draft = bv_paper_pair
    law = exact_law("gbv", target, draft, 1, 2, 2)
    assert _rounded(law) == _rounded({(0, 0): 1 / 9, (0, 1): 2 / 9, (1, 0): 2 / 9, (1, 1): 4 / 9})
    assert expected_accepted("gbv", target, draft, 1, 2) == pytest.approx(12 / 9, abs=1e-12)
    assert expected_accepted("bv", target, draft, 1, 2) == pytest.approx(11 / 9, abs=1e-12)
    assert expected_accepted("sd", target, draft, 1, 2) == pytest.approx(10 / 9, abs=1e-12)


def test_bv_paper_example_without_adjustment_is_biased(bv_paper_pair) -> None:
    target, draft = bv_paper_pair
    verifier = mdv.get_verifier("gbv", adjust_target=False)
    assert verifier.lossless is False and mdv.VERIFIERS["gbv"].lossless is True
    law = exact_law(verifier, target, draft, 1, 2, 2)
    assert _rounded(law) == _rounded({(0, 0): 1 / 9, (0, 1): 2 / 9, (1, 0): 1 / 3, (1, 1): 1 / 3})
    assert total_variation(law, target_law(target, 2)) == pytest.approx(1 / 9, abs=1e-12)


@pytest.mark.parametrize("seed,V,L", [(0, 2, 3), (1, 3, 2), (2, 3, 3)])
def test_mdbv_at_one_draft_is_gbv(seed: int, V: int, L: int) -> None:
    target, draft = toy_pair(V, seed, zeros=seed == 1)
    assert _rounded(iteration_law("mdbv", target, draft, 1, L), 13) == _rounded(iteration_law("gbv", target, draft, 1, L), 13)
    a, b = exact_law("mdbv", target, draft, 1, L, L + 2), exact_law("gbv", target, draft, 1, L, L + 2)
    assert total_variation(a, b) < 1e-12
    # and draw for draw on the same uniforms
    gen = torch.Generator().manual_seed(seed)
    block = sample_blocks(target, draft, 1, L, 500, generator=gen)
    u = Uniforms.draw(500, 1, L, gen)
    x, y = mdv.get_verifier("mdbv").sample(block, u), mdv.get_verifier("gbv").sample(block, u)
    assert torch.equal(x.tau, y.tau) and torch.equal(x.token, y.token)


def test_engine_style_stepping_keeps_state() -> None:
    """Verifier.step owns the adjustment: after an early exit the state holds a window, reset() clears it."""
    target, draft = toy_pair(3, 4)
    verifier = mdv.get_verifier("gbv")
    gen = torch.Generator().manual_seed(0)
    saw_window = False
    for _ in range(20):
        verifier.reset()
        block = sample_blocks(target, draft, 1, 3, 1, generator=gen)
        out = verifier.step(block, gen)
        if int(out.tau[0]) < 2:  # an exit with at least one position left in the window
            assert len(verifier.state.windows) == 1
            saw_window = True
    verifier.reset()
    assert verifier.state.windows == ()
    assert saw_window
