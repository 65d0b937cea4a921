"""mdv.paired.renewal: the expected iterations of a run capped at n tokens, against an enumeration and a
simulation of the engine's own cut rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mdv.errors import InvalidInputError
from mdv.paired.renewal import (stretch_weights, cap_factor, emitted_law, expected_iterations, expected_iterations_reference,
                                iteration_starts, iterations_given_output, iterations_given_output_reference,
                                kseq_survival, kseq_survival_reference)


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


# ------------------------------------------------------------------ where real iterations start, given the output
def _random_survival(rng: np.random.Generator, n: int, K_max: int) -> np.ndarray:
    T = np.zeros((n, K_max, K_max + 1))  # [n, K_max, K_max+1]
    for k in range(1, K_max + 1):
        w = rng.random((n, k + 1))
        w[rng.random((n, k + 1)) < 0.3] = 0.0
        w[:, 0] += 1e-3 * (w.sum(1) == 0)
        T[:, k - 1, :k + 1] = w / w.sum(1, keepdims=True)
    return T


def test_iteration_starts_equal_the_enumeration_of_survivor_paths() -> None:
    """(4) forward over positions against the backward walk over every path of survivor counts, on a grid
    of random survival laws drawn here (with zeros), K = 1..3, L = 1..3."""
    rng = np.random.default_rng()
    for _ in range(150):
        n, L, K = int(rng.integers(1, 8)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
        T = _random_survival(rng, n, K + int(rng.integers(0, 2)))
        assert iterations_given_output(T, L, K) == pytest.approx(iterations_given_output_reference(T, L, K), abs=1e-12)
        starts = iteration_starts(T, L, K)
        assert starts[0] == 1.0 and ((starts >= 0) & (starts <= 1 + 1e-12)).all()


def test_iteration_starts_at_the_extremes() -> None:
    """Every draft accepted: iterations of L + 1 tokens (the ceiling); none: one token each."""
    every = np.zeros((10, 1, 2))
    every[:, 0, 1] = 1.0
    assert iterations_given_output(every, 3) == 3.0  # 4 + 4 + 2 tokens
    np.testing.assert_array_equal(iteration_starts(every, 3), [1, 0, 0, 0, 1, 0, 0, 0, 1, 0])
    none = np.zeros((10, 1, 2))
    none[:, 0, 0] = 1.0
    assert iterations_given_output(none, 3) == 10.0
    with pytest.raises(InvalidInputError, match="survival must be"):
        iterations_given_output(np.ones((3, 1, 3)), 2)
    with pytest.raises(InvalidInputError, match="K_max >= K = 2"):
        iterations_given_output(every, 2, K=2)


def test_stretch_weights_sum_the_starts_over_each_contexts_stretch() -> None:
    """By hand: contexts at 2 and 5 of 8 positions stand for [0, 5) and [5, 8); a shared offset splits its
    stretch; on random starts and offsets drawn here the weights always sum to E[N | x] = sum_t B_t."""
    B = np.array([1.0, 0.0, 0.5, 0.25, 0.0, 1.0, 0.0, 0.5])
    np.testing.assert_allclose(stretch_weights(B, [2, 5]), [1.75, 1.5])
    np.testing.assert_allclose(stretch_weights(B, [5, 2]), [1.5, 1.75])  # the contexts' order is kept
    np.testing.assert_allclose(stretch_weights(B, [0, 5, 5]), [1.75, 0.75, 0.75])
    np.testing.assert_allclose(stretch_weights(B, [7]), [B.sum()])
    rng = np.random.default_rng()
    for _ in range(50):
        n = int(rng.integers(1, 40))
        starts = rng.random(n)
        offsets = rng.integers(0, n, int(rng.integers(1, 6)))
        w = stretch_weights(starts, offsets)
        assert w.shape == offsets.shape and (w >= 0).all() and w.sum() == pytest.approx(starts.sum())
    for bad in ([8], [-1], [], [1.5]):
        with pytest.raises(InvalidInputError, match="offsets"):
            stretch_weights(B, bad)


@pytest.mark.parametrize("zeros", [False, True])
def test_kseq_survival_equals_the_enumeration_of_draft_tuples(zeros: bool) -> None:
    """(5) against enumerating every k-tuple of draft tokens through K-SEQ's own tests and residual
    (mdv.verify.spectr), k = 1..3, V = 2..4; every row a law; at k = 1 it is sd's [1 - a, a]."""
    import torch

    g = torch.Generator().manual_seed(int(np.random.default_rng().integers(1 << 30)))
    for _ in range(40):
        V = int(torch.randint(2, 5, (1,), generator=g))
        p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        q = torch.rand(V, generator=g, dtype=torch.float64) ** 3
        if zeros:
            q[int(torch.randint(0, V, (1,), generator=g))] = 0.0
        p, q = p / p.sum(), q / q.sum()
        y = int(torch.multinomial(p, 1, generator=g))
        T = kseq_survival(p[None], q[None], torch.tensor([y]), 3)[0]  # [3, 4]
        for k in range(1, 4):
            np.testing.assert_allclose(T[k - 1, :k + 1].numpy(), kseq_survival_reference(p, q, y, k), atol=1e-12)
            assert float(T[k - 1].sum()) == pytest.approx(1.0, abs=1e-12) and float(T[k - 1, k + 1:].abs().sum()) == 0
        a = min(1.0, float(q[y] / p[y]))
        np.testing.assert_allclose(T[0, :2].numpy(), [1 - a, a], atol=1e-12)


