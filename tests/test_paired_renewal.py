"""mdv.paired.renewal: the expected iterations of a run capped at n tokens, against an enumeration and a
simulation of the engine's own cut rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mdv.errors import InvalidInputError
from mdv.paired.renewal import cap_factor, emitted_law, expected_iterations, expected_iterations_reference


def _random_law(rng: np.random.Generator, size: int, zeros: bool) -> np.ndarray:
    w = rng.random(size)
    if zeros:
        w[rng.random(size) < 0.4] = 0.0
        if w.sum() == 0:
            w[-1] = 1.0
    return w / w.sum()


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_programme_equals_the_enumeration(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for size in (1, 2, 3, 4):
        for n in (1, 2, 3, 5, 7):
            law = _random_law(rng, size, zeros=seed % 2 == 1)
            assert expected_iterations(law, n) == pytest.approx(expected_iterations_reference(law, n), abs=1e-12)


def test_deterministic_blocks_give_the_ceiling() -> None:
    for L1 in (1, 3, 5):
        law = np.zeros(L1)
        law[-1] = 1.0  # every iteration emits L + 1 = L1 tokens
        for n in (1, 4, 10, 33):
            assert expected_iterations(law, n) == math.ceil(n / L1)
            assert cap_factor(law, n) == pytest.approx((n / math.ceil(n / L1)) / L1)


def test_wald_identity_and_the_large_n_limit() -> None:
    """E[S_N] = E[e] E[N] >= n with overshoot below L + 1; for large n the factor tends to
    1 - E[e(e-1)] / (2 E[e] n) (the stationary overshoot of a lattice renewal process)."""
    law = np.array([0.2, 0.1, 0.15, 0.1, 0.45])
    e = np.arange(1, 6)
    mean = float(law @ e)
    for n in (5, 32, 64, 500):
        overshoot = mean * expected_iterations(law, n) - n
        assert 0.0 <= overshoot < law.size
    n = 2000
    limit = 1 - float(law @ (e * (e - 1))) / (2 * mean * n)
    assert cap_factor(law, n) == pytest.approx(limit, abs=1e-6)


def test_simulation_of_the_engine_cut() -> None:
    """Runs that append e_i ~ law until n tokens and cut the surplus (mdv.engine._commit): the mean number
    of iterations agrees with E[N(n)] (z-test, 4 sigma, fixed seed)."""
    rng = np.random.default_rng(7)
    law = np.array([0.3, 0.25, 0.05, 0.4])
    n, runs = 23, 20_000
    draws = rng.choice(np.arange(1, 5), size=(runs, n), p=law)
    iters = (np.cumsum(draws, axis=1) < n).sum(axis=1) + 1  # first k with S_k >= n
    exact = expected_iterations(law, n)
    assert abs(iters.mean() - exact) < 4 * iters.std() / math.sqrt(runs)


def test_emitted_law_from_tail_probabilities() -> None:
    reach = np.array([[0.9, 0.5, 0.2], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # P(tau >= i), i = 1..3
    law = emitted_law(reach)
    np.testing.assert_allclose(law[0], [0.1, 0.4, 0.3, 0.2])
    np.testing.assert_allclose(law[1], [1, 0, 0, 0])
    np.testing.assert_allclose(law[2], [0, 0, 0, 1])
    np.testing.assert_allclose(law @ np.arange(1, 5), 1 + reach.sum(-1))  # E[e] = 1 + sum_i P(tau >= i)


@pytest.mark.parametrize("law, n, hint", [
    ([0.5, 0.6], 4, "sum to 1"), ([[0.5, 0.5]], 4, "1-D"), ([1.0], 0, "n (max_new_tokens)"),
    ([1.0], 2.5, "n (max_new_tokens)"), ([-0.5, 1.5], 3, "non-negative")])
def test_bad_input_is_one_clear_error(law, n, hint: str) -> None:
    with pytest.raises(InvalidInputError, match=hint.replace("(", r"\(").replace(")", r"\)")):
        expected_iterations(law, n)
