"""mdv.oracle.membership: α*_K by the sorted-prefix form (Hu et al. 2025) against the 2^V enumeration
(membership_ot_mincut), the OT LP (membership_ot), identities, bounds and input validation."""
from __future__ import annotations

import json
import re
from collections import defaultdict

import numpy as np
import pytest
import torch

import mdv.oracle.membership as mem
from mdv.errors import InvalidInputError
from mdv.oracle.lp import membership_ot, membership_ot_mincut, membership_ot_upper_bound
from mdv.oracle.membership import membership_ot_sorted, membership_ot_sorted_batch

BIG_V = 49_152
N_ENUM_CASES = 12_000


# ------------------------------------------------------------------------------- case generator
def _dirichlet(rng: np.random.Generator, V: int) -> np.ndarray:
    alpha = float(rng.choice([0.03, 0.1, 0.3, 1.0, 3.0]))
    v = rng.dirichlet(alpha * np.ones(V))
    if not np.isfinite(v).all() or v.sum() <= 0:  # tiny concentrations can underflow
        v = np.zeros(V)
        v[rng.integers(V)] = 1.0
    return v


def _zero_some(rng: np.random.Generator, v: np.ndarray) -> np.ndarray:
    """Exact zeros on a random subset (at least one entry stays positive)."""
    v = v.copy()
    keep = int(rng.integers(v.size))
    mask = rng.random(v.size) < 0.4
    mask[keep] = False
    if v[~mask].sum() <= 0:
        v[keep] = 1.0
    v[mask] = 0.0
    return v / v.sum()


def _pair(rng: np.random.Generator, V: int) -> tuple[np.ndarray, np.ndarray]:
    """A random (p, q) over V tokens; kinds mix exact zeros, shared zeros, ties p = q and p = c·q on a
    subset, quantised (many exact ties and zeros), one-hot and p = q."""
    kind = int(rng.integers(9))
    p, q = _dirichlet(rng, V), _dirichlet(rng, V)
    if kind == 1:
        p = _zero_some(rng, p)
    elif kind == 2:
        q = _zero_some(rng, q)
    elif kind == 3:  # zeros in both, some shared
        shared = rng.random(V) < 0.3
        shared[int(rng.integers(V))] = False
        p[shared], q[shared] = 0.0, 0.0
        for v in (p, q):
            if v.sum() <= 0:
                v[~shared] = 1.0
        p, q = _zero_some(rng, p / p.sum()), _zero_some(rng, q / q.sum())
    elif kind in (4, 5):  # q = p (kind 4) or p = c·q (kind 5) on a subset S
        S = rng.random(V) < 0.5
        S[int(rng.integers(V))] = True
        c = 1.0 if kind == 4 else float(rng.uniform(0.2, 3.0))
        mass = c * q[S].sum()
        if mass > 1.0 or S.all():
            c, mass = 1.0 / q[S].sum(), 1.0
        p = np.zeros(V)
        p[S] = c * q[S]
        if (~S).any():
            p[~S] = (1.0 - mass) * _dirichlet(rng, int((~S).sum()))
        if rng.random() < 0.3:
            q = _zero_some(rng, q)  # ties and zeros together
    elif kind == 6:  # quantised: small integer counts
        cp, cq = rng.integers(0, 4, V).astype(float), rng.integers(0, 4, V).astype(float)
        cp[int(rng.integers(V))] += 1
        cq[int(rng.integers(V))] += 1
        p, q = cp / cp.sum(), cq / cq.sum()
    elif kind == 7:  # a one-hot side
        one = np.zeros(V)
        one[int(rng.integers(V))] = 1.0
        if rng.random() < 0.5:
            p = one
        else:
            q = one
    elif kind == 8:  # p = q everywhere (sometimes with zeros)
        p = _zero_some(rng, p) if rng.random() < 0.5 else p
        q = p.copy()
    return p / p.sum(), q / q.sum()


def _has_zero(p: np.ndarray, q: np.ndarray) -> bool:
    return bool((p == 0).any() or (q == 0).any())


