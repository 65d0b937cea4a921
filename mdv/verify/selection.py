"""The law of a draft selected from K i.i.d. drafts, walked depth by depth (algorithms.md §1 letters:
p = target, q = draft).  Shared by ``select_gbv`` (:mod:`mdv.verify.select_gbv`) and its target adjustment
(:mod:`mdv.verify.adjust`).

**The walk.**  Keep the set S of drafts that agree with the selected prefix u (initially all K).  At depth
|u| the m = |S| survivors' next tokens are m i.i.d. draws from q(.|u) (what S is depends only on tokens
before |u|).  A *token rule* picks one of them, x, and S becomes the survivors whose token is x.  After L
depths the selected draft is the first of S.  Three token rules:

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

taken in the order of RULES: a later rule replaces the best so far only if its score is larger by more
than CHOICE_TOL.

**The state.**  pi_u(m) = Pr(m survivors | the selected draft extends u); then
``q_S(x|u) = sum_m pi_u(m) sum_j T_m(x, j)`` and ``pi_{u·x}(j) = sum_m pi_u(m) T_m(x, j) / q_S(x|u)``.  The
root has pi = e_K.  Everything is a function of the prefix, so it is available off the drafted paths too
(the target adjustment of later iterations walks it along the new drafts).

Cost per prefix: O(V) per survivor count for ``kseq`` (rho* by bisection, the moments ``M_t = sum_y p_res(y)
nu(y)^t`` for the fallback sum, expanded binomially) times O(K^2), one sort of V for ``lex`` and one for
``fill`` (plus FILL_SWEEPS cumulative sums per survivor count).
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from mdv.verify.mpbv import below_mass
from mdv.verify.spectr import kseq_accept_prob, kseq_residual, kseq_rho

#: The token rules a prefix can use, and the walk modes of ``select_gbv``.
RULES = ("kseq", "lex", "fill")
MODES = ("choose",) + RULES
#: A rule replaces an earlier one in RULES only when its score is larger by more than this (scores are masses
#: <= 1): scores that are equal, or that differ only by rounding, then pick the same rule whichever code path
#: computed them (the iteration, the law, a later iteration's window); fill's scores move by up to ~1e-10 with
#: the last bits of their inputs (see FILL_EPS).
CHOICE_TOL = 1e-9
#: Jacobi sweeps of ``fill``'s recursion for theta (exact for the top this-many tokens; module docstring).
FILL_SWEEPS = 4
#: Below this, ``fill``'s root ``d^(1/m)`` is replaced by the line ``d * FILL_EPS^(1/m - 1)`` through it: the root is
#: not Lipschitz at 0, so where a target takes exactly all the mass left (d = 0 up to rounding) two computations
#: of the same prefix differing in their last bits gave thetas ~1e-8 apart and could choose different rules (TV
#: 7e-9 in tests/test_exactness.py).  The line bounds the slope by FILL_EPS^(1/m - 1) <= 3e4; a token then gets
#: at most FILL_EPS more than its target.
FILL_EPS = 1e-6


def lex_kernel(p: Tensor, q: Tensor, m: int, K: int, below: Tensor | None = None) -> Tensor:
    """``T_m(x, j) = C(m, j) q(x)^j c(x)^(m-j)`` for j = 1..m (zeros for j = 0 and j > m).
    p, q: [N, V]; below: c [N, V] if already computed (one sort of V) -> [N, V, K+1]."""
    out = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
    if m == 1:
        out[..., 1] = q
        return out
    c = below_mass(p, q)[0] if below is None else below  # [N, V]
    q_pow, c_pow = _powers(q, m), _powers(c, m)
    for j in range(1, m + 1):
        out[..., j] = math.comb(m, j) * q_pow[j] * c_pow[m - j]
    return out


def _powers(x: Tensor, n: int) -> list[Tensor]:
    """[x^0, x^1, ..., x^n] by repeated products (x^0 = 1 also where x = 0)."""
    out = [torch.ones_like(x)]
    for _ in range(n):
        out.append(out[-1] * x)
    return out


def kseq_kernel(p: Tensor, q: Tensor, m: int, K: int) -> Tensor:
    """K-SEQ with m survivors and the first-survivor fallback (module docstring).  p, q: [N, V] -> [N, V, K+1]."""
    out = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
    if m == 1:
        out[..., 1] = q
        return out
    rho = kseq_rho(p, q, m)  # [N]
    beta = kseq_accept_prob(p, q, rho.unsqueeze(-1))  # [N, V]
    mu = q * beta
    nu = (q - mu).clamp_min(0.0)
    r = nu.sum(-1, keepdim=True)  # [N, 1]
    o = (r - nu).clamp_min(0.0)  # [N, V]: rejected with another token
    res = kseq_residual(p, q, m, rho)  # [N, V]
    nu_pow, o_pow, q_pow, notq_pow = _powers(nu, m), _powers(o, m), _powers(q, m), _powers(1.0 - q, m)
    moments = [(res * nu_pow[t]).sum(-1, keepdim=True) for t in range(m)]  # M_t, t = 0..m-1
    for j in range(1, m + 1):
        first = torch.zeros_like(q)
        for i in range(1, m + 1):
            for b in range(0, min(i - 1, j - 1) + 1):
                a = j - 1 - b
                if a <= m - i:
                    first = first + (math.comb(i - 1, b) * math.comb(m - i, a)) * (
                        nu_pow[b] * o_pow[i - 1 - b] * q_pow[a] * notq_pow[m - i - a])
        first = first * mu
        drafted = math.comb(m, j) * nu_pow[j] * o_pow[m - j] * res
        n = m - j  # sum_{y != x} p_res(y) (o_x - nu(y))^n, binomially from the moments
        others = torch.zeros_like(q)
        for t in range(n + 1):
            others = others + (math.comb(n, t) * (-1.0) ** t) * o_pow[n - t] * (moments[t] - res * nu_pow[t])
        fallback = math.comb(m - 1, j - 1) * nu_pow[j] * others.clamp_min(0.0)
        out[..., j] = first + drafted + fallback
    return out


def fill_order(p: Tensor, q: Tensor) -> Tensor:
    """Token ids in ``fill``'s rank order, best first: ``(p/q, -x)`` descending (p/q := 0 where q = 0, a
    token that is never drafted).  p, q: [N, V] -> [N, V]."""
    ratio = torch.where(q > 0, p / torch.where(q > 0, q, torch.ones_like(q)), torch.zeros_like(q))
    return torch.sort(ratio, dim=-1, descending=True, stable=True).indices


def _exclusive_cumsum(x: Tensor) -> Tensor:
    cum = x.cumsum(-1)
    return torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], -1)


def _fill_root(d: Tensor, m: int) -> Tensor:
    """``d^(1/m)``, replaced below FILL_EPS by the line through (FILL_EPS, FILL_EPS^(1/m)) and 0: Lipschitz."""
    return torch.where(d >= FILL_EPS, d ** (1.0 / m), d * FILL_EPS ** (1.0 / m - 1.0))


def fill_marks(q: Tensor, target: Tensor, order: Tensor, m: int) -> Tensor:
    """theta [N, V]: the mark probabilities of ``fill`` with m survivors (module docstring), from the targets
    t = (P(u)/Q_S(u)) p [N, V] and the rank order [N, V]."""
    qs, ts = q.gather(-1, order), target.gather(-1, order)  # [N, V] in rank order
    drafted = qs > 0
    theta = torch.ones_like(qs)
    for _ in range(FILL_SWEEPS):
        s = (1.0 - _exclusive_cumsum(qs * theta)).clamp(0.0, 1.0)  # unmarked-above mass 1 - a(x)
        rest = _fill_root((s ** m - ts).clamp_min(0.0), m)
        theta = torch.where(drafted, ((s - rest) / torch.where(drafted, qs, torch.ones_like(qs))).clamp(0.0, 1.0),
                            torch.zeros_like(qs))
    return torch.empty_like(theta).scatter_(-1, order, theta)


def fill_rule(p: Tensor, q: Tensor, ratio: Tensor, m: int, order: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(theta [N, V], rank order [N, V]) of ``fill`` at a prefix with m survivors: the targets are
    ``ratio * p`` (ratio [N] = P(u)/Q_S(u)); ``order``: :func:`fill_order` if already computed.  The one
    definition the kernel, the sampler and the law use."""
    order = fill_order(p, q) if order is None else order
    return fill_marks(q, ratio.unsqueeze(-1) * p, order, m), order


