"""Tests of ``select_gbv``: a selected draft verified by greedy block verification against its own law, with
the target adjustment (mdv/verify/select_gbv.py, mdv/verify/selection.py).

What is checked:
* exactness across iterations by enumeration: the first L+2 tokens follow the target law (TV < 1e-9) for
  K, L in {1, 2, 3} on dense, zero-containing and context-free (tied) toys, every walk mode; T = 0 is
  greedy matching; temperature and top-k;
* the selection kernels T_m(x, j) equal an enumeration of the m next tokens and the walk's randomness
  (for ``fill``: of which survivors are marked); fill's Jacobi sweeps solve its filling recursion on small
  vocabularies, and where the targets are reachable its first-stage masses equal them;
* fast sampler == scalar reference on the same uniforms (random consistent blocks with ties and zeros;
  blocks whose drafts disagree on a shared prefix's rows), with and without a target adjustment;
* chi-square of the fast sampler against the exact one-iteration law;
* the law is a probability law and covers the samples;
* a choice forced by a small survivor mass on m >= 2 (no scores computed) scores within CHOICE_TOL / 2 of the best
  rule, alone or in a batch;
* K = 1 is ``gbv``: the same law, the same decisions on the same uniforms, across iterations;
* dominance: E[tau] >= max(spectr, mdbv, mpbv) - 1e-9 on the theory grid's toys; on random toys drawn
  afresh in every run (seeds printed) what is proved: ``selection="kseq"`` >= spectr, ``selection="lex"`` >=
  mpbv (coupling), and at L = 1 the default >= both; at L >= 2 the default's dominance is measured, not
  proved, and the number of misses on 60 fixed random toys is pinned;
* option validation.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import Tensor

import mdv
from mdv.errors import InvalidInputError
from mdv.oracle import exact_law, expected_accepted, iteration_law, random_toy_model, target_law, total_variation
from mdv.oracle.montecarlo import chi_square_pvalue, sample_iterations
from mdv.verify.base import Uniforms
from mdv.verify.gbv import GreedyBlockVerification
from mdv.verify.select_gbv import SelectGreedyBlockVerification
from mdv.verify.mpbv import below_mass
from mdv.verify.selection import (CHOICE_ORDER, CHOICE_TOL, FILL_EPS, FILL_SWEEPS, FORCED_MASS, FORCED_RULE, RULES, advance_survivors, fill_choice,
                                  fill_kernel, SortedMasses, fill_order, fill_rule, kseq_kernel, lex_below, lex_kernel,
                                  first_kernel, node_step, overlap, reach_mass, root_survivors)
from mdv.verify.spectr import RHO_ITERS, kseq_gap, kseq_residual, kseq_rho
from mdv.theory import random_toy_case, random_toy_dominance
from tests.conftest import toy_pair
from tests.test_verify_mpbv import VOCAB, consistent_block, inconsistent_block, tied_iid_pair

f64 = torch.float64


# ------------------------------------------------------------------------------------------ exactness
CASES = [(K, L, kind) for K in (1, 2, 3) for L in (1, 2, 3) for kind in ("dense", "zeros", "iid")]


@pytest.mark.parametrize("K,L,kind", CASES, ids=[f"K{K}-L{L}-{kind}" for K, L, kind in CASES])
def test_exact_target_law_across_iterations(K: int, L: int, kind: str) -> None:
    if kind == "iid":
        target, draft = tied_iid_pair(3 if K * L <= 6 else 2)
    else:
        target, draft = toy_pair(VOCAB[(K, L)], seed=40 + 10 * K + L, zeros=kind == "zeros")
    n = L + 2
    law = exact_law("select_gbv", target, draft, K, L, n)
    assert abs(math.fsum(law.values()) - 1.0) < 1e-9
    tv = total_variation(law, target_law(target, n))
    assert tv < 1e-9, f"select_gbv K={K} L={L} {kind}: TV {tv:.3g}"


@pytest.mark.parametrize("selection", RULES)
def test_every_walk_mode_is_exact(selection: str) -> None:
    for K, L, zeros in ((2, 2, True), (3, 2, False), (2, 3, True)):
        target, draft = toy_pair(VOCAB[(K, L)], seed=7 + K + L, zeros=zeros)
        tv = total_variation(exact_law("select_gbv", target, draft, K, L, L + 2, selection=selection),
                             target_law(target, L + 2))
        assert tv < 1e-9, f"{selection} K={K} L={L}: TV {tv:.3g}"


def test_greedy_temperature_zero_is_prefix_matching() -> None:
    target, draft = toy_pair(3, seed=8)
    for K in (1, 2, 3):
        law = exact_law("select_gbv", target, draft, K, 2, 5, temperature=0.0)
        greedy = target_law(target, 5, temperature=0.0)
        assert len(greedy) == 1 and total_variation(law, greedy) < 1e-12


def test_exact_at_temperature_and_top_k() -> None:
    target, draft = toy_pair(3, seed=9, zeros=True)
    for kw in ({"temperature": 0.6}, {"temperature": 1.5, "top_k": 2}, {"temperature": 0.9, "top_p": 0.8}):
        tv = total_variation(exact_law("select_gbv", target, draft, 3, 2, 4, **kw), target_law(target, 4, **kw))
        assert tv < 1e-9, f"{kw}: TV {tv:.3g}"


# ------------------------------------------------------------------------------------------ the kernels
def _enumerated_kernel(p: np.ndarray, q: np.ndarray, m: int, K: int, rule: str) -> np.ndarray:
    """T_m(x, j) by enumerating the m i.i.d. next tokens and, for K-SEQ, its coins and residual draw."""
    V = len(p)
    T = np.zeros((V, K + 1))
    pt, qt = torch.tensor(p)[None], torch.tensor(q)[None]
    rho = kseq_rho(pt, qt, m)
    res = kseq_residual(pt, qt, m, rho)[0].numpy()
    beta = np.where(q > 0, np.minimum(1.0, p / (float(rho[0]) * np.where(q > 0, q, 1.0))), 0.0)
    r = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 1.0)
    r = np.where(p > 0, r, 0.0)
    for tup in itertools.product(range(V), repeat=m):
        w = float(np.prod([q[x] for x in tup]))
        if w == 0.0:
            continue
        if rule in ("lex", "first"):
            x = max(tup, key=lambda t: (r[t], -t)) if rule == "lex" else tup[0]
            T[x, tup.count(x)] += w
            continue
        rest = w
        for x in tup:  # drafts tested in order; the first accepted is chosen
            T[x, tup.count(x)] += rest * beta[x]
            rest *= 1.0 - beta[x]
        for y in range(V):  # all rejected: the residual draw, or the first draft's token
            x = y if y in tup else tup[0]
            T[x, tup.count(x)] += rest * res[y]
    return T


def test_selection_kernels_equal_an_enumeration() -> None:
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(150):
        V, K = int(rng.integers(2, 6)), 4
        m = int(rng.integers(1, K + 1))
        p, q = rng.dirichlet(np.ones(V) * 0.7), rng.dirichlet(np.ones(V) * 0.7)
        if trial % 3 == 0:
            p[rng.integers(V)] = 0.0
        if trial % 5 == 0:
            q[rng.integers(V)] = 0.0
        if trial % 7 == 0:
            q = p.copy()  # every ratio 1: ties everywhere
        p, q = p / p.sum(), q / q.sum()
        for rule, fn in (("kseq", kseq_kernel), ("lex", lex_kernel), ("first", lambda p, q, m, K: first_kernel(q, m, K))):
            got = fn(torch.tensor(p)[None], torch.tensor(q)[None], m, K)[0].numpy()
            want = _enumerated_kernel(p, q, m, K, rule)
            assert abs(got.sum() - 1.0) < 1e-12
            worst = max(worst, float(np.abs(got - want).max()))
        # fill: the kernel against its marks enumerated survivor by survivor, at a random target scale
        pt, qt = torch.tensor(p)[None], torch.tensor(q)[None]
        ratio = torch.tensor([float(rng.uniform(0.3, 3.0))], dtype=f64)
        theta, order = fill_rule(pt, qt, ratio, m)
        got = fill_kernel(qt, theta, order, m, K)[0].numpy()
        want, rank = np.zeros((V, K + 1)), order[0].tolist().index
        for tup in itertools.product(range(V), repeat=m):
            w = float(np.prod([q[x] for x in tup]))
            for marks in itertools.product((0, 1), repeat=m):
                wm = w * float(np.prod([theta[0, x] if mk else 1.0 - theta[0, x] for x, mk in zip(tup, marks)]))
                x = min([x for x, mk in zip(tup, marks) if mk] or tup, key=rank)
                want[x, tup.count(x)] += wm
        assert abs(got.sum() - 1.0) < 1e-12
        worst = max(worst, float(np.abs(got - want).max()))
    assert worst < 1e-12, worst


def test_fill_marks_solve_the_filling_recursion() -> None:
    """On V <= FILL_SWEEPS the sweeps equal the sequential recursion (s = 1 - marked mass above x; theta =
    clamp((s - (s^m - t)_+^(1/m)) / q)); a token whose target is reachable gets exactly its target as
    first-stage mass; fill_choice's probabilities sum to 1 on any multiset."""
    rng = np.random.default_rng(1)
    for trial in range(200):
        V, m = int(rng.integers(2, FILL_SWEEPS + 1)), int(rng.integers(2, 5))
        p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
        if trial % 4 == 0:
            q[rng.integers(V)] = 0.0
            q = q / q.sum()
        scale = float(rng.uniform(0.3, 3.0))
        theta, order = fill_rule(torch.tensor(p)[None], torch.tensor(q)[None], torch.tensor([scale], dtype=f64), m)
        above = 0.0
        for x in order[0].tolist():
            s, t = 1.0 - above, scale * p[x]
            d = max(s ** m - t, 0.0)
            rest = d ** (1.0 / m) if d >= FILL_EPS else d * FILL_EPS ** (1.0 / m - 1.0)
            want = 0.0 if q[x] == 0 else min(1.0, max(0.0, (s - rest) / q[x]))
            assert abs(float(theta[0, x]) - want) < 1e-12, (trial, x)
            first, cap = s ** m - (s - q[x] * want) ** m, s ** m - max(s - q[x], 0.0) ** m
            assert first <= cap + 1e-12 and (first <= t + FILL_EPS or q[x] == 0)
            if t < cap - 1e-9:
                assert t - 1e-12 <= first <= t + FILL_EPS  # reachable: filled (exactly where s^m - t >= FILL_EPS)
                if s ** m - t >= FILL_EPS:
                    assert abs(first - t) < 1e-12
            above += q[x] * want
        rank = torch.empty_like(order[0]).scatter_(0, order[0], torch.arange(V))
        toks = rng.integers(0, V, size=m).tolist()
        assert abs(sum(w for _, w in fill_choice(theta[0], rank, toks)) - 1.0) < 1e-12


