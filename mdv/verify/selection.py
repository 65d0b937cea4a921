"""The law of a draft selected from K i.i.d. drafts, walked depth by depth (algorithms.md §1 letters:
p = target, q = draft).  Shared by ``select_gbv`` (:mod:`mdv.verify.select_gbv`) and its target adjustment
(:mod:`mdv.verify.adjust`).

**The walk.**  Keep the set S of drafts that agree with the selected prefix u (initially all K).  At depth
|u| the m = |S| survivors' next tokens are m i.i.d. draws from q(.|u) (what S is depends only on tokens
before |u|).  A *token rule* picks one of them, x, and S becomes the survivors whose token is x.  After L
depths the selected draft is the first of S.  Three token rules are scored (a fourth, ``first``, is taken
unscored where only one survivor is all but certain: *The choice* below):

* ``lex`` -- the largest token under the key ``(r(x), -x)``, ``r = min{1, p/q}`` (``mpbv``'s ranking; with
  it at every depth the selected draft is ``mpbv``'s lexicographic maximum).  With ``c(x)`` the q-mass ranked
  strictly below x, the kernel (x chosen, j survivors) is ``T_m(x, j) = C(m, j) q(x)^j c(x)^(m-j)``.
* ``kseq`` -- SpecTr's K-SEQ with m drafts (:mod:`mdv.verify.spectr`): the survivors are tested in draft
  order, each accepted with ``beta(x) = min{1, p(x)/(rho* q(x))}``; the first accepted token is chosen.  If
  all are rejected, y is drawn from the K-SEQ residual; y is chosen if a survivor drafted it, otherwise the
  *first* survivor's token (the fallback; the walk must keep some draft).  With ``mu = q beta`` (a draft
  accepted with token x), ``nu = q - mu`` (rejected with token x), ``r = sum nu`` and ``o_x = r - nu(x)``:

      T_m(x, j) = sum_{i=1..m} sum_{b+a=j-1} C(i-1, b) nu^b o_x^(i-1-b) mu C(m-i, a) q^a (1-q)^(m-i-a)   (draft i first accepted)
                + C(m, j) nu^j o_x^(m-j) p_res(x)                                                    (residual y = x drafted)
                + C(m-1, j-1) nu^j sum_{y != x} p_res(y) (o_x - nu(y))^(m-j)                          (fallback)

  (all of x's quantities at x).  With the K-SEQ walk at every depth the selected draft extends SpecTr's
  accepted prefix: SpecTr continues exactly where this walk keeps a drafted token.

* ``fill`` -- a thinned lexicographic rule aimed at a target mass t(x) = (P(u)/Q_S(u)) p(x|u).  Rank the
  tokens by ``(p/q, -x)`` (unclamped ratio).  Each survivor is *marked* independently with probability
  theta(x) of its token; the chosen token is the highest-ranked marked one, or, if no survivor is marked, the
  highest-ranked one.  With ``a(x) = sum_{y ranked above x} q(y) theta(y)`` (marked mass above x) and
  ``b(x) = sum_{y ranked below x} q(y) (1 - theta(y))`` (unmarked mass below):

      T_m(x, j) = C(m, j) q(x)^j (1 - (1 - theta(x))^j) (1 - q(x) - a(x))^(m-j)      (x the top marked token)
                + C(m, j) (q(x) (1 - theta(x)))^j b(x)^(m-j)                          (nothing marked)

  theta *fills* the targets in rank order: token x is marked so that its first-term mass
  ``s^m - (s - q theta)^m`` (s = 1 - a(x)) equals t(x), or with theta = 1 where t(x) is out of reach, i.e.
  ``theta(x) = clamp((s - (s^m - t(x))_+^(1/m)) / q(x), 0, 1)`` (the root made Lipschitz below FILL_EPS).
  This is a recursion along the ranking
  (a(x) depends on the thetas above x); it is solved by FILL_SWEEPS Jacobi sweeps from theta = 1: sweep n
  makes the n top-ranked thetas exact, so the recursion is solved exactly up to FILL_SWEEPS tokens and
  approximated below them.  The selection's
  law is computed from the thetas actually used, so the rule is exact whatever the sweeps give.  With
  theta = 1 it is the lexicographic maximum under the unclamped ratio.  Why it helps: ``lex`` gives the
  top-ranked tokens all of their reachable mass 1 - (1 - q)^m, far above p when K is large; the marks hand
  the excess on to lower-ranked tokens (at L = 1 on 1,486 random rows, V 2-8, K 2-4, it reaches 0.998 of the
  optimal K-draft acceptance alpha*_K on average, against 0.978 for the better of ``kseq`` and ``lex``).

At m = 1 every kernel is ``q(x)`` at j = 1: one survivor is kept whatever the rule.

**The choice** (``mode="choose"``).  The rule at a prefix u may depend on anything fixed by u -- the rows
p(.|u), q(.|u), the law pi_u of the survivor count and the ratio P(u)/Q_S(u) -- because then Q_S, the law
of the selected draft, is still a function of the prefix alone.  It is the rule that maximises the prefix's
contribution to greedy block verification's E[tau] = sum_v min(P(v), Q_S(v)) (algorithms.md §5):

    score(rule) = sum_x min( (P(u)/Q_S(u)) p(x|u),  q_S^rule(x|u) ),

taken in CHOICE_ORDER (``lex``, ``kseq``, ``fill``): a later rule replaces the best so far only if its score
is larger by more than CHOICE_TOL.  Ties are common (on 60 random V = 3 toys at L = 2, 3, 143 of 387 scored
prefixes had ``lex`` and ``kseq`` within CHOICE_TOL with different laws: equal overlaps leave equal mass above
the target, which the two rules put on different tokens), and the next depth cannot break them; the subtree
can.  Breaking them towards ``lex`` (measured, not proved: the subtree below u has no rows
the verifier could read) cut the default's misses against the best of ``spectr``, ``mdbv`` and ``mpbv`` on
random toys at L >= 2 from 78 to 40 of 1,600 (the largest gap from 8.8% to 1.6% of E[tau]; mean E[tau] 1.19987 ->
1.20026; ``experiments.theory random_toys=1600``, README *The exact theory tables*).
Where pi_u puts at most FORCED_MASS on two or more survivors every rule's score is within CHOICE_TOL / 2 of
every other's, and the rule is FORCED_RULE = ``first`` without scoring: the first survivor's token (survivors in
draft order).  The drafts through u are i.i.d. given u, so that token has law q(.|u) and
``T_m(x, j) = q(x) C(m-1, j-1) q(x)^(j-1) (1 - q(x))^(m-j)`` (the other m - 1 survivors drafting x are binomial):
its marginal is q itself, with no sort and no factors (at the benchmark's prefixes from depth 3 on).  As a walk
mode (``selection="first"``) it keeps draft 0 and is ``gbv`` on it.
Every token rule chooses one of the survivors' tokens, so ``q_S^rule(x|u) <= R(x) = sum_m pi_u(m) (1 - (1 - q(x|u))^m)``
(some survivor drafted x; :func:`reach_mass`) and no score exceeds the *ceiling* ``sum_x min(t(x), R(x))``.  Where
the ceiling is at most the best score so far + CHOICE_TOL (less CEILING_SLACK for rounding), no later rule can
replace the best, and their laws are not computed: the same choice and law, for less work.  On real blocks of the
default pair at T = 0.4 that settles 86 of 160 scored prefixes after ``lex`` alone and 4 more before ``fill``
(``fill`` comes close to the ceiling, so where it wins it is always computed).

**The state.**  pi_u(m) = Pr(m survivors | the selected draft extends u); then
``q_S(x|u) = sum_m pi_u(m) sum_j T_m(x, j)`` and ``pi_{u·x}(j) = sum_m pi_u(m) T_m(x, j) / q_S(x|u)``.  The
root has pi = e_K.  Everything is a function of the prefix, so it is available off the drafted paths too
(the target adjustment of later iterations walks it along the new drafts).

Cost per prefix (:func:`node_step`, :class:`NodeLaw`).  The walk reads the full row q_S(.|u) but the kernel
T_m(x, .) only at the tokens it follows, so q_S comes from each rule's closed-form marginal ``sum_j T_m(x, j)``
(:func:`lex_marginal`, :func:`kseq_marginal`, :func:`fill_marginal`: O(m V) per survivor count m) and the
kernel rows from the same factors at one token (:meth:`NodeLaw.rows`).  Every rule chooses a survivor's
token, so a token the draft never proposes (q(x|u) = 0 in every row) has no selected mass and moves no other
token's factors (zero q-mass in every sum; the target's mass on those tokens enters K-SEQ only as a total, P_0 of
:class:`SortedMasses`).  Where the draft's support is at most COMPACT_MAX_SHARE of V (a vocabulary-subset head,
prompt lookup, top-k), the rules run on the support's columns and one more column that carries the target's
mass off the support with q = 0 (:func:`support_columns`); only q_S is written back to the vocabulary.  The
default pair's draft proposes 8,192 of 49,152 tokens.  One sort of V serves the three rules:
``fill``'s rank order, K-SEQ's rho* (prefix sums in that order, :class:`SortedMasses`) and, above MEMO_MAX_V,
``lex``'s c(x) (:func:`lex_below`); ``fill`` adds up to FILL_SWEEPS passes per survivor count for its marks
(in C they stop where a sweep would repeat the last one: a fixed point, the same bits).  On CPU
float64 rows all of this runs in C (:mod:`mdv.verify.native`; torch and numpy are the references and the path
on GPUs or without a C compiler): the loops (the sort, the prefix sums, rho*'s bisection, lex's c and fill's
sweeps), per rule and count the factors and ``pi(m)`` times the marginal, added straight into the rule's row
(:meth:`NodeLaw.marginal`), and the choice's scores (:func:`overlap`).  A single prefix's choice above MEMO_MAX_V
(the sampler's and the law's prefixes, where some count m >= 2 is possible) makes one C call per rule that runs those
functions in the same order (:func:`_choose_in_c`; :func:`_score_prefix_stepwise`, one call per loop with tensor
operations between them, is its reference, bit for bit, and the path of batches, of the toys and of GPUs), and the
kernel row at the followed token is read in Python floats (:meth:`NodeLaw._row_at`).  The full kernels (:func:`lex_kernel`,
:func:`kseq_kernel`, :func:`fill_kernel`, O(K^3 V) for K-SEQ) are the definitions the tests hold the fast law to.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mdv.verify._math import TOL
from mdv.verify.mpbv import below_mass, power_sum, ratio_scores
from mdv.verify.native import ceiling as native_ceiling
from mdv.verify.native import fill_law as native_fill_law
from mdv.verify.native import fill_marks as native_fill_marks
from mdv.verify.native import kseq_factors as native_kseq_factors
from mdv.verify.native import kseq_marginal_add as native_kseq_marginal_add
from mdv.verify.native import kseq_rho as native_kseq_rho
from mdv.verify.native import lex_below as native_lex_below
from mdv.verify.native import lex_marginal_add as native_lex_marginal_add
from mdv.verify.native import native_rows, rank_order
from mdv.verify.native import node_rule as native_node_rule
from mdv.verify.native import overlap as native_overlap
from mdv.verify.native import sorted_masses as native_sorted_masses
from mdv.verify.native import support as native_support
from mdv.verify.spectr import RHO_ITERS, kseq_accept_prob, kseq_residual, kseq_rho

#: The token rules a prefix can use, and the walk modes of ``select_gbv``.
RULES = ("kseq", "lex", "fill", "first")
MODES = ("choose",) + RULES
#: The rules the choice scores, in its order: ties (within CHOICE_TOL) go to the earliest (module docstring).
CHOICE_ORDER = ("lex", "kseq", "fill")
#: The rule taken without scoring where the survivor law puts at most FORCED_MASS on m >= 2 survivors: the
#: first survivor's token, whose marginal is q itself (no sort, no factors).
FORCED_RULE = "first"
#: A rule replaces an earlier one in CHOICE_ORDER only when its score is larger by more than this (scores are masses
#: <= 1): scores that are equal, or that differ only by rounding, then pick the same rule whichever code path
#: computed them (the iteration, the law, a later iteration's window); fill's scores move by up to ~1e-10 with
#: the last bits of their inputs (see FILL_EPS).
CHOICE_TOL = 1e-9
#: Where the survivor law puts at most this mass on m >= 2 survivors, the rule is FORCED_RULE without scoring
#: (:func:`node_step`): every rule's marginal is ``pi(1) q`` plus pi(m >= 2) times laws over V, so any two rules'
#: marginals differ by at most 2 pi(m >= 2) = CHOICE_TOL / 2 in L1 (two laws differ by at most 2), and so do their
#: scores (min is 1-Lipschitz): forcing a rule there moves the prefix's score by less than CHOICE_TOL.
FORCED_MASS = CHOICE_TOL / 4
#: The choice skips the rules after the best so far where the scores' ceiling (:func:`reach_mass`) is at most the best
#: score + CHOICE_TOL - CEILING_SLACK: no later rule can then beat it by CHOICE_TOL.  The slack covers the rounding
#: of the sums and marginals (~1e-15 on masses <= 1), so a skipped rule is one that computing would not choose.
CEILING_SLACK = 1e-12
#: Jacobi sweeps of ``fill``'s recursion for theta (exact for the top this-many tokens; module docstring).
FILL_SWEEPS = 4
#: Below this, ``fill``'s root ``d^(1/m)`` is replaced by the line ``d * FILL_EPS^(1/m - 1)`` through it: the root is
#: not Lipschitz at 0, so where a target takes exactly all the mass left (d = 0 up to rounding) two computations
#: of the same prefix differing in their last bits gave thetas ~1e-8 apart and could choose different rules (TV
#: 7e-9 in tests/test_exactness.py).  The line bounds the slope by FILL_EPS^(1/m - 1) <= 3e4; a token then gets
#: at most FILL_EPS more than its target.
FILL_EPS = 1e-6


def _powers(x: Tensor, n: int) -> list[Tensor]:
    """[x^0, x^1, ..., x^n] by repeated products (x^0 = 1 also where x = 0)."""
    out = [torch.ones_like(x)]
    for _ in range(n):
        out.append(out[-1] * x)
    return out


def _scalar_powers(x: float, n: int) -> list[float]:
    """[x^0, ..., x^n] in Python floats by repeated products (:func:`_powers` of one entry)."""
    out = [1.0]
    for _ in range(n):
        out.append(out[-1] * x)
    return out


def _single_terms(q: Tensor, K: int) -> Tensor:
    """``T_1(x, j)``: one survivor is kept whatever the rule, so q(x) at j = 1.  q: [N, X] -> [N, X, K+1]."""
    out = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
    out[..., 1] = q
    return out


def first_kernel(q: Tensor, m: int, K: int) -> Tensor:
    """``T_m(x, j)`` of the ``first`` rule: the first of m survivors drafts x with probability q(x), and j - 1 of
    the other m - 1 draft x too, ``q(x) C(m-1, j-1) q(x)^(j-1) (1 - q(x))^(m-j)``.  q: [N, X] -> [N, X, K+1]."""
    out = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
    for j in range(1, m + 1):
        out[..., j] = math.comb(m - 1, j - 1) * q * q.pow(j - 1) * (1.0 - q).pow(m - j)
    return out


# ---------------------------------------------------------------------------------------- lex
def _lex_terms(q: Tensor, c: Tensor, m: int, K: int) -> Tensor:
    """``T_m(x, j) = C(m, j) q^j c^(m-j)`` elementwise: q, c [N, X] (at any X tokens) -> [N, X, K+1]."""
    out = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
    q_pow, c_pow = _powers(q, m), _powers(c, m)
    for j in range(1, m + 1):
        out[..., j] = math.comb(m, j) * q_pow[j] * c_pow[m - j]
    return out


def lex_kernel(p: Tensor, q: Tensor, m: int, K: int, below: Tensor | None = None) -> Tensor:
    """``T_m(x, j) = C(m, j) q(x)^j c(x)^(m-j)`` for j = 1..m (zeros for j = 0 and j > m).
    p, q: [N, V]; below: c [N, V] if already computed (one sort of V) -> [N, V, K+1]."""
    if m == 1:
        return _single_terms(q, K)
    return _lex_terms(q, below_mass(p, q)[0] if below is None else below, m, K)


def lex_marginal(q: Tensor, c: Tensor, m: int) -> Tensor:
    """``sum_j T_m(x, j) = (q + c)^m - c^m``, as ``q * sum_{i<m} (q + c)^i c^(m-1-i)`` (no cancellation where
    q << c).  q, c: [N, V] -> [N, V]."""
    return q if m == 1 else q * power_sum(q + c, c, m)


def lex_below(p: Tensor, q: Tensor, order: Tensor) -> Tensor:
    """``lex``'s ``c(x)`` (:func:`~mdv.verify.mpbv.below_mass`'s first output, the same sums bit for bit)
    from ``fill``'s rank order instead of a second sort.  The two keys differ only on the tokens whose
    clamped ratio r = min{1, p/q} is 1: ``lex`` ties them (ranked by id, smaller first), ``fill`` ranks them
    by p/q.  So ``lex``'s order from the bottom is ``fill``'s reversed, less those tokens, then those tokens
    by decreasing id.  One pass of C per row on CPU float64 rows (:func:`mdv.verify.native.lex_below`),
    else :func:`lex_below_torch`.  p, q, order: [N, V] -> [N, V]."""
    lib = native_rows(p, q)
    return lex_below_torch(p, q, order) if lib is None else native_lex_below(lib, p, q, order)


def lex_below_torch(p: Tensor, q: Tensor, order: Tensor) -> Tensor:
    """:func:`lex_below` in torch, one row at a time (for large V, where N is small)."""
    top = ratio_scores(p, q) == 1.0  # [N, V]
    out = torch.empty_like(q)
    for n in range(q.shape[0]):
        ascending = order[n].flip(0)
        seq = torch.cat([ascending[~top[n, ascending]], top[n].nonzero().squeeze(-1).flip(0)])
        cum = q[n, seq].cumsum(0)
        out[n, seq] = torch.cat([torch.zeros_like(cum[:1]), cum[:-1]])
    return out


# ---------------------------------------------------------------------------------------- kseq
@dataclass(frozen=True)
class KseqFactors:
    """K-SEQ with m survivors at N prefixes: what the sampler, the kernel and its marginal share.
    rho: [N]; beta, mu = q beta, nu = q - mu, o = r - nu, res (the K-SEQ residual): [N, V]; r = sum nu: [N, 1];
    moments: ``M_t = sum_y res(y) nu(y)^t``, t < m, each [N, 1]."""

    rho: Tensor
    beta: Tensor
    mu: Tensor
    nu: Tensor
    o: Tensor
    res: Tensor
    r: Tensor
    moments: list[Tensor]


class SortedMasses:
    """rho* of K-SEQ (:func:`~mdv.verify.spectr.kseq_rho`: the same g, the same RHO_ITERS bisection steps on
    [1, m], its upper end) with g's two sums read off prefix sums in ``fill``'s rank order.  For rho in the
    bracket,

        sum_x (q - p/rho)_+ = Q_<(rho) - P_<(rho) / rho,      sum_x (p - rho q)_+ = P_>(rho) - rho Q_>(rho) + P_0,

    with P_<, Q_< the masses of the drafted tokens whose p/q < rho (a prefix of the order read from the
    bottom), P_>, Q_> those whose p/q > rho (a suffix, summed from the top), and P_0 the target's mass on
    undrafted tokens (q = 0 < p: always uncovered).  After the sort ``lex`` and ``fill`` share, a step costs two
    binary searches instead of ``kseq_rho``'s pass over the entries still in the bracket.  The sums round
    differently (~V eps), so the root moves by ~1e-13 relative and g with kseq_rho's exact sums may read
    ~-1e-15 there, as it does at kseq_rho's own active-set result for large V.  p, q, order: [N, V]."""

    def __init__(self, p: Tensor, q: Tensor, order: Tensor) -> None:
        self.device = q.device  # the sums and the bisection run on the CPU; rho goes back to q's device
        p, q, order = p.cpu(), q.cpu(), order.cpu()
        lib = self._lib = native_rows(p, q)
        if lib is not None:  # one pass of C per row (the same sums, sequential in long double)
            self.ratio, self.p_below, self.p_above, self.q_below, self.q_above, self.p_zero = native_sorted_masses(
                lib, p, q, order)
            return
        ascending = order.flip(-1)  # [N, V]: the tokens by increasing p/q
        p_asc, q_asc = p.gather(-1, ascending), q.gather(-1, ascending)
        drafted = q_asc > 0
        p_drafted = torch.where(drafted, p_asc, torch.zeros_like(q_asc))  # undrafted: only in P_0
        self.ratio = torch.where(drafted, p_drafted / torch.where(drafted, q_asc, torch.ones_like(q_asc)),
                                 torch.zeros_like(q_asc)).numpy()  # [N, V], ascending in every row
        undrafted_p = torch.where(drafted, torch.zeros_like(q_asc), p_asc).numpy()
        self.p_zero = undrafted_p.astype(np.longdouble).sum(-1).astype(np.float64)  # [N], each row on its own

        # running sums in extended precision (x87 long double where the platform has it): a float64
        # cumsum over V terms drifts by ~V eps, which would move the root by ~1e-13 at V = 49152
        def below_above(x: Tensor) -> tuple[np.ndarray, np.ndarray]:  # [N, V+1] each: the first i, the rest
            cum = x.numpy().astype(np.longdouble).cumsum(-1)
            below = np.concatenate([np.zeros((x.shape[0], 1), np.longdouble), cum], -1)
            return below.astype(np.float64), (below[:, -1:] - below).astype(np.float64)

        (self.p_below, self.p_above), (self.q_below, self.q_above) = below_above(p_drafted), below_above(q_asc)

    def _counts(self, rho: np.ndarray, side: str) -> np.ndarray:
        """Per row, how many ratios are < rho (side 'left') or <= rho ('right'): one comparison of the whole
        [N, V] block (the small-V path of :meth:`rho`)."""
        hit = self.ratio < rho[:, None] if side == "left" else self.ratio <= rho[:, None]
        return hit.sum(-1)

    def gap(self, rho: np.ndarray, m: int) -> np.ndarray:
        """g(rho) = (sum_x (q - p/rho)_+)^m - sum_x (p - rho q)_+ of every row, off the prefix sums.  rho: [N]"""
        rows = np.arange(len(rho))
        i, j = self._counts(rho, "left"), self._counts(rho, "right")
        reject = np.clip(self.q_below[rows, i] - self.p_below[rows, i] / rho, 0.0, 1.0)
        uncovered = np.maximum(self.p_zero + self.p_above[rows, j] - rho * self.q_above[rows, j], 0.0)
        with np.errstate(divide="ignore"):  # log 0 = -inf where reject = 0; that entry takes the 0 branch
            powered = np.where(reject > 0.0, np.exp(m * np.log(reject)), 0.0)
        return powered - uncovered

    def _row_gap(self, n: int, rho: float, m: int) -> float:
        """:meth:`gap` of row n in Python floats, the counts by binary search (:meth:`row_rho`'s step)."""
        ratio = self.ratio[n]
        i, j = int(np.searchsorted(ratio, rho, "left")), int(np.searchsorted(ratio, rho, "right"))
        reject = min(max(float(self.q_below[n, i]) - float(self.p_below[n, i]) / rho, 0.0), 1.0)
        uncovered = max(float(self.p_zero[n]) + float(self.p_above[n, j]) - rho * float(self.q_above[n, j]), 0.0)
        return (math.exp(m * math.log(reject)) if reject > 0.0 else 0.0) - uncovered

    def rho(self, m: int) -> Tensor:
        """rho* with m >= 2 drafts for every row.  Each row's steps are its own, so a row gets the same bits
        alone or in a batch.  Three implementations of one bisection, chosen by the machine and V only (so
        every computation of one prefix within a process takes the same one): C (:func:`mdv.verify.native.
        kseq_rho`, ~30 us a row at V = 49k) where the library is built; else above MEMO_MAX_V row by row in Python
        floats (:meth:`_row_gap`, the C loop's reference: the same operations, the same bits; ~4 us a step
        against ~50 us for a numpy step on one row, whose cost is the calls, not the work); else all rows at
        once in numpy (one [N, V] comparison per step).  -> [N] float64"""
        N, V = self.ratio.shape
        lib = self._lib
        if lib is not None:
            masses = (self.ratio, self.p_below, self.p_above, self.q_below, self.q_above, self.p_zero)
            return torch.tensor(native_kseq_rho(lib, masses, m, RHO_ITERS), dtype=torch.float64, device=self.device)
        if V > MEMO_MAX_V:
            return torch.tensor([self.row_rho(n, m) for n in range(N)], dtype=torch.float64, device=self.device)
        at_one = self.gap(np.ones(N), m) >= 0.0  # rho* = 1
        lo, hi = np.ones(N), np.full(N, float(m))
        for _ in range(RHO_ITERS):
            mid = 0.5 * (lo + hi)
            ok = self.gap(mid, m) >= 0.0
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
        return torch.tensor(np.where(at_one, 1.0, hi), dtype=torch.float64, device=self.device)

    def row_rho(self, n: int, m: int) -> float:
        """rho* of row n by the bisection in Python floats (the C loop's reference)."""
        if self._row_gap(n, 1.0, m) >= 0.0:  # rho* = 1
            return 1.0
        lo, hi = 1.0, float(m)
        for _ in range(RHO_ITERS):
            mid = 0.5 * (lo + hi)
            if self._row_gap(n, mid, m) >= 0.0:
                hi = mid
            else:
                lo = mid
        return hi


