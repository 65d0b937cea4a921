"""The LanguageModel protocol shared by the engine, the oracle and the tests."""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from torch import Tensor


@runtime_checkable
class LanguageModel(Protocol):
    """A causal language model over token ids ``0..vocab_size-1``.

    ``next_logprobs`` returns the next-token log-probabilities (or logits: they are normalised by
    :func:`mdv.models.sampling.apply_sampling`) after each prefix, as a float tensor [N, V].  The
    oracle needs only this; the engine uses the KV-cache methods where a model offers them.
    """

    vocab_size: int

    def next_logprobs(self, prefixes: Sequence[Sequence[int]]) -> Tensor: ...