def _rows_with_ties_and_zeros(rng: np.random.Generator, N: int, V: int) -> tuple[Tensor, Tensor]:
    """N rows of (p, q) over V >= 20 tokens with zeros in p and q, q = 0 < p, p = q (ratio exactly 1), p one
    ulp below q (ratio just below 1) and repeated ratios."""
    p, q = rng.dirichlet(np.ones(V) * 0.5, size=N), rng.dirichlet(np.ones(V) * 0.5, size=N)
    for n in range(N):
        idx = rng.permutation(V)
        p[n, idx[:3]] = 0.0
        q[n, idx[3:6]] = 0.0
        q[n, idx[6:12]] = p[n, idx[6:12]]  # ratio 1
        p[n, idx[12]] = np.nextafter(q[n, idx[12]], 0.0)  # ratio just below 1
        q[n, idx[13:18]] = 2.0 * p[n, idx[13:18]]  # a tied ratio 0.5
        p[n], q[n] = p[n] / p[n].sum(), q[n] / q[n].sum()
    return torch.tensor(p), torch.tensor(q)


def test_fill_order_by_integer_keys_equals_a_float_sort() -> None:
    """fill_order sorts the ratios' bit patterns as integers: the same permutation as a stable descending float
    sort, ties (ratio 1, repeated ratios, zeros, -0.0) in increasing id."""
    rng = np.random.default_rng(7)
    for V in (20, 70, 3000):
        p, q = _rows_with_ties_and_zeros(rng, 3, V)
        p[0, :2] = -0.0  # a negative zero must tie with +0.0
        ratio = torch.where(q > 0, p / torch.where(q > 0, q, torch.ones_like(q)), torch.zeros_like(q))
        want = torch.sort(ratio, dim=-1, descending=True, stable=True).indices
        assert torch.equal(fill_order(p, q), want)


