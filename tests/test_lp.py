"""Exact LP oracles of mdv.oracle.lp against the numbers and identities of algorithms.md §2, §6.3-§7."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import mdv.oracle.lp as lpmod
from mdv.errors import InvalidInputError
from mdv.models.sampling import SamplingConfig
from mdv.oracle.lp import (
    LPSolveError,
    block_joints,
    gbv_expected_accepted_formula,
    lp_greedy,
    lp_optimum,
    lp_valid,
    membership_ot,
    membership_ot_mincut,
    membership_ot_upper_bound,
    paper_claimed_expected_accepted,
    sd_expected_accepted_formula,
)
from mdv.oracle.toy import iid_toy_model, random_toy_model


# ------------------------------------------------------------------------------- §7.1 single token
def test_example_b_membership_ot():
    """Example B (§3.1): p = (.5, .5) target, q = (.25, .75) draft, K = 2."""
    p, q = [0.5, 0.5], [0.25, 0.75]
    assert membership_ot(p, q, 2) == pytest.approx(0.9375, abs=1e-12)
    assert membership_ot_mincut(p, q, 2) == pytest.approx(0.9375, abs=1e-12)
    assert membership_ot_upper_bound(p, q, 2) == pytest.approx(0.9375, abs=1e-12)


def _random_simplex(rng: np.random.Generator, V: int) -> np.ndarray:
    v = rng.dirichlet(0.7 * np.ones(V))
    if V > 1 and rng.random() < 0.3:  # some zero entries
        v[rng.integers(V)] = 0.0
        v /= v.sum()
    return v


def test_membership_ot_matches_mincut_and_bounds():
    rng = np.random.default_rng(1234)
    gaps = []
    for _ in range(50):
        V, K = int(rng.integers(2, 5)), int(rng.integers(1, 4))
        p, q = _random_simplex(rng, V), _random_simplex(rng, V)
        ot_val = membership_ot(p, q, K)
        cut = membership_ot_mincut(p, q, K)
        assert abs(ot_val - cut) <= 1e-9, (p, q, K, ot_val, cut)
        assert ot_val <= membership_ot_upper_bound(p, q, K) + 1e-12
        # paper-style single-token value Σ p [1 - (1 - min(q/p, 1))^K] is ≤ α* (§7.1 "Fact")
        r = np.where(p > 0, np.minimum(q / np.where(p > 0, p, 1.0), 1.0), 1.0)
        assert float((p * (1 - (1 - r) ** K)).sum()) <= ot_val + 1e-12
        if K == 1:  # one draft: α* = Σ min(p, q) = 1 - TV
            assert ot_val == pytest.approx(float(np.minimum(p, q).sum()), abs=1e-12)
        gaps.append(membership_ot_upper_bound(p, q, K) - ot_val)
    assert max(gaps) > 1e-3  # the bound is not tight everywhere, so the comparison above has teeth


def test_membership_ot_bad_input():
    with pytest.raises(InvalidInputError):
        membership_ot([0.5, 0.5], [0.25, 0.75], 0)
    with pytest.raises(InvalidInputError, match="sum to 1"):
        membership_ot([0.5, 0.6], [0.25, 0.75], 2)
    with pytest.raises(InvalidInputError, match="same length"):
        membership_ot_mincut([0.5, 0.5], [0.2, 0.3, 0.5], 2)
    with pytest.raises(InvalidInputError, match="MAX_DRAFT_TUPLES"):
        membership_ot(np.ones(10) / 10, np.ones(10) / 10, 5)


# ------------------------------------------------------------------------------- block level
EXAMPLE_C = {  # §6.4: K -> (LP-greedy, LP-valid, φ-sum)
    1: (1.4375, 1.3750, 1.4375),
    2: (1.8047, 1.7734, 1.7031),
    3: (1.9260, 1.9260, 1.8242),
}


@pytest.mark.parametrize("K", [1, 2, 3])
def test_example_c_table(K: int):
    target, draft = iid_toy_model([0.5, 0.5]), iid_toy_model([0.25, 0.75])
    greedy, valid, phi = EXAMPLE_C[K]
    assert round(lp_greedy(target, draft, K, 2), 4) == greedy
    assert round(lp_valid(target, draft, K, 2), 4) == valid
    assert round(paper_claimed_expected_accepted(target, draft, K, 2), 4) == phi
    assert lp_optimum(target, draft, K, 2, "greedy") == pytest.approx(lp_greedy(target, draft, K, 2), abs=1e-12)
    assert lp_optimum(target, draft, K, 2, "valid") == pytest.approx(lp_valid(target, draft, K, 2), abs=1e-12)


def test_bv_paper_example():
    """§4: target (1/3, 2/3), draft (2/3, 1/3), L = 2: SD 10/9, BV = LP-valid 11/9, greedy 12/9."""
    target, draft = iid_toy_model([1 / 3, 2 / 3]), iid_toy_model([2 / 3, 1 / 3])
    assert lp_valid(target, draft, 1, 2) == pytest.approx(11 / 9, abs=1e-9)
    assert lp_greedy(target, draft, 1, 2) == pytest.approx(12 / 9, abs=1e-9)
    assert sd_expected_accepted_formula(target, draft, 2) == pytest.approx(10 / 9, abs=1e-12)
    assert gbv_expected_accepted_formula(target, draft, 2) == pytest.approx(12 / 9, abs=1e-12)


def _bv_expected_tau(target, draft, L: int) -> float:
    """BV's E[tau] = Σ_i E_{D~q}[w_i(D)], w_i = min{1, w_{i-1} p/q} (§4), by direct enumeration."""
    V = target.vocab_size
    total = 0.0
    for d in itertools.product(range(V), repeat=L):
        p = [float(target.probs(d[:i])[d[i]]) for i in range(L)]
        q = [float(draft.probs(d[:i])[d[i]]) for i in range(L)]
        Qd = float(np.prod(q))
        if Qd == 0:
            continue
        w = 1.0
        for i in range(L):
            w = min(1.0, w * p[i] / q[i])
            total += Qd * w
    return total