def fill_kernel(q: Tensor, theta: Tensor, order: Tensor, m: int, K: int) -> Tensor:
    """``fill``'s T_m(x, j) (module docstring).  q, theta, order: [N, V] -> [N, V, K+1]."""
    out = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
    if m == 1:
        out[..., 1] = q
        return out
    qs, ths = q.gather(-1, order), theta.gather(-1, order)  # [N, V] in rank order
    marked, unmarked = qs * ths, qs * (1.0 - ths)
    others = (1.0 - qs - _exclusive_cumsum(marked)).clamp_min(0.0)  # a draft neither x nor marked above x
    below = (unmarked.sum(-1, keepdim=True) - unmarked.cumsum(-1)).clamp_min(0.0)  # unmarked, ranked below x
    q_pow, keep_pow, o_pow = _powers(qs, m), _powers(1.0 - ths, m), _powers(others, m)
    u_pow, b_pow = _powers(unmarked, m), _powers(below, m)
    for j in range(1, m + 1):
        kern = math.comb(m, j) * (q_pow[j] * (1.0 - keep_pow[j]) * o_pow[m - j] + u_pow[j] * b_pow[m - j])
        out[..., j] = torch.empty_like(kern).scatter_(-1, order, kern)
    return out


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


#: Single rows up to this vocabulary size go through a memo of :func:`node_step` (the exact oracle's toys, V <= 8,
#: walk the same prefixes again and again; real rows are never repeated).  The bound keeps the memo's
#: 2^14 entries of [V, K+1] float64 under ~50 MB.
MEMO_MAX_V = 64


