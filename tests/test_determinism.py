"""Determinism on CPU: the same seed gives the same tokens and metrics, run to run and across entry points.

On the tiny random pair (``models=tiny_random``, built in code) at T = 1 (sampling, not greedy):

* ``mdv.generate`` with one seed, twice (and once more on a freshly built copy of the pair), gives the
  same tokens and the same non-timing statistics -- block efficiency, accepted lengths, target calls,
  acceptance rates, selected drafts, ... -- for every method (``ar`` and every verifier);
* a different seed gives different tokens for at least one of three prompts, for every method;
* the sweep entry points -- :func:`mdv.sweep.run_sweep` in-process and the Hydra command
  ``python -m experiments.run ... models=tiny_random`` in a subprocess -- record, for every generation,
  the tokens that ``mdv.generate(target, draft, prompt_ids, method, ..., seed=prompt_seed(cell_seed, i))``
  returns, and the two entry points agree on tokens and non-timing statistics cell by cell;
* the cell seed is recorded in every cell file (``config.seed``) and the per-prompt generation seed
  ``prompt_seed(cell_seed, i) = cell_seed * 1_000_003 + i`` in every generation record (``seed`` and
  ``stats.seed``); two cell seeds give different tokens.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mdv
import mdv.sweep as sweep
from mdv.models.tiny_random import build_tiny_random_pair
from mdv.sweep import expand_grid, prompt_seed, read_cell, run_sweep
from tests.test_sweep import REPO, stub_format, stub_prompts, tiny_config

METHODS = ["ar", "sd", "bv", "gbv", "spectr", "spectr_gbv", "mdbv", "mpbv", "select_gbv"]
assert set(METHODS) == {"ar", *mdv.VERIFIERS}, "a method was added: list it here"
T = 1.0
GRID = {"method.names": METHODS, "dataset.names": ["humaneval"], "sweep.seeds": [0, 7],
        "sampling.temperatures": [T], "sampling.max_new_tokens": 8}
METRICS = ("block_efficiency", "accepted_lengths", "target_calls", "acceptance_rate_kl", "acceptance_rate_l",
           "new_tokens", "selected_drafts", "accepted_length_histogram", "per_position_acceptance")


def non_timing(stats: dict[str, Any]) -> str:
    """The statistics that must not depend on the machine's speed, canonically (NaN as null)."""
    keep = {k: v for k, v in stats.items() if not k.endswith("_s") and not k.startswith("tokens_per_second")}
    assert set(METRICS) <= set(keep), f"missing metrics: {set(METRICS) - set(keep)}"
    return json.dumps(sweep.json_safe(keep), sort_keys=True)


@pytest.fixture(scope="module")
def pair() -> sweep.LoadedModels:
    return sweep.load_models(tiny_config(Path("unused")).models)  # what the sweep itself uses (cached)


@pytest.fixture(scope="module")
def prompts(pair: sweep.LoadedModels) -> list[list[int]]:
    return [stub_format(p, pair.tokenizer) for p in stub_prompts("humaneval", 3).prompts]


def gen(pair: Any, ids: list[int], method: str, seed: int, K: int = 2, L: int = 3, target: Any = None,
        draft: Any = None) -> Any:
    K = K if method != "ar" and mdv.VERIFIERS[method].multi_draft else 1
    return mdv.generate(target or pair.target, None if method == "ar" else (draft or pair.draft), ids, method,
                        K=K, L=L, temperature=T, max_new_tokens=8, seed=seed)


# ------------------------------------------------------------------------------- mdv.generate
@pytest.mark.parametrize("method", METHODS)
def test_same_seed_same_tokens_and_metrics(pair: Any, prompts: list[list[int]], method: str) -> None:
    fresh_target, fresh_draft, _ = build_tiny_random_pair(64, seed=0)  # the same pair, built again
    for i, ids in enumerate(prompts):
        seed = prompt_seed(3, i)
        a, b = gen(pair, ids, method, seed), gen(pair, ids, method, seed)
        c = gen(pair, ids, method, seed, target=fresh_target, draft=fresh_draft)
        assert a.tokens == b.tokens == c.tokens and 1 <= len(a.tokens) <= 8  # shorter: stopped at EOS
        assert non_timing(a.stats) == non_timing(b.stats) == non_timing(c.stats)
        assert a.stats["seed"] == seed
        if method != "ar":
            assert a.stats["target_calls"] == len(a.stats["accepted_lengths"]) >= 1
            assert 1.0 <= a.stats["block_efficiency"] <= 4.0


