"""SpecTr-GBV (Lin, Sheng, Cai, Zhou 2026) exactly as released: Algorithm 1 of the official code,
algorithms.md §6.2-§6.3, §6.7.  There is no Algorithm 2 (target adjustment) in the released code, so
this verifier is stateless and **not lossless** (§6.4).

Notation (algorithms.md §1): p = target, q = draft; joints along draft k measured from the block start
c, ``P(u) = prod_j p(u_j|c,u_<j)``, ``Q(u) = prod_j q(u_j|c,u_<j)``.  With (§6.3, "phi form")

    r(v)   = min{Q(v)/P(v), 1}            (r = 1 when P(v) = 0)
    phi(v) = P(v) [1 - (1 - r(v))^K]       (claimed acceptance mass of v)
    A(v)   = 1 - (1 - Q(v))^K              (Pr(some draft starts with v))
    S(u)   = sum_x phi(u.x)

the acceptance probabilities are ``h(u) = (phi(u) - S(u)) / (A(u) - S(u))`` for |u| < L and
``h_L(u) = phi(u) / A(u)``, and the residual after a partial acceptance u is the *coded* one,
``residual(x|u) ∝ P(u.x) [1 - r(u.x)^K]`` (which differs from the mass-consistent ``(1 - r)^K`` for
K >= 2, §6.3).

Algorithm 1 (§6.2), per instance: ``tau = 0, acc = (), sel = 0, H = {}``; for k = 1..K in order, with
``t0 = tau`` at the start of draft k's scan, for i = t0+1..L-1 and u = D_k,<=i: skip u if u ∈ H, else
accept with a fresh coin (``tau = i, acc = u, sel = k``) or add u to H -- a rejection does not stop
the scan; then test the full block D_k (never checked against H): on acceptance ``tau = L, sel = k``
and no later draft is examined.  The extra token is the bonus ``p(.|c, D_sel)`` when tau = L, else a
draw from the residual at u = acc (fallback ``p(.|c, acc)`` when its mass is 0, §6.7).

**H as a prefix-sharing test** (used by :meth:`SpecTrGBV.sample` and :meth:`SpecTrGBV.law`).  For i > t0
(the only lengths draft k tests), ``D_k,<=i ∈ H`` iff some earlier draft j < k has ``D_j,<=i =
D_k,<=i``.  (=>) H only holds rejected sub-blocks of earlier drafts (draft k's own entries are shorter
than i).  (<=) Draft j started its scan at ``t0_j <= t0 < i`` because tau never decreases, so it
reached length i (i <= L-1): either u was already in H, or it was tested; an acceptance would have set
tau >= i before draft k started (contradicting i > t0), so it was rejected and put into H (and a
full-block acceptance of draft j would have ended the scan before draft k).  Hence draft k tests exactly
the lengths ``max(t0, s_k) < i <= L-1``, where ``s_k`` is the longest common prefix of D_k with any
earlier draft -- a contiguous range -- plus the full block.

Coins: draft k's sub-block of length i uses ``uniforms.coins[b, k, i-1]`` (the full block
``coins[b, k, L-1]``), accepting iff ``coin < h``; the extra token uses ``uniforms.draws[b, tau]``.

**Lazy sampler** (:meth:`SpecTrGBV.sample` on CPU from ``LAZY_MIN_V`` tokens on).  h(u) for |u| < L needs
the vocabulary sum S(u) = sum_x phi(u.x), O(V) per sub-block, K(L-1) of them; the scan reads few of them.
The lazy path makes the decisions of :meth:`SpecTrGBV._h` + :meth:`SpecTrGBV.scan` (same floats, same
outcome) with:

* *order*: per draft, the full block first (h_L is O(1); its acceptance ends the scan), then the tested
  lengths from the deepest down, stopping at the first acceptance (the longest accepted one wins);
  P(u) = 0 gives h = 0;
* *a free bound*: h = (phi - S)/(A - S) <= phi/A when phi <= A (S >= 0), so a coin >= phi(u)/A(u)
  (times 1 + 16u for rounding) rejects without any sum;
* *certified cheap sums*: with a = P(u)/A(u), b = Q(u)/A(u), r = min{Q(u.x)/P(u.x), 1} and w = 1 - r,
  ``1 - (1 - r)^K = r G_K(w)``, ``G_K(w) = 1 + w + ... + w^(K-1)``, so
  ``S(u)/A(u) = sum_x min{a p(x|u), b q(x|u) G_K(w(x))}`` -- products and one division, no log/exp, no
  cancellation.  A first-order rounding analysis of both this sum and _h's log/exp evaluation (relative
  error per term <= 8 eps (|log p| + |log q| + |log-joints| + 2), with |log p|, |log q| <= 60 except on
  entries bounded by their size; at most n - 1 roundings per sum of n positive terms; times 4 for
  safety) gives an interval that holds _h's float S(u); the test is decided only if every float in
  it gives the same answer (:func:`_certified_accept`);
* otherwise (a coin within ~1e-11 of h, degenerate rows such as p = q or one-hot ones) that one node's h
  is computed exactly as :meth:`SpecTrGBV._h` computes it: torch's elementwise functions give the same
  value per element whatever the tensor's shape, and the row sum is rounded as in _h's batched sum
  (:func:`~mdv.verify._math.row_sum`).

**The released numerics** (``SpecTrGBV(precision="float32")``).  The official code (public repository
junemily/SpecTr-GBV, ``src/engine.py``, ``Decoding.speculative_decoding``) evaluates the same rule in
float32: the running joints ``m_s``, ``m_b`` start from ``torch.ones(1)`` and multiply the float32
token probabilities of ``prob_history`` one by one (its lines ``m_s = m_s * prob_s[token]``,
``m_b = m_b * prob_b[token]``); ``exp_term(x) = torch.pow(one - x, k_tensor)`` gives ``(1 - x)^K``; with
``eps = 1e-20``, a sub-block's acceptance probability is ``numerator / (denominator + eps)`` with
``numerator = sum(m_b * next_prob_b * exp_term(min_ratio)) - m_b * exp_term(raw_ratio)`` and
``denominator = one - exp_term(m_s) - sum(m_b * next_prob_b * (one - exp_term(min_ratio)))``, where
``ratio = (m_s * next_prob_s) / (m_b * next_prob_b + eps)``, ``min_ratio = min(ratio, 1)`` and
``raw_ratio = min(m_s / (m_b + eps), 1)``; the full block's is ``(m_b * (1 - exp_term(ratio))) /
(1 - exp_term(m_s) + eps)`` with ``ratio = min(m_s / (m_b + eps), 1)``; the residual is
``mb * prob_b * (one - min(ms * prob_s / (mb * prob_b + eps), one) ** k_tensor)`` over its sum
(``clamp_min(eps)``).  In float32 ``(1 - Q)^K`` rounds to 1 once ``Q`` is below ~6e-8, so the denominator of
the full-block test becomes ``0 + eps`` and its acceptance probability ``m_b (...) / 1e-20`` is far above
1: long blocks are accepted whatever their probabilities.  The float32 mode computes every node's
acceptance probability with exactly these float32 operations (:meth:`SpecTrGBV._released_h`), then runs
the same scan (the coin test ``coin < h`` of a number outside [0, 1] is a sure accept or reject, so the
law uses h clipped to [0, 1]); the deviations are stated where they are: a coin is a float64 uniform (the
code's ``torch.rand(1)`` is float32), and a residual of mass 0 falls back to p(.|c, u) (the code's
``sample`` of an all-zero vector would fail).
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.verify._math import TOL, categorical, normalize_or, row_sum
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.registry import register_verifier
from mdv.verify.sd import token_probs

# Below this log-value, 1 - (1 - x)^K is replaced by its first-order value K x (relative error ~K x,
# i.e. < 1e-190): avoids the underflow of x itself for very long or very unlikely blocks.
_LOG_SMALL = -440.0


def _log_one_minus_pow_comp(log_x: Tensor, K: int) -> Tensor:
    """``log(1 - (1 - x)^K)`` from ``log x`` (x in [0, 1]), computed as ``log(-expm1(K log1p(-x)))``
    (algorithms.md §12.11), switching to ``log K + log x`` for tiny x.  -inf when x = 0."""
    out = log_x.exp().neg_().log1p_().mul_(K).expm1_().neg_().log_()
    tiny = log_x < _LOG_SMALL
    return torch.where(tiny, math.log(K) + log_x, out) if bool(tiny.any()) else out


def _log_r(log_P: Tensor, log_Q: Tensor) -> Tensor:
    """``log r = log min{Q/P, 1}`` with r = 1 where P = 0 (algorithms.md §6.3, §12.12)."""
    p_zero = torch.isneginf(log_P)
    diff = torch.where(p_zero, torch.zeros_like(log_P), log_Q - torch.where(p_zero, torch.zeros_like(log_P), log_P))
    return torch.where(p_zero, torch.zeros_like(diff), diff.clamp_max(0.0))


def _log_phi(log_P: Tensor, log_Q: Tensor, K: int) -> Tensor:
    """``log phi_K(v) = log P(v) + log(1 - (1 - r(v))^K)``; -inf where P(v) = 0."""
    lr = _log_r(log_P, log_Q)
    return torch.where(torch.isneginf(log_P), log_P, log_P + _log_one_minus_pow_comp(lr, K))


def _h_from_scaled(num: Tensor, den: Tensor) -> Tensor:
    """h = num / den with num, den already divided by A_K(u) (scale-free), guarded as in
    algorithms.md §6.3/§12.11: numerically zero numerator -> 0 (this takes precedence, like the code's
    0/(0 + 1e-20) = 0; cf. T = 0 in §6.7), denominator <= TOL -> 1, then clamp to [0, 1]."""
    small_den = den <= TOL
    h = num / torch.where(small_den, torch.ones_like(den), den)
    h = torch.where(small_den, torch.ones_like(h), h)
    h = torch.where(num <= TOL, torch.zeros_like(h), h)
    return h.clamp(0.0, 1.0)


def longest_shared_prefix(tokens: Tensor) -> Tensor:
    """``s[b, k] = max_{j<k} lcp(D_j, D_k)`` (0 for k = 0): sub-blocks of draft k of length <= s_k are
    exactly those an earlier draft shares (the H test of Algorithm 1, see the module docstring).

    tokens: [B, K, L] -> [B, K] int64 in 0..L.
    """
    B, K, L = tokens.shape
    s = torch.zeros(B, K, dtype=torch.long, device=tokens.device)
    for k in range(1, K):
        eq = tokens[:, :k] == tokens[:, k:k + 1]  # [B, k, L]
        lcp = eq.long().cumprod(-1).sum(-1)  # [B, k]
        s[:, k] = lcp.amax(-1)
    return s


def _children_log_r(p_u: Tensor, q_u: Tensor, log_P_u: Tensor, log_Q_u: Tensor) -> tuple[Tensor, Tensor]:
    """``log r(u.x) = min{log Q(u) - log P(u) + log q(x|u) - log p(x|u), 0}`` for the children of nodes u,
    with r = 1 where P(u.x) = 0; and ``log p(x|u)``.

    p_u, q_u: [..., V] the laws after each node; log_P_u, log_Q_u: [...] its log joints.  -> two [..., V].
    """
    log_p = p_u.log()
    lr = q_u.log().sub_(log_p).add_((log_Q_u - log_P_u)[..., None]).clamp_max_(0.0)
    lr.masked_fill_((p_u == 0) | torch.isneginf(log_P_u[..., None]), 0.0)  # also clears the NaN of -inf+inf
    return lr, log_p


def _coded_residual(lr: Tensor, p_u: Tensor, K: int) -> Tensor:
    """The coded residual ``norm(p(x|c,u)[1 - r(u.x)^K])`` (fallback p(.|c,u) when numerically zero, §6.7;
    zero where P(u.x) = 0).  Consumes ``lr`` (in place).  lr, p_u: [..., V] -> [..., V]."""
    return normalize_or(lr.mul_(K).expm1_().neg_().mul_(p_u), p_u)


# ---------------------------------------------------------------------------------------- lazy sampler
#: From this vocabulary size on (CPU), :meth:`SpecTrGBV.sample` takes the lazy, certified path.
LAZY_MIN_V = 256
_U = 2.0 ** -53  # unit roundoff of float64
_LOG_THETA = 60.0  # split point of the error bound: entries below e^-60 are bounded by their size
_THETA = math.exp(-_LOG_THETA)
_MAX_LOG_SCALE = 700.0  # a = P(u)/A(u) above e^700 (Q(u) < e^-700): no fast sum, exact h


class _NodeTests:
    """The certified sub-block tests of :meth:`SpecTrGBV._sample_lazy` (module docstring, "Lazy sampler"),
    with scratch vectors reused across the sub-blocks of one call."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.bufs: list[Tensor] = []

    def accepts(self, b: int, k: int, i: int, coin: float, phi: float, lP: float, lQ: float,
                lA: float) -> bool | None:
        """``coin < h(u)`` for u = D_k,<=i of instance b as :meth:`SpecTrGBV._h` decides it, or None when
        the certified bound does not settle it.  phi: _h's ``phi(u)/A(u)``; lP, lQ, lA: log P(u), Q(u), A(u)."""
        # h = (phi - S)/(1 - S) <= phi for 0 <= S < 1 and phi <= 1; the float ops add at most 4 roundings
        if phi <= 1.0 and coin >= min(1.0, phi * (1.0 + 16 * _U)):
            return False
        c = lP - lA  # log(P(u)/A(u)), the float _h adds
        if not c <= _MAX_LOG_SCALE:
            return None
        a, bq = math.exp(c), math.exp(min(lQ - lA, _MAX_LOG_SCALE))  # P(u)/A(u), Q(u)/A(u) (<= ~1)
        S = self._phi_sum(self.block.p[b, k, i], self.block.q[b, k, i], a, bq)
        K, V = self.block.K, self.block.V
        # first-order relative error of _h's log/exp chain per term (|log p|, |log q| <= 60 on the bulk), of
        # the scale factors and of _phi_sum's arithmetic; each sum adds at most (n - 1) roundings
        rel = 16 * _U * (2 * _LOG_THETA + 3 * (abs(lP) + abs(lQ) + abs(lA)) + 8) + (2 * K * K + 4 * K + 16) * 2 * _U

        def err(n: int) -> float:  # the entries below e^-60 are bounded by their size instead
            tail = 16 * _U * 1490.0 * (min(n * a * _THETA, K * bq) + n * K * bq * _THETA)
            return 4.0 * (abs(S) * (rel + 4 * n * _U) + tail + n * 2.0 ** -1000) + 1e-300

        out = _certified_accept(coin, phi, S, err(V))
        if out is None:  # retry with the number of non-zero terms (both sums are exact beyond them)
            out = _certified_accept(coin, phi, S, err(int(torch.count_nonzero(self.block.p[b, k, i]))))
        return out

    def _phi_sum(self, p: Tensor, q: Tensor, a: float, b: float) -> float:
        """``S(u)/A(u) = sum_x min{a p(x), b q(x) G_K(w(x))}`` without transcendental functions.

        a = P(u)/A(u), b = Q(u)/A(u); p, q = p(.|c,u), q(.|c,u) ([V]).  With r = min{Q(u.x)/P(u.x), 1} and
        w = 1 - r = (a p - b q)_+ / (a p): ``1 - (1 - r)^K = r (1 + w + ... + w^(K-1)) = r G_K(w)``, a sum
        of positive terms (no cancellation), and ``a p r = b q`` where r < 1; where r = 1 (w = 0) the min
        picks a p.  Where p = 0, w is 0/0: the NaN term is skipped by nansum (its value, a p, is 0).
        """
        if not self.bufs:
            self.bufs = [torch.empty_like(p) for _ in range(4)]
        ap, t, w, G = self.bufs
        torch.mul(p, a, out=ap)
        torch.mul(q, b, out=t)
        K = self.block.K
        if K == 1:
            return float(torch.minimum(ap, t, out=G).sum())
        torch.sub(ap, t, out=w).clamp_min_(0.0).div_(ap)
        torch.add(w, 1.0, out=G)
        for _ in range(K - 2):
            G.mul_(w).add_(1.0)
        return float(torch.minimum(G.mul_(t), ap, out=G).nansum())


