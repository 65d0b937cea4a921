"""A language model given as a Python function of the prefix (audits, tests, toy models)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from mdv.errors import InvalidInputError


class CallableLM:
    """Wrap ``fn(prefix: tuple[int, ...]) -> probabilities [V]`` as a :class:`~mdv.models.base.LanguageModel`.

    Results are cached per prefix (``fn`` must be deterministic).  ``fn`` may return a list, numpy
    array or tensor; it is checked once per prefix (length V, finite, non-negative, sums to 1).
    """

    def __init__(self, fn: Callable[[tuple[int, ...]], object], vocab_size: int, name: str = "callable"):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise InvalidInputError(f"vocab_size must be a positive integer; got {vocab_size!r}")
        if not callable(fn):
            raise InvalidInputError(
                f"fn must be a function of the prefix (a tuple of token ids) returning {vocab_size} probabilities;"
                f" got {type(fn).__name__}")
        self.fn = fn
        self.vocab_size = vocab_size
        self.name = name
        self._cache: dict[tuple[int, ...], Tensor] = {}

    def probs(self, prefix: Sequence[int]) -> Tensor:
        """Next-token probabilities after ``prefix``: float64 [V]."""
        key = tuple(int(t) for t in prefix)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if key and (min(key) < 0 or max(key) >= self.vocab_size):
            raise InvalidInputError(
                f"{self.name}: token ids must lie in [0, vocab_size={self.vocab_size}); got prefix {key}")
        raw = self.fn(key)
        v = torch.as_tensor(np.asarray(raw, dtype=np.float64) if not isinstance(raw, Tensor) else raw,
                            dtype=torch.float64).flatten()
        if v.numel() != self.vocab_size:
            raise InvalidInputError(
                f"{self.name}: fn returned {v.numel()} probabilities after prefix {key}, expected vocab_size={self.vocab_size}")
        if not torch.isfinite(v).all() or (v < 0).any() or abs(float(v.sum()) - 1.0) > 1e-6:
            raise InvalidInputError(
                f"{self.name}: fn must return finite non-negative probabilities summing to 1 (prefix {key},"
                f" sum {float(v.sum()):.6g})")
        self._cache[key] = v
        return v

    def next_logprobs(self, prefixes: Sequence[Sequence[int]]) -> Tensor:
        """[N, V] float64 log-probabilities (-inf for zero probability)."""
        if len(prefixes) == 0:
            return torch.empty(0, self.vocab_size, dtype=torch.float64)
        return torch.stack([self.probs(p) for p in prefixes]).log()

    def __repr__(self) -> str:
        return f"CallableLM(name={self.name!r}, vocab_size={self.vocab_size})"