def kseq_factors(p: Tensor, q: Tensor, m: int, rho: Tensor | None = None) -> KseqFactors:
    """:class:`KseqFactors` of K-SEQ with m >= 2 survivors.  p, q: [N, V]; rho: [N] (default
    :func:`~mdv.verify.spectr.kseq_rho`).  One C call on CPU float64 rows (:func:`mdv.verify.native.
    kseq_factors`: the same algebra, its sums r, beta(rho*), the residual's mass and the moments in long
    double), else :func:`kseq_factors_torch`."""
    rho = kseq_rho(p, q, m) if rho is None else rho  # [N]
    lib = native_rows(p, q)
    if lib is None:
        return kseq_factors_torch(p, q, m, rho)
    beta, mu, nu, o, res, r, moments = native_kseq_factors(lib, p, q, rho, m, TOL)
    return KseqFactors(rho, beta, mu, nu, o, res, r, moments)


def kseq_factors_torch(p: Tensor, q: Tensor, m: int, rho: Tensor) -> KseqFactors:
    """:func:`kseq_factors` in torch: its reference, and the path on GPUs or without a C compiler."""
    beta = kseq_accept_prob(p, q, rho.unsqueeze(-1))  # [N, V]
    mu = q * beta
    nu = (q - mu).clamp_min(0.0)
    r = nu.sum(-1, keepdim=True)  # [N, 1]
    o = (r - nu).clamp_min(0.0)  # [N, V]: rejected with another token
    res = kseq_residual(p, q, m, rho)  # [N, V]
    nu_pow = _powers(nu, m - 1)
    moments = [(res * nu_pow[t]).sum(-1, keepdim=True) for t in range(m)]  # M_t, t = 0..m-1
    return KseqFactors(rho, beta, mu, nu, o, res, r, moments)