def _certified_accept(coin: float, phi: float, S: float, err: float) -> bool | None:
    """``coin < h`` for *every* float S' in [S - err, S + err], with h computed from S' exactly as
    :func:`_h_from_scaled` does (num = phi - S', den = 1 - S'; num <= TOL -> 0, else den <= TOL -> 1, else
    num / den clamped to [0, 1]); None when the answer depends on S'.

    Float subtraction and division are monotone, so over the interval num lies in [num_lo, num_hi] and den
    in [den_lo, den_hi], and h in [h_min, h_max]: h_min = 0 if num may be <= TOL, h_max = 1 if den may be
    <= TOL, the ratio of the interval ends otherwise."""
    S_lo, S_hi = S - err, S + err
    num_lo, num_hi = phi - S_hi, phi - S_lo
    if num_hi <= TOL:
        return coin < 0.0  # h = 0
    den_lo, den_hi = 1.0 - S_hi, 1.0 - S_lo
    h_max = 1.0 if den_lo <= TOL else min(max(num_hi / den_lo, 0.0), 1.0)
    if num_lo <= TOL:
        h_min = 0.0
    elif den_hi <= TOL:
        h_min = 1.0
    else:
        h_min = min(max(num_lo / den_hi, 0.0), 1.0)
    if coin < h_min:
        return True
    if coin >= h_max:
        return False
    return None


