"""mdv's exact multi-draft block verifier, ``mdbv``: sequential block coupling (algorithms.md §6.5,
proposal 3).

Keep the current law T of the target block, starting from the (effective) target T_0 = p.  For each
i.i.d. draft k = 1..K in order, couple D_k with T by single-draft GBV (§5):

* h along D_k is the GBV rule with joints taken under T_{k-1} (conditionals of the residual chain);
* if D_k's full block is accepted, stop: the bonus token comes from p(.|c, D_k) and no adjustment is
  left;
* otherwise D_k exits at u_k = D_k,<=tau_k, and T is replaced by its residual chain anchored there:
  ``T_k(x|v) ∝ (T_{k-1}(v·x) - Q(v·x))_+`` for v ⪰ u_k (a point mass towards u_k before it).

The accepted prefix is the longest exit point (all exits are prefixes of one another); the extra
token is drawn from ``T_K(.|acc)``; the next iterations inherit the chain as a target adjustment
(:mod:`mdv.verify.adjust`).  Each coupling step preserves "Z ~ T", so the generated text is exactly
target-distributed; at K = 1 this is GBV.  Cost O(K²·L·V) per iteration.

**Fast path** (:meth:`MultiDraftBlockVerification.sample` with one instance on CPU, the engine's case):
the same outcome, bit for bit, with less work.  Every elementwise torch operation gives the same value
per element whatever the tensor's shape, so only the vocabulary *sums* must be taken as the vectorised
path takes them (one row inside a batch of rows, :func:`~mdv.verify._math.row_sum`).  Work skipped, each step exact:

* drafts after a full-block acceptance (their exits are -1 and the bonus ignores the chain);
* exits are read from the deepest test down (h_L needs no vocabulary sum), stopping at the first
  acceptance: tau_k = max{i : eta_i < h_i} does not depend on the shallower tests;
* point masses are not materialised: before its anchor a level is the point mass on the anchor's token,
  and the residual of a point mass is that same point mass (``(r·1 - q(a))_+`` normalised, or the
  fallback to it); a level whose joint ratio T(v)/Q(v) is 0 equals the level below (its residual has no
  mass); only genuine residual steps cost O(V);
* once T_top(D_k,<=i) = 0, every deeper h is 0 (ratio 0, s = 0): the walk along draft k stops;
* the effective target is computed only at the positions a target-adjustment window covers (no copy of
  the whole [K, L+1, V] target); the residual chain for the extra token only when tau < L.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.verify._math import TOL, categorical, last_accepted, last_accepted_law, row_sum, safe_ratio
from mdv.verify.adjust import AdjustedTargetState, advance_state, apply_windows, residual_chain_step
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.gbv import greedy_block_h, log_joints
from mdv.verify.registry import register_verifier

# A level of the in-iteration chain: (draft index j whose exit anchors it, exit depth per instance [B]).
Level = tuple[int, Tensor]


def chain_along(block: Block, p_eff: Tensor, row: Tensor, levels: list[Level],
                upto: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The top level of the residual chain along one draft row per instance.

    row: [B] the row (draft index) walked in each instance; levels: anchors of the levels, oldest first;
    upto: only the first ``upto`` positions (default L) are computed.
    Returns (cond [B, n, V]: T_m(.|row prefix of length i) for i = 0..n-1,
             log_t [B, n+1]: log T_m(row prefix of length i), log_q [B, n+1]: log Q(row prefix)), n = upto.
    """
    B, V = block.B, block.V
    L = block.L if upto is None else upto
    ar = torch.arange(B, device=p_eff.device)
    if row.numel() and bool((row == row[0]).all()):  # one draft for every instance: views, no copies
        r0 = int(row[0])
        toks, p_row, q_row = block.tokens[:, r0], p_eff[:, r0], block.q[:, r0]
    else:
        toks = block.tokens[ar, row]  # [B, L]
        p_row, q_row = p_eff[ar, row], block.q[ar, row]  # [B, L+1, V], [B, L, V]
    if not levels:
        return p_row[:, :L], log_joints(toks[:, :L], p_row), log_joints(toks[:, :L], q_row)
    m = len(levels)
    log_t = [torch.zeros(B, dtype=p_eff.dtype, device=p_eff.device) for _ in range(m + 1)]  # log T_0..T_m
    log_q = torch.zeros(B, dtype=p_eff.dtype, device=p_eff.device)
    conds_top, log_top, log_qs = [], [log_t[m].clone()], [log_q.clone()]
    for i in range(L):
        conds = [p_row[:, i]]
        for j, (draft_j, depth) in enumerate(levels, start=1):
            # past its anchor a level is the residual chain, before it a point mass on the anchor's token;
            # the branch no instance needs is skipped
            past = i >= depth  # [B]
            n_past = int(past.sum())
            if n_past:
                transformed = residual_chain_step(conds[-1], q_row[:, i], [log_t[j - 1]], log_q)[-1]
            if n_past < B:
                anchor = torch.nn.functional.one_hot(block.tokens[:, draft_j, i], V).to(p_eff.dtype)
            conds.append(transformed if n_past == B else anchor if n_past == 0
                         else torch.where(past.unsqueeze(-1), transformed, anchor))
        tok = toks[:, i].unsqueeze(-1)
        flat = ar * V + toks[:, i]  # the same entries as gather(-1, tok), read by a faster 1-D index
        for j in range(m + 1):
            picked = (conds[j].reshape(-1).index_select(0, flat) if conds[j].is_contiguous()
                      else conds[j].gather(-1, tok).squeeze(-1))
            log_t[j] = log_t[j] + picked.log()
        log_q = log_q + q_row[:, i].gather(-1, tok).squeeze(-1).log()
        conds_top.append(conds[m])
        log_top.append(log_t[m].clone())
        log_qs.append(log_q.clone())
    return torch.stack(conds_top, 1), torch.stack(log_top, 1), torch.stack(log_qs, 1)


