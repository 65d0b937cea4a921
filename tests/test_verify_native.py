"""Tests of the verifiers' C loops (mdv/verify/native.py, mdv/verify/kernels/verify_loops.c) against their
references, on the same rows:

* K-SEQ's rho* by the C active-set bisection: within 1e-13 of the Python one and of a bisection with
  correctly rounded sums; ``spectr`` takes the same decisions with and without the library;
* ``fill``'s rank order by radix sort is torch's stable sort's permutation, exactly (ties, zeros, one-hot
  rows, several rows at once, every V);
* ``lex``'s c(x) off that order equals ``mpbv.below_mass``'s, bit for bit;
* K-SEQ's prefix sums equal the numpy ones, and rho* off them equals the Python-float bisection bit for bit;
* ``fill``'s marks equal a scalar Python transcription of the C loop bit for bit (its cube root within
  1 ulp of the exact one), and the torch sweeps to 1e-8 at V <= 300 (the sweeps amplify the last
  bits of the roots: torch's vectorised sqrt and pow are not correctly rounded);
* the closed-form marginals' C passes against their torch references on the same rows (V from 3 to 49,152,
  m = 2..5, zeros in p and q): K-SEQ's factors (the elementwise ones bit for bit, those through a sum over V
  to 1e-15), ``fill``'s marks bit for bit with :func:`fill_marks` and its factors with ``fill_factors``'s
  (bit for bit but the total's 1e-15), each rule's ``acc += w * marginal`` bit for bit given the same factors
  (``fill``'s added in its factors' last pass; K-SEQ's to 1e-15: its fallback sums over V), the choice's scores
  to 1e-15;
* a row gets the same bits alone or in a batch, and so does a prefix's whole law (rule, q_S, kernel rows)
  up to V = 49,152;
* without the library (no compiler, a failing compiler, ``MDV_NATIVE_LOOPS=0``) the references run:
  ``select_gbv`` stays exact by enumeration and its laws agree with the C path's to 1e-12.
"""
from __future__ import annotations

import decimal
import math
import struct

import numpy as np
import pytest
import torch
from torch import Tensor

import mdv
from mdv.oracle import exact_law, target_law, total_variation
from mdv.verify import native, selection, spectr
from mdv.verify.base import Uniforms
from mdv.verify.mpbv import below_mass
from mdv.verify.selection import (FILL_EPS, FILL_SWEEPS, SortedMasses, fill_factors, fill_law, fill_marginal,
                                  fill_marks, fill_marks_torch, fill_order, fill_order_torch, kseq_factors,
                                  kseq_factors_torch, kseq_marginal, lex_below, lex_below_torch, lex_marginal, node_step,
                                  overlap, reach_mass)
from tests.conftest import toy_pair
from tests.test_verify_select_gbv import _exactly_summed_rho, _rows_with_ties_and_zeros

pytestmark = pytest.mark.skipif(native.loops_library() is None, reason="needs a C compiler")


def _rows(rng: np.random.Generator, N: int, V: int) -> tuple[Tensor, Tensor]:
    """N rows over V tokens: peaked softmax rows (the benchmark's kind) at V >= 20 with zeros, q = 0 < p,
    p = q and tied ratios mixed in; Dirichlet rows below."""
    if V < 20:
        return (torch.tensor(rng.dirichlet(np.ones(V), size=N)), torch.tensor(rng.dirichlet(np.ones(V), size=N)))
    p, q = _rows_with_ties_and_zeros(rng, N, V)
    z = torch.tensor(rng.normal(size=(N, V))) * 3.0
    q[0], p[0] = torch.softmax(z[0], -1), torch.softmax(z[0] + torch.tensor(rng.normal(size=V)), -1)
    p[1] = q[1]  # every ratio 1
    p[2] = 0.0
    p[2, int(q[2].argmax())] = 1.0  # a one-hot target
    return p, q


SIZES = (3, 8, 70, 300, 5000)