def _has_tie(p: np.ndarray, q: np.ndarray) -> bool:
    """Two relevant tokens x != y with q_x p_y == q_y p_x exactly (equal q/p, incl. both +inf / both 0)."""
    rel = (p > 0) | (q > 0)
    pr, qr = p[rel], q[rel]
    cross = qr[:, None] * pr[None, :] == qr[None, :] * pr[:, None]
    np.fill_diagonal(cross, False)
    return bool(cross.any())


def _cases(seed: int, n: int, Vs: range | list[int], Ks: range | list[int]):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        V, K = int(rng.choice(list(Vs))), int(rng.choice(list(Ks)))
        p, q = _pair(rng, V)
        out.append((p, q, K))
    return out


def _counterexamples(cases, got, want, tol):
    bad = [(i, abs(g - w)) for i, (g, w) in enumerate(zip(got, want)) if not abs(g - w) <= tol]
    rec = [{"index": i, "K": cases[i][2], "p": cases[i][0].tolist(), "q": cases[i][1].tolist(),
            "sorted": got[i], "reference": want[i], "abs_err": err} for i, err in bad[:5]]
    return bad, json.dumps(rec, indent=1)


# ------------------------------------------------------------------------------- 1. vs 2^V enumeration
def test_sorted_prefix_equals_subset_enumeration():
    """The claim (Hu et al. 2025): the min over all 2^V subsets is attained at a prefix of the q/p order.

    N_ENUM_CASES random cases, V in 2..10, K in 1..6, a large share with exact zeros and exact ties;
    both the scalar and the batch function against membership_ot_mincut, within 1e-12.  A failure prints
    the counterexamples (p, q, K, both values) as JSON."""
    cases = _cases(7, N_ENUM_CASES, range(2, 11), range(1, 7))
    n_zero = sum(_has_zero(p, q) for p, q, _ in cases)
    n_tie = sum(_has_tie(p, q) for p, q, _ in cases)
    assert n_zero >= 0.3 * len(cases) and n_tie >= 0.3 * len(cases), (n_zero, n_tie)

    want = [membership_ot_mincut(p, q, K) for p, q, K in cases]
    got_scalar = [membership_ot_sorted(p, q, K) for p, q, K in cases]
    got_batch = [0.0] * len(cases)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (p, _, K) in enumerate(cases):
        groups[(p.size, K)].append(i)
    for (V, K), idx in groups.items():
        P = torch.tensor(np.stack([cases[i][0] for i in idx]))  # [n, V]
        Q = torch.tensor(np.stack([cases[i][1] for i in idx]))  # [n, V]
        for i, a in zip(idx, membership_ot_sorted_batch(P, Q, K).tolist()):
            got_batch[i] = a

    err_s = max(abs(g - w) for g, w in zip(got_scalar, want))
    err_b = max(abs(g - w) for g, w in zip(got_batch, want))
    print(f"\n[enumeration] {len(cases)} cases ({n_zero} with zeros, {n_tie} with ties): "
          f"max |sorted - mincut| scalar {err_s:.3g}, batch {err_b:.3g}")
    for got in (got_scalar, got_batch):
        bad, rec = _counterexamples(cases, got, want, 1e-12)
        assert not bad, f"sorted-prefix claim FAILS on {len(bad)} of {len(cases)} cases; first ones:\n{rec}"


def test_sorted_prefix_equals_enumeration_larger_vocab():
    """A few cases at V = 14..16 (2^16 subsets), all kinds of pairs, K up to 8."""
    cases = _cases(11, 24, [14, 15, 16], range(1, 9))
    want = [membership_ot_mincut(p, q, K) for p, q, K in cases]
    got = [membership_ot_sorted(p, q, K) for p, q, K in cases]
    bad, rec = _counterexamples(cases, got, want, 1e-12)
    assert not bad, rec


def test_permutation_invariance():
    """Relabelling the tokens (one permutation applied to p and q) leaves α* unchanged."""
    rng = np.random.default_rng(5)
    for p, q, K in _cases(13, 300, range(2, 30), range(1, 7)):
        perm = rng.permutation(p.size)
        assert membership_ot_sorted(p[perm], q[perm], K) == pytest.approx(
            membership_ot_sorted(p, q, K), abs=1e-14)


