"""Every context an audit can reach, tabulated: the draft and target laws after each prefix, and the
exact target law of the first N emitted tokens.

An audit runs a rule for N emitted tokens from a fixed prompt.  An iteration starts at a context of at
most N - 1 emitted tokens and reads the laws up to L tokens deeper, so every law it needs sits at a
prefix of at most N - 1 + L tokens: Σ_{n <= N-1+L} V^n rows, a few thousand on the audit's toy pairs.
Rows are numbered breadth first; ``child[r, x]`` is the row of prefix(r)·x (-1 past the deepest level).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.models.base import LanguageModel
from mdv.models.sampling import SamplingConfig

#: Largest number of tabulated prefixes (each costs one call of each model).
MAX_ROWS = 200_000


@dataclass(frozen=True)
class PrefixTable:
    """The laws after every prefix of at most ``depth`` tokens (after the prompt).

    q, p:   [R, V] float64 -- draft and target law (after the sampling transform) at row r.
    cdf_q:  [R, V] float64 -- cumulative q with the last entry exactly 1 (inverse-CDF draws).
    child:  [R, V] int64 -- the row of prefix(r)·x, -1 when that prefix is deeper than ``depth``.
    length: [R] int64 -- the number of tokens of prefix(r).
    """

    V: int
    depth: int
    q: Tensor
    p: Tensor
    cdf_q: Tensor
    child: Tensor
    length: Tensor

    @staticmethod
    def build(target: LanguageModel, draft: LanguageModel, depth: int, prompt: Sequence[int] = (),
              sampling: SamplingConfig | None = None) -> "PrefixTable":
        sampling = sampling or SamplingConfig()
        V = int(target.vocab_size)
        rows = sum(V ** n for n in range(depth + 1))
        if rows > MAX_ROWS:
            raise InvalidInputError(
                f"an audit case with V={V} needs laws at prefixes of up to {depth} tokens: {rows} prefixes, above"
                f" the ceiling {MAX_ROWS}; use a smaller vocabulary, block length L or n_tokens")
        prefixes = [p for n in range(depth + 1) for p in itertools.product(range(V), repeat=n)]
        full = [tuple(prompt) + p for p in prefixes]
        q = sampling.probs(draft.next_logprobs(full))  # [R, V]
        p = sampling.probs(target.next_logprobs(full))  # [R, V]
        cdf = q.cumsum(-1)
        cdf = cdf / cdf[:, -1:]
        cdf[:, -1] = 1.0
        # Breadth-first numbering: the children of the j-th row of level n are consecutive in level n+1.
        start = [sum(V ** m for m in range(n)) for n in range(depth + 2)]
        child = torch.full((rows, V), -1, dtype=torch.long)
        length = torch.empty(rows, dtype=torch.long)
        for n in range(depth + 1):
            level = torch.arange(start[n], start[n + 1])
            length[level] = n
            if n < depth:
                child[level] = start[n + 1] + (level - start[n]).unsqueeze(-1) * V + torch.arange(V)
        return PrefixTable(V, depth, q, p, cdf, child, length)

    def draw_blocks(self, rows: Tensor, K: int, L: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """K i.i.d. draft blocks of length L after each context row (inverse-CDF draws from q).

        rows: [N] context rows (prefixes of at most depth - L tokens).
        Returns tokens [N, K, L] and the rows along each draft, path [N, K, L+1] (path[..., i] = the row of
        context · D_<i+1, i = 0..L).
        """
        N = rows.shape[0]
        path = torch.empty(N, K, L + 1, dtype=torch.long)
        tokens = torch.empty(N, K, L, dtype=torch.long)
        path[:, :, 0] = rows.unsqueeze(-1)
        u = torch.rand((N, K, L), generator=generator, dtype=torch.float64)
        for i in range(L):
            r = path[:, :, i]  # [N, K]
            tok = (self.cdf_q[r] < u[:, :, i].unsqueeze(-1)).sum(-1)  # [N, K]: the first x with cdf(x) >= u
            tokens[:, :, i] = tok
            path[:, :, i + 1] = self.child[r, tok]
        return tokens, path

    def target_law(self, n_tokens: int) -> Tensor:
        """The exact law of the first ``n_tokens`` tokens sampled from the target: [V^n] indexed by the
        base-V code of the tokens (first token most significant)."""
        if n_tokens > self.depth + 1:
            raise InvalidInputError(f"target_law needs n_tokens <= depth + 1 = {self.depth + 1}; got {n_tokens}")
        law = torch.ones(1, dtype=torch.float64)
        rows = torch.zeros(1, dtype=torch.long)
        for n in range(n_tokens):
            law = (law.unsqueeze(-1) * self.p[rows]).reshape(-1)  # [V^(n+1)]
            if n + 1 < n_tokens:
                rows = self.child[rows].reshape(-1)
        return law