def test_lex_below_from_fills_order_equals_below_mass() -> None:
    """At large V lex's c(x) is read off fill's sort: the same sums, bit for bit, as mpbv's own sort."""
    rng = np.random.default_rng(8)
    for V in (20, 300, 5000):
        p, q = _rows_with_ties_and_zeros(rng, 3, V)
        assert torch.equal(lex_below(p, q, fill_order(p, q)), below_mass(p, q)[0])


def _exactly_summed_rho(p: Tensor, q: Tensor, m: int) -> float:
    """kseq_rho's definition (the smallest rho in [1, m] with g(rho) >= 0: 1 if g(1) >= 0, else the upper end
    after RHO_ITERS bisection steps) with both sums of g correctly rounded (math.fsum): the reference for the
    rounding of the fast paths' sums.  p, q: [V]"""
    pl, ql = p.tolist(), q.tolist()

    def g(rho: float) -> float:
        reject = min(max(math.fsum(max(b - a / rho, 0.0) for a, b in zip(pl, ql)), 0.0), 1.0)
        uncovered = math.fsum(max(a - rho * b, 0.0) for a, b in zip(pl, ql))
        return (math.exp(m * math.log(reject)) if reject > 0.0 else 0.0) - uncovered

    if g(1.0) >= 0.0:
        return 1.0
    lo, hi = 1.0, float(m)
    for _ in range(RHO_ITERS):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if g(mid) >= 0.0 else (mid, hi)
    return hi


def test_kseq_rho_off_the_sorted_masses_equals_the_exactly_summed_root() -> None:
    """The walk's rho* (prefix sums in fill's order, in extended precision) against the same bisection with
    correctly rounded sums, on rows with ties, zeros, p = q and one-hot rows: within 2e-15 relative (measured
    <= 5.6e-16).  spectr's kseq_rho sums in float64 and is within 1e-13 (measured 1.8e-14 at V = 2000, where
    its active-set bisection drops entries into running sums), so the two fast paths are compared through
    the reference, not with each other.  Neither lies below the root of g by more than rounding."""
    rng = np.random.default_rng(9)
    worst_sorted, worst_kseq = 0.0, 0.0
    for V in (5, 100, 2000):
        p, q = _rows_with_ties_and_zeros(rng, 6, max(V, 20))
        if V < 20:  # small rows: ties and zeros of their own
            p, q = torch.tensor(rng.dirichlet(np.ones(V), size=6)), torch.tensor(rng.dirichlet(np.ones(V), size=6))
            q[0, 0] = 0.0
            q[0] = q[0] / q[0].sum()
            p[3, :2] = q[3, :2] * (p[3, :2].sum() / q[3, :2].sum())  # a tied ratio
            p[3] = p[3] / p[3].sum()
        p[4], q[4] = q[4], q[4]  # p = q: rho* = 1
        p[5] = 0.0
        p[5, int(q[5].argmax())] = 1.0  # a one-hot target
        masses = SortedMasses(p, q, fill_order(p, q))
        for m in (2, 3, 4, 8):
            got, spectr_rho = masses.rho(m), kseq_rho(p, q, m)
            want = torch.tensor([_exactly_summed_rho(p[n], q[n], m) for n in range(6)], dtype=f64)
            assert float(got[4]) == 1.0 and float(want[4]) == 1.0  # p = q
            worst_sorted = max(worst_sorted, float(((got - want).abs() / want).max()))
            worst_kseq = max(worst_kseq, float(((spectr_rho - want).abs() / want).max()))
            assert bool((kseq_gap(p, q, torch.full_like(got, float(m)), got) >= -1e-15).all()), m
    assert worst_sorted < 2e-15, worst_sorted
    assert worst_kseq < 1e-13, worst_kseq


def test_sorted_masses_give_a_row_the_same_bits_alone_or_in_a_batch() -> None:
    """The walk computes a prefix's rho* in a batch of one; a later iteration's window recomputes the same
    prefix among B*K rows: both must use the same law, so each row's bisection must not depend on its batch
    (small V compares whole blocks, large V searches row by row: the same counts)."""
    rng = np.random.default_rng(10)
    for V in (3, 8, 300):
        p, q = _rows_with_ties_and_zeros(rng, 9, max(V, 20))
        if V < 20:
            p, q = torch.tensor(rng.dirichlet(np.ones(V), size=9)), torch.tensor(rng.dirichlet(np.ones(V), size=9))
        order = fill_order(p, q)
        batch = SortedMasses(p, q, order)
        for m in (2, 3, 4):
            together = batch.rho(m)
            alone = torch.cat([SortedMasses(p[n:n + 1], q[n:n + 1], order[n:n + 1]).rho(m) for n in range(9)])
            assert torch.equal(together, alone), (V, m)