# ------------------------------------------------------------------------------------------ K-SEQ's rho*
def test_kseq_rho_in_c_equals_the_python_active_set_and_the_exactly_summed_root(monkeypatch) -> None:
    rng = np.random.default_rng(1)
    worst_python, worst_exact = 0.0, 0.0
    for V in (spectr.ACTIVE_SET_MIN_V, 5000):
        p, q = _rows(rng, 5, V)
        for m in (2, 3, 4, 8):
            got = spectr.kseq_rho(p, q, m)
            with monkeypatch.context() as patch:
                patch.setattr(spectr, "native_rows", lambda *rows: None)
                python = spectr.kseq_rho(p, q, m)
            exact = torch.tensor([_exactly_summed_rho(p[n], q[n], m) for n in range(5)], dtype=torch.float64)
            assert float(got[1]) == 1.0 and float(python[1]) == 1.0  # p = q: rho* = 1
            assert torch.equal(got[3:4], spectr.kseq_rho(p[3:4], q[3:4], m))  # alone or in a batch
            worst_python = max(worst_python, float(((got - python).abs() / python).max()))
            worst_exact = max(worst_exact, float(((got - exact).abs() / exact).max()))
    assert worst_python < 1e-13 and worst_exact < 1e-13, (worst_python, worst_exact)


def test_spectr_takes_the_same_decisions_with_and_without_the_library(monkeypatch) -> None:
    from mdv.bench.synthetic import synthetic_block

    gen = torch.Generator().manual_seed(2)
    block = synthetic_block(2000, 4, 4, generator=gen, logit_scale=1.5)
    verifier = mdv.get_verifier("spectr")
    draws = [Uniforms.draw(1, 4, 4, gen) for _ in range(60)]
    with_c = [verifier.sample(block, u) for u in draws]
    monkeypatch.setattr(spectr, "native_rows", lambda *rows: None)
    for u, want in zip(draws, with_c):
        got = verifier.sample(block, u)
        assert (got.tau.tolist(), got.sel.tolist(), got.token.tolist()) == (want.tau.tolist(), want.sel.tolist(),
                                                                            want.token.tolist())
    assert len({int(o.tau[0]) for o in with_c}) > 1  # the draws reach rejections, not only full blocks


# ------------------------------------------------------------------------------------------ order, lex, masses
@pytest.mark.parametrize("V", SIZES)
def test_radix_order_is_the_stable_sorts_permutation(V: int) -> None:
    p, q = _rows(np.random.default_rng(V), 5, V)
    order = fill_order(p, q)
    assert torch.equal(order, fill_order_torch(p, q))
    assert torch.equal(order[3:4], fill_order(p[3:4], q[3:4]))  # alone or in a batch


@pytest.mark.parametrize("V", SIZES)
def test_lex_below_in_c_is_below_mass_bit_for_bit(V: int) -> None:
    p, q = _rows(np.random.default_rng(100 + V), 5, V)
    order = fill_order(p, q)
    got = lex_below(p, q, order)
    assert torch.equal(got, below_mass(p, q)[0]) and torch.equal(got, lex_below_torch(p, q, order))


@pytest.mark.parametrize("V", SIZES)
def test_sorted_masses_and_rho_in_c_equal_their_python_references(V: int, monkeypatch) -> None:
    p, q = _rows(np.random.default_rng(200 + V), 5, V)
    order = fill_order(p, q)
    in_c = SortedMasses(p, q, order)
    assert in_c._lib is not None
    with monkeypatch.context() as patch:
        patch.setattr(selection, "native_rows", lambda *rows: None)
        in_numpy = SortedMasses(p, q, order)
    assert in_numpy._lib is None
    for name in ("ratio", "p_below", "p_above", "q_below", "q_above"):  # the same sequential sums
        assert np.array_equal(getattr(in_c, name), getattr(in_numpy, name)), name
    np.testing.assert_allclose(in_c.p_zero, in_numpy.p_zero, rtol=1e-15, atol=0)  # numpy sums pairwise
    for m in (2, 3, 4, 7):
        got = in_c.rho(m)
        assert got.tolist() == [in_c.row_rho(n, m) for n in range(5)], m  # C == the Python floats, bit for bit
        assert torch.equal(got[1:2], SortedMasses(p[1:2], q[1:2], order[1:2]).rho(m))  # alone or in a batch
        if V >= 20:
            assert float(got[1]) == 1.0  # p = q: rho* = 1
        torch.testing.assert_close(got, in_numpy.rho(m), rtol=1e-14, atol=0)


