"""SpecTr (Sun, Suresh, Ro, Beirami, Jain, Yu; NeurIPS 2023): K i.i.d. drafts verified position by
position with K-SEQ draft selection, algorithms.md §3.

**K-SEQ** (§3.1; letters of §1, p = target, q = draft -- SpecTr's own paper swaps them, §12.1).  With k
i.i.d. draft tokens X_1..X_k ~ q and

    beta(rho) = sum_x min{q(x), p(x)/rho},     g(rho) = rho beta(rho) - 1 + (1 - beta(rho))^k,

rho* is the smallest rho in [1, k] with g(rho) >= 0 (g is non-decreasing, g(k) >= 0 by Bernoulli).
X_1..X_k are tested in draft order, X_j accepted with probability ``min(1, p(X_j) / (rho* q(X_j)))``;
the first accepted one is returned.  If all k are rejected (probability (1-beta)^k, beta = beta(rho*)),
Y is drawn from the residual

    p_res = norm( p - min{q, p/rho*} (1 - (1-beta)^k) / beta ),

which is non-negative exactly when rho >= rho*; hence the bisection keeps the *upper* end of its
bracket (§12.8).  Each draft is accepted with probability beta with law min{q, p/rho*}/beta, so the
output law is ``min{q, p/rho*} (1-(1-beta)^k)/beta + p_res (1-beta)^k = p``: exact.  The acceptance
probability is ``1 - (1-beta(rho*))^k``.  k = 1 gives rho* = 1 and plain SD.

**Sequence level** (§3.2).  Keep the accepted prefix u and the surviving set S of drafts whose first |u|
tokens equal u (initially all K).  At depth i run |S|-SEQ with p(.|c,u), q(.|c,u) on the tokens D_s,i,
s in S, **in draft order with duplicates kept** (§12.7); the output y extends u and S <- {s in S :
D_s,i = y}.  A residual draw that equals a surviving draft's token continues (§3.2 step 5).  Stop when S
is empty (tau = i accepted tokens, the extra token is y), or after L positions with S non-empty (tau = L,
bonus from p(.|c,u) along any survivor).  Every emitted token has law p(.|c,u): per-iteration valid.

Conventions of this module: ``sel`` is the *first* draft of the surviving set (its first tau tokens are
the emitted prefix); draft j at depth i uses ``uniforms.coins[b, j, i]`` and the residual / bonus draw
at depth i uses ``uniforms.draws[b, i]``; all drafts in S share their prefix, so the p and q rows of the
first survivor are used for the whole set.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.verify._math import TOL, categorical, normalize_or
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.native import kseq_rho_active, native_rows
from mdv.verify.registry import register_verifier

#: Bisection steps for rho*: the bracket [1, k] (k <= a few dozen) shrinks below float64 resolution.
RHO_ITERS = 60
#: From this vocabulary size on, rho* is bisected row by row on the entries still inside the bracket
#: (:func:`_bisect_active_set`) instead of with two O(V) sums per step.
ACTIVE_SET_MIN_V = 1024
# Below this many entries inside the bracket, the active-set bisection continues in Python floats.
_ACTIVE_FLOATS = 64


# ---------------------------------------------------------------------------------------- K-SEQ helpers
def _as_k(k: Tensor | int, like: Tensor) -> Tensor:
    """k as a float64 tensor broadcastable against ``like`` [N] (an int becomes a constant)."""
    return torch.as_tensor(k, dtype=torch.float64, device=like.device).expand_as(like)


def _beta(p: Tensor, q: Tensor, rho: Tensor) -> Tensor:
    """``beta(rho) = sum_x min{q(x), p(x)/rho}`` (algorithms.md §3.1): one draft's acceptance probability.

    p, q: [N, V]; rho: [N] -> [N].
    """
    return torch.minimum(q, p / rho.unsqueeze(-1)).sum(-1).clamp(0.0, 1.0)


def _reject(p: Tensor, q: Tensor, rho: Tensor) -> Tensor:
    """``1 - beta(rho) = sum_x (q(x) - p(x)/rho)_+`` (uses sum q = 1), one draft's rejection probability.

    Summing the positive parts avoids the cancellation in ``1 - beta``: at p = q it is exactly 0, whereas
    ``1 - sum_x min(q, p)`` is ~1e-16 and would push rho* above 1.  p, q: [N, V]; rho: [N] -> [N].
    """
    return (q - p / rho.unsqueeze(-1)).clamp_min(0.0).sum(-1).clamp(0.0, 1.0)


def _pow(m: Tensor, k: Tensor) -> Tensor:
    """``m^k = (1 - beta)^k`` as ``exp(k log m)`` (§12.11); exactly 0 at m = 0 (k >= 1).  [N]"""
    return torch.exp(k * torch.log(m))


def _accept_all(m: Tensor, k: Tensor) -> Tensor:
    """``1 - m^k = 1 - (1 - beta)^k`` as ``-expm1(k log m)`` (§12.11); exactly 1 at m = 0.  [N]"""
    return -torch.expm1(k * torch.log(m))


def kseq_gap(p: Tensor, q: Tensor, k: Tensor, rho: Tensor) -> Tensor:
    """``g(rho) = (sum_x (q - p/rho)_+)^k - sum_x (p - rho q)_+`` (algorithms.md §3.1), the function whose
    smallest root in [1, k] is rho*: ``rho beta(rho) - 1 + (1 - beta(rho))^k`` without its cancellation.
    p, q: [N, V]; k, rho: [N] -> [N]."""
    uncovered = (p - rho.unsqueeze(-1) * q).clamp_min(0.0).sum(-1)  # 1 - rho beta(rho)
    return _pow(_reject(p, q, rho), k) - uncovered


def kseq_rho(p: Tensor, q: Tensor, k: Tensor | int) -> Tensor:
    """rho* of K-SEQ for every row at once (algorithms.md §3.1).

    The smallest rho in [1, k] with ``g(rho) = rho beta(rho) - 1 + (1 - beta(rho))^k >= 0``: rho* = 1 when
    g(1) >= 0, otherwise the **upper** end of the bracket after :data:`RHO_ITERS` bisection steps
    (§12.8: a rho below rho* makes the residual negative).  g is evaluated without cancellation as
    ``(sum_x (q - p/rho)_+)^k - sum_x (p - rho q)_+`` (equal for normalised p and q), so that p = q and
    one-hot rows give g(1) = 0 exactly and rho* = 1 (§3.2 edge cases).

    From ACTIVE_SET_MIN_V tokens on, rows are done one at a time by the active-set bisection
    (:func:`_bisect_active_set`), each in one C call where mdv's loop library is built
    (:func:`mdv.verify.native.kseq_rho_active`: g(1) and the bisection, sums in extended precision; within
    1e-13 of the Python path, tests/test_verify_native.py).

    p, q: [N, V] target / draft laws at one position; k: [N] (or an int) number of drafts, >= 1.
    Returns rho: [N] float64.
    """
    kk = _as_k(k, p[..., 0]).clamp_min(1.0)  # [N]
    if p.shape[-1] >= ACTIVE_SET_MIN_V and (lib := native_rows(p, q)) is not None:
        # large vocabularies: few rows, each in one C call (g(1), then the active-set bisection): ~0.3 ms a
        # row at V = 49k, against ~2.3 ms for the torch g(1) and the Python bisection below
        return torch.tensor([1.0 if float(kk[n]) <= 1.0 else kseq_rho_active(lib, p[n], q[n], float(kk[n]), RHO_ITERS)
                             for n in range(p.shape[0])], dtype=torch.float64, device=p.device)
    g = kseq_gap

    rho = torch.ones_like(kk)
    # rows with rho* > 1; k = 1 rows keep rho = 1 (their bracket [1, 1] leaves hi = 1)
    todo = ((g(p, q, kk, rho) < 0.0) & (kk > 1.0)).nonzero().squeeze(-1)
    if todo.numel():
        pp, qq, kq = p[todo], q[todo], kk[todo]
        lo, hi = torch.ones_like(kq), kq.clone()
        if pp.shape[-1] >= ACTIVE_SET_MIN_V:  # large vocabularies: few rows, one at a time
            rho[todo] = torch.tensor([_bisect_active_set(pp[n], qq[n], float(kq[n])) for n in range(len(todo))],
                                     dtype=rho.dtype, device=rho.device)
            return rho
        for _ in range(RHO_ITERS):
            mid = 0.5 * (lo + hi)
            ok = g(pp, qq, kq, mid) >= 0.0
            hi = torch.where(ok, mid, hi)
            lo = torch.where(ok, lo, mid)
        rho[todo] = hi
    return rho


def _bisect_active_set(p: Tensor, q: Tensor, k: float) -> float:
    """The bisection of :func:`kseq_rho` for one row, summing only the entries whose ratio lies in the bracket.

    With ``r_x = p(x)/q(x)`` (inf where q = 0 < p), an entry with ``r_x <= lo`` contributes ``q - p/rho``
    to ``sum_x (q - p/rho)_+`` and nothing to ``sum_x (p - rho q)_+`` for every rho in the bracket
    (lo, hi]; one with ``r_x > hi`` the reverse.  Their masses are folded into four running sums and the
    entries dropped, so each step costs O(entries still inside the bracket) instead of O(V).  Same g,
    same bisection (upper end after :data:`RHO_ITERS` steps) as the batched path, up to rounding of the
    sums.  p, q: [V] float64; k > 1.
    """
    ratio = p / q  # inf where q = 0 < p; NaN where p = q = 0 (such entries contribute nothing: dropped)
    lo, hi = 1.0, k
    # (boolean-mask indexing is slow on CPU: masks multiply, compaction goes through nonzero())
    below, above = ratio <= lo, ratio > hi
    p_lo, q_lo = float((p * below).sum()), float((q * below).sum())  # masses below / above the bracket
    p_hi, q_hi = float((p * above).sum()), float((q * above).sum())
    idx = ((ratio > lo) & (ratio <= hi)).nonzero().squeeze(-1)
    pa, qa, ra = p.index_select(0, idx), q.index_select(0, idx), ratio.index_select(0, idx)
    small: list[tuple[float, float, float]] | None = None  # the active entries as floats, once few remain
    for _ in range(RHO_ITERS):
        mid = 0.5 * (lo + hi)
        if small is None and ra.numel() <= _ACTIVE_FLOATS:
            small = list(zip(pa.tolist(), qa.tolist(), ra.tolist()))
        if small is None:
            below, above = ra <= lo, ra > hi
            if bool((below | above).any()):
                p_lo += float((pa * below).sum())
                q_lo += float((qa * below).sum())
                p_hi += float((pa * above).sum())
                q_hi += float((qa * above).sum())
                idx = (~(below | above)).nonzero().squeeze(-1)
                pa, qa, ra = pa.index_select(0, idx), qa.index_select(0, idx), ra.index_select(0, idx)
            reject = q_lo - p_lo / mid + float((qa - pa / mid).clamp_min(0.0).sum())
            uncovered = p_hi - mid * q_hi + float((pa - mid * qa).clamp_min(0.0).sum())
        else:
            inside = []
            for px, qx, rx in small:
                if rx <= lo:
                    p_lo, q_lo = p_lo + px, q_lo + qx
                elif rx > hi:
                    p_hi, q_hi = p_hi + px, q_hi + qx
                else:
                    inside.append((px, qx, rx))
            small = inside
            reject = q_lo - p_lo / mid + sum(max(qx - px / mid, 0.0) for px, qx, _ in small)
            uncovered = p_hi - mid * q_hi + sum(max(px - mid * qx, 0.0) for px, qx, _ in small)
        reject = min(max(reject, 0.0), 1.0)
        g = (math.exp(k * math.log(reject)) if reject > 0.0 else 0.0) - max(uncovered, 0.0)
        if g >= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def kseq_acceptance(p: Tensor, q: Tensor, k: Tensor | int, rho: Tensor | None = None) -> Tensor:
    """Probability that K-SEQ returns one of the k drafts: ``1 - (1 - beta(rho*))^k`` (§3.1).

    p, q: [N, V]; k: [N] or int; rho: [N] (computed with :func:`kseq_rho` if omitted) -> [N].
    """
    kk = _as_k(k, p[..., 0]).clamp_min(1.0)
    if rho is None:
        rho = kseq_rho(p, q, kk)
    return _accept_all(_reject(p, q, rho), kk)


def kseq_residual(p: Tensor, q: Tensor, k: Tensor | int, rho: Tensor | None = None) -> Tensor:
    """The K-SEQ residual ``norm(p - min{q, p/rho*} (1 - (1-beta)^k) / beta)`` (§3.1), falling back to p
    where its mass is (numerically) zero (β = 1: never used in exact arithmetic, §3.2 edge cases).

    At beta = 0 the factor (1-(1-beta)^k)/beta is replaced by its limit k (it multiplies min{q, p/rho} = 0).
    p, q: [N, V]; k: [N] or int; rho: [N] (computed if omitted) -> [N, V].
    """
    kk = _as_k(k, p[..., 0]).clamp_min(1.0)
    if rho is None:
        rho = kseq_rho(p, q, kk)
    beta = _beta(p, q, rho)
    accept = _accept_all(_reject(p, q, rho), kk)
    factor = torch.where(beta > 0.0, accept / torch.where(beta > 0.0, beta, torch.ones_like(beta)), kk)
    factor = torch.where(kk == 1.0, torch.ones_like(factor), factor)  # exactly 1 at k = 1 (rho* = 1)
    capped = p / rho.unsqueeze(-1)
    # Tokens with q >= p/rho* carry no residual: p - (p/rho*)·factor is exactly 0 there (rho* beta =
    # 1 - (1-beta)^k), but rounding and the bisection's rho >= rho* leave up to ~1e-10·p(x), which a
    # residual draw could return -- even a rejected draft token (§12.11).  At k = 1 this is SD's (p - q)_+.
    res = torch.where(q >= capped, torch.zeros_like(p), p - q * factor.unsqueeze(-1))
    return normalize_or(res, p)


def kseq_accept_prob(p_x: Tensor, q_x: Tensor, rho: Tensor) -> Tensor:
    """Per-draft test ``min(1, p(x) / (rho q(x)))`` (§3.1); 0 where q(x) = 0 (never drafted).  Same shapes."""
    den = rho * q_x
    ok = den > 0.0
    return torch.where(ok, p_x / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(p_x)).clamp(0.0, 1.0)


# ---------------------------------------------------------------------------------------- the verifier
@register_verifier
class SpecTr(Verifier):
    """``spectr``: K i.i.d. drafts, K-SEQ selection at every depth over the drafts still agreeing with
    the accepted prefix (algorithms.md §3.2).  Per-iteration valid (lossless); K = 1 is SD."""

    name: ClassVar[str] = "spectr"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = True
    prefix_consistent: ClassVar[bool] = True

    # ------------------------------------------------------------------ exact law
    def law(self, block: Block, state: Any = None) -> list[Branch]:
        """Exact law of (sel, tau, extra token) given the drafts, vectorised over B.

        The surviving set after i accepted tokens u is ``S = {s : D_s,<=i = u}``; it is determined by its
        first row f, so the state is (i, f).  ``reach[b, f]`` = Pr(reach depth i with first survivor f).
        At depth i the K-SEQ output law over the class of f is

            pi(y) = sum_{j in S} [prod_{l in S, l < j} (1 - a_l)] a_j 1[D_j,i = y] + prod_{l in S}(1 - a_l) p_res(y),

        with ``a_j = min(1, p(D_j,i) / (rho q(D_j,i)))``.  Mass on a token drafted by some s in S moves to
        the child class (first row = first such s); the rest stops: Branch(sel=f, tau=i), next token ~ pi
        restricted to undrafted tokens.  After L positions every class stops with the bonus law
        ``p[b, f, L]``.  Returns K (L+1) branches ordered by tau, then sel; unreachable ones have prob 0.
        """
        tokens, p, q = block.tokens.long(), block.p, block.q  # [B,K,L], [B,K,L+1,V], [B,K,L,V]
        B, K, L, V = block.B, block.K, block.L, block.V
        dev = p.device
        reach = torch.zeros(B, K, dtype=torch.float64, device=dev)  # [B, K]: first survivor f
        reach[:, 0] = 1.0
        earlier = torch.ones(K, K, dtype=torch.bool, device=dev).tril(-1)  # [s, s']: s' < s
        branches: list[Branch] = []
        for i in range(L):
            # class[b, f, s]: draft s shares draft f's first i tokens.
            cls = (tokens[:, :, None, :i] == tokens[:, None, :, :i]).all(-1)  # [B, K, K]
            k = cls.sum(-1).to(torch.float64)  # [B, K]
            P, Qd = p[:, :, i], q[:, :, i]  # [B, K, V]: laws after row f's prefix
            rho = kseq_rho(P.reshape(B * K, V), Qd.reshape(B * K, V), k.reshape(-1)).view(B, K)
            res = kseq_residual(P.reshape(B * K, V), Qd.reshape(B * K, V), k.reshape(-1),
                                rho.reshape(-1)).view(B, K, V)
            X = tokens[:, :, i]  # [B, K]: token of draft s at depth i
            Xf = X[:, None, :].expand(B, K, K)  # [B, f, s]
            a = kseq_accept_prob(P.gather(-1, Xf), Qd.gather(-1, Xf), rho.unsqueeze(-1))
            a = torch.where(cls, a, torch.zeros_like(a))  # [B, f, s]; non-members are skipped
            surv = torch.cumprod(1.0 - a, -1)  # [B, f, s]: all of s' <= s rejected
            before = torch.cat([torch.ones_like(surv[..., :1]), surv[..., :-1]], -1)  # s' < s rejected
            pi = torch.zeros(B, K, V, dtype=torch.float64, device=dev).scatter_add_(-1, Xf, before * a)
            pi = pi + surv[..., -1:] * res  # [B, f, V]: K-SEQ output law of the class of f
            drafted = torch.zeros(B, K, V, dtype=torch.float64, device=dev).scatter_add_(
                -1, Xf, cls.to(torch.float64)) > 0  # [B, f, V]: y drafted by some s in the class
            stop_w = torch.where(drafted, torch.zeros_like(pi), pi)
            stop_p = (reach * stop_w.sum(-1)).clamp(0.0, 1.0)  # [B, f]
            nxt = normalize_or(stop_w, P)
            for f in range(K):
                branches.append(Branch(stop_p[:, f], torch.full((B,), f, dtype=torch.long, device=dev),
                                       torch.full((B,), i, dtype=torch.long, device=dev), nxt[:, f]))
            # child[b, f, s]: s is the first member of f's class with its token (s heads the child class).
            same = X[:, :, None] == X[:, None, :]  # [B, s', s]
            dup = torch.einsum("bft,bts->bfs", cls.to(torch.float64),
                               (same & earlier.T[None]).to(torch.float64)) > 0
            child = cls & ~dup
            go = torch.where(child, pi.gather(-1, Xf), torch.zeros_like(a))  # [B, f, s]
            reach = (reach.unsqueeze(-1) * go).sum(1).clamp(0.0, 1.0)  # [B, s]
        for f in range(K):
            branches.append(Branch(reach[:, f], torch.full((B,), f, dtype=torch.long, device=dev),
                                   torch.full((B,), L, dtype=torch.long, device=dev), p[:, f, L]))
        return branches

    # ------------------------------------------------------------------ fast sampler
    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Vectorised walk of §3.2 over B (python loops over depth and draft only).

        At each depth only the instances still running are processed (``act``): S is their surviving set,
        f its first row, whose p and q rows serve the whole set.
        """
        tokens, p, q = block.tokens.long(), block.p, block.q
        B, K, L = block.B, block.K, block.L
        dev = p.device
        S = torch.ones(B, K, dtype=torch.bool, device=dev)  # [B, K] surviving set
        alive = torch.ones(B, dtype=torch.bool, device=dev)
        tau = torch.full((B,), L, dtype=torch.long, device=dev)
        sel = torch.zeros(B, dtype=torch.long, device=dev)
        token = torch.zeros(B, dtype=torch.long, device=dev)
        for i in range(L):
            act = alive.nonzero().squeeze(-1)  # [A]
            if act.numel() == 0:
                break
            Sa = S[act]  # [A, K]
            f = Sa.to(torch.int8).argmax(-1)  # [A]: first survivor (argmax returns the first maximum)
            if act.numel() == 1:  # one instance still running (the engine's case): row views, not the ~0.1 ms
                a0, f0 = int(act[0]), int(f[0])  # copies of advanced indexing at V = 49k (same values)
                P, Qd = p[a0, f0, i].unsqueeze(0), q[a0, f0, i].unsqueeze(0)
            else:
                P, Qd = p[act, f, i], q[act, f, i]  # [A, V]
            k = Sa.sum(-1).to(torch.float64)  # [A] >= 1
            rho = kseq_rho(P, Qd, k)  # [A]
            X = tokens[act, :, i]  # [A, K]
            y = torch.full_like(f, -1, dtype=torch.long)
            for j in range(K):  # draft order, duplicates kept; the first accepted draft wins
                x = X[:, j]
                a = kseq_accept_prob(P.gather(-1, x[:, None]).squeeze(-1), Qd.gather(-1, x[:, None]).squeeze(-1), rho)
                hit = Sa[:, j] & (y < 0) & (uniforms.coins[act, j, i] < a)
                y = torch.where(hit, x, y)
            rej = (y < 0).nonzero().squeeze(-1)  # all rejected: draw from the residual
            if rej.numel():
                res = kseq_residual(P[rej], Qd[rej], k[rej], rho[rej])
                y[rej] = categorical(res, uniforms.draws[act[rej], i])
            S_new = Sa & (X == y[:, None])
            stop = ~S_new.any(-1)  # y matches no surviving draft
            done = act[stop]
            tau[done] = i
            sel[done] = f[stop]
            token[done] = y[stop]
            alive[done] = False
            S[act] = S_new
        act = alive.nonzero().squeeze(-1)  # all L positions accepted: bonus token
        if act.numel():
            f = S[act].to(torch.int8).argmax(-1)
            sel[act] = f
            token[act] = categorical(p[act, f, L], uniforms.draws[act, L])
        return Outcome(tau, sel, token)

    # ------------------------------------------------------------------ scalar reference
    @staticmethod
    def _kseq_scalar(p: list[float], q: list[float], k: int) -> tuple[float, list[float]]:
        """rho* and the (unnormalised, clipped) residual at one position, in plain python floats."""

        def beta(rho: float) -> float:  # one draft's acceptance probability
            return min(1.0, sum(min(qx, px / rho) for px, qx in zip(p, q)))

        def reject(rho: float) -> float:  # 1 - beta(rho), summed without cancellation
            return min(1.0, sum(max(qx - px / rho, 0.0) for px, qx in zip(p, q)))

        def g(rho: float) -> float:  # rho beta - 1 + (1 - beta)^k
            return reject(rho) ** k - sum(max(px - rho * qx, 0.0) for px, qx in zip(p, q))

        if g(1.0) >= 0.0:
            rho = 1.0
        else:
            lo, hi = 1.0, float(k)
            for _ in range(RHO_ITERS):
                mid = 0.5 * (lo + hi)
                if g(mid) >= 0.0:
                    hi = mid
                else:
                    lo = mid
            rho = hi
        b = beta(rho)
        factor = (1.0 - reject(rho) ** k) / b if b > 0.0 else float(k)
        if k == 1:
            factor = 1.0  # exactly (rho* = 1): the residual is SD's (p - q)_+
        # no residual on the tokens with q >= p/rho* (exactly 0 at rho*; see kseq_residual)
        res = [0.0 if qx >= px / rho else max(px - qx * factor, 0.0) for px, qx in zip(p, q)]
        return rho, res

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Slow scalar transcription of §3.2, one instance at a time, on the same uniforms."""
        K, L = block.K, block.L
        taus, sels, toks = [], [], []
        for b in range(block.B):
            D = block.tokens[b].tolist()  # K lists of L tokens
            S = list(range(K))
            tau, sel, tok = L, 0, -1
            for i in range(L):
                f = S[0]
                p = block.p[b, f, i].tolist()
                q = block.q[b, f, i].tolist()
                rho, res = self._kseq_scalar(p, q, len(S))
                y = -1
                for j in S:  # draft order, duplicates kept
                    x = D[j][i]
                    a = min(1.0, p[x] / (rho * q[x])) if q[x] > 0 else 0.0
                    if float(uniforms.coins[b, j, i]) < a:
                        y = x
                        break
                if y < 0:
                    mass = sum(res)
                    dist = [r / mass for r in res] if mass > TOL * max(1.0, sum(p)) else p
                    y = int(categorical(torch.tensor(dist, dtype=torch.float64), uniforms.draws[b, i]))
                S_new = [s for s in S if D[s][i] == y]
                if not S_new:
                    tau, sel, tok = i, f, y
                    break
                S = S_new
            if tok < 0:
                sel = S[0]
                tok = int(categorical(block.p[b, sel, L], uniforms.draws[b, L]))
            taus.append(tau)
            sels.append(sel)
            toks.append(tok)
        return Outcome(torch.tensor(taus, dtype=torch.long), torch.tensor(sels, dtype=torch.long),
                       torch.tensor(toks, dtype=torch.long))


__all__ = ["SpecTr", "kseq_rho", "kseq_gap", "kseq_acceptance", "kseq_residual", "kseq_accept_prob", "RHO_ITERS"]