def draft_h(block: Block, p_eff: Tensor, k: int, levels: list[Level]) -> Tensor:
    """GBV acceptance probabilities of draft k against the current chain T.  -> [B, L]"""
    row = torch.full((block.B,), k, dtype=torch.long, device=p_eff.device)
    cond, log_t, log_q = chain_along(block, p_eff, row, levels)
    return greedy_block_h(log_t, log_q, cond, block.q[:, k])


def extra_token_law(block: Block, p_eff: Tensor, sel: Tensor, tau: Tensor, levels: list[Level]) -> Tensor:
    """Law of the correction token T_top(.|acc) (tau < L) or of the bonus p(.|c, D_sel) (tau = L).  -> [B, V]"""
    ar = torch.arange(block.B, device=p_eff.device)
    t = tau.clamp_max(block.L - 1)
    cond, _, _ = chain_along(block, p_eff, sel, levels, upto=int(t.max()) + 1 if t.numel() else block.L)  # [B, n, V]
    correction = cond[ar, t]
    bonus = p_eff[ar, sel, block.L]
    return torch.where((tau == block.L).unsqueeze(-1), bonus, correction)


# ---------------------------------------------------------------------------------------- fast path (B = 1)
_U = 2.0 ** -53  # unit roundoff of float64


class _EffectiveRows:
    """Rows of the effective target of one call: ``apply_windows`` on the first n+1 positions only, n the
    deepest position a window covers (the same values: the windows are applied position by position on
    [B, K, V] slices); deeper positions are the raw target."""

    def __init__(self, state: Any, block: Block) -> None:
        self.p = block.p
        self.head: Tensor | None = None
        self.n = 0
        if state is not None and state.windows:
            n = min(block.L, max(w.length - w.depth for w in state.windows))
            self.head = apply_windows(state, block.tokens[:, :, :n], block.p[:, :, :n + 1], block.q[:, :, :n])
            self.n = n
        self._rows: dict[int, list[Tensor]] = {}

    def row(self, k: int, i: int) -> Tensor:
        """p_eff[:, k, i]: [1, V]"""
        if k not in self._rows:
            rows = list(self.p[:, k].unbind(1))  # L+1 views [1, V]
            if self.head is not None:
                rows[:self.n] = list(self.head[:, k, :self.n].unbind(1))
            self._rows[k] = rows
        return self._rows[k][i]


#: a level's law at one position: the point mass on a token (an int), or a dense [1, V] vector with a
#: flag "built here by a division" (then its sum is < 2: no need to read it for normalize_or's threshold)
Cond = int | tuple[Tensor, bool]