# ------------------------------------------------------------------------------- 2. vs the OT LP
def test_sorted_prefix_equals_ot_lp():
    """Against SpecTr's OT with membership cost (POT's network simplex) on 300 cases with V^K <= 256."""
    rng = np.random.default_rng(3)
    cases = []
    while len(cases) < 300:
        V, K = int(rng.integers(2, 7)), int(rng.integers(1, 5))
        if V ** K <= 256:
            p, q = _pair(rng, V)
            cases.append((p, q, K))
    want = [membership_ot(p, q, K) for p, q, K in cases]
    got = [membership_ot_sorted(p, q, K) for p, q, K in cases]
    err = max(abs(g - w) for g, w in zip(got, want))
    print(f"\n[OT LP] {len(cases)} cases: max |sorted - membership_ot| {err:.3g}")
    bad, rec = _counterexamples(cases, got, want, 1e-9)
    assert not bad, rec


# ------------------------------------------------------------------------------- 3. batch, identities, large V
def test_batch_equals_scalar_row_by_row():
    rng = np.random.default_rng(17)
    for V, K in [(2, 1), (7, 3), (300, 2), (300, 6), (1000, 12)]:
        rows = [_pair(rng, V) for _ in range(40)]
        P = torch.tensor(np.stack([r[0] for r in rows]))  # [40, V]
        Q = torch.tensor(np.stack([r[1] for r in rows]))  # [40, V]
        got = membership_ot_sorted_batch(P, Q, K)
        assert got.shape == (40,) and got.dtype == torch.float64
        want = torch.tensor([membership_ot_sorted(p, q, K) for p, q in rows], dtype=torch.float64)
        assert torch.allclose(got, want, rtol=0, atol=1e-14), (V, K, (got - want).abs().max())


def test_batch_chunking_matches_one_chunk(monkeypatch):
    """Rows are processed in chunks: tiny chunks (one or two rows) give the same numbers as one chunk."""
    rng = np.random.default_rng(19)
    rows = [_pair(rng, 50) for _ in range(9)]
    P = torch.tensor(np.stack([r[0] for r in rows]))
    Q = torch.tensor(np.stack([r[1] for r in rows]))
    whole = membership_ot_sorted_batch(P, Q, 3)
    for chunk in (50, 100):  # 1 and 2 rows per chunk
        monkeypatch.setattr(mem, "_CHUNK_ELEMENTS", chunk)
        assert torch.equal(membership_ot_sorted_batch(P, Q, 3), whole)
    assert membership_ot_sorted_batch(P[:0], Q[:0], 3).shape == (0,)


def test_k1_is_one_minus_total_variation():
    """K = 1: min_H [p(H) + 1 - q(H)] = 1 - max_H (q - p)(H) = 1 - TV(p, q) = Σ min(p, q)."""
    rng = np.random.default_rng(23)
    for V in (2, 5, 40, 1000, BIG_V):
        for _ in range(3 if V == BIG_V else 20):
            p, q = _pair(rng, V)
            want = float(np.minimum(p, q).sum())
            assert membership_ot_sorted(p, q, 1) == pytest.approx(want, abs=1e-12)
            assert membership_ot_sorted_batch(torch.tensor(p[None]), torch.tensor(q[None]), 1).item() == \
                pytest.approx(want, abs=1e-12)


def test_equal_laws_give_one():
    rng = np.random.default_rng(29)
    for V in (1, 2, 9, BIG_V):
        p = rng.dirichlet(0.2 * np.ones(V))
        for K in (1, 2, 5, 50):
            assert membership_ot_sorted(p, p, K) == pytest.approx(1.0, abs=1e-14)
        P = torch.tensor(np.stack([p, p]))
        assert torch.allclose(membership_ot_sorted_batch(P, P, 4), torch.ones(2, dtype=torch.float64),
                              rtol=0, atol=1e-14)