# ------------------------------------------------------------------------------------------ fill's marks
def _cube_root(d: float) -> float:
    """kernels/verify_loops.c's cube_root, operation for operation (the seed from d's upper 32 bits)."""
    hi = struct.unpack("<Q", struct.pack("<d", d))[0] >> 32
    z = struct.unpack("<d", struct.pack("<Q", ((0x553EF000 - hi // 3) & 0xFFFFFFFF) << 32))[0]
    for _ in range(4):
        z = z + z * ((1.0 - d * ((z * z) * z)) * (1.0 / 3.0))
    y = d * (z * z)
    return y - ((y * y) * y - d) * (z * z) * (1.0 / 3.0)


def _fill_marks_scalar(q: list[float], target: list[float], order: list[int], m: int) -> list[float]:
    """kernels/verify_loops.c's sel_fill_marks for one row, in Python floats (the same operations, the same bits)."""
    V = len(q)
    qs, ts, th = [q[x] for x in order], [target[x] for x in order], [1.0] * V
    line = FILL_EPS ** (1.0 / m - 1.0)
    for _ in range(FILL_SWEEPS):
        s, above = [0.0] * V, 0.0
        for i in range(V):
            s[i] = min(max(1.0 - above, 0.0), 1.0)
            above = above + qs[i] * th[i]
        for i in range(V):
            pw = s[i]
            for _ in range(m - 1):
                pw = pw * s[i]
            d = max(pw - ts[i], 0.0)
            if d >= FILL_EPS:  # below it C computes the root too (0/0 at d = 0) and discards it
                rest = (math.sqrt(d) if m == 2 else _cube_root(d) if m == 3 else math.sqrt(math.sqrt(d)) if m == 4
                        else math.pow(d, 1.0 / m))
            else:
                rest = d * line
            t = min(max((s[i] - rest) / (qs[i] if qs[i] > 0.0 else 1.0), 0.0), 1.0)
            th[i] = t if qs[i] > 0.0 else 0.0
    out = [0.0] * V
    for i, x in enumerate(order):
        out[x] = th[i]
    return out


def test_the_cube_root_is_within_1_ulp_of_the_exact_one() -> None:
    ds = np.concatenate([np.geomspace(FILL_EPS, 1.0, 4001), np.random.default_rng(0).uniform(FILL_EPS, 1.0, 4000),
                         [1.0, 0.125]])
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        exact = [decimal.Decimal(float(d)) ** (decimal.Decimal(1) / 3) for d in ds]
    got = [_cube_root(float(d)) for d in ds]
    assert got[-2:] == [1.0, 0.5]  # exact cubes
    worst = max(float(abs(decimal.Decimal(g) - e)) / math.ulp(float(e)) for g, e in zip(got, exact))
    assert worst <= 1.0, worst


@pytest.mark.parametrize("V", (3, 8, 70, 300))
@pytest.mark.parametrize("m", (2, 3, 4, 5))
def test_fill_marks_in_c_equal_the_scalar_transcription_and_the_torch_sweeps(V: int, m: int) -> None:
    rng = np.random.default_rng(300 + 7 * V + m)
    p, q = _rows(rng, 5, V)
    ratio = torch.tensor(rng.uniform(0.2, 3.0, size=5))
    target = ratio.unsqueeze(-1) * p
    order = fill_order(p, q)
    got = fill_marks(q, target, order, m)
    for n in range(5):
        want = _fill_marks_scalar(q[n].tolist(), target[n].tolist(), order[n].tolist(), m)
        assert got[n].tolist() == want, n
    assert torch.equal(got[2:3], fill_marks(q[2:3], target[2:3], order[2:3], m))  # alone or in a batch
    assert bool(((got >= 0.0) & (got <= 1.0)).all()) and bool((got[q == 0] == 0.0).all())
    # the torch sweeps round their roots differently (torch's vectorised roots differ by CPU); the sweeps carry
    # those last bits through the cumulative sums, amplified up to FILL_EPS^(1/m - 1) where a root takes the line
    # (measured on an Intel Xeon with AVX-512: 1e-13 at V = 8, 1e-10 at 70, 1e-9 at 300, 1e-4 at 49,152; on an AMD
    # EPYC: 1.2e-8 at 300, m = 4)
    torch.testing.assert_close(got, fill_marks_torch(q, target, order, m), rtol=0, atol=1e-7)


@pytest.mark.parametrize("V", (70, 5000))
@pytest.mark.parametrize("m", (2, 3, 4, 5))
def test_fill_sweeps_stopped_at_a_fixed_point_give_the_bits_of_every_sweep(V: int, m: int) -> None:
    """Where every target is out of reach (P(u)/Q_S(u) large, as at the benchmark's deep prefixes) the thetas
    are fixed after the first sweep and the C loop stops there: the bits of the scalar transcription,
    which runs every sweep."""
    rng = np.random.default_rng(900 + 7 * V + m)
    p, q = _rows(rng, 5, V)
    ratio = torch.tensor([20.0, 1e3, 1.0, 3.0, 0.5], dtype=torch.float64)  # rows 0 and 1: out of reach
    target = ratio.unsqueeze(-1) * p
    order = fill_order(p, q)
    got = fill_marks(q, target, order, m)
    for n in range(5):
        assert got[n].tolist() == _fill_marks_scalar(q[n].tolist(), target[n].tolist(), order[n].tolist(), m), n
    one_sweep = native.fill_marks(native.loops_library(), q, target, order, m, 1, FILL_EPS, FILL_EPS ** (1.0 / m - 1.0))
    assert torch.equal(got[:2], one_sweep[:2])  # the fixed point the early stop takes


# ------------------------------------------------------------------------------------------ the marginals
MARGINAL_SIZES = (3, 8, 70, 300, 5000, 49152)


def _accumulated(add, q: Tensor, rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """(acc after ``add(weight, acc)``, the acc it started from, weight): a random start and random weights, as
    NodeLaw.marginal's running sum meets them."""
    start = torch.tensor(rng.uniform(0.0, 0.5, size=tuple(q.shape)))
    weight = torch.tensor(rng.uniform(0.0, 1.0, size=q.shape[0]))
    acc = start.clone()
    add(weight, acc)
    return acc, start, weight


@pytest.mark.parametrize("V", MARGINAL_SIZES)
@pytest.mark.parametrize("m", (2, 3, 4, 5))
def test_kseq_factors_and_marginal_in_c_equal_the_torch_ones(V: int, m: int) -> None:
    rng = np.random.default_rng(400 + 7 * V + m)
    p, q = _rows(rng, 5, V)
    rho = SortedMasses(p, q, fill_order(p, q)).rho(m)
    got, want = kseq_factors(p, q, m, rho), kseq_factors_torch(p, q, m, rho)
    assert got.beta.data_ptr() != want.beta.data_ptr()  # two computations, not one shared
    for name in ("beta", "mu", "nu"):  # elementwise: the same operations, the same bits
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for name in ("o", "res", "r"):  # through sum nu and the residual's sums over V (long double in C)
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=0, atol=1e-15, msg=name)
    assert len(got.moments) == m
    torch.testing.assert_close(torch.cat(got.moments, -1), torch.cat(want.moments, -1), rtol=0, atol=1e-15)
    assert bool((got.res >= 0.0).all()) and bool(((got.res.sum(-1) - 1.0).abs() < 1e-12).all())
    alone = kseq_factors(p[2:3], q[2:3], m, rho[2:3])
    assert all(torch.equal(getattr(alone, k), getattr(got, k)[2:3]) for k in ("beta", "mu", "nu", "o", "res", "r"))
    lib = native.loops_library()
    acc, start, weight = _accumulated(
        lambda w, a: native.kseq_marginal_add(lib, got.mu, got.nu, got.o, got.res, got.r, m, w, a), q, rng)
    torch.testing.assert_close(acc, start + weight[:, None] * kseq_marginal(got, m), rtol=0, atol=1e-15)


@pytest.mark.parametrize("V", MARGINAL_SIZES)
@pytest.mark.parametrize("m", (2, 3, 4, 5))
def test_fill_law_and_marginal_in_c_equal_the_marks_and_the_torch_factors(V: int, m: int) -> None:
    rng = np.random.default_rng(500 + 7 * V + m)
    p, q = _rows(rng, 5, V)
    ratio = torch.tensor(rng.uniform(0.2, 3.0, size=5))
    order = fill_order(p, q)
    got = fill_law(p, q, ratio, m, order)
    theta = fill_marks(q, ratio.unsqueeze(-1) * p, order, m)
    assert torch.equal(got.theta, theta)  # the sweeps of fill_marks, the same bits
    want = fill_factors(q, theta, order)
    for name in ("qs", "ths", "marked", "unmarked", "others"):  # elementwise and torch's sequential cumsum
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    torch.testing.assert_close(got.below, want.below, rtol=0, atol=1e-15)  # the unmarked total: long double
    alone = fill_law(p[3:4], q[3:4], ratio[3:4], m, order[3:4])
    assert all(torch.equal(getattr(alone, k), getattr(got, k)[3:4]) for k in ("theta", "qs", "others", "below"))
    laws = []  # the marginal added in the factors' last pass: the same factors, and the torch marginal's bits
    acc, start, weight = _accumulated(lambda w, a: laws.append(fill_law(p, q, ratio, m, order, None, w, a)), q, rng)
    fields = ("theta", "qs", "ths", "marked", "unmarked", "others", "below")
    assert all(torch.equal(getattr(laws[0], k), getattr(got, k)) for k in fields)
    assert torch.equal(acc, start + weight[:, None] * fill_marginal(got, m))
    ranked = selection.fill_ranked(p, q, ratio, order)  # the rows gathered once for every count: the same law
    assert all(torch.equal(getattr(fill_law(p, q, ratio, m, order, ranked), k), getattr(got, k)) for k in fields)


@pytest.mark.parametrize("V", MARGINAL_SIZES)
@pytest.mark.parametrize("m", (2, 3, 4, 5))
def test_lex_marginal_in_c_equals_the_torch_one(V: int, m: int) -> None:
    rng = np.random.default_rng(600 + 7 * V + m)
    p, q = _rows(rng, 5, V)
    c = lex_below(p, q, fill_order(p, q))
    lib = native.loops_library()
    acc, start, weight = _accumulated(lambda w, a: native.lex_marginal_add(lib, q, c, m, w, a), q, rng)
    assert torch.equal(acc, start + weight[:, None] * lex_marginal(q, c, m))
    with pytest.raises(ValueError, match="contiguous"):  # C adds in place: a strided view would be misread
        native.lex_marginal_add(lib, q, c, m, weight, acc.t().contiguous().t())


@pytest.mark.parametrize("V", MARGINAL_SIZES)
def test_overlap_in_c_equals_torchs_and_is_row_by_row(V: int) -> None:
    rng = np.random.default_rng(700 + V)
    p, q = _rows(rng, 5, V)
    ratio = torch.tensor(rng.uniform(0.2, 3.0, size=5))
    target = ratio.unsqueeze(-1) * p
    got = overlap(target, q)
    torch.testing.assert_close(got, torch.minimum(target, q).sum(-1), rtol=0, atol=1e-15)
    assert torch.equal(got[4:5], overlap(target[4:5], q[4:5]))  # alone or in a batch
    if V >= 20:  # row 1 has p = q: the overlap is min(ratio, 1)
        assert abs(float(got[1]) - min(float(ratio[1]), 1.0)) < 1e-14


@pytest.mark.parametrize("V", MARGINAL_SIZES)
def test_ceiling_in_c_equals_the_overlap_with_the_reach_mass(V: int) -> None:
    rng = np.random.default_rng(750 + V)
    p, q = _rows(rng, 5, V)
    target = torch.tensor(rng.uniform(0.2, 3.0, size=5)).unsqueeze(-1) * p
    pi = torch.tensor(rng.dirichlet(np.ones(5), size=5))
    pi[:, 0] = 0.0
    pi[1, 3] = 0.0  # a count that cannot occur
    pi[2, 2:] = 0.0  # one survivor: the reach is q
    pi = pi / pi.sum(-1, keepdim=True)
    got = native.ceiling(native.loops_library(), target, q, pi)
    torch.testing.assert_close(got, overlap(target, reach_mass(q, pi)), rtol=0, atol=1e-15)
    assert torch.equal(got[3:4], native.ceiling(native.loops_library(), target[3:4], q[3:4], pi[3:4]))
    torch.testing.assert_close(got[2], overlap(target[2:3], q[2:3])[0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("V", (40, 300, 5000, 49152))
def test_node_step_gives_a_prefix_the_same_law_alone_or_in_a_batch(V: int) -> None:
    """The choice compares scores to CHOICE_TOL, and the walk (one prefix), the law and a later iteration's
    window (a batch of prefixes) must agree on it: on the C path every rule, q_S and the kernel rows at the
    drafted tokens carry the same bits for a row alone as in a batch of four (torch's reductions need not)."""
    rng = np.random.default_rng(800 + V)
    p, q = _rows(rng, 4, V)
    ratio = torch.tensor(rng.uniform(0.3, 3.0, size=4))
    pi = torch.tensor(rng.dirichlet(np.ones(5), size=4))  # K = 4, every survivor count possible
    tok = q.argmax(-1)
    for mode in selection.MODES:
        batch = node_step(p, q, ratio, pi, mode)
        rows = batch.rows(tok)
        for n in range(4):
            alone = node_step(p[n:n + 1], q[n:n + 1], ratio[n:n + 1], pi[n:n + 1], mode)
            assert torch.equal(alone.rule, batch.rule[n:n + 1]), (mode, n)
            assert torch.equal(alone.q_sel, batch.q_sel[n:n + 1]), (mode, n)
            assert torch.equal(alone.rows(tok[n:n + 1]), rows[n:n + 1]), (mode, n)
    assert len(set(node_step(p, q, ratio, pi, "choose").rule.tolist())) > 1  # the batch mixes rules


def _sparse_rows(rng: np.random.Generator, V: int) -> tuple[Tensor, Tensor]:
    """Four rows over V tokens: three drafts with supports of different sizes (one with a target that is 0 off
    it), one dense draft."""
    p = torch.tensor(rng.dirichlet(np.ones(V) * 0.5, size=4))
    q = torch.zeros(4, V, dtype=torch.float64)
    for n, size in enumerate((V // 10, V // 4, V // 3)):
        support = rng.choice(V, size=size, replace=False)
        q[n, support] = torch.tensor(rng.dirichlet(np.ones(size)))
    q[3] = torch.tensor(rng.dirichlet(np.ones(V)))
    p[2] = torch.where(q[2] > 0, p[2], torch.zeros_like(p[2]))
    return p / p.sum(-1, keepdim=True), q


@pytest.mark.parametrize("V", (300, 5000, 49152))
def test_support_columns_in_c_equal_the_torch_ones(V: int, monkeypatch) -> None:
    """The draft's support in one pass of C against torch: the same ids and columns, the mass off the support
    to 1e-15 (long double against torch's sum); None where the support is more than COMPACT_MAX_SHARE of V."""
    rng = np.random.default_rng(830 + V)
    p, q = _sparse_rows(rng, V)
    got = [selection.support_columns(p[n:n + 1], q[n:n + 1]) for n in range(4)]
    monkeypatch.setattr(selection, "native_rows", lambda *rows: None)
    want = [selection.support_columns(p[n:n + 1], q[n:n + 1]) for n in range(4)]
    assert got[3] is None and want[3] is None  # the dense draft
    for n in range(3):
        (vocab, p_cols, q_cols), (vocab_t, p_cols_t, q_cols_t) = got[n], want[n]
        assert torch.equal(vocab, vocab_t) and torch.equal(vocab, (q[n] > 0).nonzero().squeeze(-1))
        assert torch.equal(q_cols, q_cols_t) and torch.equal(p_cols[:, :-1], p_cols_t[:, :-1])
        assert abs(float(p_cols[0, -1] - p_cols_t[0, -1])) <= 1e-15 and float(q_cols[0, -1]) == 0.0
    assert float(got[2][1][0, -1]) == 0.0  # no target mass off that support


@pytest.mark.parametrize("V", (300, 5000))
def test_node_step_on_draft_supports_gives_a_prefix_the_same_law_alone_or_in_a_batch(V: int) -> None:
    """:func:`test_node_step_gives_a_prefix_the_same_law_alone_or_in_a_batch` where three of the four rows are
    scored on their draft's support (each its own) and one on the vocabulary."""
    rng = np.random.default_rng(860 + V)
    p, q = _sparse_rows(rng, V)
    ratio = torch.tensor(rng.uniform(0.3, 3.0, size=4))
    pi = torch.tensor(rng.dirichlet(np.ones(5), size=4))
    tok = q.argmax(-1)
    for mode in selection.MODES:
        batch = node_step(p, q, ratio, pi, mode)
        assert isinstance(batch, selection.StackedLaws)  # its rows stepped one at a time
        rows = batch.rows(tok)
        for n in range(4):
            alone = node_step(p[n:n + 1], q[n:n + 1], ratio[n:n + 1], pi[n:n + 1], mode)
            assert (alone.vocab is None) == (n == 3)
            assert torch.equal(alone.rule, batch.rule[n:n + 1]), (mode, n)
            assert torch.equal(alone.q_sel, batch.q_sel[n:n + 1]), (mode, n)
            assert torch.equal(alone.rows(tok[n:n + 1]), rows[n:n + 1]), (mode, n)


# ------------------------------------------------------------------------------------------ without the library
def test_no_compiler_or_a_failing_one_leaves_the_torch_code(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MDV_CACHE", str(tmp_path))
    try:
        for cc in ("mdv-no-such-compiler", "false"):  # not on PATH; on PATH, exits 1 and writes nothing
            monkeypatch.setenv("CC", cc)
            native.loops_library.cache_clear()
            assert native.loops_library() is None and native.native_rows(torch.zeros(1, 3, dtype=torch.float64)) is None
        assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.tmp"))
        monkeypatch.delenv("CC")
        monkeypatch.setenv("MDV_NATIVE_LOOPS", "0")
        native.loops_library.cache_clear()
        assert native.loops_library() is None
    finally:
        native.loops_library.cache_clear()
    assert native.native_rows(torch.zeros(1, 3, dtype=torch.float32)) is None  # float32 rows: torch


def test_select_gbv_is_exact_on_the_torch_code_and_agrees_with_the_c_path(monkeypatch) -> None:
    """The torch path is what runs on GPUs and without a compiler: the same rule, exact by enumeration, and
    node laws equal to the C path's to 1e-12 (V = 300, every mode)."""
    rng = np.random.default_rng(5)
    p, q = _rows(rng, 4, 300)
    ratio = torch.tensor(rng.uniform(0.5, 2.0, size=4))
    pi = torch.tensor(rng.dirichlet(np.ones(5), size=4))  # K = 4, every survivor count possible
    with_c = {mode: node_step(p, q, ratio, pi, mode) for mode in selection.MODES}
    selection._node_step_memo.cache_clear()
    monkeypatch.setattr(selection, "native_rows", lambda *rows: None)
    try:
        for mode, law in with_c.items():
            again = node_step(p, q, ratio, pi, mode)
            assert torch.equal(again.rule, law.rule), mode
            torch.testing.assert_close(again.q_sel, law.q_sel, rtol=0, atol=1e-12)
            tok = q.argmax(-1)
            torch.testing.assert_close(again.rows(tok), law.rows(tok), rtol=0, atol=1e-12)
        target, draft = toy_pair(3, seed=61, zeros=True)
        law = exact_law("select_gbv", target, draft, 3, 2, 4)
        assert total_variation(law, target_law(target, 4)) < 1e-9
    finally:
        selection._node_step_memo.cache_clear()
