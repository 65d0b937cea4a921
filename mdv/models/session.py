"""Incremental decoding sessions: the engine-facing side of a language model.

A :class:`DecodeSession` holds the state of one sequence being decoded by one model -- for a
transformer, its KV cache -- as ``rows`` parallel copies that all have the same ``length`` (number of
tokens already processed).  The engine needs five operations:

* ``extend(tokens [R, n]) -> logits [R, n, V]``: process n new tokens in each of the R rows and return
  the next-token scores after each of them (logits or log-probabilities, any float dtype; the engine
  normalises them once, in float64, with :func:`mdv.models.sampling.apply_sampling`);
* ``prefill(tokens)``: process a prompt (one row) without returning scores;
* ``fork(k)``: turn the single row into k identical rows (the K i.i.d. drafts share their prefix);
* ``keep(row)``: keep one row (the draft the verifier selected), dropping the others;
* ``crop(length)``: forget every token past ``length`` (roll back the rejected part of a block).

A session with ``supports_tree = True`` also scores K drafts as one token tree in its single row
(:mod:`mdv.models.tree`; the engine then needs no ``fork``/``keep`` on the target):

* ``extend_tree(tree) -> logits [n, V]``: process the tree's n nodes, each conditioned on the processed
  tokens and its own ancestors; the scores after node j are those after the path root -> j;
* ``keep_nodes(nodes)``: keep the processed tokens plus the tree nodes on one root path (the accepted
  draft prefix), forgetting the rest of the tree.

:class:`PrefixSession` implements them for *any* :class:`~mdv.models.base.LanguageModel` by calling
``next_logprobs`` on the full prefixes; it suits :class:`~mdv.models.callable.CallableLM` (whose results
are cached per prefix).  :class:`~mdv.models.hf.HFModel` provides a KV-cache session
(:class:`mdv.models.hf.HFSession`).  :func:`open_session` picks the right one.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor

from mdv.errors import InvalidInputError
from mdv.models.base import LanguageModel
from mdv.models.tree import TokenTree


@runtime_checkable
class DecodeSession(Protocol):
    """Incremental decoding state of one sequence: ``rows`` copies of ``length`` processed tokens."""

    @property
    def rows(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def prefill(self, tokens: Sequence[int]) -> None: ...

    def extend(self, tokens: Tensor) -> Tensor: ...

    def fork(self, k: int) -> None: ...

    def keep(self, row: int) -> None: ...

    def crop(self, length: int) -> None: ...


def tree_capable(session: object) -> bool:
    """True when ``session`` can score a token tree in one row (``extend_tree`` / ``keep_nodes``)."""
    return bool(getattr(session, "supports_tree", False))


def check_no_tree(op: str, pending: object) -> None:
    """A session holding a scored tree accepts only ``keep_nodes`` (settle it) or ``crop`` (drop it)."""
    if pending is not None:
        raise InvalidInputError(f"{op}() called while a scored token tree is pending: call keep_nodes() to keep"
                                " one of its paths, or crop() to drop it")


def check_tree_start(rows: int, pending: object) -> None:
    """``extend_tree`` needs one row and no tree already pending."""
    check_no_tree("extend_tree", pending)
    if rows != 1:
        raise InvalidInputError(f"extend_tree() needs a single row; the session has {rows}")


def _check_extend(tokens: Tensor, rows: int) -> None:
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise InvalidInputError(f"extend() takes tokens of shape [rows, n >= 1]; got {tuple(tokens.shape)}")
    if tokens.shape[0] != rows:
        raise InvalidInputError(f"extend() got {tokens.shape[0]} rows but the session has {rows}")


class CacheSessionBase:
    """What a KV-cache session (:class:`~mdv.models.hf.HFSession`, :class:`~mdv.models.lean.LeanSession`)
    shares: ``rows``, ``length`` and ``device``, and the argument checks of each operation (one clear
    :class:`~mdv.errors.InvalidInputError` each).  Subclasses set ``_rows``, ``_length``, ``_device`` and
    ``_tree`` (the token tree scored by ``extend_tree`` and not yet settled, or None)."""

    _rows: int
    _length: int
    _device: torch.device
    _tree: TokenTree | None

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def length(self) -> int:
        return self._length

    @property
    def device(self) -> torch.device:
        return self._device

    def _prompt_ids(self, tokens: Sequence[int]) -> Tensor | None:
        """``prefill``'s checks, then the prompt as ids [1, n] (None for an empty prompt: nothing to do).
        Subclasses have ``hf`` (the :class:`~mdv.models.hf.HFModel`, which checks the ids' range)."""
        check_no_tree("prefill", self._tree)
        if self._rows != 1:
            raise InvalidInputError(f"prefill() needs a single row; the session has {self._rows}")
        if len(tokens) == 0:
            return None
        ids = torch.tensor([list(map(int, tokens))], dtype=torch.long)
        self.hf._check_ids(ids)  # type: ignore[attr-defined]
        return ids

    def _check_extend(self, tokens: Tensor) -> None:
        check_no_tree("extend", self._tree)
        if tokens.dim() != 2 or tokens.shape[1] < 1 or tokens.shape[0] != self._rows:
            raise InvalidInputError(
                f"extend() takes tokens of shape [rows={self._rows}, n >= 1]; got {tuple(tokens.shape)}")

    def _check_fork(self, k: int) -> None:
        check_no_tree("fork", self._tree)
        if self._rows != 1:
            raise InvalidInputError(f"fork() needs a single row; the session has {self._rows}")
        if k < 1:
            raise InvalidInputError(f"fork() needs k >= 1; got {k}")

    def _check_keep(self, row: int) -> None:
        check_no_tree("keep", self._tree)
        if not 0 <= row < self._rows:
            raise InvalidInputError(f"keep() got row {row}; the session has {self._rows} rows")

    def _check_crop(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise InvalidInputError(f"crop() to {length} tokens; the session holds {self._length}")


class PrefixSession:
    """A :class:`DecodeSession` for any LanguageModel, kept as explicit token lists (no KV cache).

    ``extend`` asks the model for the next-token scores after every new prefix, so its cost is that of
    ``next_logprobs`` on full prefixes: fine for :class:`~mdv.models.callable.CallableLM` (cached per
    prefix, no forward pass), not meant for transformers (use :class:`~mdv.models.hf.HFModel`).
    """

    supports_tree = True

    def __init__(self, model: LanguageModel, device: torch.device | str = "cpu"):
        self.model = model
        self._rows: list[list[int]] = [[]]
        self._device = torch.device(device)
        self._tree: TokenTree | None = None  # scored by extend_tree, waiting for keep_nodes

    @property
    def rows(self) -> int:
        return len(self._rows)

    @property
    def length(self) -> int:
        return len(self._rows[0])

    @property
    def device(self) -> torch.device:
        return self._device

    def prefill(self, tokens: Sequence[int]) -> None:
        check_no_tree("prefill", self._tree)
        if self.rows != 1:
            raise InvalidInputError(f"prefill() needs a single row; the session has {self.rows}")
        self._rows[0].extend(int(t) for t in tokens)

    def extend(self, tokens: Tensor) -> Tensor:
        """tokens: [R, n] -> scores [R, n, V] after each new token."""
        check_no_tree("extend", self._tree)
        _check_extend(tokens, self.rows)
        R, n = tokens.shape
        new = tokens.tolist()
        prefixes: list[tuple[int, ...]] = []
        for r in range(R):
            row = self._rows[r]
            for j in range(n):
                row.append(int(new[r][j]))
                prefixes.append(tuple(row))
        out = self.model.next_logprobs(prefixes)  # [R*n, V]
        return torch.as_tensor(out).reshape(R, n, -1).to(self._device)

    def extend_tree(self, tree: TokenTree) -> Tensor:
        """Scores [n, V] after each node of ``tree`` (the prefix: the row, then the node's root path)."""
        check_tree_start(self.rows, self._tree)
        row = tuple(self._rows[0])
        paths: list[tuple[int, ...]] = []
        for j, par in enumerate(tree.parent):
            paths.append((paths[par] if par >= 0 else row) + (tree.ids[j],))
        out = self.model.next_logprobs(paths)  # [n, V]
        self._tree = tree
        return torch.as_tensor(out).to(self._device)

    def keep_nodes(self, nodes: Sequence[int]) -> None:
        """Append the tokens of one root path of the last scored tree to the row."""
        if self._tree is None:
            raise InvalidInputError("keep_nodes() needs a tree scored by extend_tree() first")
        nodes = self._tree.check_path(nodes)
        self._rows[0].extend(self._tree.ids[j] for j in nodes)
        self._tree = None

    def fork(self, k: int) -> None:
        check_no_tree("fork", self._tree)
        if self.rows != 1:
            raise InvalidInputError(f"fork() needs a single row; the session has {self.rows}")
        if k < 1:
            raise InvalidInputError(f"fork() needs k >= 1; got {k}")
        self._rows = [list(self._rows[0]) for _ in range(k)]

    def keep(self, row: int) -> None:
        check_no_tree("keep", self._tree)
        if not 0 <= row < self.rows:
            raise InvalidInputError(f"keep() got row {row}; the session has {self.rows} rows")
        self._rows = [self._rows[row]]

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise InvalidInputError(f"crop() to {length} tokens; the session holds {self.length}")
        self._tree = None  # a pending tree is dropped
        for row in self._rows:
            del row[length:]


def open_session(model: LanguageModel) -> DecodeSession:
    """A fresh decoding session for ``model``: its own (KV-cache) session when it offers
    ``new_session()``, else a :class:`PrefixSession` over ``next_logprobs``."""
    factory = getattr(model, "new_session", None)
    if callable(factory):
        return factory()
    if not isinstance(model, LanguageModel):
        raise InvalidInputError(
            f"{model!r} is not a LanguageModel: it needs an integer `vocab_size` and a"
            " `next_logprobs(prefixes)` method (wrap a function in mdv.models.CallableLM, a transformers"
            " model in mdv.models.HFModel)")
    return PrefixSession(model)
