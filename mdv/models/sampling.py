"""Sampling transforms -- temperature, top-k, top-p -- applied identically to target and draft.

Correctness of every verifier needs q to be *exactly* the law the draft tokens were drawn from and p
the target law to reproduce (algorithms.md §8); mdv computes both here, once, in float64.
T = 0 is greedy: a one-hot vector on the argmax (ties broken towards the lowest id).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from mdv.errors import InvalidInputError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature >= 0 (0 = greedy); top_k: None or 0 = off, else keep the k most likely tokens (and every
    token tied with the k-th: a tie is not broken by token id, so p and q keep the same set);
    top_p in (0, 1]: keep the smallest set of most likely tokens whose mass reaches top_p."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or t != t or t < 0 or t == float("inf"):
            raise InvalidInputError(f"temperature must be a finite number >= 0 (0 = greedy); got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0):
            raise InvalidInputError(f"top_k must be None or an integer >= 0 (0 = off); got {k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0):
            raise InvalidInputError(f"top_p must lie in (0, 1] (None = off); got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: Tensor) -> Tensor:
        """Sampling law from logits (or log-probabilities) [..., V] -> float64 probabilities [..., V]."""
        return apply_sampling(logits, self.temperature, self.top_k, self.top_p)


def apply_sampling(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """Temperature, then top-k, then top-p, in float64.  logits: [..., V] -> probs [..., V]."""
    x = logits.to(torch.float64)
    V = x.shape[-1]
    if temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(-1), V).to(torch.float64)
    x = x / temperature
    if top_k is not None and 0 < top_k < V:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, -1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
        drop_sorted = before >= top_p  # the first token is always kept (before = 0 < top_p)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs
