"""Greedy multi-path block verification, ``mpbv`` (Thomas & Pal, arXiv 2602.16961; the public artifact is
``TreeVerifier.gbv_verify`` / ``compute_skew`` in ``Rmuk655/Distill-Spec-Research/verifiers/verifier.py``).
Letters of algorithms.md §1: p = target, q = draft, K i.i.d. draft blocks D_1..D_K of length L.

**Ranking.**  At a prefix v every token gets the key ``kappa_v(x) = (r_v(x), -x)`` with
``r_v(x) = min{1, p(x|c,v)/q(x|c,v)}`` (r = 1 where q = 0 < p, r = 0 where p = 0: such tokens are never
drafted and carry no q-mass, so their place in the order is immaterial).  Keys are distinct, so
``x ≺_v y  iff  kappa_v(x) < kappa_v(y)`` is a strict total order on Omega: ties in r -- every token
with p >= q has r = 1 -- are broken towards the *smaller* token id, the same rule in the selection and
in the law below.  The lexicographic order on Omega^L compares two blocks at their first differing
position i with ≺ at their common prefix.

**Selection.**  The kept path is ``M = max(D_1..D_K)`` in that order: walk the depths keeping the set S
of drafts equal to the current maximum so far (initially all K) and keep those whose token at depth i
is the ≺-largest among S.  Ranks at depth i are read from the p and q rows of the first draft of S
(SpecTr's convention); ``sel`` is the first draft equal to M, and the law of M and BV below use the
kept draft's own rows.  All of S share the prefix, so in exact arithmetic their rows are equal and the
choice is immaterial; where batched rows differ (rounding), the kept draft's q is the law its tokens
were drawn from, so q > 0 at every kept token (Block.validate).  The selection uses no randomness.

**The law of M ("skew").**  Cylinders ``cyl(u) = {s : u ⪯ s}`` are intervals of the lexicographic order.
Let ``Q(u)`` be the draft mass of cyl(u) and ``A(u)`` the draft mass of the blocks *below* cyl(u); then
``A(∅) = 0``, ``Q(∅) = 1`` and, with ``c_u(x) = sum_{x' ≺_u x} q(x'|c,u)`` and ``C_u(x) = c_u(x) + q(x|c,u)``,

    A(u·x) = A(u) + Q(u) c_u(x),       Q(u·x) = Q(u) q(x|c,u).

M lies in cyl(u) iff no draft lies above cyl(u) and not all lie below it:
``Pr(u ⪯ M) = (A(u) + Q(u))^K - A(u)^K``.  Hence the conditionals of M, the law BV must be given, are

    q_sel(x|u) = Pr(u·x ⪯ M) / Pr(u ⪯ M)
               = [ (A + Q C_u(x))^K - (A + Q c_u(x))^K ] / [ (A + Q)^K - A^K ]          (A = A(u), Q = Q(u))
               = q(x|c,u) · N_K(X_x, Y_x) / N_K(1, alpha),
    N_K(X, Y) = sum_{j=0..K-1} X^j Y^(K-1-j),   X_x = alpha + rho C_u(x),  Y_x = alpha + rho c_u(x),

with the scale-free ``alpha = A/(A+Q)``, ``rho = Q/(A+Q)`` (alpha + rho = 1), updated along M by

    alpha(u·x) = (alpha + rho c_u(x)) / (alpha + rho C_u(x)),    rho(u·x) = rho q(x|c,u) / (alpha + rho C_u(x)).

The difference-of-powers form has no cancellation (all terms are >= 0) and the recursions stay in [0, 1]
(no underflow of joints on long blocks); log q_sel at the kept token, which the BV weights divide by, is
taken in log space (``N_K`` by logsumexp), since a kept token can have q_sel below float64's range.
K = 1 gives N = 1 and q_sel = q exactly.  **What q_sel needs**: at each prefix u of M, the full rows
q(.|c,u) and p(.|c,u) (for the ranking) -- the kept draft's own rows -- and the two scalars carried down
M.  Off-path laws are never needed: the cylinder masses of the one-token extensions of u are
``Q(u)·q(x|c,u)`` and their positions in the order come from u's ranking.  ``tests/test_verify_mpbv.py``
checks q_sel against a brute-force enumeration of the lexicographic maximum of K i.i.d. paths.

**Verification.**  Block verification (Sun et al., ICLR 2025; algorithms.md §4, :mod:`mdv.verify.bv`) of
the single draft M with q replaced by q_sel: ``w_0 = 1``, ``w_i = min{1, w_{i-1} p(M_i|c,M_<i) /
q_sel(M_i|M_<i)}`` (log space), ``h_i = A_i / (A_i + 1 - w_i)`` with ``A_i = sum_x (w_i p(x|c,M_<=i) -
q_sel(x|M_<=i))_+`` for i < L, ``h_L = w_L``, tau = the last i with ``eta_i < h_i`` (coins
``uniforms.coins[:, 0]``), extra token ``norm((w_tau p(.|c,M_<=tau) - q_sel(.|M_<=tau))_+)`` or the
bonus ``p(.|c,M)`` at tau = L (draws ``uniforms.draws[:, tau]``).  E[tau] = sum_i E_M[w_i(M)].

**Why it is lossless (per iteration).**  BV's Theorem 1 (Sun et al.) holds for *any* draft law: if the
block D is distributed as some Q' and the verifier is handed the exact conditionals q'(.|D_<i) along D,
the emitted string (accepted prefix, extra token) followed by target sampling is target-distributed.
Here D = M has law Q_sel, whose conditionals are exactly q_sel above (a function of the prefix only, not
of the other drafts), and BV's coins and draws are independent of the drafts.  So conditionally on M the
output law is BV's, and averaging over M ~ Q_sel gives the target law.  The verifier keeps no state, so
every iteration starts afresh and the whole sequence is target-distributed (checked by enumeration in
``tests/test_exactness.py``).  K = 1 is ``bv`` exactly (same arithmetic, same coins).

**The released tie rule** (``mpbv(tie_rule="released")``, ``lossless = False``).  The artifact walks to the
*first* child (draft order) with the largest ratio, while ``compute_skew`` builds its CDF with a stable
ascending argsort of the ratios, i.e. ranks tied tokens by *increasing* token id.  Whenever two drafted
tokens tie in r (common: every token with p >= q has r = 1), the walk's choice is not the maximum of the
order the skew describes, so BV is handed conditionals that are not the law of the kept path: the oracle
measures a TV of 1e-3 to 1e-1 from the target on 3-token toys (``experiments/mpbv_tie_rule.py``).  This
option reproduces exactly that tie handling (selection: first draft of S with the largest r; law: keys
``(r, +x)``); the artifact's other numerical guards (``p/(q + eps)``, ``clamp(A, 1e-8)``, BV's ``+1e-10``)
are not reproduced, so the measured bias is the tie rule's alone.

**Cost.**  Selection O(B·K·L); the scalars along M (alpha, rho, log q_sel(M_i): one masked O(V) sum per
depth, no sort) O(B·L·V); a full row q_sel(.|M_<i) needs the rank of every token, one sort of V, plus
O(K·V) for N_K.  :meth:`law` builds all L rows: O(B·L·V·(log V + K)).  :meth:`sample` reads the tests
from the deepest down (tau = max{i : eta_i < h_i} does not depend on shallower tests; h_L = w_L needs no
row) and builds a row only for the instances still undecided at that depth, reusing it for the extra
token: L - tau rows per instance.  No enumeration of blocks or draft tuples anywhere.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.verify._math import categorical, last_accepted_law, normalize_or
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.bv import h_and_residuals, h_middle, scalar_decision, weights_from_log_ratio
from mdv.verify.registry import register_verifier
from mdv.verify.sd import token_probs

#: ``exact``: keys (r, -token id) in the selection and in the law (lossless); ``released``: the artifact's
#: selection (first draft with the largest r) with its law's keys (r, +token id) (biased on ties).
TIE_RULES = ("exact", "released")


# ---------------------------------------------------------------------------------------- math helpers
def ratio_scores(p: Tensor, q: Tensor) -> Tensor:
    """``r(x) = min{1, p(x)/q(x)}``, with 1 where q = 0 < p and 0 where p = 0.  p, q: [..., V] -> [..., V]"""
    pos = q > 0.0
    r = torch.where(pos, p / torch.where(pos, q, torch.ones_like(q)), torch.ones_like(p)).clamp_max(1.0)
    return torch.where(p > 0.0, r, torch.zeros_like(r))


def rank_order(r: Tensor, tie_rule: str = "exact") -> Tensor:
    """The tokens from the lowest to the highest rank: ascending keys (r, -x) (``exact``) or (r, x)
    (``released``, the artifact's stable argsort).  r: [..., V] -> [..., V] int64"""
    if tie_rule == "released":
        return torch.sort(r, dim=-1, stable=True).indices
    V = r.shape[-1]
    # a stable sort of the reversed vector keeps tied entries in decreasing original id
    return (V - 1) - torch.sort(r.flip(-1), dim=-1, stable=True).indices


def below_mass(p: Tensor, q: Tensor, tie_rule: str = "exact") -> tuple[Tensor, Tensor, Tensor]:
    """The draft mass ranked strictly below / up to each token at one prefix.

    p, q: [..., V].  Returns (c [..., V]: ``c(x) = sum_{x' ≺ x} q(x')``, C [..., V]: ``c(x) + q(x)``,
    total [...]: ``sum_x q(x)``, the top of the cylinder)."""
    order = rank_order(ratio_scores(p, q), tie_rule)  # [..., V]
    qs = q.gather(-1, order)  # [..., V] in rank order
    cum = qs.cumsum(-1)  # [..., V] inclusive
    excl = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], -1)
    c = torch.empty_like(q).scatter_(-1, order, excl)
    C = torch.empty_like(q).scatter_(-1, order, cum)
    return c, C, cum[..., -1]