@register_verifier
class SpecTrGBV(Verifier):
    """``spectr_gbv``: SpecTr-GBV's Algorithm 1 as implemented in the official code (§6.2), stateless.

    Not lossless (``lossless = False``), as measured by exact enumeration (algorithms.md §6.4,
    ``tests/test_spectr_gbv.py``): on the context-free toy target (.5, .5), draft (.25, .75), L = 2 the
    total variation between the law of the first 3 generated tokens and the target is 0.0625 / 0.0731
    / 0.0951 for K = 1 / 2 / 3, and at K >= 2 the accepted prefix (1, 1) has probability 0.2628 (K=2),
    0.2995 (K=3) > 0.25 = its target probability, which no later adjustment could repair.  At K = 1 the
    per-iteration law is GBV's (§5) without its target adjustment.
    """

    name: ClassVar[str] = "spectr_gbv"
    lossless: ClassVar[bool] = False
    multi_draft: ClassVar[bool] = True
    PRECISIONS: ClassVar[tuple[str, ...]] = ("float64", "float32")

    def __init__(self, precision: str = "float64") -> None:
        """precision: ``"float64"`` (the rule in float64, log space) or ``"float32"`` (the released code's
        float32 arithmetic, operation for operation: module doc, "The released numerics")."""
        if precision not in self.PRECISIONS:
            raise InvalidInputError(f"spectr_gbv option precision must be 'float64' or 'float32'; got {precision!r}")
        self.precision = precision
        super().__init__()

    # ------------------------------------------------------------------ formulas (§6.3)
    @staticmethod
    def h_and_dists(block: Block) -> tuple[Tensor, Tensor]:
        """Acceptance probabilities and extra-token laws along every draft.

        Returns
          h:     [B, K, L] -- ``h[b, k, i-1]`` = h(D_k,<=i) for i = 1..L-1 and ``h[b, k, L-1]`` = h_L(D_k).
          dists: [B, K, L+1, V] -- ``dists[b, k, i]`` = law of the extra token after accepting D_k,<=i:
                 the coded residual ``norm(P(u.x)[1 - r(u.x)^K])`` for i < L (fallback p(.|c,u)), the bonus
                 ``p(.|c, D_k)`` for i = L.
        """
        K = block.K
        p, q = block.p, block.q  # [B, K, L+1, V], [B, K, L, V]
        h, log_P, log_Q = SpecTrGBV._h(block)
        # coded residual P(u.x)[1 - r(u.x)^K] relative to P(u), at every node u = D_k,<=i, i = 0..L-1
        lr, _ = _children_log_r(p[:, :, :-1], q, log_P[..., :-1], log_Q[..., :-1])  # [B, K, L, V]
        dists = torch.cat([_coded_residual(lr, p[:, :, :-1], K), p[:, :, -1:]], 2)  # [B, K, L+1, V]
        return h, dists

    @staticmethod
    def _node_scalars(block: Block) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The O(B·K·L) part of :meth:`_h`: log joints of every draft prefix, log phi_K and log A_K there,
        ``phi(u)/A(u)`` at the sub-blocks and ``h_L``.

        Returns log_P, log_Q, log_phi, log_A [B, K, L+1]; phi_mid [B, K, L-1] = phi(u)/A(u) for |u| = 1..L-1;
        h_full [B, K] = h_L(D_k).  Shared by both paths of :meth:`sample`, so their values agree bit for bit.
        """
        K, L = block.K, block.L
        tok = block.tokens.long()
        p, q = block.p, block.q  # [B, K, L+1, V], [B, K, L, V]
        zeros = torch.zeros_like(p[:, :, 0, 0])[..., None]  # [B, K, 1]
        log_P = torch.cat([zeros, token_probs(p[:, :, :-1], tok).log().cumsum(-1)], -1)  # [B, K, L+1]
        log_Q = torch.cat([zeros, token_probs(q, tok).log().cumsum(-1)], -1)  # [B, K, L+1]; finite (q > 0 on drafts)
        log_phi_u = _log_phi(log_P, log_Q, K)  # [B, K, L+1]
        log_A_u = _log_one_minus_pow_comp(log_Q, K)  # [B, K, L+1]; finite since Q(u) > 0
        phi = (log_phi_u[:, :, 1:L] - log_A_u[:, :, 1:L]).exp()  # [B, K, L-1]: phi(u)/A(u)
        h_full = (log_phi_u[:, :, L] - log_A_u[:, :, L]).exp().clamp(0.0, 1.0)  # [B, K]
        return log_P, log_Q, log_phi_u, log_A_u, phi, h_full

    @staticmethod
    def _h(block: Block) -> tuple[Tensor, Tensor, Tensor]:
        """The acceptance probabilities h [B, K, L] of :meth:`h_and_dists`, with the log joints log_P, log_Q
        [B, K, L+1] of every draft prefix.  Only the children of the nodes of length 1..L-1 enter h."""
        K, L = block.K, block.L
        p, q = block.p, block.q  # [B, K, L+1, V], [B, K, L, V]
        log_P, log_Q, _, log_A_u, phi, h_full = SpecTrGBV._node_scalars(block)

        # children u.x of the nodes u = D_k,<=i, i = 1..L-1 ([B, K, L-1, V], updated in place: V ~ 5e4)
        lr, log_p = _children_log_r(p[:, :, 1:L], q[:, :, 1:L], log_P[..., 1:L], log_Q[..., 1:L])
        # phi(u.x) / A(u) = exp(log P(u) - log A(u) + log p(x|u) + log(1 - (1 - r)^K)), scale-free
        phi_c = _log_one_minus_pow_comp(lr, K).add_(log_p).add_((log_P - log_A_u)[..., 1:L, None]).exp_()
        S = phi_c.sum(-1)  # [B, K, L-1]: S(u)/A(u) for |u| = 1..L-1
        h_mid = _h_from_scaled(phi - S, 1.0 - S)
        return torch.cat([h_mid, h_full[..., None]], -1), log_P, log_Q  # h: [B, K, L]

    # ------------------------------------------------------------------ the released float32 numerics
    @staticmethod
    def _released_joints(block: Block) -> tuple[Tensor, Tensor]:
        """float32 m_s, m_b [B, K, L+1] of every draft prefix: ``ones(1)`` times the token probabilities one
        by one, left to right, as the released loop multiplies them (module doc)."""
        tok = block.tokens.long()
        q32 = token_probs(block.q, tok).to(torch.float32)  # [B, K, L]
        p32 = token_probs(block.p[:, :, :-1], tok).to(torch.float32)  # [B, K, L]
        m_s, m_b = [torch.ones_like(q32[..., 0])], [torch.ones_like(p32[..., 0])]
        for i in range(block.L):
            m_s.append(m_s[-1] * q32[..., i])
            m_b.append(m_b[-1] * p32[..., i])
        return torch.stack(m_s, -1), torch.stack(m_b, -1)

    def _released_h(self, block: Block) -> Tensor:
        """h [B, K, L] from the released float32 formulas (module doc), clipped to [0, 1] (what ``draw <
        acceptance_prob`` gives); NaN counts as 0 (``draw < nan`` is False)."""
        K, L = block.K, block.L
        one, eps, k_t = torch.tensor(1.0), torch.tensor(1e-20), torch.tensor(K)  # as the code: an integer K
        m_s, m_b = self._released_joints(block)  # [B, K, L+1]
        p32, q32 = block.p.to(torch.float32), block.q.to(torch.float32)

        def exp_term(x: Tensor) -> Tensor:
            return torch.pow(one - x, k_t)

        ms, mb = m_s[:, :, 1:L, None], m_b[:, :, 1:L, None]  # sub-blocks of length 1..L-1
        next_b, next_s = p32[:, :, 1:L], q32[:, :, 1:L]  # [B, K, L-1, V]
        ratio = (ms * next_s) / (mb * next_b + eps)
        min_ratio = torch.minimum(ratio, one)
        raw_ratio = torch.minimum(ms / (mb + eps), one)
        numerator = torch.sum(mb * next_b * exp_term(min_ratio), -1) - (mb * exp_term(raw_ratio))[..., 0]
        denominator = one - exp_term(ms)[..., 0] - torch.sum(mb * next_b * (one - exp_term(min_ratio)), -1)
        h_mid = numerator / (denominator + eps)  # [B, K, L-1]
        ms_f, mb_f = m_s[:, :, L], m_b[:, :, L]
        ratio_f = torch.minimum(ms_f / (mb_f + eps), one)
        h_full = (mb_f * (1 - exp_term(ratio_f))) / (1 - exp_term(ms_f) + eps)  # [B, K]
        h = torch.cat([h_mid, h_full[..., None]], -1).to(torch.float64)
        return torch.nan_to_num(h, nan=0.0).clamp(0.0, 1.0)

    def _released_residuals(self, block: Block) -> Tensor:
        """[B, K, L, V]: the released code's residual after accepting D_k,<=i (i = 0..L-1) in float32, as a
        float64 law; a residual of mass 0 falls back to p(.|c, u) (module doc)."""
        one, eps, k_t = torch.tensor(1.0), torch.tensor(1e-20), torch.tensor(block.K)
        m_s, m_b = self._released_joints(block)
        ms, mb = m_s[:, :, :-1, None], m_b[:, :, :-1, None]  # [B, K, L, 1]
        prob_b, prob_s = block.p[:, :, :-1].to(torch.float32), block.q.to(torch.float32)
        residual = mb * prob_b * (one - torch.minimum(ms * prob_s / (mb * prob_b + eps), one) ** k_t)
        mass = residual.sum(-1, keepdim=True)
        law = (residual / mass.clamp_min(eps)).to(torch.float64)
        return torch.where(mass > 0, law, block.p[:, :, :-1])

    def _h_and_dists_of(self, block: Block) -> tuple[Tensor, Tensor]:
        """:meth:`h_and_dists` in this instance's precision."""
        if self.precision == "float64":
            return self.h_and_dists(block)
        return self._released_h(block), torch.cat([self._released_residuals(block), block.p[:, :, -1:]], 2)

    def acceptance_law(self, block: Block, state: Any = None) -> Tensor:
        """P(tau = t), t = 0..L [B, L+1]: the dynamic program of :meth:`law` on h alone (:meth:`_h`), without
        the O(K·L·V) next-token laws of every node."""
        h = self._h(block)[0] if self.precision == "float64" else self._released_h(block)
        m, F = self._scan_masses(h, block.tokens)  # [B, L, K], [B, K]
        return torch.cat([m.sum(-1), F.sum(-1, keepdim=True)], -1)  # [B, L+1]

    @staticmethod
    def _scan_masses(h: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """The dynamic program of :meth:`law`: m [B, L, K] (tau = t < L, sel = j) and F [B, K] (a full
        acceptance at draft j).  h: [B, K, L]; tokens: [B, K, L]."""
        B, K, L = h.shape
        s = longest_shared_prefix(tokens).clamp_max(L - 1)  # [B, K]
        m = torch.zeros(B, L, K, dtype=h.dtype, device=h.device)  # tau = 0..L-1, sel
        m[:, 0, 0] = 1.0
        F = torch.zeros(B, K, dtype=h.dtype, device=h.device)
        lengths = torch.arange(L, device=h.device)  # index i = 0..L-1 (i = 0 never an exit)
        for k in range(K):
            g = torch.cat([torch.zeros_like(h[:, k, :1]), h[:, k, :L - 1]], -1)  # [B, L]: g_i = h_i, g_0 = 0
            h_full = h[:, k, L - 1]  # [B]
            one = torch.ones_like(g[:, :1])
            # suffix[a] = prod_{j=a+1}^{L-1} (1 - g_j), a = 0..L-1
            suffix = torch.cat([torch.flip(torch.cumprod(torch.flip(1.0 - g[:, 1:], [-1]), -1), [-1]), one], -1)
            exit_at = g * suffix  # [B, L]: Pr(last accepted tested length = i) if i is tested
            F[:, k] = h_full * m.sum((1, 2))
            new = torch.zeros_like(m)
            for t in range(L):
                a = s[:, k].clamp_min(t)  # [B]
                mt = m[:, t, :]  # [B, K]
                new[:, t, :] += mt * suffix.gather(1, a[:, None])  # nothing accepted
                tested = lengths[None, :] > a[:, None]  # [B, L]
                new[:, :, k] += mt.sum(-1, keepdim=True) * torch.where(tested, exit_at, torch.zeros_like(exit_at))
            m = (1.0 - h_full)[:, None, None] * new
        return m, F

    # ------------------------------------------------------------------ exact law
    def law(self, block: Block, state: Any = None) -> list[Branch]:
        """Exact outcome law by a dynamic program over the drafts.

        State before draft k: the mass ``m[b, t, j]`` of (tau = t < L, sel = j) and the masses ``F[b, j]``
        of a full acceptance at draft j (terminal).  Draft k tests the lengths ``a < i <= L-1`` with
        ``a = max(t, s_k)`` (module docstring) and then the full block; as in BV (§4), its scan ends at
        tau = L w.p. h_L, otherwise at the last accepted tested length i w.p.
        ``(1 - h_L) h_i prod_{a<j<=L-1, j>i} (1 - h_j)`` (tau and sel unchanged if none is accepted).
        Branches: (tau=0, sel=0), (tau=i, sel=k) for i = 1..L, k = 0..K-1.
        """
        h, dists = self._h_and_dists_of(block)
        m, F = self._scan_masses(h, block.tokens)
        B, K, L = block.B, block.K, block.L
        zeros = torch.zeros(B, dtype=torch.long, device=h.device)
        branches = [Branch(m[:, 0, 0], zeros, zeros, dists[:, 0, 0])]
        for k in range(K):
            for i in range(1, L + 1):
                prob = F[:, k] if i == L else m[:, i, k]
                branches.append(Branch(prob, zeros + k, zeros + i, dists[:, k, i]))
        return branches

    # ------------------------------------------------------------------ fast sampler
    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Fast sampler, the same outcome as :meth:`scan` on :meth:`h_and_dists` for the same uniforms.

        On CPU from ``LAZY_MIN_V`` tokens on, :meth:`_sample_lazy` (instance by instance, only the tests the
        scan needs, certified cheap vocabulary sums); otherwise vectorised over B: h for every node
        (:meth:`_h`), the scan of :meth:`scan`.  Either way the extra-token law is built at the chosen node
        only (O(B·V) instead of O(B·K·L·V)).
        """
        if self.precision == "float32":
            h, dists = self._h_and_dists_of(block)  # [B, K, L], [B, K, L+1, V]
            tau, sel = self._scan_choice(h, longest_shared_prefix(block.tokens), uniforms.coins)
            rows = torch.arange(block.B, device=tau.device)
            return Outcome(tau, sel, categorical(dists[rows, sel, tau], uniforms.draws[rows, tau]))
        if block.V >= LAZY_MIN_V and block.p.device.type == "cpu":
            return self._sample_lazy(block, uniforms)
        h, log_P, log_Q = self._h(block)
        tau, sel = self._scan_choice(h, longest_shared_prefix(block.tokens), uniforms.coins)
        return self._extra_token(block, uniforms, tau, sel, log_P, log_Q)

    @staticmethod
    def _extra_token(block: Block, uniforms: Uniforms, tau: Tensor, sel: Tensor, log_P: Tensor,
                     log_Q: Tensor) -> Outcome:
        """The outcome once (tau, sel) [B] are known: the coded residual at (sel, tau), or the bonus when
        tau = L, drawn with ``uniforms.draws[b, tau]``.  log_P, log_Q: [B, K, L+1] from :meth:`_node_scalars`."""
        B, L = block.B, block.L
        rows = torch.arange(B, device=tau.device)
        if B == 1:  # views instead of gathered copies, and only the branch the where below would keep
            t0, s0 = int(tau[0]), int(sel[0])
            if t0 == L:
                dist = block.p[:, s0, L]  # [1, V]
            else:
                p_u = block.p[:, s0, t0]
                lr, _ = _children_log_r(p_u, block.q[:, s0, t0], log_P[:, s0, t0], log_Q[:, s0, t0])
                dist = _coded_residual(lr, p_u, block.K)
            return Outcome(tau, sel, categorical(dist, uniforms.draws[rows, tau]))
        t = tau.clamp_max(L - 1)
        p_u = block.p[rows, sel, t]  # [B, V]
        lr, _ = _children_log_r(p_u, block.q[rows, sel, t], log_P[rows, sel, t], log_Q[rows, sel, t])
        dist = torch.where((tau == L).unsqueeze(-1), block.p[rows, sel, L], _coded_residual(lr, p_u, block.K))
        return Outcome(tau, sel, categorical(dist, uniforms.draws[rows, tau]))

    def _sample_lazy(self, block: Block, uniforms: Uniforms) -> Outcome:
        """:meth:`scan`'s outcome without h at every node: O(B·K·L) scalars, then per instance only the
        vocabulary sums S(u) of the sub-blocks whose coin the scan actually reads, in cheap arithmetic whose
        decisions are certified (module docstring, "Lazy sampler").

        Per draft k (draft order, as Algorithm 1): the full-block test first (h_L needs no vocabulary sum;
        an acceptance ends the scan whatever the sub-blocks did), then the tested lengths
        ``max(tau, s_k) < i <= L-1`` from the deepest down, stopping at the first acceptance (the longest
        accepted sub-block wins, so shorter ones cannot change the outcome).  A sub-block with P(u) = 0 has
        h = 0.  A test the certified interval cannot decide computes that node's h exactly as :meth:`_h` does.
        """
        B, K, L = block.B, block.K, block.L
        log_P, log_Q, _, log_A, phi, h_full = self._node_scalars(block)
        lP, lQ, lA = log_P.tolist(), log_Q.tolist(), log_A.tolist()  # [B][K][L+1]
        phi_l, hf = phi.tolist(), h_full.tolist()  # [B][K][L-1], [B][K]
        coins = uniforms.coins.tolist()  # [B][K][L]
        shared_all = longest_shared_prefix(block.tokens).tolist()  # [B][K]
        tests = _NodeTests(block)

        def exact_h(b: int, k: int, i: int) -> float:
            """h(D_k,<=i) of instance b exactly as :meth:`_h` computes it, for this node alone."""
            sl = slice(b, b + 1)
            p_u, q_u = block.p[sl, k, i], block.q[sl, k, i]  # [1, V]
            lr, log_p = _children_log_r(p_u, q_u, log_P[sl, k, i], log_Q[sl, k, i])
            phi_c = _log_one_minus_pow_comp(lr, K).add_(log_p).add_((log_P[sl, k, i] - log_A[sl, k, i])[..., None]).exp_()
            S = row_sum(phi_c, B * K * (L - 1))  # this row of _h's [B, K, L-1, V] sum
            num, den = phi_l[b][k][i - 1] - S, 1.0 - S  # _h_from_scaled
            h = 1.0 if den <= TOL else num / den
            h = 0.0 if num <= TOL else h
            return min(max(h, 0.0), 1.0)

        taus, sels = [], []
        for b in range(B):
            tau, sel = 0, 0
            for k in range(K):
                start = max(tau, shared_all[b][k])  # draft k tests the lengths start < i <= L-1 (module docstring)
                if coins[b][k][L - 1] < hf[b][k]:  # the full block is never checked against H
                    tau, sel = L, k
                    break
                for i in range(L - 1, start, -1):  # deepest first: the last accepted length wins
                    coin = coins[b][k][i - 1]
                    if lP[b][k][i] == -math.inf:
                        acc: bool | None = coin < 0.0  # P(u) = 0: h = 0
                    else:
                        acc = tests.accepts(b, k, i, coin, phi_l[b][k][i - 1], lP[b][k][i], lQ[b][k][i], lA[b][k][i])
                    if acc is None:
                        acc = coin < exact_h(b, k, i)
                    if acc:
                        tau, sel = i, k
                        break
            taus.append(tau)
            sels.append(sel)
        dev = block.p.device
        tau_t = torch.tensor(taus, dtype=torch.long, device=dev)
        sel_t = torch.tensor(sels, dtype=torch.long, device=dev)
        return self._extra_token(block, uniforms, tau_t, sel_t, log_P, log_Q)

    @staticmethod
    def scan(h: Tensor, dists: Tensor, shared: Tensor, uniforms: Uniforms) -> Outcome:
        """Algorithm 1's scan over drafts (python loops over k and i, vectorised over B), with the H test
        replaced by the prefix-sharing test ``i <= shared[b, k]`` (module docstring), then the extra token.

        h: [B, K, L] and dists: [B, K, L+1, V] from :meth:`h_and_dists`; shared: [B, K] from
        :func:`longest_shared_prefix`; uniforms.coins [B, K, L], uniforms.draws [B, L+1].
        """
        tau, sel = SpecTrGBV._scan_choice(h, shared, uniforms.coins)
        rows = torch.arange(h.shape[0], device=h.device)
        token = categorical(dists[rows, sel, tau], uniforms.draws[rows, tau])  # tau = 0 => sel = 0 (root)
        return Outcome(tau, sel, token)

    @staticmethod
    def _scan_choice(h: Tensor, shared: Tensor, coins: Tensor) -> tuple[Tensor, Tensor]:
        """(tau, sel) [B] of :meth:`scan`, before the extra token is drawn."""
        B, K, L = h.shape
        tau = torch.zeros(B, dtype=torch.long, device=h.device)
        sel = torch.zeros_like(tau)
        done = torch.zeros(B, dtype=torch.bool, device=h.device)
        for k in range(K):
            start = torch.maximum(tau, shared[:, k])  # draft k tests the lengths start < i <= L-1
            for i in range(1, L):
                acc = ~done & (i > start) & (coins[:, k, i - 1] < h[:, k, i - 1])
                tau = torch.where(acc, i, tau)
                sel = torch.where(acc, k, sel)
            full = ~done & (coins[:, k, L - 1] < h[:, k, L - 1])  # the full block is never checked against H
            tau = torch.where(full, L, tau)
            sel = torch.where(full, k, sel)
            done = done | full
        return tau, sel

    # ------------------------------------------------------------------ scalar transcription
    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Literal transcription of §6.2 with an explicit set H of token tuples; h from §6.3 in plain
        float64 products, one instance at a time (``precision="float32"``: :meth:`_reference_released`)."""
        if self.precision == "float32":
            return self._reference_released(block, uniforms)
        K, L = block.K, block.L
        taus, sels, tokens = [], [], []
        for b in range(block.B):
            D = [tuple(int(x) for x in block.tokens[b, k].tolist()) for k in range(K)]
            p = block.p[b].tolist()  # [K][L+1][V]
            q = block.q[b].tolist()  # [K][L][V]

            def joints(k: int, i: int) -> tuple[float, float]:
                Pu, Qu = 1.0, 1.0
                for j in range(i):
                    Pu *= p[k][j][D[k][j]]
                    Qu *= q[k][j][D[k][j]]
                return Pu, Qu

            def r_of(Pv: float, Qv: float) -> float:
                return 1.0 if Pv == 0.0 else min(Qv / Pv, 1.0)

            def phi(Pv: float, Qv: float) -> float:
                r = r_of(Pv, Qv)
                return Pv * -math.expm1(K * math.log1p(-r)) if r < 1.0 else Pv

            def A(Qv: float) -> float:
                return -math.expm1(K * math.log1p(-Qv)) if Qv < 1.0 else 1.0

            def h_sub(k: int, i: int) -> float:
                Pu, Qu = joints(k, i)
                S = sum(phi(Pu * p[k][i][x], Qu * q[k][i][x]) for x in range(block.V))
                a = A(Qu)
                num, den = (phi(Pu, Qu) - S) / a, (a - S) / a
                if num <= TOL:
                    return 0.0
                if den <= TOL:
                    return 1.0
                return min(max(num / den, 0.0), 1.0)

            def h_full(k: int) -> float:
                Pu, Qu = joints(k, L)
                return min(max(phi(Pu, Qu) / A(Qu), 0.0), 1.0)

            tau, acc, sel = 0, (), 0
            H: set[tuple[int, ...]] = set()
            for k in range(K):
                t0 = tau
                for i in range(t0 + 1, L):
                    u = D[k][:i]
                    if u in H:
                        continue  # the code draws and discards a uniform here: no effect on the law
                    if float(uniforms.coins[b, k, i - 1]) < h_sub(k, i):
                        tau, acc, sel = i, u, k
                    else:
                        H.add(u)
                if float(uniforms.coins[b, k, L - 1]) < h_full(k):
                    tau, acc, sel = L, D[k], k
                    break
            assert acc == D[sel][:tau]
            if tau == L:
                dist = torch.tensor(p[sel][L], dtype=torch.float64)
            else:
                Pu, Qu = joints(sel, tau)
                w = []
                for x in range(block.V):
                    Pv, Qv = Pu * p[sel][tau][x], Qu * q[sel][tau][x]
                    w.append(Pv * (1.0 - r_of(Pv, Qv) ** K))
                mass = sum(w)
                dist = (torch.tensor(w, dtype=torch.float64) / mass if Pu > 0.0 and mass / Pu > TOL
                        else torch.tensor(p[sel][tau], dtype=torch.float64))
            tokens.append(int(categorical(dist, uniforms.draws[b, tau])))
            taus.append(tau)
            sels.append(sel)
        return Outcome(torch.tensor(taus, dtype=torch.long), torch.tensor(sels, dtype=torch.long),
                       torch.tensor(tokens, dtype=torch.long))

    def _reference_released(self, block: Block, uniforms: Uniforms) -> Outcome:
        """``precision="float32"``: a transcription of the released loop (junemily/SpecTr-GBV,
        ``src/engine.py``, ``speculative_decoding``: the ``for j`` / ``for k`` / ``for i`` loops, the
        full-block test and the residual) in its float32 torch arithmetic, one instance at a time, with
        the block's positions for ``prob_history`` (``prefix_len`` = 0) and ``uniforms`` for its
        ``torch.rand(1)`` draws: ``coins[b, j, i]`` for the sub-block ``x[j, :i+1]``, ``coins[b, j, L-1]``
        for the full block, ``draws[b, tau]`` for the extra token."""
        K, gamma = block.K, block.L
        eps, one, k_tensor = torch.tensor(1e-20), torch.tensor(1.0), torch.tensor(K)

        def exp_term(x: Tensor) -> Tensor:
            return torch.pow(one - x, k_tensor)

        taus, sels, tokens = [], [], []
        for b in range(block.B):
            x = block.tokens[b].long()  # [K, L]
            prob_s_all, prob_b_all = block.q[b].to(torch.float32), block.p[b].to(torch.float32)  # [K, L, V], [K, L+1, V]
            tau, accepted, selected = 0, (), 0
            seen: set[tuple[int, ...]] = set()
            ms_final, mb_final = torch.ones(1), torch.ones(1)
            for j in range(K):
                probs_s_j, probs_b_j = prob_s_all[j], prob_b_all[j]
                m_s, m_b = torch.ones(1), torch.ones(1)
                for k in range(tau):
                    token = x[j, k]
                    m_s = m_s * probs_s_j[k, token]
                    m_b = m_b * probs_b_j[k, token]
                for i in range(tau, gamma - 1):
                    token = x[j, i]
                    prob_b, prob_s = probs_b_j[i], probs_s_j[i]
                    next_prob_b, next_prob_s = probs_b_j[i + 1], probs_s_j[i + 1]
                    m_s = m_s * prob_s[token]
                    m_b = m_b * prob_b[token]
                    ratio = (m_s * next_prob_s) / (m_b * next_prob_b + eps)
                    min_ratio = torch.minimum(ratio, one)
                    raw_ratio = torch.minimum(m_s / (m_b + eps), one)
                    numerator = torch.sum(m_b * next_prob_b * exp_term(min_ratio)) - m_b * exp_term(raw_ratio)
                    denominator = one - exp_term(m_s) - torch.sum(m_b * next_prob_b * (one - exp_term(min_ratio)))
                    acceptance_prob = numerator / (denominator + eps)
                    key = tuple(x[j, :i + 1].tolist())
                    if key in seen:
                        continue
                    if float(uniforms.coins[b, j, i]) < float(acceptance_prob):
                        tau, accepted, selected, ms_final, mb_final = i + 1, key, j, m_s, m_b
                    else:
                        seen.add(key)
                final_token = x[j, gamma - 1]
                m_s = m_s * probs_s_j[gamma - 1, final_token]
                m_b = m_b * probs_b_j[gamma - 1, final_token]
                ratio = torch.minimum(m_s / (m_b + eps), one)
                acceptance_prob = (m_b * (1 - exp_term(ratio))) / (1 - exp_term(m_s) + eps)
                if float(uniforms.coins[b, j, gamma - 1]) < float(acceptance_prob):
                    tau, accepted, selected, ms_final, mb_final = gamma, tuple(x[j].tolist()), j, m_s, m_b
                    break
            if tau < gamma:
                prob_b, prob_s = prob_b_all[selected, tau], prob_s_all[selected, tau]
                residual = mb_final * prob_b * (one - torch.minimum(ms_final * prob_s / (mb_final * prob_b + eps),
                                                                    one) ** k_tensor)
                mass = residual.sum()
                dist = ((residual / mass.clamp_min(eps)).to(torch.float64) if float(mass) > 0
                        else block.p[b, selected, tau])  # the code's sample() would fail on an all-zero law
            else:
                dist = block.p[b, selected, gamma]
            assert accepted == tuple(x[selected, :tau].tolist())
            tokens.append(int(categorical(dist, uniforms.draws[b, tau])))
            taus.append(tau)
            sels.append(selected)
        return Outcome(torch.tensor(taus, dtype=torch.long), torch.tensor(sels, dtype=torch.long),
                       torch.tensor(tokens, dtype=torch.long))
