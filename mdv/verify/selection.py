"""The law of a draft selected from K i.i.d. drafts, walked depth by depth (algorithms.md §1 letters:
p = target, q = draft).  Shared by ``select_gbv`` (:mod:`mdv.verify.select_gbv`) and its target adjustment
(:mod:`mdv.verify.adjust`).

**The walk.**  Keep the set S of drafts that agree with the selected prefix u (initially all K).  At depth
|u| the m = |S| survivors' next tokens are m i.i.d. draws from q(.|u) (what S is depends only on tokens
before |u|).  A *token rule* picks one of them, x, and S becomes the survivors whose token is x.  After L
depths the selected draft is the first of S.  Two token rules:

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

At m = 1 both kernels are ``q(x)`` at j = 1: one survivor is kept whatever the rule.

**The choice** (``mode="choose"``).  The rule at a prefix u may depend on anything fixed by u -- the rows
p(.|u), q(.|u), the law pi_u of the survivor count and the ratio P(u)/Q_S(u) -- because then Q_S, the law
of the selected draft, is still a function of the prefix alone.  It is the rule that maximises the prefix's
contribution to greedy block verification's E[tau] = sum_v min(P(v), Q_S(v)) (algorithms.md §5):

    score(rule) = sum_x min( (P(u)/Q_S(u)) p(x|u),  q_S^rule(x|u) ),   lex iff score(lex) > score(kseq) + CHOICE_TOL.

**The state.**  pi_u(m) = Pr(m survivors | the selected draft extends u); then
``q_S(x|u) = sum_m pi_u(m) sum_j T_m(x, j)`` and ``pi_{u·x}(j) = sum_m pi_u(m) T_m(x, j) / q_S(x|u)``.  The
root has pi = e_K.  Everything is a function of the prefix, so it is available off the drafted paths too
(the target adjustment of later iterations walks it along the new drafts).

Cost per prefix: O(V) per survivor count for ``kseq`` (rho* by bisection, the moments ``M_t = sum_y p_res(y)
nu(y)^t`` for the fallback sum, expanded binomially) times O(K^2), and one sort of V for ``lex``.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from mdv.verify.mpbv import below_mass
from mdv.verify.spectr import kseq_accept_prob, kseq_residual, kseq_rho

#: The token rules a prefix can use, and the walk modes of ``select_gbv``.
RULES = ("kseq", "lex")
MODES = ("choose", "kseq", "lex")
#: ``lex`` is chosen only when its score beats ``kseq``'s by more than this (scores are masses <= 1): equal
#: scores computed along two code paths then pick the same rule.
CHOICE_TOL = 1e-12


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


#: Single rows up to this vocabulary size go through a memo of :func:`node_step` (the exact oracle's toys, V <= 8,
#: walk the same prefixes again and again; real rows are never repeated).  The bound keeps the memo's
#: 2^14 entries of [V, K+1] float64 under ~50 MB.
MEMO_MAX_V = 64


def node_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    """One prefix of the walk.

    p, q: [N, V] rows at the prefix (p: the law the verifier checks against); ratio: [N] P(u)/Q_S(u);
    pi: [N, K+1] survivor-count law at the prefix.
    Returns (use_lex [N] bool, nxt [N, V, K+1] = sum_m pi(m) T_m(x, .)): q_S(x|u) = nxt.sum(-1) and
    pi_{u·x} = nxt[:, x] / q_S(x|u).
    """
    if p.shape[0] == 1 and p.shape[-1] <= MEMO_MAX_V and p.device.type == "cpu":
        p64, q64, r64, pi64 = (x.to(torch.float64).contiguous() for x in (p, q, ratio, pi))
        use_lex, nxt = _node_step_memo(p64.numpy().tobytes(), q64.numpy().tobytes(), float(r64[0]),
                                       pi64.numpy().tobytes(), mode)
        return use_lex.clone(), nxt.clone()
    return _node_step(p, q, ratio, pi, mode)


@functools.lru_cache(maxsize=1 << 14)
def _node_step_memo(p: bytes, q: bytes, ratio: float, pi: bytes, mode: str) -> tuple[Tensor, Tensor]:
    rows = [torch.frombuffer(bytearray(x), dtype=torch.float64).reshape(1, -1) for x in (p, q, pi)]
    return _node_step(rows[0], rows[1], torch.tensor([ratio], dtype=torch.float64), rows[2], mode)


def _node_step(p: Tensor, q: Tensor, ratio: Tensor, pi: Tensor, mode: str) -> tuple[Tensor, Tensor]:
    K = pi.shape[-1] - 1
    rules = RULES if mode == "choose" else (mode,)
    counts = [m for m in range(1, K + 1) if bool((pi[:, m] > 0).any())]
    below = below_mass(p, q)[0] if "lex" in rules and any(m > 1 for m in counts) else None  # one sort per prefix
    mixed = {}
    for rule in rules:
        acc = torch.zeros(*q.shape, K + 1, dtype=q.dtype, device=q.device)
        for m in counts:
            kernel = lex_kernel(p, q, m, K, below) if rule == "lex" else kseq_kernel(p, q, m, K)
            acc = acc + pi[:, m, None, None] * kernel
        mixed[rule] = acc
    if mode != "choose":
        return torch.full_like(ratio, mode == "lex", dtype=torch.bool), mixed[mode]
    target = ratio.unsqueeze(-1) * p  # [N, V]
    scores = {rule: torch.minimum(target, mixed[rule].sum(-1)).sum(-1) for rule in RULES}  # [N]
    use_lex = scores["lex"] > scores["kseq"] + CHOICE_TOL
    return use_lex, torch.where(use_lex[:, None, None], mixed["lex"], mixed["kseq"])


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


__all__ = ["RULES", "MODES", "CHOICE_TOL", "lex_kernel", "kseq_kernel", "node_step", "root_survivors",
           "advance_survivors"]