def _kseq_terms(f: KseqFactors, q: Tensor, idx: Tensor, m: int, K: int) -> Tensor:
    """K-SEQ's ``T_m(x, j)`` (module docstring) at the tokens idx [N, X] -> [N, X, K+1]; q: [N, V]."""
    mu, nu, o, res, qx = (t.gather(-1, idx) for t in (f.mu, f.nu, f.o, f.res, q))
    out = torch.zeros(*idx.shape, K + 1, dtype=q.dtype, device=q.device)
    nu_pow, o_pow, q_pow, notq_pow = _powers(nu, m), _powers(o, m), _powers(qx, m), _powers(1.0 - qx, m)
    for j in range(1, m + 1):
        first = torch.zeros_like(qx)
        for i in range(1, m + 1):
            for b in range(0, min(i - 1, j - 1) + 1):
                a = j - 1 - b
                if a <= m - i:
                    first = first + (math.comb(i - 1, b) * math.comb(m - i, a)) * (
                        nu_pow[b] * o_pow[i - 1 - b] * q_pow[a] * notq_pow[m - i - a])
        first = first * mu
        drafted = math.comb(m, j) * nu_pow[j] * o_pow[m - j] * res
        n = m - j  # sum_{y != x} p_res(y) (o_x - nu(y))^n, binomially from the moments
        others = torch.zeros_like(qx)
        for t in range(n + 1):
            others = others + (math.comb(n, t) * (-1.0) ** t) * o_pow[n - t] * (f.moments[t] - res * nu_pow[t])
        fallback = math.comb(m - 1, j - 1) * nu_pow[j] * others.clamp_min(0.0)
        out[..., j] = first + drafted + fallback
    return out


