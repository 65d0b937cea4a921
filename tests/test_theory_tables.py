"""The theory tables' summaries (mdv/theory.py): the best exact rule per K and L, and the dominance count,
checked by hand on rows made up for the purpose (the numbers of a real grid come from the oracle)."""
from __future__ import annotations

import math

import pytest

from mdv.theory import Row, best_exact_by_shape, dominance


def _row(method: str, K: int, L: int, e_tau: float, seed: int = 0, lp_greedy: float = 2.0) -> Row:
    return Row(seed, 3, 1.0, K, L, method, e_tau, math.nan, math.nan, lp_greedy, math.nan)


ROWS = [
    # K = 2, L = 1, two cells: spectr 0.9/1.0 of LP-greedy, mpbv 0.8/1.0, spectr_gbv (lossy) above both
    _row("spectr", 2, 1, 1.8), _row("mpbv", 2, 1, 1.6), _row("spectr_gbv", 2, 1, 2.4),
    _row("spectr", 2, 1, 2.0, seed=1), _row("mpbv", 2, 1, 2.0, seed=1), _row("spectr_gbv", 2, 1, 2.4, seed=1),
    # K = 3, L = 2, one cell: mdbv ahead
    _row("spectr", 3, 2, 1.0), _row("mdbv", 3, 2, 1.5),
    # K = 1 is not a multi-draft shape
    _row("gbv", 1, 2, 1.9),
]


def test_best_exact_rule_per_shape_by_hand() -> None:
    shapes = best_exact_by_shape(ROWS)
    assert [(d["K"], d["L"]) for d in shapes] == [(2, 1), (3, 2)]
    first, second = shapes
    assert first["means"] == pytest.approx({"spectr": 0.95, "mpbv": 0.9})  # the lossy spectr_gbv is left out
    assert first["best"] == "spectr" and first["lead"] == pytest.approx(0.05) and first["cells"] == 2
    assert second["best"] == "mdbv" and second["lead"] == pytest.approx(0.25)


def test_dominance_counts_cells_where_a_rule_is_at_least_every_other_exact_rule() -> None:
    dom = dominance(ROWS)
    assert dom["spectr"] == (2, 3)  # ahead in the first cell, tied in the second, behind mdbv in the third
    assert dom["mpbv"] == (1, 2)  # tied in the second cell only
    assert dom["mdbv"] == (1, 1)
    assert "spectr_gbv" not in dom and "gbv" not in dom