@pytest.mark.parametrize("method", METHODS)
def test_different_seeds_give_different_tokens(pair: Any, prompts: list[list[int]], method: str) -> None:
    for other in (1, 2):
        differ = [gen(pair, ids, method, 0).tokens != gen(pair, ids, method, other).tokens for ids in prompts]
        assert any(differ), f"{method}: seeds 0 and {other} gave the same tokens on every prompt"


# ------------------------------------------------------------------------------- sweep entry points
def check_cells_against_generate(results_dir: Path, pair: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """Every cell file of the GRID: seed recorded, tokens == mdv.generate(..., seed=prompt_seed(...))."""
    cells = expand_grid(tiny_config(results_dir, **GRID))
    assert len(cells) == 2 * len(METHODS)
    records = {}
    for cell in cells:
        rec = read_cell(sweep.cell_path(results_dir, cell.cell_id))
        assert rec is not None and rec["status"] == "ok", cell.cell_id
        assert rec["config"]["seed"] == cell.seed and rec["config"]["temperature"] == T
        assert [g["prompt_index"] for g in rec["generations"]] == [0, 1]
        for g in rec["generations"]:
            i = g["prompt_index"]
            assert g["seed"] == g["stats"]["seed"] == prompt_seed(cell.seed, i) == cell.seed * 1_000_003 + i
            direct = gen(pair, prompts[i], cell.method, g["seed"], K=cell.K or 1, L=cell.L or 1)
            assert g["tokens"] == direct.tokens, f"{cell.cell_id} prompt {i}: sweep and generate differ"
            assert non_timing(g["stats"]) == non_timing(direct.stats), f"{cell.cell_id} prompt {i}"
            assert g["text"] == pair.tokenizer.decode(direct.tokens, skip_special_tokens=True)
        records[cell.cell_id] = rec
    # the two cell seeds give different tokens, method by method
    for method in METHODS:
        by_seed = {r["config"]["seed"]: [g["tokens"] for g in r["generations"]]
                   for r in records.values() if r["config"]["method"] == method}
        assert set(by_seed) == {0, 7} and by_seed[0] != by_seed[7], f"{method}: seeds 0 and 7 gave the same tokens"
    return records


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, pair: Any, prompts: list[list[int]]) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sweep")
    report = run_sweep(tiny_config(out, **GRID), loader=stub_prompts, formatter=stub_format)
    assert len(report.ok) == 2 * len(METHODS) and not report.failed
    return {"dir": out, "records": check_cells_against_generate(out, pair, prompts)}


def test_run_sweep_records_the_seed_and_the_tokens_of_generate(in_process: dict[str, Any]) -> None:
    assert len(in_process["records"]) == 2 * len(METHODS)  # checked in the fixture: seeds recorded, tokens == generate


def test_run_sweep_twice_gives_the_same_files_but_timings(in_process: dict[str, Any], tmp_path: Path) -> None:
    sweep.reset_model_cache()  # the models are built again as well
    run_sweep(tiny_config(tmp_path, **GRID), loader=stub_prompts, formatter=stub_format)
    for cid, rec in in_process["records"].items():
        again = read_cell(sweep.cell_path(tmp_path, cid))
        assert again is not None and again["config"] == rec["config"]
        assert [g["tokens"] for g in again["generations"]] == [g["tokens"] for g in rec["generations"]]
        assert [non_timing(g["stats"]) for g in again["generations"]] == \
               [non_timing(g["stats"]) for g in rec["generations"]]


def test_hydra_command_gives_the_tokens_of_generate(in_process: dict[str, Any], tmp_path: Path, pair: Any,
                                                    prompts: list[list[int]]) -> None:
    results = tmp_path / "hydra-results"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "experiments.run", "experiment=smoke", "models=tiny_random", "method=all",
           "dataset=humaneval", "dataset.n_prompts=2", "sweep.K=[2]", "sweep.L=[3]", "sweep.seeds=[0,7]",
           f"sampling.temperatures=[{T}]", "sampling.max_new_tokens=8",
           "dataset.loader=tests.test_sweep:stub_prompts", "dataset.formatter=tests.test_sweep:stub_format",
           "threads=1", "progress=false", f"results_dir={results}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{2 * len(METHODS)} cells: {2 * len(METHODS)} run" in proc.stdout
    records = check_cells_against_generate(results, pair, prompts)
    assert set(records) == set(in_process["records"])  # the same cell ids: the same configs
    for cid, rec in records.items():
        mine = in_process["records"][cid]
        assert [g["tokens"] for g in rec["generations"]] == [g["tokens"] for g in mine["generations"]]
        assert [non_timing(g["stats"]) for g in rec["generations"]] == \
               [non_timing(g["stats"]) for g in mine["generations"]]
        assert not math.isnan(rec["summary"]["block_efficiency_mean"])