class _Walk:
    """The residual chain along one draft row of instance 0 (what :func:`chain_along` computes), with
    point masses kept symbolic and no-mass levels aliased to the level below (module docstring).

    tops[i]: the top level's law after the row's prefix of length i; log_top[i], log_q[i]: log T_top and
    log Q of that prefix (Python floats with the same values as chain_along's tensors)."""

    def __init__(self, block: Block, rows: _EffectiveRows, toks: list[list[int]], k: int,
                 anchors: list[tuple[int, int]], upto: int, stop_at_zero: bool) -> None:
        m = len(anchors)
        q_k = block.q[:, k]  # [1, L, V]
        row = toks[k]
        self.tops: list[Cond] = []
        if not m:  # no level: the target itself (chain_along's log_joints, same ops)
            tok = block.tokens[:, k, :upto]
            p_row = torch.cat([rows.row(k, i).unsqueeze(1) for i in range(upto)], 1) \
                if rows.head is not None else rows.p[:, k]  # [1, >= upto, V]
            self.log_top = log_joints(tok, p_row)[0].tolist()
            self.log_q = log_joints(tok, q_k)[0].tolist()
            self.tops = [(rows.row(k, i), False) for i in range(upto)]
            return
        log_t = [0.0] * (m + 1)
        log_q = 0.0
        self.log_top, self.log_q = [0.0], [0.0]
        dtype, dev = block.p.dtype, block.p.device
        for i in range(upto):
            cond: Cond = (rows.row(k, i), False)
            conds = [cond]
            ratios: list[float] | None = None
            for j, (draft_j, depth) in enumerate(anchors, start=1):
                if i < depth:
                    cond = toks[draft_j][i]  # before its anchor: the point mass on the anchor's token
                elif not isinstance(cond, int):
                    if ratios is None:  # T_{j-1}(v)/Q(v) of every level, as residual_chain_step computes it
                        ratios = safe_ratio(torch.tensor(log_t[:m], dtype=dtype, device=dev),
                                            torch.tensor(log_q, dtype=dtype, device=dev)).tolist()
                    if ratios[j - 1] != 0.0:  # else no mass: normalize_or falls back to the level below
                        cond = self._residual(cond, q_k[:, i], ratios[j - 1])
                # the residual of a point mass is the same point mass
                conds.append(cond)
            tok = row[i]
            picked = [float(c == tok) if isinstance(c, int) else float(c[0][0, tok]) for c in conds]
            logs = torch.tensor(picked + [float(q_k[0, i, tok])], dtype=dtype, device=dev).log().tolist()
            for j in range(m + 1):
                log_t[j] = log_t[j] + logs[j]
            log_q = log_q + logs[-1]
            self.tops.append(conds[m])
            self.log_top.append(log_t[m])
            self.log_q.append(log_q)
            if stop_at_zero and log_t[m] == -math.inf:
                break  # T_top is 0 on every longer prefix: every deeper h is 0

    @staticmethod
    def _residual(cond: tuple[Tensor, bool], q: Tensor, ratio: float) -> tuple[Tensor, bool]:
        """``normalize_or(ratio * cond - q, cond)`` (residual_chain_step's level), the same values with one
        buffer: the fallback's sum (in the ``ok`` threshold) is read only when the mass does not settle
        it -- below 2 TOL, or when cond is not a normalised vector built here (whose sum is < 2)."""
        c, normed = cond
        w = torch.mul(c, ratio)
        w.sub_(q).clamp_min_(0.0)
        mass = float(w.sum())  # [1, V]: the same reduction as normalize_or's
        if mass <= TOL:
            return cond  # max(sum, 1) >= 1: not ok
        if not (mass > 2 * TOL and normed):
            if not mass > TOL * max(float(c.sum()), 1.0):
                return cond
        return w.div_(mass), True

    def top_dense(self, i: int, V: int, like: Tensor) -> Tensor:
        """tops[i] as a [1, V] vector."""
        c = self.tops[i]
        if not isinstance(c, int):
            return c[0]
        return torch.nn.functional.one_hot(torch.tensor([c], device=like.device), V).to(like.dtype)