def kseq_kernel(p: Tensor, q: Tensor, m: int, K: int) -> Tensor:
    """K-SEQ with m survivors and the first-survivor fallback (module docstring).  p, q: [N, V] -> [N, V, K+1]."""
    if m == 1:
        return _single_terms(q, K)
    every = torch.arange(q.shape[-1], device=q.device).expand(q.shape)
    # the torch factors: the definition the tests hold the fast law (C factors on CPU float64) to
    return _kseq_terms(kseq_factors_torch(p, q, m, kseq_rho(p, q, m)), q, every, m, K)


def kseq_marginal(f: KseqFactors, m: int) -> Tensor:
    """``sum_j T_m(x, j)`` of K-SEQ in closed form, O(m V):

        mu(x) sum_{i<m} r^i                                  (a draft accepted with x, the earlier ones rejected)
      + res(x) nu(x) sum_{i<m} r^i o_x^(m-1-i)                (all rejected, y = x drafted: r^m - o_x^m)
      + nu(x) (sum_y res(y) o_y^(m-1) - res(x) o_x^(m-1))     (fallback: the first survivor has x, none has y)

    (summing the kernel's binomials over j).  -> [N, V]."""
    o_last = f.o ** (m - 1)
    fallback = ((f.res * o_last).sum(-1, keepdim=True) - f.res * o_last).clamp_min(0.0)
    return (f.mu * power_sum(f.r, torch.ones_like(f.r), m) + f.res * f.nu * power_sum(f.r, f.o, m)
            + f.nu * fallback)


# ---------------------------------------------------------------------------------------- fill
def fill_order(p: Tensor, q: Tensor) -> Tensor:
    """Token ids in ``fill``'s rank order, best first: ``(p/q, -x)`` descending (p/q := 0 where q = 0, a
    token that is never drafted).  p, q: [N, V] -> [N, V].  A stable radix sort in C on CPU float64 rows
    (:func:`mdv.verify.native.rank_order`, ~1.5 ms at V = 49k against ~3.5 ms), the same permutation as
    :func:`fill_order_torch`."""
    lib = native_rows(p, q)
    return fill_order_torch(p, q) if lib is None else rank_order(lib, p, q)


def fill_order_torch(p: Tensor, q: Tensor) -> Tensor:
    """:func:`fill_order` in torch (its reference, and the path on GPUs or without a C compiler).

    The ratios are >= 0, so their float64 bit patterns, read as int64, order like the values: a stable
    ascending sort of the negated patterns is the same permutation as a stable descending float sort, ~4x
    faster on CPU at V = 49k (tests/test_verify_select_gbv.py).  ``+ 0.0`` turns -0.0 into +0.0 first."""
    ratio = torch.where(q > 0, p / torch.where(q > 0, q, torch.ones_like(q)), torch.zeros_like(q)) + 0.0
    return torch.sort(-ratio.contiguous().view(torch.int64), dim=-1, stable=True).indices


def _exclusive_cumsum(x: Tensor) -> Tensor:
    cum = x.cumsum(-1)
    return torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], -1)


def _int_power(x: Tensor, m: int) -> Tensor:
    """``x^m`` for a small integer m by products (a float ``pow`` costs ~20x a product on CPU)."""
    out = x
    for _ in range(m - 1):
        out = out * x
    return out


def _fill_root(d: Tensor, m: int) -> Tensor:
    """``d^(1/m)``, replaced below FILL_EPS by the line through (FILL_EPS, FILL_EPS^(1/m)) and 0: Lipschitz.
    Square roots where m is 2 or 4 (cheaper than ``pow``)."""
    root = d.sqrt() if m == 2 else d.sqrt().sqrt() if m == 4 else d ** (1.0 / m)
    return torch.where(d >= FILL_EPS, root, d * _fill_line(m))


def _fill_line(m: int) -> float:
    """The slope of ``fill``'s root below FILL_EPS: FILL_EPS^(1/m - 1) (one Python float for both paths)."""
    return FILL_EPS ** (1.0 / m - 1.0)


def fill_marks(q: Tensor, target: Tensor, order: Tensor, m: int) -> Tensor:
    """theta [N, V]: the mark probabilities of ``fill`` with m survivors (module docstring), from the targets
    t = (P(u)/Q_S(u)) p [N, V] and the rank order [N, V].  One C pass per sweep on CPU float64 rows
    (:func:`mdv.verify.native.fill_marks`), else :func:`fill_marks_torch`."""
    lib = native_rows(q, target)
    if lib is None:
        return fill_marks_torch(q, target, order, m)
    return native_fill_marks(lib, q, target, order, m, FILL_SWEEPS, FILL_EPS, _fill_line(m))


def fill_marks_torch(q: Tensor, target: Tensor, order: Tensor, m: int) -> Tensor:
    """:func:`fill_marks` in torch: its reference, and the path on GPUs or without a C compiler."""
    qs, ts = q.gather(-1, order), target.gather(-1, order)  # [N, V] in rank order
    drafted = qs > 0
    theta = torch.ones_like(qs)
    for _ in range(FILL_SWEEPS):
        s = (1.0 - _exclusive_cumsum(qs * theta)).clamp(0.0, 1.0)  # unmarked-above mass 1 - a(x)
        rest = _fill_root((_int_power(s, m) - ts).clamp_min(0.0), m)
        theta = torch.where(drafted, ((s - rest) / torch.where(drafted, qs, torch.ones_like(qs))).clamp(0.0, 1.0),
                            torch.zeros_like(qs))
    return torch.empty_like(theta).scatter_(-1, order, theta)


def fill_rule(p: Tensor, q: Tensor, ratio: Tensor, m: int, order: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(theta [N, V], rank order [N, V]) of ``fill`` at a prefix with m survivors: the targets are
    ``ratio * p`` (ratio [N] = P(u)/Q_S(u)); ``order``: :func:`fill_order` if already computed.  The one
    definition the kernel, the sampler and the law use."""
    order = fill_order(p, q) if order is None else order
    return fill_marks(q, ratio.unsqueeze(-1) * p, order, m), order


@dataclass(frozen=True)
class FillFactors:
    """``fill`` with m survivors at N prefixes.  theta, order: [N, V] (token space); in rank order [N, V]: qs,
    ths (theta), marked = qs ths, unmarked = qs (1 - ths), others (a draft neither x nor marked above x),
    below (unmarked mass ranked below x)."""

    theta: Tensor
    order: Tensor
    qs: Tensor
    ths: Tensor
    marked: Tensor
    unmarked: Tensor
    others: Tensor
    below: Tensor

    def rank(self) -> Tensor:
        """[N, V]: the position of each token in the order."""
        pos = torch.arange(self.order.shape[-1], device=self.order.device).expand(self.order.shape)
        return torch.empty_like(self.order).scatter_(-1, self.order, pos)


def fill_law(p: Tensor, q: Tensor, ratio: Tensor, m: int, order: Tensor, ranked: tuple[Tensor, Tensor] | None = None,
             weight: Tensor | None = None, acc: Tensor | None = None) -> FillFactors:
    """:class:`FillFactors` of ``fill`` with m survivors at its own marks: :func:`fill_factors` of
    :func:`fill_rule`.  One C call on CPU float64 rows (:func:`mdv.verify.native.fill_law`: the sweeps of
    :func:`fill_marks`, the same thetas bit for bit, then the factors in the same pass over the rank order;
    the unmarked total in long double), else the two in torch.  Given weight [N] and acc [N, V] (contiguous
    CPU float64 on the C path), also ``acc += weight * fill_marginal(law, m)`` in place, in C in the factors'
    last pass (the same bits).  p, q, order: [N, V]; ratio: [N]; ranked: :func:`fill_ranked` if already
    computed (the C path's inputs, the same at every count)."""
    lib = native_rows(p, q)
    if lib is None:
        f = fill_factors(q, fill_rule(p, q, ratio, m, order)[0], order)
        if acc is not None:
            acc.add_(weight[:, None] * fill_marginal(f, m))
        return f
    qs, ts = fill_ranked(p, q, ratio, order) if ranked is None else ranked
    fields = native_fill_law(lib, qs, ts, order, m, FILL_SWEEPS, FILL_EPS, _fill_line(m), weight, acc)
    return FillFactors(fields[0], order, qs, *fields[1:])


def fill_ranked(p: Tensor, q: Tensor, ratio: Tensor, order: Tensor) -> tuple[Tensor, Tensor]:
    """(q, the targets ``ratio * p``) in rank order, what ``fill``'s sweeps read at every survivor count.
    p, q, order: [N, V]; ratio: [N] -> [N, V] each."""
    return q.gather(-1, order), (ratio.unsqueeze(-1) * p).gather(-1, order)


def fill_factors(q: Tensor, theta: Tensor, order: Tensor) -> FillFactors:
    """:class:`FillFactors` from the marks theta and the rank order.  q, theta, order: [N, V]."""
    qs, ths = q.gather(-1, order), theta.gather(-1, order)  # [N, V] in rank order
    marked, unmarked = qs * ths, qs * (1.0 - ths)
    others = (1.0 - qs - _exclusive_cumsum(marked)).clamp_min(0.0)
    below = (unmarked.sum(-1, keepdim=True) - unmarked.cumsum(-1)).clamp_min(0.0)
    return FillFactors(theta, order, qs, ths, marked, unmarked, others, below)


def _fill_terms(f: FillFactors, pos: Tensor, m: int, K: int) -> Tensor:
    """``fill``'s T_m(x, j) (module docstring) at rank positions pos [N, X] -> [N, X, K+1]."""
    qs, ths, others, unmarked, below = (t.gather(-1, pos) for t in (f.qs, f.ths, f.others, f.unmarked, f.below))
    out = torch.zeros(*pos.shape, K + 1, dtype=qs.dtype, device=qs.device)
    q_pow, keep_pow, o_pow = _powers(qs, m), _powers(1.0 - ths, m), _powers(others, m)
    u_pow, b_pow = _powers(unmarked, m), _powers(below, m)
    for j in range(1, m + 1):
        out[..., j] = math.comb(m, j) * (q_pow[j] * (1.0 - keep_pow[j]) * o_pow[m - j] + u_pow[j] * b_pow[m - j])
    return out


def fill_kernel(q: Tensor, theta: Tensor, order: Tensor, m: int, K: int) -> Tensor:
    """``fill``'s T_m(x, j) (module docstring).  q, theta, order: [N, V] -> [N, V, K+1]."""
    if m == 1:
        return _single_terms(q, K)
    f = fill_factors(q, theta, order)
    return _fill_terms(f, f.rank(), m, K)


def fill_marginal(f: FillFactors, m: int) -> Tensor:
    """``sum_j T_m(x, j)`` of ``fill`` in closed form, O(m V), in token space:

        (q + o)^m - (u + o)^m + (u + b)^m - b^m = q theta sum_{i<m} (q+o)^i (u+o)^(m-1-i) + u sum_{i<m} (u+b)^i b^(m-1-i)

    (o = others, u = unmarked, b = below; the differences as sums, so no cancellation).  -> [N, V]."""
    ranked = (f.marked * power_sum(f.qs + f.others, f.unmarked + f.others, m)
              + f.unmarked * power_sum(f.unmarked + f.below, f.below, m))
    return torch.empty_like(ranked).scatter_(-1, f.order, ranked)


def fill_choice(theta: Tensor, rank: Tensor, toks: list[int]) -> list[tuple[int, float]]:
    """``fill``'s choice among the survivors' tokens ``toks`` (their multiset): [(token, probability)] over
    the distinct tokens in rank order.  theta: [V]; rank: [V], the position of each token in the order."""
    distinct = sorted(set(toks), key=lambda x: int(rank[x]))
    none_marked, out = 1.0, []
    for x in distinct:
        keep = (1.0 - float(theta[x])) ** toks.count(x)  # no copy of x marked
        out.append((x, none_marked * (1.0 - keep)))
        none_marked *= keep
    out[0] = (out[0][0], out[0][1] + none_marked)  # nothing marked: the top-ranked token
    return out


# ---------------------------------------------------------------------------------------- one prefix
#: Single rows up to this vocabulary size go through a memo of :func:`node_step` (the exact oracle's toys, V <= 8,
#: walk the same prefixes again and again; real rows are never repeated), and their kernel rows are tabulated
#: for every token on first use.  Above it, ``lex`` reads its order off ``fill``'s sort (:func:`lex_below`).
#: Each entry is a NodeLaw with the factors filled on demand: measured ~5 KB at V = 8 and ~30 KB at V = 64
#: with every rule's factors filled, so the memo's 2^14 entries hold ~80 MB on the toys, ~0.5 GB at most.
MEMO_MAX_V = 64

#: A prefix's rows are scored on the draft's support (module docstring, *Cost*) when it covers at most this share
#: of the vocabulary, from COMPACT_MIN_V tokens on (below it a row is small whatever its support).
COMPACT_MAX_SHARE = 0.5
COMPACT_MIN_V = MEMO_MAX_V + 1


class NodeLaw:
    """The selected law at N prefixes u, as :func:`node_step` leaves it.

    ``rule`` [N] (index in RULES), ``q_sel`` [N, V] = q_S(.|u) (closed-form marginals: the walk reads the
    full row), and on demand the kernel rows ``sum_m pi(m) T_m(x, .)`` [N, K+1] at one token per prefix
    (:meth:`rows`: pi_{u·x} is needed only at tokens the walk follows) and the per-count factors of a rule
    (:meth:`kseq`, :meth:`fill`: the sampler's beta, residual and marks are the law's own).

    Scored on the draft's support (:func:`support_columns`), the rows, factors and ``rule`` live on *columns*: the
    support's tokens in increasing id, then one column for the rest of the vocabulary (``vocab`` [S] the
    support's ids); ``q_sel`` and :meth:`rows` take token ids, the factors take :meth:`columns`."""

    def __init__(self, p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, order: Tensor | None,
                 below: Tensor | None) -> None:
        self.p, self.q, self.ratio, self.pi = p, q, ratio, pi  # [N, V], [N, V], [N], [N, K+1]
        self.K = pi.shape[-1] - 1
        self.order, self.below = order, below  # fill's rank order, lex's c (when some count m >= 2)
        self.counts = [m for m, used in enumerate((pi > 0).any(0).tolist()) if m >= 1 and used]  # one read of pi
        self.rule = torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
        self.q_cols = q  # [N, V'] q_S(.|u) on the law's columns (the tokens, or the support and one column off it)
        self._factors: dict[tuple[str, int], Any] = {}
        self._table: Tensor | None = None
        self._masses: SortedMasses | None = None
        self._ranked: tuple[Tensor, Tensor] | None = None  # fill_ranked
        self.vocab: Tensor | None = None  # [S]: the support's token ids, when scored on it (None: columns = tokens)
        self._V = q.shape[-1]
        self._q_full: Tensor | None = None  # q_sel on the V tokens, formed on first read

    def on_vocabulary(self, vocab: Tensor, V: int) -> None:
        """Scored on the columns of the support ``vocab`` [S] (+ the column off it) of a vocabulary of V tokens:
        :attr:`q_sel` is then written back to the tokens when it is first read (the sampler reads it at one prefix
        of L, :meth:`q_at` and :meth:`overlap_on_columns` read the columns)."""
        self.vocab, self._V, self._q_full = vocab, V, None

    @property
    def q_sel(self) -> Tensor:
        """q_S(.|u) on the V tokens [N, V] (0 off the draft's support where the law was scored on it)."""
        if self.vocab is None:
            return self.q_cols
        if self._q_full is None:
            full = self.q_cols.new_zeros(self.q_cols.shape[0], self._V)
            full[:, self.vocab] = self.q_cols[:, :self.vocab.numel()]  # the last column's q_S is 0: its q is
            self._q_full = full
        return self._q_full

    def q_at(self, tok: Tensor) -> Tensor:
        """q_S(tok|u) [N] at the token ids tok [N], read on the law's columns."""
        return self.q_cols.gather(-1, self.columns(tok).view(-1, 1)).squeeze(-1)

    def overlap_on_columns(self, ratio: Tensor) -> Tensor:
        """GBV's s(u)/Q_S(u) = sum_x min(ratio p(x|u), q_S(x|u)) per prefix [N], summed on the law's columns (q_S is
        0 off the support, so those tokens add nothing); ratio: P(u)/Q_S(u), [N] or a scalar."""
        return torch.minimum(torch.as_tensor(ratio).reshape(-1, 1) * self.p, self.q_cols).sum(-1)

    def residual_on_tokens(self, res: Tensor, p: Tensor) -> Tensor:
        """K-SEQ's residual of one prefix, res [V'] on the law's columns, on the V tokens: off the support q = 0, so
        the residual there is proportional to the target p [V] (the prefix's row), and the last column holds its
        total.  The sampler's inverse-CDF draw then runs over the tokens in id order, as it does unscored on the
        support.  The row itself when the columns are the tokens."""
        if self.vocab is None:
            return res
        S = self.vocab.numel()
        p_off, res_off = float(self.p[0, S]), float(res[S])
        full = p * (res_off / p_off) if p_off > 0.0 else torch.zeros_like(p)
        full[self.vocab] = res[:S]
        return full

    def columns(self, tok: Tensor) -> Tensor:
        """The columns of the token ids tok (any shape): the ids themselves unless scored on the support, else
        a binary search in it (no map over V), the last column for a token off it."""
        if self.vocab is None:
            return tok
        S = self.vocab.numel()
        at = torch.searchsorted(self.vocab, tok.contiguous()).clamp_max(S - 1)
        return torch.where(self.vocab[at] == tok, at, torch.full_like(at, S))

    def column_list(self, toks: list[int]) -> list[int]:
        """:meth:`columns` of a list of token ids (the walk's survivors), as a list."""
        return toks if self.vocab is None else self.columns(torch.tensor(toks, dtype=torch.long)).tolist()

    def kseq(self, m: int) -> KseqFactors:
        if ("kseq", m) not in self._factors:
            # rho* off the shared sort at every V: also at the toys' V <= 8, one sort and a scalar bisection
            # cost ~1 ms against ~7 ms for kseq_rho's bisection of tensor steps (and agree to ~1e-16)
            if self._masses is None:
                if self.order is None:
                    self.order = fill_order(self.p, self.q)
                self._masses = SortedMasses(self.p, self.q, self.order)
            self._factors["kseq", m] = kseq_factors(self.p, self.q, m, self._masses.rho(m))
        return self._factors["kseq", m]

    def fill(self, m: int, weight: Tensor | None = None, acc: Tensor | None = None) -> FillFactors:
        """``fill``'s factors with m survivors; given weight [N] and acc [N, V], also ``acc += weight *`` its
        marginal (:func:`fill_law`: in C in the pass that computes the factors, when they are new)."""
        f = self._factors.get(("fill", m))
        if f is None:
            if self.order is None:
                self.order = fill_order(self.p, self.q)
            if self._ranked is None:  # gathered once for every count
                self._ranked = fill_ranked(self.p, self.q, self.ratio, self.order)
            f = self._factors["fill", m] = fill_law(self.p, self.q, self.ratio, m, self.order, self._ranked, weight,
                                                    acc)
        elif acc is not None:
            acc.add_(weight[:, None] * fill_marginal(f, m))
        return f

    def lex_c(self) -> Tensor:
        if self.below is None:
            self.below = below_mass(self.p, self.q)[0]
        return self.below

    def marginal(self, rule: str) -> Tensor:
        """q_S^rule(.|u) = sum_m pi(m) sum_j T_m(., j)  [N, V].  On CPU float64 rows each count m >= 2 adds
        ``pi(m) sum_j T_m`` into the row in C from the rule's factors (:mod:`mdv.verify.native`: per token the
        same operations as the torch loop below, no [N, V] intermediates)."""
        if rule == "first":  # sum_j T_m(x, j) = q(x) for every m
            return self.pi[:, 1:].sum(-1, keepdim=True) * self.q
        lib = native_rows(self.p, self.q)
        if lib is not None:
            acc = torch.zeros(self.q.shape, dtype=torch.float64)  # contiguous: C adds into it in place
            for m in self.counts:
                weight = self.pi[:, m]  # [N]
                if m == 1:
                    acc.add_(weight[:, None] * self.q)
                elif rule == "lex":
                    native_lex_marginal_add(lib, self.q, self.lex_c(), m, weight, acc)
                elif rule == "fill":
                    self.fill(m, weight, acc)
                else:
                    f = self.kseq(m)
                    native_kseq_marginal_add(lib, f.mu, f.nu, f.o, f.res, f.r, m, weight, acc)
            return acc
        acc = torch.zeros_like(self.q)
        for m in self.counts:
            if m == 1:
                marg = self.q
            elif rule == "lex":
                marg = lex_marginal(self.q, self.lex_c(), m)
            elif rule == "fill":
                marg = fill_marginal(self.fill(m), m)
            else:
                marg = kseq_marginal(self.kseq(m), m)
            acc = acc + self.pi[:, m, None] * marg
        return acc

    def _rows_at(self, idx: Tensor) -> Tensor:
        """sum_m pi(m) T_m(x, .) of each prefix's rule at the tokens idx [N, X] -> [N, X, K+1]."""
        out = torch.zeros(*idx.shape, self.K + 1, dtype=self.q.dtype, device=self.q.device)
        for r in self.rule.unique().tolist():
            rule, acc = RULES[r], torch.zeros_like(out)
            for m in self.counts:
                if m == 1:
                    terms = _single_terms(self.q.gather(-1, idx), self.K)
                elif rule == "first":
                    terms = first_kernel(self.q.gather(-1, idx), m, self.K)
                elif rule == "lex":
                    terms = _lex_terms(self.q.gather(-1, idx), self.lex_c().gather(-1, idx), m, self.K)
                elif rule == "fill":
                    f = self.fill(m)
                    terms = _fill_terms(f, f.rank().gather(-1, idx), m, self.K)
                else:
                    terms = _kseq_terms(self.kseq(m), self.q, idx, m, self.K)
                acc = acc + self.pi[:, m, None, None] * terms
            out = torch.where((self.rule == r)[:, None, None], acc, out)
        return out

    def _row_at(self, n: int, col: int) -> list[float]:
        """``sum_m pi(m) T_m(x, .)`` of prefix n's rule at one column, in Python floats: the kernels of
        :meth:`_rows_at` (module docstring) read at that column only, powers by repeated products.  The walk
        follows one token per prefix, and at large V a dozen scalar reads and ~100 products cost ~10x less
        than :meth:`_rows_at`'s small tensors (tests/test_verify_select_gbv.py holds the two to 1e-15)."""
        K, rule = self.K, RULES[int(self.rule[n])]
        out = [0.0] * (K + 1)
        q = float(self.q[n, col])
        for m in self.counts:
            weight = float(self.pi[n, m])
            if weight == 0.0:
                continue
            if m == 1:
                out[1] += weight * q
                continue
            terms = [0.0] * (K + 1)
            if rule == "first":
                q_pow, notq_pow = _scalar_powers(q, m), _scalar_powers(1.0 - q, m)
                for j in range(1, m + 1):
                    terms[j] = math.comb(m - 1, j - 1) * q_pow[j] * notq_pow[m - j]
            elif rule == "lex":
                q_pow, c_pow = _scalar_powers(q, m), _scalar_powers(float(self.lex_c()[n, col]), m)
                for j in range(1, m + 1):
                    terms[j] = math.comb(m, j) * q_pow[j] * c_pow[m - j]
            elif rule == "fill":
                f = self.fill(m)
                pos = int((f.order[n] == col).nonzero()[0, 0])  # the column's place in the rank order
                qs, ths, others, unmarked, below = (float(t[n, pos]) for t in (f.qs, f.ths, f.others, f.unmarked,
                                                                               f.below))
                q_pow, keep_pow, o_pow = (_scalar_powers(x, m) for x in (qs, 1.0 - ths, others))
                u_pow, b_pow = _scalar_powers(unmarked, m), _scalar_powers(below, m)
                for j in range(1, m + 1):
                    terms[j] = math.comb(m, j) * (q_pow[j] * (1.0 - keep_pow[j]) * o_pow[m - j]
                                                  + u_pow[j] * b_pow[m - j])
            else:
                f = self.kseq(m)
                mu, nu, o, res = (float(t[n, col]) for t in (f.mu, f.nu, f.o, f.res))
                moments = [float(t[n, 0]) for t in f.moments]
                nu_pow, o_pow, q_pow, notq_pow = (_scalar_powers(x, m) for x in (nu, o, q, 1.0 - q))
                for j in range(1, m + 1):
                    first = 0.0
                    for i in range(1, m + 1):
                        for b in range(0, min(i - 1, j - 1) + 1):
                            a = j - 1 - b
                            if a <= m - i:
                                first += math.comb(i - 1, b) * math.comb(m - i, a) * (
                                    nu_pow[b] * o_pow[i - 1 - b] * q_pow[a] * notq_pow[m - i - a])
                    others = 0.0
                    for t in range(m - j + 1):
                        others += math.comb(m - j, t) * (-1.0) ** t * o_pow[m - j - t] * (moments[t] - res * nu_pow[t])
                    terms[j] = (first * mu + math.comb(m, j) * nu_pow[j] * o_pow[m - j] * res
                                + math.comb(m - 1, j - 1) * nu_pow[j] * max(others, 0.0))
            for j in range(1, m + 1):
                out[j] += weight * terms[j]
        return out

    def rows(self, tok: Tensor) -> Tensor:
        """tok [N] (token ids) -> [N, K+1]: ``sum_m pi(m) T_m(tok, .)``; at V <= MEMO_MAX_V columns from a table
        of every column (:meth:`_rows_at`), above it one prefix at a time in Python floats (:meth:`_row_at`), so a
        prefix's row is the same alone or in a batch."""
        tok = self.columns(tok)
        V = self.q.shape[-1]
        if V <= MEMO_MAX_V:
            if self._table is None:
                self._table = self._rows_at(torch.arange(V, device=self.q.device).expand(self.q.shape))
            return self._table.gather(1, tok.view(-1, 1, 1).expand(-1, 1, self.K + 1)).squeeze(1)
        return torch.tensor([self._row_at(n, c) for n, c in enumerate(tok.tolist())], dtype=self.q.dtype,
                            device=self.q.device)


def node_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> NodeLaw | StackedLaws:
    """One prefix of the walk.

    p, q: [N, V] rows at the prefix (p: the law the verifier checks against); ratio: [N] P(u)/Q_S(u);
    pi: [N, K+1] survivor-count law at the prefix.  Returns the :class:`NodeLaw` (a :class:`StackedLaws` of
    them where N > 1 rows were stepped one at a time): the rule used at each prefix, q_S(x|u) = ``q_sel`` and
    pi_{u·x} = ``rows(x) / rows(x).sum()`` (:func:`advance_survivors`).
    """
    if p.shape[0] == 1 and p.shape[-1] <= MEMO_MAX_V and p.device.type == "cpu":
        p64, q64, r64, pi64 = (x.to(torch.float64).contiguous() for x in (p, q, ratio, pi))
        return _node_step_memo(p64.numpy().tobytes(), q64.numpy().tobytes(), float(r64[0]),
                               pi64.numpy().tobytes(), mode)
    return _node_step(p, q, ratio, pi, mode)


@functools.lru_cache(maxsize=1 << 14)
def _node_step_memo(p: bytes, q: bytes, ratio: float, pi: bytes, mode: str) -> NodeLaw:
    rows = [torch.frombuffer(bytearray(x), dtype=torch.float64).reshape(1, -1) for x in (p, q, pi)]
    return _node_step(rows[0], rows[1], torch.tensor([ratio], dtype=torch.float64), rows[2], mode)


def support_columns(p: Tensor, q: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """One prefix's rows p, q [1, V] on the draft's support: (vocab [S], the token ids with q > 0 in increasing
    order; p and q on their columns and one more column with the target's mass off the support and q = 0,
    [1, S + 1] each) where that pays, V >= COMPACT_MIN_V and S + 1 <= COMPACT_MAX_SHARE * V; else None.  One pass
    of C on CPU float64 rows (:func:`mdv.verify.native.support`: the mass off the support summed left to right in
    long double), else torch."""
    V = q.shape[-1]
    max_cols = int(COMPACT_MAX_SHARE * V) - 1
    if V < COMPACT_MIN_V or max_cols < 1:
        return None
    lib = native_rows(p, q)
    if lib is not None:
        cols = native_support(lib, p, q, max_cols)
    else:
        vocab = q[0].nonzero().squeeze(-1)  # q >= 0: nonzero is q > 0
        p_off = p[:, q[0] == 0].sum(-1, keepdim=True)  # [1, 1]: a sum of the target's entries there, no cancellation
        cols = None if vocab.numel() > max_cols else (
            vocab, torch.cat([p[:, vocab], p_off], -1), torch.cat([q[:, vocab], torch.zeros_like(p_off)], -1))
    return cols if cols is not None and cols[0].numel() > 0 else None


class StackedLaws:
    """:func:`node_step`'s laws of N prefixes stepped one at a time (where some are scored on their draft's support),
    read as one batch: ``rule`` [N], ``q_sel`` [N, V] and :meth:`rows` -- what the target adjustment reads
    (:mod:`mdv.verify.adjust`, :func:`advance_survivors`)."""

    def __init__(self, laws: list[NodeLaw]) -> None:
        self.laws = laws
        self.rule = torch.cat([law.rule for law in laws])

    @property
    def q_sel(self) -> Tensor:
        """[N, V]: each prefix's :attr:`NodeLaw.q_sel`."""
        return torch.cat([law.q_sel for law in self.laws])

    def q_at(self, tok: Tensor) -> Tensor:
        """tok [N] -> [N]: each prefix's :meth:`NodeLaw.q_at` at its token."""
        return torch.cat([law.q_at(tok[n:n + 1]) for n, law in enumerate(self.laws)])

    def rows(self, tok: Tensor) -> Tensor:
        """tok [N] -> [N, K+1]: each prefix's :meth:`NodeLaw.rows` at its token."""
        return torch.cat([law.rows(tok[n:n + 1]) for n, law in enumerate(self.laws)])


def _node_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> NodeLaw | StackedLaws:
    """:func:`node_step`, on the draft's support where it is small (module docstring, *Cost*;
    :func:`support_columns`).  Every rule treats a token with q = 0 alike, and such a token adds nothing to
    another's factors, so the columns give the same law.  A prefix's law must not depend on its batch: where
    some of N > 1 rows would be scored on their support, every row is stepped alone (:class:`StackedLaws`)."""
    N, V = q.shape
    if N > 1:
        if V < COMPACT_MIN_V or bool(((q > 0).sum(-1) + 1 > COMPACT_MAX_SHARE * V).all()):
            return _score_prefix(p, q, ratio, pi, mode)  # no row on its support: one batch
        return StackedLaws([_node_step(p[n:n + 1], q[n:n + 1], ratio[n:n + 1], pi[n:n + 1], mode) for n in range(N)])
    cols = support_columns(p, q)
    if cols is None:
        return _score_prefix(p, q, ratio, pi, mode)
    vocab, p_cols, q_cols = cols
    law = _score_prefix(p_cols, q_cols, ratio, pi, mode)
    law.on_vocabulary(vocab, V)
    return law


def _scoring_plan(pi: Tensor, mode: str) -> tuple[tuple[str, ...], Tensor, bool]:
    """(the rules a prefix's mode scores, forced [N], several): forced rows put at most FORCED_MASS on m >= 2
    survivors (per row, so a row's rule does not depend on its batch); several: some row has a count m >= 2."""
    rules = CHOICE_ORDER if mode == "choose" else (mode,)
    forced = pi[:, 2:].sum(-1) <= FORCED_MASS  # [N]
    if mode == "choose" and bool(forced.all()):
        # the drafts through u rarely agree on its next token (at the benchmark's depths >= 3 pi(m >= 2) < 1e-10)
        rules = (FORCED_RULE,)
    return rules, forced, any((pi[:, 2:] > 0).any(0).tolist())


def _score_prefix(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> NodeLaw:
    rules, _, several = _scoring_plan(pi, mode)
    if (rules == _C_RULES and several and q.shape[-1] > MEMO_MAX_V and p.shape[0] == 1
            and ratio.dtype == torch.float64):
        lib = native_rows(p, q)
        if lib is not None:
            return _choose_in_c(lib, p, q, ratio, pi)
    return _score_prefix_stepwise(p, q, ratio, pi, mode)


def _score_prefix_stepwise(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> NodeLaw:
    """:func:`_score_prefix` one rule and count at a time (each loop in C on CPU float64 rows, with tensor
    operations between them): the path of batches, of the toys' small V and of GPUs, and the reference of
    :func:`_choose_in_c`."""
    rules, forced, several = _scoring_plan(pi, mode)
    large = q.shape[-1] > MEMO_MAX_V
    order = fill_order(p, q) if several and ("fill" in rules or ("lex" in rules and large)) else None
    below = lex_below(p, q, order) if several and "lex" in rules and large else None  # one sort for both
    law = NodeLaw(p, q, ratio, pi, order, below)
    if len(rules) == 1:
        law.rule = torch.full_like(ratio, RULES.index(rules[0]), dtype=torch.long)
        law.q_cols = law.marginal(rules[0])
        return law
    target = ratio.unsqueeze(-1) * p  # [N, V]
    best, q_sel = torch.full_like(ratio, RULES.index(rules[0]), dtype=torch.long), law.marginal(rules[0])
    best_score = overlap(target, q_sel)  # [N]
    ceiling = choice_ceiling(target, q, pi)  # [N]: no token rule scores more (module docstring, *The choice*)
    for rule in rules[1:]:
        if not bool((~forced & (ceiling > best_score + (CHOICE_TOL - CEILING_SLACK))).any()):
            break  # no later rule can replace the best of any scored row: the same choice without their laws
        marginal = law.marginal(rule)
        score = overlap(target, marginal)
        better = score > best_score + CHOICE_TOL
        best = torch.where(better, torch.full_like(best, RULES.index(rule)), best)
        best_score = torch.where(better, score, best_score)
        q_sel = torch.where(better[:, None], marginal, q_sel)
    if bool(forced.any()):  # forced rows batched with scored ones (mode "choose": the only one that scores)
        best = torch.where(forced, torch.full_like(best, RULES.index(FORCED_RULE)), best)
        q_sel = torch.where(forced[:, None], law.marginal(FORCED_RULE), q_sel)
    law.rule, law.q_cols = best, q_sel
    return law


#: The rules of :func:`mdv.verify.native.node_rule` by their codes 0, 1, 2 (CHOICE_ORDER: lex first, as it must be, since
#: its call also forms the order, lex's c and the targets the others read).
_C_RULES = ("lex", "kseq", "fill")


def _choose_in_c(lib: Any, p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor) -> NodeLaw:
    """:func:`_score_prefix`'s choice at one prefix (mode ``choose``, some count m >= 2, not forced, V > MEMO_MAX_V)
    with one C call per rule (:func:`mdv.verify.native.node_rule`: the same C functions in the same order, so the
    same rule, q_S and factors bit for bit, without ~40 small tensor operations between them).  The choice (CHOICE_ORDER,
    the ceiling's skip, CHOICE_TOL) is :func:`_score_prefix_stepwise`'s, on the same float64 scores.  The NodeLaw gets
    the order, lex's c and the factors of every rule computed.  p, q: [1, V]; ratio: [1]; pi: [1, K+1]."""
    K, V = pi.shape[-1] - 1, q.shape[-1]
    pi_row = pi.reshape(-1).to(torch.float64).contiguous()
    counts = [m for m, w in enumerate(pi_row.tolist()) if m >= 2 and w > 0.0]
    p_row, q_row = p.reshape(-1).contiguous(), q.reshape(-1).contiguous()  # the C loops read whole rows

    def new() -> Tensor:  # each array its own allocation, as the stepwise path's (the allocator reuses them)
        return torch.empty(V, dtype=torch.float64)

    order = torch.empty(V, dtype=torch.int64)
    below, target, work = new(), new(), torch.empty(4 * V, dtype=torch.float64)
    ceiling = torch.empty(1, dtype=torch.float64)
    common = dict(rho_iters=RHO_ITERS, tol=TOL, sweeps=FILL_SWEEPS, eps=FILL_EPS,
                  lines=torch.tensor([0.0, 0.0] + [_fill_line(m) for m in range(2, K + 1)], dtype=torch.float64),
                  order=order, below=below, target=target, work=work)
    rows = [new()]
    best, best_score = 0, native_node_rule(lib, 0, p_row, q_row, float(ratio[0]), pi_row, row=rows[0], ceiling=ceiling,
                                           **common)
    law = NodeLaw(p, q, ratio, pi, order.view(1, V), below.view(1, V))
    ceiling_value = float(ceiling[0])
    for r in (1, 2):
        if not ceiling_value > best_score + (CHOICE_TOL - CEILING_SLACK):
            break  # no later rule can replace the best: the same choice without their laws
        rows.append(new())
        if r == 1:
            rho = torch.zeros(K + 1, dtype=torch.float64)
            kseq = {m: [new() for _ in range(5)] + [torch.empty(1 + m, dtype=torch.float64)] for m in counts}
            masses = [new()] + [torch.empty(V + 1, dtype=torch.float64) for _ in range(4)] + [
                torch.empty(1, dtype=torch.float64)]
            score = native_node_rule(lib, 1, p_row, q_row, float(ratio[0]), pi_row, row=rows[r], masses=masses,
                                     rho=rho, kseq=kseq, **common)
            for m, (beta, mu, nu, o, res, r_moments) in kseq.items():
                law._factors["kseq", m] = KseqFactors(
                    rho[m:m + 1], *(x.view(1, V) for x in (beta, mu, nu, o, res)), r_moments[:1].view(1, 1),
                    [r_moments[1 + t:2 + t].view(1, 1) for t in range(m)])
        else:
            qs, ts = new(), new()
            fill = {m: [new() for _ in range(6)] for m in counts}
            score = native_node_rule(lib, 2, p_row, q_row, float(ratio[0]), pi_row, row=rows[r], qs=qs, ts=ts,
                                     fill=fill, **common)
            law._ranked = (qs.view(1, V), ts.view(1, V))
            for m, fields in fill.items():
                theta, ths, marked, unmarked, others, below_m = (x.view(1, V) for x in fields)
                law._factors["fill", m] = FillFactors(theta, law.order, law._ranked[0], ths, marked, unmarked, others,
                                                      below_m)
        if score > best_score + CHOICE_TOL:
            best, best_score = r, score
    law.rule = torch.tensor([RULES.index(_C_RULES[best])], dtype=torch.long)
    law.q_cols = rows[best].view(1, V)
    return law


def reach_mass(q: Tensor, pi: Tensor) -> Tensor:
    """``R(x) = sum_m pi(m) (1 - (1 - q(x))^m)``: the probability that some survivor drafted x, which bounds every
    token rule's ``q_S(x|u)`` (each chooses one of the survivors' tokens).  ``1 - (1 - q)^m`` as
    ``q N_m(1, 1 - q)`` (no cancellation where q is small).  q: [N, V]; pi: [N, K+1] -> [N, V]."""
    out = pi[:, 1:2] * q
    ones, keep = torch.ones_like(q), 1.0 - q
    for m in range(2, pi.shape[-1]):
        if bool((pi[:, m] > 0).any()):
            out = out + pi[:, m, None] * (q * power_sum(ones, keep, m))
    return out


def choice_ceiling(target: Tensor, q: Tensor, pi: Tensor) -> Tensor:
    """The ceiling of every rule's score, ``sum_x min(target, reach_mass(q, pi))`` per row: one pass of C on CPU
    float64 rows (:func:`mdv.verify.native.ceiling`), else torch.  target, q: [N, V]; pi: [N, K+1] -> [N]."""
    lib = native_rows(target, q)
    return overlap(target, reach_mass(q, pi)) if lib is None else native_ceiling(lib, target, q, pi)


def overlap(target: Tensor, marginal: Tensor) -> Tensor:
    """The choice's score ``sum_x min(target, marginal)`` per row.  In C on CPU float64 rows, a long double sum
    per row (:func:`mdv.verify.native.overlap`: a row gets the same bits alone or in a batch), else torch's.
    target, marginal: [N, V] -> [N]."""
    lib = native_rows(target, marginal)
    return torch.minimum(target, marginal).sum(-1) if lib is None else native_overlap(lib, target, marginal)


def root_survivors(K: int, like: Tensor) -> Tensor:
    """pi at the block start: all K drafts survive.  -> [*like.shape, K+1]"""
    pi = torch.zeros(*like.shape, K + 1, dtype=torch.float64, device=like.device)
    pi[..., K] = 1.0
    return pi


def advance_survivors(law: NodeLaw | StackedLaws, tok: Tensor) -> tuple[Tensor, Tensor]:
    """(q_S(tok|u) [N], pi_{u·tok} [N, K+1]) from :func:`node_step`'s law and tok [N]."""
    row = law.rows(tok)  # [N, K+1]
    total = row.sum(-1)
    pi = row / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    return law.q_at(tok), pi


__all__ = ["RULES", "MODES", "CHOICE_ORDER", "FORCED_RULE", "CHOICE_TOL", "CEILING_SLACK", "FORCED_MASS", "FILL_SWEEPS", "FILL_EPS", "MEMO_MAX_V", "COMPACT_MAX_SHARE", "COMPACT_MIN_V", "NodeLaw", "KseqFactors", "SortedMasses", "first_kernel",
           "FillFactors", "lex_kernel", "lex_marginal", "lex_below", "lex_below_torch", "kseq_kernel", "kseq_factors", "kseq_marginal",
           "kseq_factors_torch", "fill_order", "fill_order_torch", "fill_marks", "fill_marks_torch", "fill_rule", "fill_law", "fill_ranked", "fill_factors", "fill_kernel", "fill_marginal", "fill_choice",
           "reach_mass", "choice_ceiling", "overlap", "node_step", "support_columns", "StackedLaws", "root_survivors", "advance_survivors"]