def power_sum(X: Tensor, Y: Tensor, K: int) -> Tensor:
    """``N_K(X, Y) = sum_{j=0..K-1} X^j Y^(K-1-j)`` (= (X^K - Y^K)/(X - Y)) by the recursion
    ``N_1 = 1``, ``N_{m+1} = X N_m + Y^m``.  X, Y broadcastable, >= 0."""
    if K == 1:
        return torch.ones_like(X + Y)
    N, Ypow = X + Y, Y  # N_2 (the same bits as X * 1 + 1 * Y)
    for _ in range(K - 2):
        Ypow = Ypow * Y
        N = X * N + Ypow
    return N


def log_power_sum(X: Tensor, Y: Tensor, K: int) -> Tensor:
    """``log N_K(X, Y)`` by logsumexp over j (no underflow); X > 0, Y >= 0.  Same shapes -> same shape."""
    if K == 1:
        return torch.zeros_like(X)
    j = torch.arange(K, dtype=X.dtype, device=X.device)  # [K]
    lx, ly = X.log().unsqueeze(-1), Y.log().unsqueeze(-1)  # [..., 1]
    terms = torch.where(j > 0, j * lx, torch.zeros_like(j * lx)) + \
        torch.where(j < K - 1, (K - 1 - j) * ly, torch.zeros_like(j * ly))  # 0·log 0 = 0
    return torch.logsumexp(terms, -1)