def _full_kernel_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """node_step's definition with every kernel tabulated over the whole vocabulary: (rule [N], sum_m pi(m)
    T_m [N, V, K+1] of the chosen rule), the choice by the scores of the kernels' row sums."""
    K = pi.shape[-1] - 1
    rules = RULES if mode == "choose" else (mode,)
    counts = [m for m in range(1, K + 1) if bool((pi[:, m] > 0).any())]
    mixed = []
    for rule in rules:
        acc = torch.zeros(*q.shape, K + 1, dtype=f64)
        for m in counts:
            if rule == "fill" and m > 1:
                kern = fill_kernel(q, *fill_rule(p, q, ratio, m), m, K)
            elif rule == "first":
                kern = first_kernel(q, m, K)
            else:
                kern = (lex_kernel if rule == "lex" else kseq_kernel)(p, q, m, K)
            acc = acc + pi[:, m, None, None] * kern
        mixed.append(acc)
    if mode != "choose":
        return torch.full((q.shape[0],), RULES.index(mode)), mixed[0]
    target = ratio.unsqueeze(-1) * p
    forced = pi[:, 2:].sum(-1) <= FORCED_MASS  # rows whose rule is FORCED_RULE, unscored
    best, nxt = torch.full((q.shape[0],), RULES.index(CHOICE_ORDER[0])), mixed[RULES.index(CHOICE_ORDER[0])]
    best_score = torch.minimum(target, nxt.sum(-1)).sum(-1)
    for rule in CHOICE_ORDER[1:]:
        r = RULES.index(rule)
        score = torch.minimum(target, mixed[r].sum(-1)).sum(-1)
        better = score > best_score + CHOICE_TOL
        best = torch.where(better, torch.full_like(best, r), best)
        best_score = torch.where(better, score, best_score)
        nxt = torch.where(better[:, None, None], mixed[r], nxt)
    best = torch.where(forced, torch.full_like(best, RULES.index(FORCED_RULE)), best)
    nxt = torch.where(forced[:, None, None], mixed[RULES.index(FORCED_RULE)], nxt)
    return best, nxt


@pytest.mark.parametrize("V", [6, 40, 200])
def test_node_law_equals_the_tabulated_kernels(V: int) -> None:
    """The fast node_step (closed-form marginals q_S, kernel rows only where the walk reads them, one sort for
    lex and fill at V > MEMO_MAX_V) against the same definition with every kernel tabulated over the
    vocabulary: the same rule per prefix, q_S and every kernel row to 1e-14, in every walk mode."""
    rng = np.random.default_rng(V)
    worst = 0.0
    for trial in range(12):
        N, K = 2, int(rng.integers(2, 5))
        p, q = _rows_with_ties_and_zeros(rng, N, V) if V >= 20 else (
            torch.tensor(rng.dirichlet(np.ones(V), size=N)), torch.tensor(rng.dirichlet(np.ones(V), size=N)))
        pi = torch.tensor(rng.dirichlet(np.ones(K + 1), size=N))
        pi[:, 0] = 0.0
        if trial % 3 == 0:
            pi[:, int(rng.integers(1, K + 1))] = 0.0  # a survivor count that cannot occur
        pi = pi / pi.sum(-1, keepdim=True)
        ratio = torch.tensor(rng.uniform(0.3, 3.0, size=N))
        for mode in ("choose",) + RULES:
            law = node_step(p, q, ratio, pi, mode)
            rule, nxt = _full_kernel_step(p, q, ratio, pi, mode)
            assert torch.equal(law.rule, rule), (trial, mode)
            worst = max(worst, float((law.q_sel - nxt.sum(-1)).abs().max()))
            for tok in rng.integers(0, V, size=(4, N)):
                tok = torch.tensor(tok)
                worst = max(worst, float((law.rows(tok) - nxt[torch.arange(N), tok]).abs().max()))
                mass, new_pi = advance_survivors(law, tok)
                assert torch.allclose(mass, law.q_sel[torch.arange(N), tok], rtol=0, atol=0)
                assert torch.all((new_pi.sum(-1) - 1.0).abs() < 1e-12) or not bool((mass > 0).all())
    assert worst < 1e-14, worst