def _draft_exit(block: Block, rows: _EffectiveRows, toks: list[list[int]], k: int, anchors: list[tuple[int, int]],
                coins: list[float]) -> int:
    """The exit ``last_accepted(draft_h(...), coins)`` of draft k against the chain anchored at ``anchors``
    (instance 0), testing from the deepest sub-block down (greedy_block_h's formulas, same floats)."""
    L = block.L
    walk = _Walk(block, rows, toks, k, anchors, L, stop_at_zero=True)
    dtype, dev = block.p.dtype, block.p.device
    r = safe_ratio(torch.tensor(walk.log_top, dtype=dtype, device=dev),
                   torch.tensor(walk.log_q, dtype=dtype, device=dev)).tolist()  # r(u) = T(u)/Q(u)
    r += [0.0] * (L + 1 - len(r))  # the walk stopped where T_top = 0: r = 0 beyond
    n = len(walk.tops)  # prefixes longer than n - 1 have T_top = 0
    if coins[L - 1] < min(r[L], 1.0):  # h_L = min{1, T(D)/Q(D)}
        return L
    q_k = block.q[0, k]  # [L, V]
    bound = 1.0 + 2 * (block.V + 2) * _U  # rounding of a sum of V positive terms, generously
    for i in range(L - 1, 0, -1):
        mid, coin = r[i], coins[i - 1]
        if i >= n:  # T_top(u) = 0: r = 0, s = 0, num = 0, h = 0
            h = 0.0
        elif mid >= 1.0:  # num = den = 1 - s: h = 1 whatever s is
            h = 1.0
        else:
            c = walk.tops[i]
            # h = (r - s)/(1 - s) <= r for 0 <= s, once 1 - s > TOL is sure (s <= r sum_x T(x|u)); the float
            # ops add at most 4 roundings: a coin above r (1 + 16u) rejects without the vocabulary sum
            if coin >= mid * (1.0 + 16 * _U):
                if isinstance(c, int):
                    sure = mid < 1.0 - 4 * TOL
                else:
                    sure = c[1] and mid * 2.0 * bound < 1.0 - 4 * TOL  # a normalised vector: its sum is < 2
                    sure = sure or mid * float(c[0].sum()) * bound < 1.0 - 4 * TOL
                if sure:
                    continue
            if isinstance(c, int):  # a point mass: the other terms are exact zeros
                s = min(mid, float(q_k[i, c]))
            else:  # s(u)/Q(u) = sum_x min(r(u) T(x|u), q(x|u)), one row of the [L-1, V] batch
                s = row_sum(torch.minimum(mid * c[0][0], q_k[i]), L - 1)
            num, den = min(mid, 1.0) - s, 1.0 - s
            h = 1.0 if den <= TOL else 0.0 if num <= TOL else num / max(den, TOL)
            h = min(max(h, 0.0), 1.0)
        if coin < h:
            return i
    return 0