def select_path(block: Block, tie_rule: str = "exact") -> tuple[Tensor, Tensor]:
    """The lexicographic maximum of the K drafts (ranks at depth i from the rows of the first draft of S).

    Returns (sel [B]: the first draft equal to the maximum, heads [B, L+1]: the first draft of the set S
    of drafts equal to the maximum's first i tokens, i = 0..L, whose rows rank depth i; heads[:, L] = sel).
    """
    tokens, p, q = block.tokens.long(), block.p, block.q
    B, K, L = block.B, block.K, block.L
    ar = torch.arange(B, device=p.device)
    alive = torch.ones(B, K, dtype=torch.bool, device=p.device)  # [B, K]: S
    heads = []
    for i in range(L):
        f = alive.to(torch.int8).argmax(-1)  # [B]: first survivor (argmax returns the first maximum)
        heads.append(f)
        if K == 1:
            continue
        X = tokens[:, :, i]  # [B, K]
        r = ratio_scores(p[ar, f, i].gather(-1, X), q[ar, f, i].gather(-1, X))  # [B, K]
        best = torch.where(alive, r, torch.full_like(r, -1.0)).amax(-1, keepdim=True)  # [B, 1]
        cand = alive & (r == best)  # [B, K]
        if tie_rule == "released":  # the first draft (in draft order) with the largest ratio
            top = X.gather(-1, cand.to(torch.int8).argmax(-1, keepdim=True))
        else:  # ties in r go to the smallest token id
            top = torch.where(cand, X, torch.full_like(X, block.V)).amin(-1, keepdim=True)
        alive = alive & (X == top)
    heads.append(alive.to(torch.int8).argmax(-1))
    return heads[-1], torch.stack(heads, -1)


