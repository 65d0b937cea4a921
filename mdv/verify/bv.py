"""Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; ICLR 2025),
algorithms.md §4.

Weights ``w_0 = 1``, ``w_i = min{1, w_{i-1} p(D_i|c,D_<i) / q(D_i|c,D_<i)}``; for i < L
``h_i = A_i / (A_i + 1 - w_i)`` with ``A_i = sum_x (w_i p(x|c,D_<=i) - q(x|c,D_<=i))_+`` and
``h_L = w_L``.  tau is the **last** i with ``eta_i < h_i`` (a rejection does not stop the scan); the
extra token is drawn from ``norm((w_tau p(.|c,D_<=tau) - q(.|c,D_<=tau))_+)``, or from
``p(.|c,D)`` when tau = L.  BV is per-iteration valid and maximises E[tau] among such verifiers:
``E[tau] = sum_i E[w_i]`` = the valid LP at K = 1.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.verify._math import TOL, categorical, last_accepted, last_accepted_law, normalize_or
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.registry import register_verifier
from mdv.verify.sd import token_probs


def weights_from_log_ratio(log_ratio: Tensor) -> Tensor:
    """BV's weights ``w_0 = 1, w_i = min(1, w_{i-1} p_i(D_i) / q_i(D_i))`` in log space (long blocks underflow)
    from the log ratios ``log p_i(D_i) - log q_i(D_i)`` [B, L].  -> [B, L+1]"""
    log_w = [torch.zeros_like(log_ratio[:, 0])]
    for i in range(log_ratio.shape[-1]):
        log_w.append((log_w[-1] + log_ratio[:, i]).clamp_max(0.0))
    return torch.stack(log_w, -1).exp()


def h_middle(A: Tensor, w: Tensor) -> Tensor:
    """``h_i = A_i / (A_i + 1 - w_i)`` for 0 < i < L (1 where the denominator vanishes), clamped to [0, 1]."""
    den = A + 1.0 - w
    vanishes = den <= TOL
    ratio = A / torch.where(vanishes, torch.ones_like(den), den)
    return torch.where(vanishes, torch.ones_like(den), ratio).clamp(0.0, 1.0)


def h_and_residuals(w: Tensor, p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """BV's acceptance probabilities h_1..h_L [B, L] and unnormalised residuals ``w_i p_i - q_i`` [B, L, V]
    (i = 0..L-1) from the weights w [B, L+1], the target rows p [B, L+1, V] and the draft law q [B, L, V]
    along the draft: ``A_i = sum_x (w_i p_i - q_i)_+``, h_i = :func:`h_middle`, ``h_L = w_L``."""
    scaled = w[:, :-1, None] * p[:, :-1] - q  # [B, L, V]
    A = scaled.clamp_min(0.0).sum(-1)  # [B, L]
    return torch.cat([h_middle(A[:, 1:], w[:, 1:-1]), w[:, -1:]], -1), scaled


def scalar_decision(w: list[float], p: Tensor, q: Tensor, coins: Tensor, draws: Tensor) -> tuple[int, int]:
    """BV's decision along one draft from its weights, step by step (Sun et al., ICLR 2025, Algorithm 2).

    w: w_0..w_L (w_0 = 1, w_i = min(1, w_{i-1} p_i(D_i) / q_i(D_i))); p: [L+1, V] the target along the draft;
    q: [L+1 or L, V] the draft law along it; coins: [L]; draws: [L+1].  h_i = A_i / (A_i + 1 - w_i) with
    A_i = sum_x (w_i p_i(x) - q_i(x))_+ for i < L, h_L = w_L; tau = the last i with coin_i < h_i; the token is
    drawn from the normalised residual (w_tau p_tau - q_tau)_+ (p_tau if it has no mass), or from p_L at
    tau = L.  -> (tau, token).
    """
    L = len(w) - 1
    h = [1.0]
    for i in range(1, L):
        A = float(torch.clamp(w[i] * p[i] - q[i], min=0.0).sum())
        den = A + 1.0 - w[i]
        h.append(1.0 if den <= 1e-12 else min(1.0, A / den))
    h.append(w[L])
    tau = 0
    for i in range(1, L + 1):  # the last accepted index wins
        if float(coins[i - 1]) < h[i]:
            tau = i
    if tau == L:
        dist = p[L]
    else:
        res = torch.clamp(w[tau] * p[tau] - q[tau], min=0.0)
        dist = res / res.sum() if float(res.sum()) > 1e-12 else p[tau]
    return tau, int(categorical(dist, draws[tau]))


@register_verifier
class BlockVerification(Verifier):
    """``bv``: block verification of a single draft."""

    name: ClassVar[str] = "bv"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = False

    @staticmethod
    def weights(block: Block) -> Tensor:
        """``w_0..w_L`` along draft 0, computed in log space (long blocks underflow).  -> [B, L+1]"""
        tok = block.tokens[:, 0]
        log_ratio = token_probs(block.p[:, 0, :-1], tok).log() - token_probs(block.q[:, 0], tok).log()  # [B, L]
        return weights_from_log_ratio(log_ratio)

    @classmethod
    def h_and_dists(cls, block: Block) -> tuple[Tensor, Tensor]:
        """Acceptance probabilities h_1..h_L [B, L] and extra-token laws after tau = 0..L [B, L+1, V]."""
        h, scaled = cls._h_and_scaled(block)
        p = block.p[:, 0]  # [B, L+1, V]
        dists = torch.cat([normalize_or(scaled, p[:, :-1]), p[:, -1:]], 1)
        return h, dists

    @classmethod
    def _h_and_scaled(cls, block: Block) -> tuple[Tensor, Tensor]:
        """h [B, L] and the unnormalised residuals ``w_i p_i - q_i`` [B, L, V], i = 0..L-1."""
        return h_and_residuals(cls.weights(block), block.p[:, 0], block.q[:, 0])

    def law(self, block: Block, state: Any = None) -> list[Branch]:
        h, dists = self.h_and_dists(block)
        prob = last_accepted_law(h)  # [B, L+1]
        zeros = torch.zeros(block.B, dtype=torch.long, device=h.device)
        return [Branch(prob[:, i], zeros, zeros + i, dists[:, i]) for i in range(block.L + 1)]

    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        h, scaled = self._h_and_scaled(block)
        tau = last_accepted(h, uniforms.coins[:, 0])
        rows = torch.arange(block.B, device=h.device)
        # the extra token's law only at tau (O(B·V), not O(B·L·V))
        t, p = tau.clamp_max(block.L - 1), block.p[:, 0]
        dist = torch.where((tau == block.L).unsqueeze(-1), p[rows, tau], normalize_or(scaled[rows, t], p[rows, t]))
        token = categorical(dist, uniforms.draws[rows, tau])
        return Outcome(tau, torch.zeros_like(tau), token)

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        taus, tokens = [], []
        L = block.L
        for b in range(block.B):
            D, p, q = block.tokens[b, 0], block.p[b, 0], block.q[b, 0]
            w = [1.0]
            for i in range(1, L + 1):
                x = int(D[i - 1])
                w.append(min(1.0, w[-1] * float(p[i - 1, x]) / float(q[i - 1, x])))
            tau, token = scalar_decision(w, p, q, uniforms.coins[b, 0], uniforms.draws[b])
            tokens.append(token)
            taus.append(tau)
        tau_t = torch.tensor(taus, dtype=torch.long)
        return Outcome(tau_t, torch.zeros_like(tau_t), torch.tensor(tokens, dtype=torch.long))