def test_the_choice_in_c_calls_per_rule_equals_the_stepwise_choice_bit_for_bit() -> None:
    """A single prefix's choice (mode ``choose``, V > MEMO_MAX_V) runs one C call per rule (selection._choose_in_c); it
    equals the stepwise path (selection._score_prefix_stepwise, each loop its own C call) bit for bit: the rule,
    q_S, and every factor of every rule it computed, on flat and peaky rows (so the ceiling skips some rules and
    every rule wins somewhere), with some survivor counts impossible and on draft supports."""
    from mdv.verify.native import loops_library
    from mdv.verify.selection import _choose_in_c, _score_prefix_stepwise, support_columns

    lib = loops_library()
    assert lib is not None  # the suite's machines build the C loops (gcc); without them this path never runs
    rng = np.random.default_rng(5)
    chosen, skipped = set(), 0
    for trial in range(60):
        V, K = (300 if trial % 6 == 5 else int(rng.choice([70, 300]))), int(rng.integers(2, 5))
        scale = float(rng.choice([0.5, 2.0, 6.0]))
        p, q = (torch.softmax(torch.tensor(rng.normal(size=(1, V)) * scale), -1) for _ in range(2))
        if trial % 3 == 0:
            p, q = _rows_with_ties_and_zeros(rng, 1, V)
        if trial % 4 == 1:  # q agrees with p more often, as a trained pair's rows do
            q = (0.7 * p + 0.3 * q) / (0.7 * p + 0.3 * q).sum(-1, keepdim=True)
        if trial % 6 == 5:  # the columns of a draft proposing 40% of a 300-token vocabulary, as node_step scores them
            q = q.clone()
            q[0, rng.permutation(V)[: 3 * V // 5]] = 0.0
            _, p, q = support_columns(p, q / q.sum(-1, keepdim=True))
        pi = torch.tensor(rng.dirichlet(np.ones(K + 1), size=1))
        pi[0, 0] = 0.0
        if trial % 5 == 2 and K >= 3:
            pi[0, int(rng.integers(2, K + 1))] = 0.0  # a count that cannot occur (another m >= 2 stays possible)
        pi = pi / pi.sum(-1, keepdim=True)
        ratio = torch.tensor([rng.uniform(0.3, 3.0)], dtype=torch.float64)
        fused = _choose_in_c(lib, p, q, ratio, pi)
        assert float(pi[0, 2:].sum()) > FORCED_MASS  # the prefixes the C calls serve: not forced
        stepwise = _score_prefix_stepwise(p, q, ratio, pi, "choose")
        assert torch.equal(fused.rule, stepwise.rule), trial
        assert torch.equal(fused.q_cols, stepwise.q_cols), trial
        assert torch.equal(fused.order, stepwise.order) and torch.equal(fused.below, stepwise.below), trial
        assert set(fused._factors) == set(stepwise._factors), trial
        for key, f in fused._factors.items():
            g = stepwise._factors[key]
            for name in f.__dataclass_fields__:
                a, b = getattr(f, name), getattr(g, name)
                pairs = zip(a, b) if isinstance(a, list) else [(a, b)]
                assert all(torch.equal(x, y) for x, y in pairs), (trial, key, name)
        chosen.add(RULES[int(fused.rule[0])])
        skipped += ("fill", 2) not in fused._factors
    assert chosen == set(CHOICE_ORDER) and skipped > 0, (chosen, skipped)


def test_scalar_kernel_rows_equal_the_tensor_kernel_rows_at_every_token() -> None:
    """Above MEMO_MAX_V a prefix's kernel row at the followed token is read in Python floats (NodeLaw._row_at);
    it equals the tensor kernels (NodeLaw._rows_at) at every token, for every rule (forced through the walk
    modes) and survivor-count law, on the whole vocabulary and on the draft's support."""
    rng = np.random.default_rng(11)
    V, worst, checked = 200, 0.0, 0
    for trial in range(6):
        K = int(rng.integers(2, 5))
        p, q = _rows_with_ties_and_zeros(rng, 1, V)
        if trial % 2:  # a draft proposing a fifth of the vocabulary: the law lives on its support's columns
            q[0, rng.permutation(V)[: 4 * V // 5]] = 0.0
            q = q / q.sum(-1, keepdim=True)
        pi = torch.tensor(rng.dirichlet(np.ones(K + 1), size=1))
        pi[:, 0] = 0.0
        pi = pi / pi.sum(-1, keepdim=True)
        for mode in ("choose",) + RULES:
            law = node_step(p, q, torch.tensor([rng.uniform(0.3, 3.0)]), pi, mode)
            tokens = torch.arange(V)
            cols = law.columns(tokens)
            tensor_rows = law._rows_at(cols.view(1, -1))[0]  # [V, K+1]
            scalar_rows = torch.tensor([law._row_at(0, int(c)) for c in cols], dtype=torch.float64)
            assert (law.vocab is not None) == bool(trial % 2)
            worst = max(worst, float((scalar_rows - tensor_rows).abs().max()))
            assert torch.equal(law.rows(tokens[5:6]), scalar_rows[5:6])  # rows() takes the scalar path
            checked += 1
    assert checked == 30 and worst < 1e-15, worst


@pytest.mark.parametrize("V", [40, 200])
def test_rules_below_the_ceiling_are_skipped_without_changing_the_choice(V: int) -> None:
    """No token rule scores above the ceiling sum_x min(t, R) (R = reach_mass: some survivor drafted x), on
    peaky rows like a trained pair's (where the drafts agree) and on flat ones; node_step skips the rules that
    the ceiling rules out, and its choice and law are still the definition's with every rule scored
    (_full_kernel_step).  The skip happens on these rows (else this would test nothing).  One row per call, as
    the walk makes them (V > MEMO_MAX_V: no memo hands back a law whose factors an earlier call filled)."""
    rng = np.random.default_rng(900 + V)
    skipped = 0
    for trial in range(36):
        K = int(rng.integers(2, 5))
        z = rng.standard_normal((1, V)) * (1.0, 10.0, 25.0)[trial % 3]
        q = torch.softmax(torch.tensor(z), -1)
        p = torch.softmax(torch.tensor(z + rng.standard_normal((1, V)) * rng.uniform(0.1, 0.3)), -1)
        pi = torch.zeros(1, K + 1, dtype=f64)
        pi[0, 1:] = torch.tensor(rng.dirichlet(np.ones(K) * 0.5))
        if trial % 2:  # the drafts agreed so far, as at T = 0.4 (mostly all K survive)
            pi[0, 1:] = 0.1 * pi[0, 1:] + 0.9 * torch.nn.functional.one_hot(torch.tensor(K - 1), K).to(f64)
        ratio = torch.tensor(rng.uniform(0.5, 2.0, size=1))
        law = node_step(p, q, ratio, pi, "choose")
        skipped += not any(key[0] == "fill" for key in law._factors)  # fill's law never computed
        rule, nxt = _full_kernel_step(p, q, ratio, pi, "choose")
        assert torch.equal(law.rule, rule), trial
        torch.testing.assert_close(law.q_sel, nxt.sum(-1), rtol=0, atol=1e-14)
        target = ratio.unsqueeze(-1) * p
        ceiling = overlap(target, reach_mass(q, pi))
        for r in RULES:
            assert bool((overlap(target, law.marginal(r)) <= ceiling + 1e-15).all()), (trial, r)
    assert skipped >= 5, skipped


@pytest.mark.parametrize("V", [6, 40, 5000])
def test_a_choice_forced_by_a_small_survivor_mass_scores_within_the_tolerance(V: int) -> None:
    """Where pi puts at most FORCED_MASS on m >= 2 survivors node_step takes FORCED_RULE without scoring:
    the premise (any two rules' marginals, hence scores, differ by at most 2 pi(m >= 2): they are pi(1) q plus
    pi(m >= 2) times laws over V) holds on random rows and survivor laws, so the forced rule's score is within
    CHOICE_TOL / 2 of the best; its rule and q_S are the definition's (_full_kernel_step tabulates every
    kernel); and a batch mixing forced and scored rows gives each row what it gets alone."""
    rng = np.random.default_rng(70 + V)
    for trial in range(8):
        N, K = 2, int(rng.integers(2, 5))
        p, q = _rows_with_ties_and_zeros(rng, N, V) if V >= 20 else (
            torch.tensor(rng.dirichlet(np.ones(V), size=N)), torch.tensor(rng.dirichlet(np.ones(V), size=N)))
        ratio = torch.tensor(rng.uniform(0.3, 3.0, size=N))
        pi = torch.tensor(rng.dirichlet(np.ones(K + 1), size=N))
        pi[:, 0] = 0.0
        pi = pi / pi.sum(-1, keepdim=True)
        law = node_step(p, q, ratio, pi, "choose")  # scored: pi(m >= 2) is large
        scores = torch.stack([overlap(ratio.unsqueeze(-1) * p, law.marginal(rule)) for rule in RULES])  # [4, N]
        assert bool(((scores - scores[0]).abs() <= 2.0 * pi[:, 2:].sum(-1) + 1e-14).all()), trial
        small = pi.clone()
        small[:, 2:] *= float(rng.uniform(0.1, 1.0)) * FORCED_MASS / small[:, 2:].sum(-1, keepdim=True)
        small[:, 1] = 1.0 - small[:, 2:].sum(-1)
        forced = node_step(p, q, ratio, small, "choose")
        rule, nxt = _full_kernel_step(p, q, ratio, small, "choose")
        assert torch.equal(forced.rule, rule) and bool((rule == RULES.index(FORCED_RULE)).all()), trial
        torch.testing.assert_close(forced.q_sel, nxt.sum(-1), rtol=0, atol=1e-14)
        target = ratio.unsqueeze(-1) * p
        best = torch.stack([overlap(target, forced.marginal(rule)) for rule in CHOICE_ORDER]).max(0).values
        assert bool((overlap(target, forced.q_sel) >= best - CHOICE_TOL / 2).all()), trial
        mixed = pi.clone()
        mixed[0] = small[0]  # row 0 forced, row 1 scored, in one batch
        both = node_step(p, q, ratio, mixed, "choose")
        for n in range(N):
            alone = node_step(p[n:n + 1], q[n:n + 1], ratio[n:n + 1], mixed[n:n + 1], "choose")
            assert int(both.rule[n]) == int(alone.rule[0]), (trial, n)
            torch.testing.assert_close(both.q_sel[n], alone.q_sel[0], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ parity
PARITY = [(K, L, V) for K in (1, 2, 3, 4) for L in (1, 2, 3) for V in (2, 3, 5)]


@pytest.mark.parametrize("selection", ["choose", "kseq", "lex", "fill"])
def test_sample_matches_reference_on_same_draws(selection: str) -> None:
    v = SelectGreedyBlockVerification(selection)
    gen = torch.Generator().manual_seed(3)
    n = 0
    for seed, (K, L, V) in enumerate(PARITY):
        for block in (consistent_block(seed, 12, K, L, V), inconsistent_block(seed, 4, K, L, V)):
            drawn = Uniforms.draw(block.B, K, L, gen)
            for uniforms in (drawn, Uniforms(torch.zeros_like(drawn.coins), drawn.draws)):
                fast, slow = v.sample(block, uniforms), v.reference(block, uniforms)
                for name in ("tau", "sel", "token"):
                    a, b = getattr(fast, name).tolist(), getattr(slow, name).tolist()
                    assert a == b, f"K={K} L={L} V={V} seed={seed}: {name} {a} != {b}"
                n += block.B
    assert n == 2 * len(PARITY) * 16


def test_sample_matches_reference_under_a_target_adjustment() -> None:
    """Three consecutive iterations on one toy: the state left by an early exit (a selection window) is
    applied identically by both views, and sample/reference agree on the same uniforms."""
    target, draft = toy_pair(3, seed=12, zeros=True)
    from mdv.oracle.montecarlo import sample_blocks

    gen = torch.Generator().manual_seed(5)
    windows = 0
    for K, L in ((2, 3), (3, 2)):
        v = SelectGreedyBlockVerification()
        for trial in range(20):
            state, prompt = v.initial_state(), ()
            for it in range(3):
                block = sample_blocks(target, draft, K, L, 1, prompt=prompt, generator=gen)
                u = Uniforms.draw(1, K, L, gen)
                fast, slow = v.sample(block, u, state), v.reference(block, u, state)
                assert (fast.tau.tolist(), fast.sel.tolist(), fast.token.tolist()) == \
                    (slow.tau.tolist(), slow.sel.tolist(), slow.token.tolist())
                state = v.advance(state, block, fast)
                windows += sum(1 for w in state.windows if w.selection)
                prompt = prompt + tuple(fast.emitted(block))
    assert windows > 10  # early exits happened and left selection windows


def _sparse_blocks(K: int, L: int) -> list:
    """Blocks over V = 300 whose drafts propose 15-60 tokens per prefix (some targets equal to q, so also 0 off
    its support; others with mass there): the case scored on the draft's support."""
    return [consistent_block(100 + seed, 3, K, L, 300, zeros=zeros) for seed, zeros in enumerate((0.8, 0.95))]


def _support_runs(block, K: int, L: int, draws: int) -> tuple[list, list]:
    v = SelectGreedyBlockVerification()
    gen = torch.Generator().manual_seed(K * 10 + L)
    outcomes = []
    for _ in range(draws):
        u = Uniforms.draw(block.B, K, L, gen)
        o = v.sample(block, u)
        outcomes.append((o.tau.tolist(), o.sel.tolist(), o.token.tolist()))
    return outcomes, v.law(block)


@pytest.mark.parametrize("K,L", [(2, 3), (3, 2), (4, 3)])
def test_scoring_on_the_draft_support_gives_the_same_law_and_draws(K: int, L: int, monkeypatch) -> None:
    """Where the draft proposes few of the V tokens the rules run on the support's columns and one column off
    it (:func:`~mdv.verify.selection.support_columns`).  Against the same walk scored on the whole vocabulary:
    every branch's probability and extra-token law to 1e-13, and the same outcome on the same uniforms
    (K-SEQ's residual draw included: it is spread back over the tokens)."""
    import mdv.verify.selection as selection

    scored = []
    on_vocabulary = selection.NodeLaw.on_vocabulary
    monkeypatch.setattr(selection.NodeLaw, "on_vocabulary",
                        lambda self, vocab, V: (scored.append(vocab.numel()), on_vocabulary(self, vocab, V))[1])
    selection._node_step_memo.cache_clear()
    runs = [_support_runs(b, K, L, 60) for b in _sparse_blocks(K, L)]
    assert len(scored) > 10 and max(scored) < 150  # the support's columns were used
    monkeypatch.setattr(selection, "COMPACT_MIN_V", 10 ** 9)
    selection._node_step_memo.cache_clear()
    for block, (outcomes, law) in zip(_sparse_blocks(K, L), runs):
        outcomes_v, law_v = _support_runs(block, K, L, 60)
        assert outcomes == outcomes_v
        for a, b in zip(law, law_v):
            assert torch.equal(a.sel, b.sel) and torch.equal(a.tau, b.tau)
            assert float((a.prob - b.prob).abs().max()) < 1e-13
            assert float((a.next_dist - b.next_dist).abs().max()) < 1e-13
    selection._node_step_memo.cache_clear()


def test_kseq_residual_spread_from_the_support_equals_the_vocabularys() -> None:
    """K-SEQ's residual off the draft's support is the target there over the residual's mass: spread from the
    support's columns (:meth:`~mdv.verify.selection.NodeLaw.residual_on_tokens`) it equals the residual
    computed over the vocabulary, to 1e-15; the selected law q_S is 0 off the support."""
    rng = np.random.default_rng(8)
    V = 400
    for trial in range(6):
        q = np.zeros(V)
        support = rng.choice(V, size=int(rng.integers(10, 120)), replace=False)
        q[support] = rng.dirichlet(np.ones(support.size))
        p = rng.dirichlet(np.ones(V) * 0.3)
        p_t, q_t = torch.tensor(p)[None], torch.tensor(q)[None]
        K = int(rng.integers(2, 5))
        pi = root_survivors(K, torch.zeros(1))
        law = node_step(p_t, q_t, torch.tensor([1.0], dtype=f64), pi, "kseq")
        assert law.vocab is not None and law.vocab.tolist() == sorted(support.tolist())
        assert float(law.q_sel[0, torch.tensor(q == 0)].abs().max()) == 0.0
        spread = law.residual_on_tokens(law.kseq(K).res[0], p_t[0])
        assert torch.allclose(spread, kseq_residual(p_t, q_t, K, kseq_rho(p_t, q_t, K))[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("K,L", [(2, 2), (2, 3), (3, 2)])
def test_exact_when_every_row_with_a_zero_is_scored_on_the_draft_support(K: int, L: int, monkeypatch) -> None:
    """The oracle's verdict with the support's columns forced on the toys (V = 3-5, where they are otherwise not
    used): every row with q = 0 somewhere runs on its support and one column off it, also where the target is 0
    off the support; the target law of the first L + 2 tokens to TV < 1e-9."""
    import mdv.verify.selection as selection

    selection._node_step_memo.cache_clear()
    monkeypatch.setattr(selection, "COMPACT_MIN_V", 1)
    monkeypatch.setattr(selection, "COMPACT_MAX_SHARE", 1.0)
    scored = []
    on_vocabulary = selection.NodeLaw.on_vocabulary
    monkeypatch.setattr(selection.NodeLaw, "on_vocabulary",
                        lambda self, vocab, V: (scored.append(V), on_vocabulary(self, vocab, V))[1])
    try:
        target, draft = toy_pair(VOCAB[(K, L)], seed=60 + 10 * K + L, zeros=True)
        law = exact_law("select_gbv", target, draft, K, L, L + 2)
        tv = total_variation(law, target_law(target, L + 2))
    finally:
        selection._node_step_memo.cache_clear()
    assert scored, "no row was scored on its support"
    assert tv < 1e-9, f"K={K} L={L}: TV {tv:.3g}"


def test_law_is_a_probability_law_and_covers_the_samples() -> None:
    v = SelectGreedyBlockVerification()
    gen = torch.Generator().manual_seed(4)
    for seed, (K, L, V) in enumerate([(3, 3, 5), (4, 2, 3), (2, 4, 8), (3, 1, 2)]):
        block = consistent_block(100 + seed, 20, K, L, V)
        branches = v.law(block)
        total = torch.stack([br.prob for br in branches]).sum(0)
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-12, rtol=0)
        out = v.sample(block, Uniforms.draw(block.B, K, L, gen))
        for b in range(block.B):
            br = branches[int(out.sel[b]) * (L + 1) + int(out.tau[b])]
            assert float(br.prob[b]) > 0 and int(br.sel[b]) == int(out.sel[b])
            assert float(br.next_dist[b, out.token[b]]) > 0


def test_fast_sampler_matches_exact_law() -> None:
    for (K, L), (tgt, drf) in (((3, 2), toy_pair(3, seed=5, zeros=True)), ((2, 3), tied_iid_pair(3))):
        law = iteration_law("select_gbv", tgt, drf, K, L)
        counts = sample_iterations("select_gbv", tgt, drf, K, L, 30_000, seed=17)
        p_value = chi_square_pvalue(counts, law)
        assert p_value > 1e-3, f"K={K} L={L}: chi-square p = {p_value:.3g} over {len(law)} outcomes"


# ------------------------------------------------------------------------------------------ K = 1 is gbv
def test_k1_equals_gbv() -> None:
    gen = torch.Generator().manual_seed(8)
    gbv, sel = GreedyBlockVerification(), SelectGreedyBlockVerification()
    for seed, (L, V) in enumerate([(1, 3), (3, 5), (4, 2), (6, 8)]):
        block = consistent_block(200 + seed, 30, 1, L, V)
        for x in gbv.law(block):
            y = next(y for y in sel.law(block) if int(y.tau[0]) == int(x.tau[0]) and int(y.sel[0]) == 0)
            assert torch.equal(x.prob, y.prob) and torch.equal(x.next_dist, y.next_dist)
        top = 1.0 - 2.0 ** -53
        drawn = Uniforms.draw(block.B, 1, L, gen)
        for u in (drawn, Uniforms(torch.zeros_like(drawn.coins), torch.zeros_like(drawn.draws)),
                  Uniforms(torch.full_like(drawn.coins, top), torch.full_like(drawn.draws, top))):
            a, b, r = gbv.sample(block, u), sel.sample_walk(block, u), sel.reference(block, u)
            assert torch.equal(a.tau, b.tau) and torch.equal(a.token, b.token)
            assert torch.equal(a.tau, r.tau) and torch.equal(a.token, r.token)
            assert torch.equal(sel.sample(block, u).token, a.token)  # sample delegates to gbv at K = 1
    target, draft = toy_pair(3, seed=2, zeros=True)
    for L in (1, 2, 3):
        assert expected_accepted("select_gbv", target, draft, 1, L) == expected_accepted("gbv", target, draft, 1, L)
        assert total_variation(exact_law("select_gbv", target, draft, 1, L, L + 2),
                               exact_law("gbv", target, draft, 1, L, L + 2)) < 1e-15


def test_the_first_walk_is_gbv_on_draft_0() -> None:
    """selection="first" keeps draft 0 (Q_S = q): the law and E[tau] of ``gbv`` with one draft, at any K."""
    target, draft = toy_pair(3, seed=5, zeros=True)
    for K, L in ((2, 2), (3, 1), (2, 3)):
        first = expected_accepted("select_gbv", target, draft, K, L, selection="first")
        assert abs(first - expected_accepted("gbv", target, draft, 1, L)) < 1e-12, (K, L)
    assert total_variation(exact_law("select_gbv", target, draft, 2, 2, 4, selection="first"),
                           exact_law("gbv", target, draft, 1, 2, 4)) < 1e-12


# ------------------------------------------------------------------------------------------ dominance
def _expected(method: str, target, draft, K: int, L: int, T: float, **options) -> float:
    return expected_accepted(method, target, draft, K, L, temperature=T, **options)


def _check_dominance(target, draft, K: int, L: int, T: float, label: str) -> float:
    new = _expected("select_gbv", target, draft, K, L, T)
    peers = {m: _expected(m, target, draft, K, L, T) for m in ("spectr", "mdbv", "mpbv")}
    assert new >= max(peers.values()) - 1e-9, f"{label}: select_gbv {new:.12f} < {peers}"
    # the two single-rule walks dominate their peer by coupling (module docstring), on every toy
    assert _expected("select_gbv", target, draft, K, L, T, selection="kseq") >= peers["spectr"] - 1e-9, label
    assert _expected("select_gbv", target, draft, K, L, T, selection="lex") >= peers["mpbv"] - 1e-9, label
    return new - max(peers.values())


def test_dominates_spectr_mdbv_mpbv_on_fixed_toys() -> None:
    margins = []
    for seed in (0, 1):
        for T in (1.0, 0.5):
            for K, L in ((2, 1), (3, 1), (2, 2), (3, 2), (2, 3)):
                V = 3 if K * L <= 6 else 2
                target = random_toy_model(V, 100 + seed, zero_prob=0.2, name=f"target{seed}")
                draft = random_toy_model(V, 200 + seed, zero_prob=0.2, name=f"draft{seed}")
                margins.append(_check_dominance(target, draft, K, L, T, f"seed {seed} T {T} K {K} L {L}"))
    assert max(margins) > 0.01  # strictly better somewhere, not only equal


def _random_toy(rng: np.random.Generator, K: int, L: int):
    V = 3 if K * L <= 6 else 2
    target, draft, T, zp, s = random_toy_case(rng, V)
    return target, draft, T, f"V {V} K {K} L {L} T {T} zp {zp} seed {s}"


def test_proved_dominances_on_random_toys_drawn_in_this_run() -> None:
    """Fresh seeds every run (printed, so a failure can be replayed).  What is proved holds on every toy:
    ``selection="kseq"`` >= spectr and ``selection="lex"`` >= mpbv (coupling); at L = 1 the default takes the
    best of the three token rules at the only prefix, so it is >= both walks, hence >= spectr and mpbv."""
    entropy = np.random.SeedSequence().entropy
    print(f"dominance seeds: SeedSequence({entropy})")
    rng = np.random.default_rng(entropy)
    for trial in range(10):
        K, L = [(2, 1), (3, 1), (4, 1), (2, 2), (3, 2), (2, 3)][trial % 6]
        target, draft, T, label = _random_toy(rng, K, L)
        label = f"entropy {entropy} trial {trial}: {label}"
        peers = {m: _expected(m, target, draft, K, L, T) for m in ("spectr", "mpbv")}
        walks = {mode: _expected("select_gbv", target, draft, K, L, T, selection=mode)
                 for mode in ("kseq", "lex", "fill")}
        assert walks["kseq"] >= peers["spectr"] - 1e-9, label
        assert walks["lex"] >= peers["mpbv"] - 1e-9, label
        if L == 1:
            default = _expected("select_gbv", target, draft, K, L, T)
            assert default >= max(walks.values()) - 1e-9 and default >= max(peers.values()) - 1e-9, label


#: Cells of :func:`test_default_dominance_is_measured_not_proved` where the default fell below the best peer
#: (3 of 60, gaps <= 0.17%; with ties broken towards K-SEQ instead of ``lex``, 7, gaps up to 10.5%; on 1,600
#: random toys, ``experiments.theory random_toys=1600``: 40 (2.5%), 39 of them below mdbv, gaps <= 1.6%).
DOMINANCE_MISSES = 3


def test_default_dominance_is_measured_not_proved() -> None:
    """The default's per-prefix choice is greedy: it cannot see the subtree below a prefix (the verifier has
    no rows off the drafted paths), and at L >= 2 it sometimes falls below max(spectr, mdbv, mpbv).  On 60
    fixed random V = 3 toys at L = 2, 3 this pins how often, so a change that makes the choice worse fails;
    the misses stay small (the largest on 1,600 toys, 1.6% of E[tau], is recorded in the README)."""
    result = random_toy_dominance(60, 11, "select_gbv", ("spectr", "mdbv", "mpbv"))
    misses = [(f"K {x['K']} L {x['L']} T {x['T']} zp {x['zero_prob']} seed {x['toy_seed']}", round(x["gap"], 4))
              for x in result["misses"]]
    print(f"default below the best peer in {len(misses)} of 60 cells: {misses}")
    assert len(misses) <= DOMINANCE_MISSES, misses
    assert all(gap < 0.02 for _, gap in misses), misses


# ------------------------------------------------------------------------------------------ options
def test_flags_and_options() -> None:
    cls = mdv.VERIFIERS["select_gbv"]
    assert cls.lossless and cls.multi_draft and cls.stateful
    for mode in ("choose",) + RULES:
        assert mdv.get_verifier("select_gbv", selection=mode).lossless
    for bad in ("last", "", None, 1):
        with pytest.raises(InvalidInputError, match="selection"):
            mdv.get_verifier("select_gbv", selection=bad)
