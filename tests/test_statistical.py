"""The fast samplers agree with the exact law of one iteration: Pearson chi-square over the emitted
strings of 10^6 independent iterations (fixed seeds), at significance level 1e-3 per test."""
from __future__ import annotations

import pytest

import mdv
from mdv.oracle import iteration_law
from mdv.oracle.montecarlo import chi_square_pvalue, sample_iterations
from tests.conftest import ALL_METHODS, toy_pair

TRIALS = 1_000_000
ALPHA = 1e-3
#: select_gbv's sampler walks one instance at a time in Python (~0.1 ms each): fewer draws here; its own
#: chi-square (tests/test_verify_select_gbv.py) and exact-law tests carry its evidence.
TRIALS_FOR = {"select_gbv": 40_000}


@pytest.mark.parametrize("method", ALL_METHODS)
def test_fast_sampler_matches_exact_law(method: str) -> None:
    K = 3 if mdv.VERIFIERS[method].multi_draft else 1
    target, draft = toy_pair(3, seed=5, zeros=True)
    law = iteration_law(method, target, draft, K, 2)
    trials = TRIALS_FOR.get(method, TRIALS)
    counts = sample_iterations(method, target, draft, K, 2, trials, seed=11)
    assert sum(counts.values()) == trials
    p_value = chi_square_pvalue(counts, law)
    assert p_value > ALPHA, f"{method}: chi-square p = {p_value:.3g} over {len(law)} outcomes"


def test_chi_square_detects_a_wrong_law() -> None:
    """The statistical check has power: GBV's samples, tested against the law of another method (BV)
    on the same pair, are rejected."""
    target, draft = toy_pair(3, seed=5, zeros=True)
    counts = sample_iterations("gbv", target, draft, 1, 2, TRIALS, seed=11)
    assert chi_square_pvalue(counts, iteration_law("bv", target, draft, 1, 2)) < 1e-12