@pytest.mark.parametrize("method,K", [("sd", 1), ("spectr", 2)])
def test_real_runs_count_the_iterations_predicted_along_target_trajectories(method: str, K: int) -> None:
    """On a tiny random pair: the mean of E[N | x] over target trajectories x (survival_along, (4)) equals the
    mean number of iterations of real mdv.generate runs of the same length (z-test, level 1e-3).  The test
    tells rules apart: counting spectr's K = 2 runs with the K = 1 law gives z = -4.8 at this size."""
    import torch

    from mdv.drafters.registry import get_drafter
    from mdv.engine import generate
    from mdv.models.sampling import SamplingConfig
    from mdv.paired.trajectory import survival_along
    from tests.test_hf_model import tiny_pair

    target, draft = tiny_pair(vocab_size=12, seed=3, noise=1.0, scale=8.0)
    prompt, n, L, T = [1, 4, 2, 7], 10, 3, 0.7
    sampling = SamplingConfig(T)
    drafter = get_drafter("model")
    drafter.bind(target, draft)
    predicted, real = [], []
    with torch.inference_mode():
        for s in range(300):
            x = generate(target, None, prompt, "ar", temperature=T, max_new_tokens=n, seed=s, eos_token_id=[]).tokens
            logits = target.new_session().extend(torch.tensor([prompt + x[:-1]]))[0, len(prompt) - 1:]  # [n, V]
            laws = list(sampling.probs(logits))
            predicted.append(iterations_given_output(np.array(survival_along(drafter, prompt, x, laws, sampling, K)),
                                                     L, K))
            r = generate(target, draft, prompt, method, K=K, L=L, temperature=T, max_new_tokens=n, seed=10_000 + s,
                         eos_token_id=[])
            real.append(r.stats["target_calls"])
    predicted, real = np.array(predicted), np.array(real, dtype=np.float64)
    se = math.sqrt(predicted.var(ddof=1) / predicted.size + real.var(ddof=1) / real.size)
    z = (real.mean() - predicted.mean()) / se
    assert abs(z) < 3.29, (real.mean(), predicted.mean(), z)  # two-sided, level 1e-3
    assert 1.5 < real.mean() < n - 0.5  # the check is not trivial: iterations of several tokens, not all


@pytest.mark.parametrize("method,K", [("sd", 1), ("spectr", 2)])
def test_each_real_run_is_counted_by_the_law_given_its_own_output(method: str, K: int) -> None:
    """The speed check's pairing (mdv.paired.speedcheck.InterleavedCheck.add_survival): E[N | x] evaluated on a
    real run's own output x is that run's expected iteration count, so the mean of (target calls - E[N | x])
    over runs is 0 (z-test, level 1e-3) -- which needs the survivors at a position to say nothing of the output
    after it.  Paired, the spread is the count's conditional one, well under the unpaired spread of the test
    above.  It tells rules apart: spectr's K = 2 runs counted with the K = 1 law fail."""
    import torch

    from mdv.drafters.registry import get_drafter
    from mdv.engine import generate
    from mdv.models.sampling import SamplingConfig
    from mdv.paired.trajectory import laws_along, survival_given_output
    from tests.test_hf_model import tiny_pair

    target, draft = tiny_pair(vocab_size=12, seed=3, noise=1.0, scale=8.0)
    prompt, n, L, T = [1, 4, 2, 7], 10, 3, 0.7
    sampling = SamplingConfig(T)
    drafter = get_drafter("model")
    drafter.bind(target, draft)
    diff, wrong, calls = [], [], []
    with torch.inference_mode():
        for s in range(300):
            r = generate(target, draft, prompt, method, K=K, L=L, temperature=T, max_new_tokens=n, seed=20_000 + s,
                         eos_token_id=[])
            law = np.array(survival_given_output(target, drafter, prompt, r.tokens, sampling, K))  # [n, K, K+1]
            calls.append(r.stats["target_calls"])
            diff.append(r.stats["target_calls"] - iterations_given_output(law, L, K))
            if K > 1:
                wrong.append(r.stats["target_calls"] - iterations_given_output(law, L, 1))
        if s == 299:  # the one-pass laws are the engine's AR laws (float32 rounding apart)
            x = generate(target, None, prompt, "ar", temperature=T, max_new_tokens=n, seed=s, eos_token_id=[]).tokens
            logits = target.new_session().extend(torch.tensor([prompt + x[:-1]]))[0, len(prompt) - 1:]  # [n, V]
            np.testing.assert_allclose(laws_along(target, prompt, x, sampling).numpy(),
                                       sampling.probs(logits).double().numpy(), atol=1e-6)
    diff, calls = np.array(diff), np.array(calls, dtype=np.float64)
    z = diff.mean() / (diff.std(ddof=1) / math.sqrt(diff.size))
    assert abs(z) < 3.29, (diff.mean(), z)  # two-sided, level 1e-3
    assert diff.std() < 0.8 * calls.std(), (diff.std(), calls.std())  # the pairing removes the output's spread
    if K > 1:
        w = np.array(wrong)
        assert w.mean() / (w.std(ddof=1) / math.sqrt(w.size)) < -3.29  # the K = 1 law over-counts spectr's runs
