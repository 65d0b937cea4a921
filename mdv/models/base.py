"""The LanguageModel protocol shared by the engine, the oracle and the tests, and the input checks
that every entry point applies to models and token ids."""
from __future__ import annotations

import numbers
from typing import Any, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from mdv.errors import InvalidInputError


@runtime_checkable
class LanguageModel(Protocol):
    """A causal language model over token ids ``0..vocab_size-1``.

    ``next_logprobs`` returns the next-token log-probabilities (or logits: they are normalised by
    :func:`mdv.models.sampling.apply_sampling`) after each prefix, as a float tensor [N, V].  The
    oracle needs only this; the engine uses the KV-cache methods where a model offers them.
    """

    vocab_size: int

    def next_logprobs(self, prefixes: Sequence[Sequence[int]]) -> Tensor: ...


def check_model(role: str, model: Any) -> int:
    """``model``'s vocabulary size, or :class:`~mdv.errors.InvalidInputError` naming ``role`` when it is
    not a :class:`LanguageModel` (None, a string, a raw transformers model, ...)."""
    if model is None:
        raise InvalidInputError(f"{role} model is missing; pass a LanguageModel (CallableLM or HFModel)")
    vs = getattr(model, "vocab_size", None)
    if not isinstance(model, LanguageModel) or isinstance(vs, bool) or not isinstance(vs, numbers.Integral) or vs < 1:
        raise InvalidInputError(
            f"{role} must be a LanguageModel with an integer vocab_size and next_logprobs(); got"
            f" {type(model).__name__} (wrap a transformers model in mdv.models.HFModel, a function in"
            " mdv.models.CallableLM)")
    return int(vs)


def check_token_ids(name: str, ids: Any, vocab_size: int, *, allow_empty: bool = False) -> list[int]:
    """``ids`` (a sequence, 1-D tensor / array, or a [1, n] batch) as a list of ints in
    ``[0, vocab_size)``; :class:`~mdv.errors.InvalidInputError` naming ``name`` otherwise."""
    if isinstance(ids, Tensor) or type(ids).__module__ == "numpy":
        arr = torch.as_tensor(ids)
        if arr.dim() == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.dim() != 1 or arr.dtype.is_floating_point or arr.dtype.is_complex or arr.dtype == torch.bool:
            raise InvalidInputError(
                f"{name} must be a 1-D sequence of integer token ids; got an array of shape"
                f" {tuple(arr.shape)} and dtype {arr.dtype}")
        out = [int(t) for t in arr.tolist()]
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, range)):
        raise InvalidInputError(
            f"{name} must be a sequence of token ids (encode text with the tokenizer first); got"
            f" {type(ids).__name__}")
    else:
        out = []
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise InvalidInputError(f"{name} must contain integer token ids; got {t!r}")
            out.append(int(t))
    if not out:
        if allow_empty:
            return out
        raise InvalidInputError(f"{name} is empty: the models need at least one token to condition on"
                                " (e.g. the tokenizer's BOS token)")
    lo, hi = min(out), max(out)
    if lo < 0 or hi >= vocab_size:
        raise InvalidInputError(f"{name} must lie in [0, vocab_size={vocab_size}); got values in [{lo}, {hi}]")
    return out
