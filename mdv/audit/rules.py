"""Rules for exercising the audit: a deliberately buggy one for the docs, and a known perturbation for
measuring the audit's power.  Neither is a verifier to use."""
from __future__ import annotations

import torch
from torch import Tensor

from mdv.audit.protocol import as_sampler
from mdv.verify.base import Block, Uniforms
from mdv.verify.bv import BlockVerification


def block_verification_residual_off_by_one(tokens: Tensor, q: Tensor, p: Tensor,
                                           generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Single-draft block verification (Sun et al., mdv's ``bv``) with one bug: after a rejection at depth
    tau the correction is drawn from the residual of the *next* position, (p_{tau+1} - q_{tau+1})_+,
    instead of (p_tau - q_tau)_+ (the residual at the bonus position falls back to p_L).

    tokens [N, 1, L], q [N, 1, L, V], p [N, 1, L+1, V] -> (tau, sel, token), each [N].
    The acceptance of the first tau tokens follows BV's weights exactly; only the correction is wrong.
    """
    N, K, L = tokens.shape
    out = BlockVerification().sample(Block(tokens, q, p), Uniforms.draw(N, K, L, generator))
    tau = out.tau.long()
    rows = torch.arange(N)
    nxt = torch.clamp(tau + 1, max=L)
    q_next = torch.cat([q[:, 0], torch.zeros_like(q[:, 0, :1])], 1)[rows, nxt]  # [N, V]; zero at the bonus slot
    residual = torch.clamp(p[rows, 0, nxt] - q_next, min=0.0)  # [N, V]: the residual one position too far
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, 0, nxt])
    wrong = torch.multinomial(residual, 1, generator=generator).squeeze(-1)
    token = torch.where(tau < L, wrong, out.token.long())
    return tau, torch.zeros_like(tau), token


block_verification_residual_off_by_one.multi_draft = False  # type: ignore[attr-defined]


class MoveMass:
    """A lossless rule made biased by exactly TV ``epsilon``: at the first iteration of a sequence, with
    probability r = epsilon / (1 - P1(b)) its outcome is replaced by "reject everything, emit b", where
    P1 = p[:, 0, 0] is the target's first-token law and b its most likely token.  The first emitted
    token then has the law (1 - r) P1 + r δ_b, at TV exactly epsilon from P1, and every later token
    still follows the target given the prefix, so the law of the first N tokens is at TV epsilon.
    ``only``: perturb only on the cases with these (V, K, L) shapes (None: everywhere)."""

    def __init__(self, rule: object, epsilon: float, only: tuple[tuple[int, int, int], ...] | None = None) -> None:
        self.base = as_sampler(rule)
        self.epsilon = float(epsilon)
        self.only = only
        self.multi_draft = getattr(self.base, "multi_draft", True)
        self.name = f"{getattr(self.base, 'name', 'rule')}+move_mass({epsilon:g})"
        self._calls = 0

    def reset(self) -> None:
        self._calls = 0
        if hasattr(self.base, "reset"):
            self.base.reset()

    def __call__(self, tokens: Tensor, q: Tensor, p: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        tau, sel, token = self.base(tokens, q, p, generator)
        self._calls += 1
        N, K, L = tokens.shape
        if self._calls > 1 or (self.only is not None and (p.shape[-1], K, L) not in self.only):
            return tau, sel, token
        first = p[:, 0, 0]  # [N, V]: the target's first-token law (every sequence is at the prompt)
        b = first.argmax(-1)  # [N]
        r = self.epsilon / (1.0 - first.gather(-1, b.unsqueeze(-1)).squeeze(-1))
        hit = torch.rand(N, generator=generator, dtype=torch.float64) < r
        return torch.where(hit, 0, tau), torch.where(hit, 0, sel), torch.where(hit, b, token)
