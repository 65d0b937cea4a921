"""The drafter interface: what proposes the K i.i.d. draft blocks of one iteration, with their exact law.

A drafter proposes ``tokens [K, L]`` after the committed sequence ``c`` and records ``q [K, L, V]``, the
law each token was drawn from: ``q[k, i] = q(. | c, D_k,<i+1)`` (algorithms.md §1, §12.2).  Every
verifier needs that q *exactly* (a drafter that cannot give it is not a drafter here); the K blocks are
i.i.d.: row k's token i is drawn from ``q[k, i]`` with its own uniform, independently of the other rows.

Lifecycle per sequence, driven by :func:`mdv.engine.generate`:

1. :meth:`Drafter.bind` once per ``generate`` call, before any work: check the target (and the draft
   model, where one is needed) and raise :class:`~mdv.errors.InvalidInputError` naming the problem;
2. :meth:`Drafter.prefill` with the prompt (a fresh sequence);
3. per iteration :meth:`Drafter.propose` -> :class:`Draft`, then :meth:`Drafter.commit` with the
   verifier's outcome (the selected row and its accepted length tau), so a drafter with a cache can roll
   it back.

Each rule also has :meth:`Drafter.reference_law`, a slow, obviously-correct computation of the law of
one drafted position from the full context alone; the parity tests hold the fast ``propose`` to it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch
from torch import Tensor

from mdv.models.sampling import SamplingConfig
from mdv.verify._math import categorical


@dataclass(frozen=True)
class Draft:
    """One iteration's proposal.  tokens: [K, L] int64; q: [K, L, V] float64 (q[k, i] is the law token
    ``tokens[k, i]`` was drawn from); calls: the drafter's model forward calls it took (0 for a lookup)."""

    tokens: Tensor
    q: Tensor
    calls: int


class Drafter(ABC):
    """Base class of drafters (see the module docstring).  Subclasses set ``name`` and register with
    :func:`mdv.drafters.registry.register_drafter`."""

    name: ClassVar[str] = ""
    #: True for a drafter that reads the target's own hidden states (``eagle``): the engine then records the
    #: last decoder layer's output of every target pass and hands the committed positions' to
    #: :meth:`observe_target`.
    uses_target_features: ClassVar[bool] = False

    def bind(self, target: Any, draft: Any) -> int:
        """Check ``target`` (and ``draft``) before any generation; -> the vocabulary size V of q."""
        from mdv.models.base import check_model

        return check_model("target", target)

    @property
    def max_context(self) -> int | None:
        """The longest context the drafter can draft after (None: unbounded); valid after :meth:`bind`."""
        return None

    def prefill(self, prompt: Sequence[int]) -> None:
        """A new sequence starts with ``prompt`` (its last token not yet processed by any model)."""

    @abstractmethod
    def propose(self, seq: Sequence[int], K: int, L: int, sampling: SamplingConfig,
                generator: torch.Generator, shorter_ok: bool = False) -> Draft:
        """K i.i.d. blocks of L tokens after the committed sequence ``seq``, drawn with ``generator``.

        shorter_ok: the caller takes blocks of any length 0..L (the engine does, for every verifier without
        a state over iterations: ``gbv`` and ``mdbv`` carry a target adjustment whose window spans L); a drafter may then
        choose a shorter length, *from the context alone* (before drawing), so that the K blocks stay
        i.i.d. of one length and every verifier's guarantee holds.  Length 0 (tokens [K, 0]) proposes
        nothing: the engine then takes one autoregressive step.  The paired measurement needs L."""

    def observe_target(self, features: Tensor) -> None:
        """The target's last-layer features [m, d] of the next m committed positions, in order (the
        positions the target's cache now holds beyond those handed over before); only called when
        :attr:`uses_target_features`."""

    def commit(self, sel: int, tau: int) -> None:
        """The verifier kept row ``sel`` of the last proposal and accepted its first ``tau`` tokens."""

    def rewind(self, length: int) -> None:
        """Forget the last proposal and everything processed past the first ``length`` tokens of the
        sequence (the paired measurement draws again at the same context)."""

    @abstractmethod
    def reference_law(self, context: Sequence[int], sampling: SamplingConfig, committed: int | None = None) -> Tensor:
        """The law [V] float64 of the next drafted token after ``context`` (committed sequence plus the
        row's drafted prefix), computed slowly from ``context`` alone.  committed: how many leading tokens
        of ``context`` are committed (None: all); only a drafter whose law depends on what the target has
        scored (``eagle``) reads it."""

    def options(self) -> dict[str, Any]:
        """The drafter's settings, recorded with every generation (``stats["drafter_options"]``)."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


#: The drafter of a run that names none: the pair's draft model (ids and labels of such runs carry no drafter).
DEFAULT_DRAFTER = "model"


def method_label(method: str, drafter: str | None) -> str:
    """A run's label: the method, with its drafter where that is not the default (``sd+ngram``)."""
    return method if drafter in (None, DEFAULT_DRAFTER) else f"{method}+{drafter}"


def verifier_of(label: str) -> str:
    """The method of a :func:`method_label` (``sd+ngram`` -> ``sd``; a plain method name is its own)."""
    return label.split("+", 1)[0]


def draw_rows(laws: Tensor, generator: torch.Generator) -> Tensor:
    """One token per row of ``laws`` [K, V] (float64), each with its own float64 uniform of
    ``generator``, by inverse CDF: exactly the law of its row.  -> [K] int64."""
    u = torch.rand(laws.shape[0], generator=generator, dtype=torch.float64, device=generator.device)
    return categorical(laws, u)
