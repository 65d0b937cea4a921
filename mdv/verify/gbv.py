"""Greedy block verification, GBV, with the target adjustment (algorithms.md §5).

Joints measured from the block start along the draft D under the (effective) target P and the draft
Q; ``a(u) = min{P(u), Q(u)}``, ``s(u) = sum_x a(u·x)``.  For i < L

    h_i = (a(u) - s(u)) / (Q(u) - s(u)),   u = D_<=i          (1 if the denominator vanishes),

``h_L = min{1, P(D)/Q(D)}``, and tau = max{i : eta_i < h_i}.  This is the unique rule with
``Pr(tau >= i | D_<=i) = min{1, P(D_<=i)/Q(D_<=i)}``, so ``E[tau] = sum_t sum_u min(P(u), Q(u))``, the
greedy LP optimum at K = 1 (§7.2).  The extra token is ``norm((P(u·x) - Q(u·x))_+)`` at u = D_<=tau, or
``p(.|c, D)`` when tau = L.

GBV alone is **not** distribution-preserving: after an early exit the rest of the old window must
follow the residual chain (:mod:`mdv.verify.adjust`).  With ``adjust_target=False`` the verifier
skips that step and is biased (the BV-paper example gives the first-two-token law
(1/9, 2/9, 1/3, 1/3) instead of (1/9, 2/9, 2/9, 4/9)); that variant reports ``lossless = False``.

All quantities are computed scale-free: dividing by Q(u) turns them into functions of the ratio
r(u) = P(u)/Q(u), obtained from log-joints, so long blocks do not underflow.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.verify._math import TOL, categorical, last_accepted, last_accepted_law, normalize_or, safe_ratio
from mdv.verify.adjust import AdjustedTargetState, advance_state
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.registry import register_verifier
from mdv.verify.sd import token_probs


def log_joints(tokens: Tensor, dist: Tensor) -> Tensor:
    """Log joint probabilities of every prefix of ``tokens`` under ``dist``.

    tokens: [..., L]; dist: [..., >=L, V] conditionals along the tokens -> [..., L+1] (entry 0 is log 1).
    """
    L = tokens.shape[-1]
    logs = token_probs(dist[..., :L, :], tokens).log()  # [..., L]
    return torch.cat([torch.zeros_like(logs[..., :1]), logs.cumsum(-1)], -1)


def greedy_block_h(log_p: Tensor, log_q: Tensor, target: Tensor, q: Tensor) -> Tensor:
    """GBV acceptance probabilities h_1..h_L along one draft.

    log_p, log_q: [..., L+1] log joints of the draft's prefixes under the target law and the draft law;
    target, q: [..., L, V] conditionals after each prefix of length 0..L-1 (only 1..L-1 are used).
    Returns h: [..., L].
    """
    r = safe_ratio(log_p, log_q)  # [..., L+1] r(u) = P(u)/Q(u)
    s = torch.minimum(r[..., 1:-1].unsqueeze(-1) * target[..., 1:, :], q[..., 1:, :]).sum(-1)  # s(u)/Q(u)
    return greedy_h_of(r, s)


def greedy_h_of(r: Tensor, s: Tensor) -> Tensor:
    """:func:`greedy_block_h` from its two inputs: r [..., L+1] = P(u)/Q(u) along the draft and s [..., L-1] =
    s(u)/Q(u) at its prefixes of length 1..L-1 (for a caller that sums s(u) its own way).  Returns h: [..., L]."""
    mid = r[..., 1:-1]  # u of length 1..L-1
    num = mid.clamp_max(1.0) - s
    den = 1.0 - s
    h_mid = torch.where(den <= TOL, torch.ones_like(den),
                        torch.where(num <= TOL, torch.zeros_like(num), num / den.clamp_min(TOL)))
    return torch.cat([h_mid.clamp(0.0, 1.0), r[..., -1:].clamp_max(1.0)], -1)


def greedy_residual(ratio: Tensor, target: Tensor, q: Tensor) -> Tensor:
    """``norm((P(u·x) - Q(u·x))_+) = norm((r(u) p(x|u) - q(x|u))_+)``; ratio: [...], target, q: [..., V]."""
    return normalize_or(ratio.unsqueeze(-1) * target - q, target)


@register_verifier
class GreedyBlockVerification(AdjustedTargetState, Verifier):
    """``gbv``: single-draft greedy block verification with the target adjustment (§5)."""

    name: ClassVar[str] = "gbv"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = False
    stateful: ClassVar[bool] = True

    def __init__(self, adjust_target: bool = True) -> None:
        if not isinstance(adjust_target, (bool, np.bool_)):
            raise InvalidInputError(f"gbv option adjust_target must be True or False; got {adjust_target!r}")
        self.adjust_target = bool(adjust_target)
        if not self.adjust_target:
            self.lossless = False  # type: ignore[misc]  # measured: TV 1/9 on the BV-paper example
        super().__init__()

    # ------------------------------------------------------------------ state (AdjustedTargetState)
    def advance(self, state: Any, block: Block, outcome: Outcome) -> Any:
        if not self.adjust_target:
            return state
        tau, sel = int(outcome.tau[0]), int(outcome.sel[0])
        path = outcome.emitted(block, 0)
        anchors = None if tau == block.L else [tuple(path[:tau])]
        return advance_state(state, path, block.p[0, sel, :tau + 1], block.q[0, sel], block.L, anchors)

    # ------------------------------------------------------------------ math
    def h_and_dists(self, block: Block, state: Any) -> tuple[Tensor, Tensor]:
        """h_1..h_L [B, L] and the extra-token laws after tau = 0..L [B, L+1, V], along draft 0."""
        h, p_eff, log_p, log_q = self._h(block, state)
        q = block.q[:, 0]
        residuals = greedy_residual(safe_ratio(log_p[:, :-1], log_q[:, :-1]), p_eff[:, :-1], q)  # [B, L, V]
        return h, torch.cat([residuals, p_eff[:, -1:]], 1)

    def _h(self, block: Block, state: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """h [B, L], the effective target along draft 0 [B, L+1, V] and the log joints log P, log Q [B, L+1]."""
        p_eff = self.effective_target(block, state)[:, 0]  # [B, L+1, V]
        q, tok = block.q[:, 0], block.tokens[:, 0]  # [B, L, V], [B, L]
        log_p, log_q = log_joints(tok, p_eff), log_joints(tok, q)  # [B, L+1]
        return greedy_block_h(log_p, log_q, p_eff[:, :-1], q), p_eff, log_p, log_q

    def law(self, block: Block, state: Any = None) -> list[Branch]:
        h, dists = self.h_and_dists(block, state)
        prob = last_accepted_law(h)  # [B, L+1]
        zeros = torch.zeros(block.B, dtype=torch.long, device=h.device)
        return [Branch(prob[:, i], zeros, zeros + i, dists[:, i]) for i in range(block.L + 1)]

    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        h, p_eff, log_p, log_q = self._h(block, state)
        tau = last_accepted(h, uniforms.coins[:, 0])
        rows = torch.arange(block.B, device=h.device)
        # the extra token's law only at tau (O(B·V), not O(B·L·V))
        t = tau.clamp_max(block.L - 1)
        residual = greedy_residual(safe_ratio(log_p[rows, t], log_q[rows, t]), p_eff[rows, t], block.q[rows, 0, t])
        dist = torch.where((tau == block.L).unsqueeze(-1), p_eff[rows, tau], residual)
        token = categorical(dist, uniforms.draws[rows, tau])
        return Outcome(tau, torch.zeros_like(tau), token)

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        """Plain products of probabilities and the §5 formulas, one instance at a time."""
        p_all = self.effective_target(block, state)
        L, taus, tokens = block.L, [], []
        for b in range(block.B):
            D = [int(x) for x in block.tokens[b, 0]]
            p, q = p_all[b, 0], block.q[b, 0]
            P, Q = [1.0], [1.0]
            for i in range(L):
                P.append(P[-1] * float(p[i, D[i]]))
                Q.append(Q[-1] * float(q[i, D[i]]))
            h = [1.0]
            for i in range(1, L):
                a = min(P[i], Q[i])
                s = float(torch.minimum(P[i] * p[i], Q[i] * q[i]).sum())
                num, den = a - s, Q[i] - s
                if den <= 1e-12 * Q[i]:
                    h.append(1.0)
                elif num <= 1e-12 * Q[i]:
                    h.append(0.0)
                else:
                    h.append(min(1.0, num / den))
            h.append(min(1.0, P[L] / Q[L]))
            tau = 0
            for i in range(1, L + 1):
                if float(uniforms.coins[b, 0, i - 1]) < h[i]:
                    tau = i
            if tau == L:
                dist = p[L]
            else:
                res = torch.clamp(P[tau] * p[tau] - Q[tau] * q[tau], min=0.0)
                dist = res / res.sum() if float(res.sum()) > 1e-12 * Q[tau] else p[tau]
            tokens.append(int(categorical(dist, uniforms.draws[b, tau])))
            taus.append(tau)
        tau_t = torch.tensor(taus, dtype=torch.long)
        return Outcome(tau_t, torch.zeros_like(tau_t), torch.tensor(tokens, dtype=torch.long))