def path_scalars(path: Tensor, p_rows: Tensor, q_rows: Tensor, K: int,
                 tie_rule: str = "exact") -> tuple[Tensor, Tensor, Tensor]:
    """The scalars of the law of the maximum along the kept path M, in O(V) per depth (no sort).

    path: [B, L]; p_rows: [B, >=L, V], q_rows: [B, L, V] the target / draft laws after M_<i.  At each depth
    the mass ranked below M_i is one masked sum, ``c(M_i) = sum_x q(x) [kappa(x) < kappa(M_i)]``.
    Returns (alpha [B, L], rho [B, L]: alpha(M_<i), rho(M_<i); log_q_tok [B, L]: log q_sel(M_i|M_<i),
    = log q + log N_K(X, Y) - log N_K(alpha + rho·sum q, alpha), in log space).  K = 1: alpha = 0, rho = 1,
    log_q_tok = log q(M_i) exactly.
    """
    B, L = path.shape
    dt, dev = q_rows.dtype, q_rows.device
    path = path.long()
    log_q_tok = token_probs(q_rows, path).log()  # [B, L]
    if K == 1:
        return torch.zeros(B, L, dtype=dt, device=dev), torch.ones(B, L, dtype=dt, device=dev), log_q_tok
    ids = torch.arange(q_rows.shape[-1], device=dev)  # [V]
    alpha = torch.zeros(B, dtype=dt, device=dev)  # A / (A + Q)
    rho = torch.ones(B, dtype=dt, device=dev)  # Q / (A + Q)
    alphas, rhos, logs = [], [], []
    for i in range(L):
        qi, x = q_rows[:, i], path[:, i:i + 1]  # [B, V], [B, 1]
        r = ratio_scores(p_rows[:, i], qi)  # [B, V]
        r_x = r.gather(-1, x)  # [B, 1]
        lower_id = ids > x if tie_rule == "exact" else ids < x  # the tied tokens ranked below M_i
        below = (r < r_x) | ((r == r_x) & lower_id)  # [B, V]
        c_x = torch.where(below, qi, torch.zeros_like(qi)).sum(-1)  # [B]
        q_x = qi.gather(-1, x).squeeze(-1)
        X, Y = alpha + rho * (c_x + q_x), alpha + rho * c_x  # [B]
        alphas.append(alpha)
        rhos.append(rho)
        logs.append(log_q_tok[:, i] + log_power_sum(X, Y, K) - log_power_sum(alpha + rho * qi.sum(-1), alpha, K))
        alpha, rho = Y / X, rho * q_x / X
    return torch.stack(alphas, 1), torch.stack(rhos, 1), torch.stack(logs, 1)


def skew_rows(p: Tensor, q: Tensor, alpha: Tensor, rho: Tensor, K: int, tie_rule: str = "exact") -> Tensor:
    """The full rows ``q_sel(x|u) = q(x|u) N_K(alpha + rho C_u(x), alpha + rho c_u(x)) / N_K(alpha + rho, alpha)``
    at prefixes u of the kept path (one sort of V per row).  p, q: [..., V]; alpha, rho: [...] -> [..., V]."""
    if K == 1:  # N = 1: q_sel = q exactly
        return q
    c, C, total = below_mass(p, q, tie_rule)  # [..., V], [..., V], [...]
    a, r = alpha.unsqueeze(-1), rho.unsqueeze(-1)
    D = power_sum(alpha + rho * total, alpha, K)  # [...]: alpha + rho = 1 for a normalised row
    return q * power_sum(a + r * C, a + r * c, K) / D.unsqueeze(-1)