TOYS = [(V, seed, zp) for V in (2, 3) for seed in (0, 1) for zp in (0.0, 0.3)]


@pytest.mark.parametrize("V,seed,zero_prob", TOYS)
def test_random_toy_identities(V: int, seed: int, zero_prob: float):
    target = random_toy_model(V, 10 + seed, zero_prob=zero_prob)
    draft = random_toy_model(V, 20 + seed, zero_prob=zero_prob)
    L = 2
    greedy = {K: lp_greedy(target, draft, K, L) for K in (1, 2)}
    valid = {K: lp_valid(target, draft, K, L) for K in (1, 2)}
    phi = {K: paper_claimed_expected_accepted(target, draft, K, L) for K in (1, 2)}
    # identities at K = 1 (§7.2, §7.3)
    assert greedy[1] == pytest.approx(gbv_expected_accepted_formula(target, draft, L), abs=1e-9)
    assert valid[1] == pytest.approx(_bv_expected_tau(target, draft, L), abs=1e-9)
    assert phi[1] == pytest.approx(greedy[1], abs=1e-12)
    # orderings
    assert sd_expected_accepted_formula(target, draft, L) <= valid[1] + 1e-9
    for K in (1, 2):
        assert valid[K] <= greedy[K] + 1e-9
        assert phi[K] <= greedy[K] + 1e-9
        assert 0.0 <= valid[K] <= L + 1e-9
    assert greedy[2] >= greedy[1] - 1e-9
    assert valid[2] >= valid[1] - 1e-9
    assert phi[2] >= phi[1] - 1e-12


def test_reference_toy_numbers():
    """run_checks.out, random context-dependent toy seed 0 (V=3, L=2): LP-valid / LP-greedy / φ-sum."""
    target, draft = random_toy_model(3, 100), random_toy_model(3, 200)
    assert round(lp_valid(target, draft, 1, 2), 5) == 1.03901
    assert round(lp_valid(target, draft, 2, 2), 4) == 1.1001
    assert round(lp_greedy(target, draft, 2, 2), 4) == 1.1045
    assert round(paper_claimed_expected_accepted(target, draft, 2, 2), 4) == 1.0981
    assert round(lp_greedy(target, draft, 3, 2), 4) == 1.1623


