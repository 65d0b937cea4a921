"""The theory tables' summaries (mdv/theory.py): the best exact rule per K and L, and the dominance count,
checked by hand on rows made up for the purpose (the numbers of a real grid come from the oracle); the
off-grid check on random toys against a direct computation with the oracle."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mdv.errors import InvalidInputError
from mdv.oracle import expected_accepted, random_toy_model
from mdv.theory import (RANDOM_TOY_SHAPES, Row, TheoryConfig, best_exact_by_shape, dominance, random_toy_dominance,
                        write_outputs)


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


def test_random_toy_dominance_replays_its_toys_and_counts_what_the_oracle_counts(tmp_path) -> None:
    """The toys are a function of the seed, and every count is the oracle's own E[tau] compared directly;
    a rule held to a better one has misses (the check can fail), a rule held to itself has none."""
    n, seed = 6, 3
    spectr_vs_best = random_toy_dominance(n, seed, method="spectr", peers=["select_gbv", "mdbv"])
    rng = np.random.default_rng(seed)
    direct_misses, direct_below = 0, {"select_gbv": 0, "mdbv": 0}
    for t in range(n):
        K, L = RANDOM_TOY_SHAPES[t % 3]
        toy_seed = int(rng.integers(1 << 30))
        zero_prob, T = float(rng.choice([0.0, 0.2, 0.4])), float(rng.choice([0.5, 1.0, 2.0]))
        target = random_toy_model(3, toy_seed, zero_prob=zero_prob, name="target")
        draft = random_toy_model(3, toy_seed + 1, zero_prob=zero_prob, name="draft")
        value = {m: expected_accepted(m, target, draft, K, L, temperature=T) for m in ("spectr", "select_gbv", "mdbv")}
        for m in direct_below:
            direct_below[m] += value["spectr"] < value[m] - 1e-9
        direct_misses += value["spectr"] < max(value["select_gbv"], value["mdbv"]) - 1e-9
    assert len(spectr_vs_best["misses"]) == direct_misses >= 1
    assert spectr_vs_best["below"] == direct_below
    assert all(0 < x["gap"] <= spectr_vs_best["max_gap"] for x in spectr_vs_best["misses"])
    assert random_toy_dominance(3, seed, method="mdbv", peers=["mdbv"])["misses"] == []
    cfg = TheoryConfig(seeds=[0], K=[1], L=[1], temperatures=[1.0])
    rows = [Row(0, 3, 1.0, 1, 1, "sd", 0.5, 1.0, 1.0, 1.0, math.nan)]
    md = write_outputs(rows, tmp_path, cfg, 1.0, spectr_vs_best)["md"].read_text()
    assert f"Below the best peer in **{direct_misses} of {n}**" in md


def test_random_toy_options_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="random_toys must be >= 0"):
        TheoryConfig(random_toys=-1).validate()
    with pytest.raises(InvalidInputError, match="dominance_peers must name registered verifiers"):
        TheoryConfig(random_toys=2, dominance_peers=[]).validate()
    TheoryConfig(random_toys=0, dominance_peers=["nope"]).validate()  # not read when the check is off
