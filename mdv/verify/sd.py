"""Token-level speculative sampling (Leviathan et al. 2023; Chen et al. 2023), algorithms.md §2.

For i = 1..L accept D_i with probability ``a_i = min(1, p_i(D_i) / q_i(D_i))`` and stop at the first
rejection; then tau = i - 1 and the correction is drawn from ``norm((p_i - q_i)_+)``.  If all L are
accepted the bonus token is drawn from ``p_{L+1}``.  Exact: at each position the emitted token has law
p_i, since the accepted mass is ``min(p_i, q_i)`` and the residual supplies the rest.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from mdv.verify._math import categorical, normalize_or
from mdv.verify.base import Block, Branch, Outcome, Uniforms, Verifier
from mdv.verify.registry import register_verifier


def token_probs(dist: Tensor, tokens: Tensor) -> Tensor:
    """dist: [..., L, V], tokens: [..., L] -> [..., L], the probability of each token at its position."""
    return dist.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


@register_verifier
class SpeculativeSampling(Verifier):
    """``sd``: single-draft token-level speculative sampling."""

    name: ClassVar[str] = "sd"
    lossless: ClassVar[bool] = True
    multi_draft: ClassVar[bool] = False
    prefix_consistent: ClassVar[bool] = True

    @staticmethod
    def acceptance(block: Block) -> Tensor:
        """``a_i = min(1, p_i(D_i) / q_i(D_i))`` along draft 0.  -> [B, L]"""
        tok = block.tokens[:, 0]  # [B, L]
        pd = token_probs(block.p[:, 0, :-1], tok)  # [B, L]
        qd = token_probs(block.q[:, 0], tok)  # [B, L]
        return torch.where(pd >= qd, torch.ones_like(pd), pd / qd)

    @staticmethod
    def next_dists(block: Block) -> Tensor:
        """Law of the extra token after tau = 0..L accepted tokens.  -> [B, L+1, V]"""
        p, q = block.p[:, 0], block.q[:, 0]  # [B, L+1, V], [B, L, V]
        residual = normalize_or(p[:, :-1] - q, p[:, :-1])  # [B, L, V]
        return torch.cat([residual, p[:, -1:]], 1)

    def law(self, block: Block, state: Any = None) -> list[Branch]:
        a = self.acceptance(block)  # [B, L]
        B, L = a.shape
        ones = torch.ones_like(a[:, :1])
        reach = torch.cat([ones, a.cumprod(-1)], -1)  # [B, L+1]: Pr(first i accepted)
        stop = torch.cat([1.0 - a, ones], -1)  # [B, L+1]: Pr(reject at i+1 | reached), 1 at L
        prob = reach * stop
        dists = self.next_dists(block)
        zeros = torch.zeros(B, dtype=torch.long, device=a.device)
        return [Branch(prob[:, i], zeros, zeros + i, dists[:, i]) for i in range(L + 1)]

    def sample(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        a = self.acceptance(block)  # [B, L]
        accepted = uniforms.coins[:, 0] < a  # [B, L]
        tau = accepted.long().cumprod(-1).sum(-1)  # number of leading acceptances
        rows = torch.arange(block.B, device=a.device)
        p, q = block.p[rows, 0, tau], block.q[rows, 0, tau.clamp_max(block.L - 1)]  # [B, V]
        dist = torch.where((tau < block.L).unsqueeze(-1), normalize_or(p - q, p), p)
        token = categorical(dist, uniforms.draws[rows, tau])
        return Outcome(tau, torch.zeros_like(tau), token)

    def reference(self, block: Block, uniforms: Uniforms, state: Any = None) -> Outcome:
        taus, tokens = [], []
        for b in range(block.B):
            D, p, q = block.tokens[b, 0], block.p[b, 0], block.q[b, 0]
            tau = block.L
            for i in range(block.L):
                x = int(D[i])
                accept_prob = min(1.0, float(p[i, x]) / float(q[i, x]))
                if not float(uniforms.coins[b, 0, i]) < accept_prob:
                    tau = i
                    break
            if tau < block.L:
                dist = torch.clamp(p[tau] - q[tau], min=0.0)
                dist = dist / dist.sum() if float(dist.sum()) > 1e-12 else p[tau]
            else:
                dist = p[tau]
            tokens.append(int(categorical(dist, uniforms.draws[b, tau])))
            taus.append(tau)
        tau_t = torch.tensor(taus, dtype=torch.long)
        return Outcome(tau_t, torch.zeros_like(tau_t), torch.tensor(tokens, dtype=torch.long))