def node_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """One prefix of the walk.

    p, q: [N, V] rows at the prefix (p: the law the verifier checks against); ratio: [N] P(u)/Q_S(u);
    pi: [N, K+1] survivor-count law at the prefix.
    Returns (rule [N] long, the index in RULES of the rule used, nxt [N, V, K+1] = sum_m pi(m) T_m(x, .)):
    q_S(x|u) = nxt.sum(-1) and pi_{u·x} = nxt[:, x] / q_S(x|u).
    """
    if p.shape[0] == 1 and p.shape[-1] <= MEMO_MAX_V and p.device.type == "cpu":
        p64, q64, r64, pi64 = (x.to(torch.float64).contiguous() for x in (p, q, ratio, pi))
        rule, nxt = _node_step_memo(p64.numpy().tobytes(), q64.numpy().tobytes(), float(r64[0]),
                                    pi64.numpy().tobytes(), mode)
        return rule.clone(), nxt.clone()
    return _node_step(p, q, ratio, pi, mode)


@functools.lru_cache(maxsize=1 << 14)
def _node_step_memo(p: bytes, q: bytes, ratio: float, pi: bytes, mode: str) -> tuple[Tensor, Tensor]:
    rows = [torch.frombuffer(bytearray(x), dtype=torch.float64).reshape(1, -1) for x in (p, q, pi)]
    return _node_step(rows[0], rows[1], torch.tensor([ratio], dtype=torch.float64), rows[2], mode)


def _node_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    K = pi.shape[-1] - 1
    rules = RULES if mode == "choose" else (mode,)
    counts = [m for m in range(1, K + 1) if bool((pi[:, m] > 0).any())]
    several = any(m > 1 for m in counts)
    below = below_mass(p, q)[0] if "lex" in rules and several else None  # one sort per prefix
    order = fill_order(p, q) if "fill" in rules and several else None  # and one for fill
    mixed = []
    for rule in rules:
        acc = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
        for m in counts:
            if rule == "lex":
                kernel = lex_kernel(p, q, m, K, below)
            elif rule == "fill":
                kernel = fill_kernel(q, *fill_rule(p, q, ratio, m, order), m, K) if m > 1 else lex_kernel(p, q, 1, K)
            else:
                kernel = kseq_kernel(p, q, m, K)
            acc = acc + pi[:, m, None, None] * kernel
        mixed.append(acc)
    if mode != "choose":
        return torch.full_like(ratio, RULES.index(mode), dtype=torch.long), mixed[0]
    target = ratio.unsqueeze(-1) * p  # [N, V]
    best, nxt = torch.zeros_like(ratio, dtype=torch.long), mixed[0]
    best_score = torch.minimum(target, nxt.sum(-1)).sum(-1)  # [N]
    for r in range(1, len(RULES)):
        score = torch.minimum(target, mixed[r].sum(-1)).sum(-1)
        better = score > best_score + CHOICE_TOL
        best = torch.where(better, torch.full_like(best, r), best)
        best_score = torch.where(better, score, best_score)
        nxt = torch.where(better[:, None, None], mixed[r], nxt)
    return best, nxt


def root_survivors(K: int, like: Tensor) -> Tensor:
    """pi at the block start: all K drafts survive.  -> [*like.shape, K+1]"""
    pi = torch.zeros(*like.shape, K + 1, dtype=torch.float64, device=like.device)
    pi[..., K] = 1.0
    return pi


def advance_survivors(nxt: Tensor, tok: Tensor) -> tuple[Tensor, Tensor]:
    """(q_S(tok|u) [N], pi_{u·tok} [N, K+1]) from :func:`node_step`'s ``nxt`` [N, V, K+1] and tok [N]."""
    row = nxt.gather(1, tok.view(-1, 1, 1).expand(-1, 1, nxt.shape[-1])).squeeze(1)  # [N, K+1]
    mass = row.sum(-1)
    pi = row / torch.where(mass > 0, mass, torch.ones_like(mass)).unsqueeze(-1)
    return mass, pi


__all__ = ["RULES", "MODES", "CHOICE_TOL", "FILL_SWEEPS", "FILL_EPS", "lex_kernel", "kseq_kernel", "fill_order",
           "fill_marks", "fill_rule", "fill_kernel", "fill_choice", "node_step", "root_survivors", "advance_survivors"]
