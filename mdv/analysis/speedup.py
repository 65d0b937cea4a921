"""Speedups: a method's cell paired with its AR cell (same dataset, transform, length, seed, prompts, models
and machine), AR decode seconds ÷ method decode seconds per prompt, the warm-up prompts excluded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from mdv.analysis.cells import AR, Cell, as_number
from mdv.drafters.base import verifier_of


# ----------------------------------------------------------------------------------------------- speedup


@dataclass
class Speedup:
    """Per-prompt speedups of one method cell against its AR cell."""

    decode: list[float]
    e2e: list[float]
    ar_cell: Cell
    unequal_tokens: int = 0


def lossless(method: str) -> bool | None:
    """The registry's flag of ``method`` (or of a ``method+drafter`` label: the drafter does not change it;
    AR is lossless by definition); None for an unknown method."""
    if method == AR:
        return True
    from mdv.verify.registry import VERIFIERS

    cls = VERIFIERS.get(verifier_of(method))
    return None if cls is None else bool(cls.lossless)


def multi_draft(method: str) -> bool:
    """Whether the method (or ``method+drafter`` label) uses K drafts (unknown methods are treated as
    multi-draft: their K is kept)."""
    if method == AR:
        return False
    from mdv.verify.registry import VERIFIERS

    cls = VERIFIERS.get(verifier_of(method))
    return True if cls is None else bool(cls.multi_draft)


def find_ar(cell: Cell, ar_cells: Sequence[Cell]) -> tuple[Cell | None, str]:
    """The AR cell to pair ``cell`` with, or (None, why not)."""
    same = [a for a in ar_cells if a.pair_key() == cell.pair_key() and (not a.draft or a.draft == cell.draft)]
    if not same:
        return None, "no AR cell with the same dataset, sampling, seed, prompt count and models"
    machine = [a for a in same if a.env_key() == cell.env_key()]
    if not machine:
        return None, "the AR cell was measured on a different machine/environment"
    ts = str(cell.environment.get("timestamp", ""))
    machine.sort(key=lambda a: (str(a.environment.get("timestamp", "")) != ts, a.cell_id))
    return machine[0], ""


def speedups(cell: Cell, ar: Cell) -> Speedup:
    """Per prompt (paired by prompt_index, warm-up of both cells excluded): AR ÷ method decode seconds and
    AR ÷ method end-to-end seconds."""
    ar_by = {int(g["prompt_index"]): g["stats"] for g in ar.timed()}
    out = Speedup([], [], ar)
    for g in cell.timed():
        a = ar_by.get(int(g["prompt_index"]))
        if a is None:
            continue
        s = g["stats"]
        d_m, d_a = as_number(s["decode_s"]), as_number(a["decode_s"])
        t_m, t_a = as_number(s["total_s"]), as_number(a["total_s"])
        if d_m > 0 and d_a > 0:
            out.decode.append(d_a / d_m)
        if t_m > 0 and t_a > 0:
            out.e2e.append(t_a / t_m)
        if as_number(s["new_tokens"]) != as_number(a["new_tokens"]):
            out.unequal_tokens += 1
    return out