# ---------------------------------------------------------------------------------------- the verifier
@register_verifier
class MultiPathBlockVerification(Verifier):
    """``mpbv``: keep the lexicographic maximum of the K drafts under the ratio ranking, then block
    verification against the exact law of that maximum (module docstring).  Lossless; K = 1 is ``bv``."""

    name: ClassVar[str] = "mpbv"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = True
    # BV's decision at depth i depends on deeper rows, and the kept path on every draft: neither flag holds.
    prefix_consistent: ClassVar[bool] = False
    drafts_in_sequence: ClassVar[bool] = False

    def __init__(self, tie_rule: str = "exact") -> None:
        if not isinstance(tie_rule, str) or tie_rule not in TIE_RULES:
            raise InvalidInputError(
                f"mpbv option tie_rule must be one of {', '.join(map(repr, TIE_RULES))}; got {tie_rule!r}")
        self.tie_rule = tie_rule
        if tie_rule == "released":
            self.lossless = False  # type: ignore[misc]  # measured by the oracle: TV > 1e-3 on tied toys
        super().__init__()

    # ------------------------------------------------------------------ math
    def kept_path(self, block: Block) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(sel [B], path [B, L], p and q along it [B, L+1, V], [B, L, V], alpha, rho [B, L],
        log q_sel(M_i) [B, L], BV's weights w [B, L+1])."""
        sel, _ = select_path(block, self.tie_rule)  # [B]
        ar = torch.arange(block.B, device=block.p.device)
        # the kept draft's own rows: p(.|c, M_<i) and the q its tokens were drawn from
        p_rows, q_rows = block.p[ar, sel], block.q[ar, sel]  # [B, L+1, V], [B, L, V]
        path = block.tokens[ar, sel].long()  # [B, L]
        alpha, rho, log_q_tok = path_scalars(path, p_rows, q_rows, block.K, self.tie_rule)
        w = weights_from_log_ratio(token_probs(p_rows[:, :-1], path).log() - log_q_tok)  # [B, L+1]
        return sel, path, p_rows, q_rows, alpha, rho, log_q_tok, w

    def selected(self, block: Block) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(sel [B], path [B, L], p along the path [B, L+1, V], q_sel [B, L, V], log q_sel(M_i) [B, L])."""
        sel, path, p_rows, q_rows, alpha, rho, log_q_tok, _ = self.kept_path(block)
        return sel, path, p_rows, skew_rows(p_rows[:, :-1], q_rows, alpha, rho, block.K, self.tie_rule), log_q_tok

    # ------------------------------------------------------------------ the three views
    def law(self, block: Block, state: Any = None) -> list[Branch]:
        """The kept path is a function of the drafts; given it, BV's law: L+1 branches by tau."""
        sel, _, p, q_rows, alpha, rho, _, w = self.kept_path(block)
        q_sel = skew_rows(p[:, :-1], q_rows, alpha, rho, block.K, self.tie_rule)  # [B, L, V]
        h, scaled = h_and_residuals(w, p, q_sel)
        dists = torch.cat([normalize_or(scaled, p[:, :-1]), p[:, -1:]], 1)  # [B, L+1, V]
        prob = last_accepted_law(h)  # [B, L+1]
        zeros = torch.zeros(block.B, dtype=torch.long, device=h.device)
        return [Branch(prob[:, i], sel, zeros + i, dists[:, i]) for i in range(block.L + 1)]

    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """tau = max{i : eta_i < h_i} read from the deepest test down: h_L = w_L needs no row of q_sel, and
        the (sorted) row at depth i is built only for the instances still undecided there, then reused for
        the extra token.  The same values as :meth:`law`'s (elementwise operations on the same rows)."""
        sel, _, p, q_rows, alpha, rho, _, w = self.kept_path(block)
        B, L, K = block.B, block.L, block.K
        coins = uniforms.coins[:, 0]  # [B, L]
        tau = torch.where(coins[:, L - 1] < w[:, L], L, -1)  # [B]; -1: undecided
        res = torch.zeros(B, block.V, dtype=p.dtype, device=p.device)  # [B, V] residual at tau (tau < L)
        for i in range(L - 1, -1, -1):
            und = (tau < 0).nonzero().squeeze(-1)
            if und.numel() == 0:
                break
            q_sel = skew_rows(p[und, i], q_rows[und, i], alpha[und, i], rho[und, i], K, self.tie_rule)  # [n, V]
            scaled = w[und, i, None] * p[und, i] - q_sel  # [n, V]
            if i > 0:
                acc = coins[und, i - 1] < h_middle(scaled.clamp_min(0.0).sum(-1), w[und, i])
                und, scaled = und[acc], scaled[acc]
            tau[und] = i
            res[und] = scaled
        rows = torch.arange(B, device=p.device)
        dist = torch.where((tau == L).unsqueeze(-1), p[rows, tau], normalize_or(res, p[rows, tau.clamp_max(L - 1)]))
        token = categorical(dist, uniforms.draws[rows, tau])
        return Outcome(tau, sel, token)

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Scalar transcription: pairwise selection, plain joints A(u), Q(u) for the law of the maximum
        (divided by A + Q before the powers), then BV's scalar steps."""
        K, L, V = block.K, block.L, block.V
        released = self.tie_rule == "released"

        def ratio(pr: list[float], qr: list[float], x: int) -> float:
            if pr[x] <= 0.0:
                return 0.0
            return 1.0 if qr[x] <= 0.0 else min(1.0, pr[x] / qr[x])

        def key(pr: list[float], qr: list[float], x: int) -> tuple[float, int]:
            return (ratio(pr, qr, x), x if released else -x)

        taus, sels, toks = [], [], []
        for b in range(block.B):
            D = block.tokens[b].tolist()
            S = list(range(K))
            for i in range(L):  # selection: ranks from the first survivor's rows
                f = S[0]
                pr, qr = block.p[b, f, i].tolist(), block.q[b, f, i].tolist()
                if released:
                    best = max(ratio(pr, qr, D[s][i]) for s in S)
                    y = next(D[s][i] for s in S if ratio(pr, qr, D[s][i]) == best)
                else:
                    y = max((D[s][i] for s in S), key=lambda x: key(pr, qr, x))
                S = [s for s in S if D[s][i] == y]
            sel = S[0]
            M = D[sel]
            # the law of the maximum along M, and BV's weights
            A, Qj = 0.0, 1.0
            w, qsel_rows = [1.0], []
            for i in range(L):
                pr, qr = block.p[b, sel, i].tolist(), block.q[b, sel, i].tolist()
                if K == 1:
                    qs = qr
                else:
                    c, run = [0.0] * V, 0.0
                    for x in sorted(range(V), key=lambda x: key(pr, qr, x)):  # lowest rank first
                        c[x] = run
                        run += qr[x]
                    F = A + Qj * run
                    a, s = A / F, Qj / F

                    def N(X: float, Y: float) -> float:
                        return sum(X ** j * Y ** (K - 1 - j) for j in range(K))

                    den = N(A / F + Qj * run / F, a)
                    qs = [qr[x] * N(a + s * (c[x] + qr[x]), a + s * c[x]) / den for x in range(V)]
                    A += Qj * c[M[i]]
                Qj *= qr[M[i]]
                qsel_rows.append(qs)
                x = M[i]
                ratio_x = (pr[x] / qs[x] if qs[x] > 0.0 else math.inf) if pr[x] > 0.0 else 0.0
                w.append(0.0 if w[-1] == 0.0 else min(1.0, w[-1] * ratio_x))  # (0·inf: a kept q_sel below range)
            q_path = torch.stack([torch.tensor(r, dtype=torch.float64) for r in qsel_rows])  # [L, V]
            tau, token = scalar_decision(w, block.p[b, sel], q_path, uniforms.coins[b, 0], uniforms.draws[b])
            toks.append(token)
            taus.append(tau)
            sels.append(sel)
        return Outcome(torch.tensor(taus, dtype=torch.long), torch.tensor(sels, dtype=torch.long),
                       torch.tensor(toks, dtype=torch.long))


__all__ = ["MultiPathBlockVerification", "TIE_RULES", "ratio_scores", "rank_order", "below_mass", "power_sum",
           "log_power_sum", "select_path", "path_scalars", "skew_rows"]