def test_big_vocab_bounds_and_monotone_in_k():
    """V = 49,152: single-token lower bound <= α*_K <= SpecTr's upper bound, α*_K <= min over one-token H,
    α*_K >= α*_1 = Σ min(p, q), non-decreasing in K; batch = scalar."""
    rng = np.random.default_rng(31)
    P = torch.tensor(rng.dirichlet(0.1 * np.ones(BIG_V), size=4))  # [4, V]
    Q = torch.tensor(rng.dirichlet(0.1 * np.ones(BIG_V), size=4))  # [4, V]
    Q[1] = 0.5 * Q[1] + 0.5 * P[1]  # a closer pair
    Q[2, :1000] = 0.0  # exact zeros in q
    Q[2] /= Q[2].sum()
    P[3, 2000:3000] = 0.0  # exact zeros in p
    P[3] /= P[3].sum()
    prev = None
    for K in (1, 2, 4, 8):
        batch = membership_ot_sorted_batch(P, Q, K)  # [4]
        for i in range(4):
            p, q = P[i].numpy(), Q[i].numpy()
            a = membership_ot_sorted(p, q, K)
            assert batch[i].item() == pytest.approx(a, abs=1e-13)
            hit = -np.expm1(K * np.log1p(-q))  # Pr[y among K drafts]
            lower = max(float(np.minimum(p, hit).max()), float(np.minimum(p, q).sum()))
            upper = membership_ot_upper_bound(p, q, K)
            single = float((p + 1.0 - q ** K).min())
            assert lower - 1e-12 <= a <= min(upper, single) + 1e-12, (i, K, lower, a, upper, single)
        if prev is not None:
            assert (batch >= prev - 1e-12).all()
        prev = batch