def test_block_joints():
    target = random_toy_model(3, 5, zero_prob=0.3)
    draft = random_toy_model(3, 6)
    prompt = (2, 0)
    bj = block_joints(target, draft, 2, prompt)
    assert bj.blocks.shape == (9, 2) and bj.P.shape == bj.Q.shape == (9,)
    assert bj.P.dtype == np.float64
    assert [tuple(b) for b in bj.blocks] == list(itertools.product(range(3), repeat=2))
    assert bj.P.sum() == pytest.approx(1.0, abs=1e-12) and bj.Q.sum() == pytest.approx(1.0, abs=1e-12)
    for i, (u1, u2) in enumerate(bj.blocks.tolist()):
        expect = float(target.probs(prompt)[u1] * target.probs(prompt + (u1,))[u2])
        assert bj.P[i] == pytest.approx(expect, abs=1e-15)
    # temperature 0: one-hot on the greedy path
    bj0 = block_joints(target, draft, 2, prompt, SamplingConfig(temperature=0.0))
    g1 = int(target.probs(prompt).argmax())
    g2 = int(target.probs(prompt + (g1,)).argmax())
    assert bj0.P[g1 * 3 + g2] == 1.0 and bj0.P.sum() == 1.0


def test_greedy_decoding_limits():
    """At T = 0 with target == draft every draft matches: both optima equal L; a different draft
    matches only its common greedy prefix."""
    m = random_toy_model(3, 7)
    for kind in ("valid", "greedy"):
        assert lp_optimum(m, m, 2, 2, kind, temperature=0.0) == pytest.approx(2.0, abs=1e-9)
    target, draft = iid_toy_model([0.2, 0.8]), iid_toy_model([0.7, 0.3])  # argmax 1 vs 0
    for kind in ("valid", "greedy"):
        assert lp_optimum(target, draft, 2, 2, kind, temperature=0.0) == pytest.approx(0.0, abs=1e-9)


def test_lp_optimum_bad_input():
    target, draft = iid_toy_model([0.5, 0.5]), iid_toy_model([0.25, 0.75])
    with pytest.raises(InvalidInputError, match="valid kinds are: valid, greedy"):
        lp_optimum(target, draft, 1, 2, "optimal")
    with pytest.raises(InvalidInputError, match="K"):
        lp_optimum(target, draft, 0, 2, "valid")
    with pytest.raises(InvalidInputError, match="L"):
        lp_optimum(target, draft, 1, 0, "greedy")
    with pytest.raises(InvalidInputError):
        lp_greedy(target, draft, 2, 0)
    with pytest.raises(InvalidInputError, match="vocabulary"):
        lp_valid(target, iid_toy_model([0.2, 0.3, 0.5]), 1, 2)
    with pytest.raises(InvalidInputError, match=r"2\^\(5·3\) = 32768"):
        lp_optimum(target, draft, 3, 5, "greedy")
    with pytest.raises(InvalidInputError, match="MAX_DRAFT_TUPLES"):
        lp_optimum(target, draft, 3, 5, "valid")


def test_solver_failures_raise(monkeypatch):
    target, draft = iid_toy_model([0.5, 0.5]), iid_toy_model([0.25, 0.75])
    real_emd = lpmod.ot.emd

    def emd_not_optimal(a, b, M, **kw):
        G, log = real_emd(a, b, M, **kw)
        return G, dict(log, result_code=3, warning="numItermax reached before optimality")

    monkeypatch.setattr(lpmod.ot, "emd", emd_not_optimal)
    with pytest.raises(LPSolveError, match="result_code=3"):
        lp_greedy(target, draft, 1, 2)
    with pytest.raises(LPSolveError):
        membership_ot([0.5, 0.5], [0.25, 0.75], 2)
    monkeypatch.undo()

    class Failed:
        status, message, fun = 4, "numerical difficulties", 0.0

    monkeypatch.setattr(lpmod, "linprog", lambda *a, **k: Failed())
    with pytest.raises(LPSolveError, match="status=4"):
        lp_valid(target, draft, 1, 2)