@register_verifier
class MultiDraftBlockVerification(AdjustedTargetState, Verifier):
    """``mdbv``: exact multi-draft greedy block verification by sequential block coupling."""

    name: ClassVar[str] = "mdbv"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = True
    drafts_in_sequence: ClassVar[bool] = True
    stateful: ClassVar[bool] = True

    # ------------------------------------------------------------------ state (AdjustedTargetState)
    def advance(self, state: Any, block: Block, outcome: Outcome) -> Any:
        tau, sel = int(outcome.tau[0]), int(outcome.sel[0])
        path = outcome.emitted(block, 0)
        anchors = None
        if tau < block.L:
            if outcome.exits is None:
                raise ValueError("mdbv outcomes carry the exit point of every scanned draft")
            anchors = [tuple(int(x) for x in block.tokens[0, j, :e]) for j, e in enumerate(outcome.exits[0].tolist())
                       if e >= 0]
        return advance_state(state, path, block.p[0, sel, :tau + 1], block.q[0, sel], block.L, anchors)

    # ------------------------------------------------------------------ the three views
    def law(self, block: Block, state: Any = None) -> list[Branch]:
        return self._law(block, state, with_next=True)[0]

    def acceptance_law(self, block: Block, state: Any = None) -> Tensor:
        """P(tau = t), t = 0..L [B, L+1]: the recursion of :meth:`law` without the next-token law of each
        leaf (a residual-chain walk, O(tau·K·V), per leaf: most of ``law``'s time)."""
        return self.acceptance_laws_upto_K(block, state)[:, -1]

    def acceptance_laws_upto_K(self, block: Block, state: Any = None) -> Tensor:
        """The law of tau with the first K' drafts, for every K' = 1..K, from ONE recursion: [B, K, L+1].

        The drafts are coupled one after the other and the scan of draft k does not look at later drafts,
        so the run with K' drafts is the run with K drafts stopped after draft K' (a full acceptance at
        draft j < K' ends both): the mass at depth K' of the recursion is the K'-draft law."""
        return self._law(block, state, with_next=False)[1]

    def _law(self, block: Block, state: Any, with_next: bool) -> tuple[list[Branch], Tensor]:
        """Every exit sequence of the K drafts, with its probability: the branches (with the next-token
        law when ``with_next``) and the law of tau with the first K' drafts, [B, K, L+1]."""
        p_eff = self.effective_target(block, state)
        B, K, L = block.B, block.K, block.L
        device = p_eff.device
        branches: list[Branch] = []
        tau_laws = torch.zeros(B, K, L + 1, dtype=p_eff.dtype, device=device)

        def recurse(k: int, exits: tuple[int, ...], prob: Tensor, levels: list[Level]) -> None:
            if exits:
                if exits[-1] == L:  # a full acceptance ends the run for every K' >= k
                    tau_laws[:, k - 1:, L] += prob.unsqueeze(-1)
                else:
                    tau_laws[:, k - 1, max(exits)] += prob
            if k == K or (exits and exits[-1] == L):
                if not with_next:
                    return
                tau_val = max(exits)
                sel_val = exits.index(tau_val)
                tau = torch.full((B,), tau_val, dtype=torch.long, device=device)
                sel = torch.full((B,), sel_val, dtype=torch.long, device=device)
                dist = extra_token_law(block, p_eff, sel, tau, levels)
                full = exits + (-1,) * (K - len(exits))
                branches.append(Branch(prob, sel, tau, dist, full))
                return
            exit_law = last_accepted_law(draft_h(block, p_eff, k, levels))  # [B, L+1]
            for e in range(L + 1):
                pe = prob * exit_law[:, e]
                if not (pe > 0).any():
                    continue
                depth = torch.full((B,), e, dtype=torch.long, device=device)
                recurse(k + 1, exits + (e,), pe, levels if e == L else levels + [(k, depth)])

        recurse(0, (), torch.ones(B, dtype=p_eff.dtype, device=device), [])
        return branches, tau_laws

    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Fast sampler, vectorised over B; one instance on CPU takes :meth:`_sample_one` (same outcome)."""
        if block.B == 1 and block.p.device.type == "cpu":
            return self._sample_one(block, uniforms, state)
        p_eff = self.effective_target(block, state)
        B, K, L = block.B, block.K, block.L
        device = p_eff.device
        exits = torch.full((B, K), -1, dtype=torch.long, device=device)
        stopped = torch.zeros(B, dtype=torch.bool, device=device)
        tau = torch.zeros(B, dtype=torch.long, device=device)
        sel = torch.zeros(B, dtype=torch.long, device=device)
        levels: list[Level] = []
        for k in range(K):
            e = last_accepted(draft_h(block, p_eff, k, levels), uniforms.coins[:, k])  # [B]
            e = torch.where(stopped, torch.full_like(e, -1), e)
            exits[:, k] = e
            longer = e > tau  # strictly longer exits replace acc: ties keep the earlier draft
            sel = torch.where(longer, torch.full_like(sel, k), sel)
            tau = torch.where(longer, e, tau)
            stopped = stopped | (e == L)
            # For instances still scanning, every level is a genuine early exit (< L).  Stopped
            # instances (a full block was accepted) get placeholder levels; their outcome is final
            # and the bonus law ignores the chain.
            levels = levels + [(k, torch.where(e < 0, torch.full_like(e, L), e))]
        token = categorical(extra_token_law(block, p_eff, sel, tau, levels), uniforms.draws[torch.arange(B), tau])
        return Outcome(tau, sel, token, exits)

    def _sample_one(self, block: Block, uniforms: Uniforms, state: Any) -> Outcome:
        """:meth:`sample` for B = 1 with only the work the outcome needs (module docstring, "Fast path")."""
        K, L, V = block.K, block.L, block.V
        rows = _EffectiveRows(state, block)
        toks = block.tokens[0].tolist()  # [K][L]
        coins = uniforms.coins[0].tolist()  # [K][L]
        exits = [-1] * K
        tau, sel = 0, 0
        anchors: list[tuple[int, int]] = []  # (draft, exit depth) of every level, oldest first
        for k in range(K):
            e = _draft_exit(block, rows, toks, k, anchors, coins[k])
            exits[k] = e
            if e > tau:  # strictly longer exits replace acc: ties keep the earlier draft
                tau, sel = e, k
            if e == L:
                break
            anchors.append((k, e))
        dev = block.p.device
        ar = torch.arange(1, device=dev)
        if tau == L:
            dist = block.p[ar, sel, L]  # bonus (never covered by a window)
        else:
            walk = _Walk(block, rows, toks, sel, anchors, tau + 1, stop_at_zero=False)
            dist = walk.top_dense(tau, V, block.p)
        tau_t = torch.tensor([tau], dtype=torch.long, device=dev)
        token = categorical(dist, uniforms.draws[ar, tau_t])
        return Outcome(tau_t, torch.tensor([sel], dtype=torch.long, device=dev), token,
                       torch.tensor([exits], dtype=torch.long, device=dev))

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Scalar transcription: explicit residual-chain conditionals per prefix, one instance at a time."""
        p_all = self.effective_target(block, state)
        K, L, V = block.K, block.L, block.V
        taus, sels, tokens, all_exits = [], [], [], []
        for b in range(block.B):
            drafts = [tuple(int(x) for x in block.tokens[b, k]) for k in range(K)]
            # conditionals of the target and draft along every draft prefix of this instance
            p_at = {drafts[k][:i]: p_all[b, k, i] for k in range(K) for i in range(L + 1)}
            q_at = {drafts[k][:i]: block.q[b, k, i] for k in range(K) for i in range(L)}
            chain: list[tuple[int, ...]] = []  # exit anchors of the levels, oldest first

            def cond(level: int, v: tuple[int, ...]) -> Tensor:
                """T_level(.|v), v a prefix of some draft (|v| < L)."""
                if level == 0:
                    return p_at[v]
                u = chain[level - 1]
                if len(v) < len(u):
                    return torch.nn.functional.one_hot(torch.tensor(u[len(v)]), V).to(torch.float64)
                below = cond(level - 1, v)
                w = torch.clamp(joint(level - 1, v) * below - joint_q(v) * q_at[v], min=0.0)
                return w / w.sum() if float(w.sum()) > 0 else below

            def joint(level: int, v: tuple[int, ...]) -> float:
                out = 1.0
                for i in range(len(v)):
                    out *= float(cond(level, v[:i])[v[i]])
                return out

            def joint_q(v: tuple[int, ...]) -> float:
                out = 1.0
                for i in range(len(v)):
                    out *= float(q_at[v[:i]][v[i]])
                return out

            tau, sel, exits = 0, 0, [-1] * K
            for k in range(K):
                d, top = drafts[k], len(chain)
                h = []
                for i in range(1, L + 1):
                    u = d[:i]
                    T_u, Q_u = joint(top, u), joint_q(u)
                    if i == L:
                        h.append(min(1.0, T_u / Q_u))
                        continue
                    s = float(torch.minimum(T_u * cond(top, u), Q_u * q_at[u]).sum())
                    num, den = min(T_u, Q_u) - s, Q_u - s
                    h.append(1.0 if den <= 1e-12 * Q_u else 0.0 if num <= 1e-12 * Q_u else min(1.0, num / den))
                e = 0
                for i in range(1, L + 1):
                    if float(uniforms.coins[b, k, i - 1]) < h[i - 1]:
                        e = i
                exits[k] = e
                if e > tau:
                    tau, sel = e, k
                if e == L:
                    break
                chain.append(d[:e])
            acc = drafts[sel][:tau]
            dist = p_at[acc] if tau == L else cond(len(chain), acc)
            tokens.append(int(categorical(dist, uniforms.draws[b, tau])))
            taus.append(tau)
            sels.append(sel)
            all_exits.append(exits)
        return Outcome(torch.tensor(taus), torch.tensor(sels), torch.tensor(tokens), torch.tensor(all_exits))