def test_big_vocab_disjoint_supports_and_cancellation():
    """Disjoint supports give 0; and a case where the minimiser has q(H) = 1 - 1e-10, where
    α* = 1 - (1 - 1e-10)^K ≈ K·1e-10 needs the complement-mass evaluation to keep 1e-9 relative accuracy
    (1 minus a prefix sum over 49,151 tokens would be off by ~1e-5 relative)."""
    rng = np.random.default_rng(37)
    p, q = np.zeros(BIG_V), np.zeros(BIG_V)
    p[: BIG_V // 2] = rng.dirichlet(np.ones(BIG_V // 2))
    q[BIG_V // 2:] = rng.dirichlet(np.ones(BIG_V - BIG_V // 2))
    assert membership_ot_sorted(p, q, 3) == pytest.approx(0.0, abs=1e-15)

    eps = 1e-10
    p = np.zeros(BIG_V)
    p[0] = 1.0
    q = rng.dirichlet(np.ones(BIG_V))
    q[0] = 0.0
    q *= (1.0 - eps) / q.sum()
    q[0] = eps
    for K in (1, 3, 7):
        want = -np.expm1(K * np.log1p(-q[0] / q.sum()))
        assert membership_ot_sorted(p, q, K) == pytest.approx(want, rel=1e-9, abs=0)
        got = membership_ot_sorted_batch(torch.tensor(p[None]), torch.tensor(q[None]), K).item()
        assert got == pytest.approx(want, rel=1e-9, abs=0)


# ------------------------------------------------------------------------------- 4. bad input
_P3, _Q3 = [0.2, 0.3, 0.5], [0.5, 0.25, 0.25]


@pytest.mark.parametrize("p, q, K, match", [
    (_P3, _Q3, 0, "K (number of drafts) must be an integer >= 1"),
    (_P3, _Q3, -2, "K (number of drafts) must be an integer >= 1"),
    (_P3, _Q3, 2.5, "K (number of drafts) must be an integer >= 1"),
    (_P3, _Q3, True, "K (number of drafts) must be an integer >= 1"),
    (_P3, [0.5, 0.5], 2, "p and q must have the same length"),
    ([0.5, -0.1, 0.6], _Q3, 2, "p (target) must be finite and non-negative"),
    (_P3, [0.5, float("nan"), 0.5], 2, "q (draft) must be finite and non-negative"),
    (_P3, [0.5, float("inf"), 0.5], 2, "q (draft) must be finite and non-negative"),
    ([0.2, 0.3, 0.6], _Q3, 2, "p (target) must sum to 1"),
    (_P3, [0.5, 0.25, 0.2499], 2, "q (draft) must sum to 1"),
    ([], [], 2, "p (target) must be a non-empty 1-D probability vector"),
    ([[0.5, 0.5]], [[0.5, 0.5]], 2, "p (target) must be a non-empty 1-D probability vector"),
])
def test_scalar_bad_input(p, q, K, match):
    with pytest.raises(InvalidInputError, match=re.escape(match)):
        membership_ot_sorted(p, q, K)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


_PB, _QB = _t([_P3, _Q3]), _t([_Q3, _P3])


@pytest.mark.parametrize("p, q, K, match", [
    (_PB, _QB, 0, "K (number of drafts) must be an integer >= 1"),
    (_PB, _QB, 3.0, "K (number of drafts) must be an integer >= 1"),
    (_PB, _QB[:1], 2, "p and q must have the same shape [N, V]; got p (2, 3) and q (1, 3)"),
    (_PB, _t([[0.5, 0.5], [0.5, 0.5]]), 2, "p and q must have the same shape [N, V]; got p (2, 3) and q (2, 2)"),
    (_PB[0], _QB[0], 2, "p (target) must be a 2-D [N, V] tensor"),
    (_PB, _QB[None], 2, "q (draft) must be a 2-D [N, V] tensor"),
    (_PB[:, :0], _QB[:, :0], 2, "p (target) must be a 2-D [N, V] tensor of probability rows with V >= 1"),
    (_t([_P3, [0.5, -0.1, 0.6]]), _QB, 2, "p (target) must be finite and non-negative; got p (target)[1, 1] = -0.1"),
    (_PB, _t([_Q3, [0.5, float("nan"), 0.5]]), 2, "q (draft) must be finite and non-negative; got q (draft)[1, 1]"),
    (_PB, _t([[float("inf"), 0.0, 0.0], _P3]), 2, "q (draft) must be finite and non-negative; got q (draft)[0, 0]"),
    (_t([_P3, [0.2, 0.3, 0.6]]), _QB, 2, "p (target) rows must each sum to 1 within 1e-06; row 1 sums to 1.1"),
    (_PB, _t([_Q3, [0.2, 0.3, 0.49]]), 2, "q (draft) rows must each sum to 1 within 1e-06; row 1 sums to 0.99"),
    (_PB.to(torch.complex128), _QB, 2, "p (target) must be a real [N, V] tensor"),
])
def test_batch_bad_input(p, q, K, match):
    with pytest.raises(InvalidInputError, match=re.escape(match)):
        membership_ot_sorted_batch(p, q, K)


def test_inputs_not_modified_and_sum_tolerance():
    """Rows within 1e-6 of summing to 1 are accepted (and renormalised); inputs are not modified."""
    P = _t([[0.2, 0.3, 0.5 + 5e-7]])
    Q = _t([[0.5, 0.25, 0.25]])
    P0 = P.clone()
    a = membership_ot_sorted_batch(P, Q, 2).item()
    assert torch.equal(P, P0)
    assert a == pytest.approx(membership_ot_mincut(P[0].numpy() / P[0].sum().item(), Q[0].numpy(), 2), abs=1e-15)
    assert a == pytest.approx(membership_ot_sorted(P[0], Q[0], 2), abs=1e-15)


def test_upto_equals_one_call_per_K() -> None:
    """membership_ot_sorted_upto sorts once for every K: the same values as one membership_ot_sorted per K,
    and the enumeration's on small cases with zeros."""
    from mdv.oracle.lp import membership_ot_mincut
    from mdv.oracle.membership import membership_ot_sorted, membership_ot_sorted_upto

    rng = np.random.default_rng(7)
    for _ in range(200):
        V = int(rng.integers(2, 9))
        p, q = rng.dirichlet(np.full(V, 0.5)), rng.dirichlet(np.full(V, 0.5))
        p[rng.random(V) < 0.2] = 0.0
        p = p / p.sum() if p.sum() > 0 else np.full(V, 1.0 / V)
        got = membership_ot_sorted_upto(p, q, 5)
        assert len(got) == 5
        for K in range(1, 6):
            assert got[K - 1] == membership_ot_sorted(p, q, K)
            assert abs(got[K - 1] - membership_ot_mincut(p, q, K)) < 1e-12
