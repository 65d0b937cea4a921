"""The sweep runner (mdv.sweep) and its W&B logger (mdv.tracking), on the tiny random pair.

* grid expansion: AR once per (dataset, T, seed) with K = L = None, single-draft verifiers at K = 1,
  cell ids unique and sensitive to every config field;
* a sweep writes one strict-JSON file per cell with every field of the ``mdv.cell/1`` contract, and
  no temp file stays behind;
* resume: after an interrupted sweep (KeyboardInterrupt in the middle), after deleting one cell file,
  with a truncated temp file or a truncated cell file left behind, a rerun computes exactly the
  missing cells, leaves finished files untouched, removes the dead writer's temp file, moves the torn
  cell file aside (kept, not overwritten), and loads no model when nothing is pending
  (SIGKILLed sweeps in subprocesses: ``tests/test_sweep_interrupted.py``);
* a failing cell is recorded (status "failed", its error) and the sweep goes on; the rerun retries it;
* an unwritable results folder, an unavailable dataset or missing models fail before any cell runs;
* the W&B logger writes an offline run (WANDB_MODE=offline, WANDB_DIR in tmp_path) with the summary table;
* a tiny Hydra multirun (``python -m experiments.run -m ...``, a subprocess) runs end to end.

The prompts come from :func:`stub_prompts` / :func:`stub_format` (a tiny in-test dataset), so these
tests need no dataset files; ``test_real_formatter_with_tiny_tokenizer`` checks the real
``mdv.data.format_prompt`` on the tiny tokenizer.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import mdv.sweep as sweep
import mdv.sweep.runner as runner
from mdv.errors import InvalidInputError, MdvError, MissingAssetError
from mdv.models.tiny_random import TinyTokenizer, build_tiny_random_pair
from mdv.sweep import Cell, ModelKind, ModelsGroup, RunConfig, cell_path, expand_grid, read_cell, run_sweep

REPO = Path(__file__).resolve().parent.parent
TOP_KEYS = {"schema", "cell_id", "status", "error", "config", "dataset", "models", "environment", "generations",
            "summary", "wall_seconds"}
CONFIG_KEYS = {"method", "K", "L", "temperature", "top_k", "top_p", "max_new_tokens", "seed", "dataset", "n_prompts",
               "models", "warmup_prompts"}
ENV_KEYS = {"cpu", "threads", "torch", "transformers", "dtype", "device", "mdv", "python", "timestamp"}
GEN_KEYS = {"prompt_index", "prompt_id", "seed", "tokens", "stats", "text"}


# ------------------------------------------------------------------------------- a tiny in-test dataset
def stub_prompts(name: str, n: int, source: str = "auto") -> SimpleNamespace:
    """A PromptSet-like stand-in for mdv.data.load_prompts (importable as tests.test_sweep:stub_prompts)."""
    prompts = [SimpleNamespace(id=f"{name}/{i}", text=f"{name} problem {i}: add {i} and {i + 1}.") for i in range(n)]
    return SimpleNamespace(name=f"{name}-stub", label=f"{name}-stub (test fixture; stand-in)", source="stand-in",
                           size=len(prompts), prompts=prompts)


def stub_format(prompt: Any, tokenizer: Any) -> list[int]:
    """Token ids of a stub prompt (tests.test_sweep:stub_format)."""
    return tokenizer.encode(prompt.text)


def unavailable_prompts(name: str, n: int, source: str = "auto") -> SimpleNamespace:
    raise ConnectionError("the hub is unreachable\nsecond line of detail")


def tiny_config(results_dir: Path, **over: Any) -> RunConfig:
    cfg = RunConfig()
    cfg.name = "test"
    cfg.results_dir = str(results_dir)
    cfg.progress = False
    cfg.models = ModelsGroup(kind=ModelKind.tiny_random, name="tiny_random-s0", device="cpu")
    cfg.method.names = ["ar", "sd", "mdbv"]
    cfg.dataset.names = ["humaneval", "gsm8k"]
    cfg.dataset.n_prompts = 2
    cfg.sampling.max_new_tokens = 6
    cfg.sweep.K, cfg.sweep.L = [2], [3]
    for k, v in over.items():
        obj = cfg
        *path, last = k.split(".")
        for p in path:
            obj = getattr(obj, p)
        setattr(obj, last, v)
    return cfg


def run(cfg: RunConfig, **kw: Any) -> sweep.SweepReport:
    return run_sweep(cfg, loader=kw.pop("loader", stub_prompts), formatter=kw.pop("formatter", stub_format), **kw)


def snapshot(results_dir: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted((results_dir / "cells").glob("*.json"))}


def _strict(path: Path) -> dict[str, Any]:
    def bad(c: str) -> None:
        raise AssertionError(f"{path.name} holds the non-JSON constant {c}")

    return json.loads(path.read_text(), parse_constant=bad)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """One finished sweep (6 cells), shared read-only by the tests that only inspect it."""
    out = tmp_path_factory.mktemp("finished")
    report = run(tiny_config(out))
    assert len(report.ok) == 6 and not report.failed
    return out


# ------------------------------------------------------------------------------- grid
def test_grid_expansion_collapses_ar_and_single_draft_axes() -> None:
    cfg = RunConfig()
    cfg.method.names = ["ar", "sd", "bv", "mdbv"]
    cfg.dataset.names = ["humaneval"]
    cfg.sweep.K, cfg.sweep.L = [1, 3], [2, 4]
    cells = expand_grid(cfg)
    by = {(c.method, c.K, c.L) for c in cells}
    assert by == {("ar", None, None), ("sd", 1, 2), ("sd", 1, 4), ("bv", 1, 2), ("bv", 1, 4),
                  ("mdbv", 1, 2), ("mdbv", 1, 4), ("mdbv", 3, 2), ("mdbv", 3, 4)}
    assert len(cells) == len(by)
    assert cells[0].method == "ar"  # the baseline first, next to the methods it pairs with
    ids = [c.cell_id for c in cells]
    assert len(set(ids)) == len(ids)
    assert ids[0].startswith("humaneval__ar__T0.4__s0__")
    assert any(i.startswith("humaneval__mdbv__K3_L4_T0.4__s0__") for i in ids)


def test_smoke_grid_has_every_method_and_dataset() -> None:
    cells = expand_grid(RunConfig())  # the schema defaults are the smoke preset's grid
    assert len(cells) == 5 * 9
    assert {c.method for c in cells} == {"ar", "sd", "spectr", "bv", "gbv", "spectr_gbv", "mdbv", "mpbv", "select_gbv"}
    assert {c.dataset for c in cells} == {"gsm8k", "humaneval", "mgsm", "lm1b", "alpaca"}
    multi = {c.K for c in cells if c.method in ("spectr", "spectr_gbv", "mdbv")}
    assert multi == {3} and {c.K for c in cells if c.method in ("sd", "bv", "gbv")} == {1}


def test_method_schema_lists_exactly_the_registered_methods() -> None:
    """The typed schema's ``Method`` enum is built from the registry when the schema is imported (Hydra
    checks names against it at compose time): the baseline, then every built-in verifier."""
    from mdv.engine import valid_methods

    assert [m.value for m in sweep.Method] == valid_methods() == ["ar", "bv", "gbv", "mdbv", "mpbv", "sd", "select_gbv",
                                                                  "spectr", "spectr_gbv"]


def test_cell_id_depends_on_every_config_field() -> None:
    base = Cell(dataset="gsm8k", method="sd", K=1, L=4, temperature=0.4, top_k=None, top_p=None, max_new_tokens=32,
                seed=0, n_prompts=3, models="default")
    changes = {"dataset": "humaneval", "method": "bv", "K": 2, "L": 5, "temperature": 0.7, "top_k": 5, "top_p": 0.9,
               "max_new_tokens": 16, "seed": 1, "n_prompts": 4, "models": "other", "dataset_source": "hub",
               "warmup_prompts": 2, "drafter": "ngram"}
    ids = {base.cell_id}
    for k, v in changes.items():
        ids.add(dataclasses.replace(base, **{k: v}).cell_id)
    ngram = dataclasses.replace(base, drafter="ngram")
    ids.add(dataclasses.replace(ngram, drafter_options=(("n_max", 2),)).cell_id)
    assert len(ids) == 2 + len(changes)
    assert base.cell_id == Cell(**dataclasses.asdict(base)).cell_id  # deterministic
    # the default drafter adds nothing: the id is the one this cell had before mdv.drafters existed
    assert base.cell_id == "gsm8k__sd__K1_L4_T0.4__s0__73ba2911"
    assert ngram.cell_id.startswith("gsm8k__sd+ngram__K1_L4_T0.4__s0__")


def test_drafters_are_an_axis_of_every_speculative_method(tmp_path: Path) -> None:
    from mdv.analysis import build_tables, load_results

    cfg = tiny_config(tmp_path, **{"method.names": ["ar", "sd", "mdbv"], "dataset.names": ["humaneval"],
                                   "drafter.names": ["model", "ngram"]})
    cells = expand_grid(cfg)
    assert {(c.method, c.K, c.drafter) for c in cells} == {("ar", None, "model"), ("sd", 1, "model"), ("sd", 1, "ngram"),
                                                           ("mdbv", 2, "model"), ("mdbv", 2, "ngram")}
    report = run(cfg)
    assert not report.failed and len(report.ok) == 5
    for c in cells:
        data = json.loads((tmp_path / "cells" / f"{c.cell_id}.json").read_text())
        if c.drafter == "ngram":
            assert data["config"]["drafter"] == "ngram" and data["config"]["drafter_options"] == {"n_max": 3, "n_min": 2}
            assert all(g["stats"]["drafter"] == "ngram" and g["stats"]["draft_calls"] == 0 for g in data["generations"])
        else:
            assert "drafter" not in data["config"]
    tables = build_tables(load_results(tmp_path).ok, warn=lambda line: None)
    assert {m for t in tables for m in t.methods} == {"ar", "sd", "mdbv", "sd+ngram", "mdbv+ngram"}


@pytest.mark.parametrize("over,needle", [
    ({"drafter.names": ["eagle3"]}, "unknown drafter 'eagle3'; valid drafters are: eagle, layerskip, model, ngram"),
    ({"drafter.names": []}, "drafter.names is empty"),
    ({"drafter.names": ["ngram"], "drafter.options": {"ngram": {"n_min": 5, "n_max": 2}}}, "n_min=5 > n_max=2"),
    ({"drafter.names": ["layerskip"], "drafter.options": {"layerskip": {"depth": 2.5}}}, "depth must be an integer"),
])
def test_bad_drafter_config_raises_before_any_work(tmp_path: Path, over: dict[str, Any], needle: str) -> None:
    with pytest.raises(MdvError, match=re.escape(needle)):
        run(tiny_config(tmp_path / "r", **over))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("key,value,needle", [
    ("sweep.K", [0], "sweep.K"), ("sweep.L", [2, -1], "sweep.L"), ("sampling.top_p", 1.5, "top_p"),
    ("sampling.top_p", 0.0, "top_p"), ("sampling.temperatures", [-0.1], "temperatures"),
    ("sampling.max_new_tokens", 0, "max_new_tokens"), ("dataset.n_prompts", 0, "n_prompts"),
    ("method.names", [], "method"), ("dataset.source", "cloud", "dataset.source"),
])
def test_bad_grid_values_raise_before_any_work(tmp_path: Path, key: str, value: Any, needle: str) -> None:
    calls: list[str] = []

    def loader(name: str, n: int, source: str = "auto") -> Any:
        calls.append(name)
        return stub_prompts(name, n, source)

    with pytest.raises(InvalidInputError, match=needle):
        run(tiny_config(tmp_path / "r", **{key: value}), loader=loader)
    assert calls == [] and not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------- the cell files
def test_sweep_writes_contract_files(finished: Path) -> None:
    files = sorted((finished / "cells").glob("*.json"))
    assert len(files) == 6
    assert not [p for p in (finished / "cells").iterdir() if p.name.startswith(".")]  # no temp file left
    methods = set()
    for path in files:
        rec = _strict(path)
        assert set(rec) == TOP_KEYS
        assert rec["schema"] == "mdv.cell/1" and rec["status"] == "ok" and rec["error"] is None
        assert path.name == rec["cell_id"] + ".json"
        assert CONFIG_KEYS <= set(rec["config"]) and rec["config"]["warmup_prompts"] == 1
        assert set(rec["dataset"]) >= {"name", "label", "source", "size"}
        assert rec["dataset"]["source"] == "stand-in" and rec["dataset"]["size"] == 2
        assert rec["models"]["target"].startswith("tiny-random-llama") and rec["models"]["draft"]
        assert set(rec["environment"]) == ENV_KEYS
        gens = rec["generations"]
        assert [g["prompt_index"] for g in gens] == [0, 1]
        assert all(set(g) == GEN_KEYS for g in gens)
        assert gens[1]["prompt_id"] == f"{rec['config']['dataset']}/1"
        for g in gens:
            st = g["stats"]
            assert 1 <= st["new_tokens"] <= 6 and isinstance(g["text"], str)
            assert len(g["tokens"]) == st["new_tokens"] and all(isinstance(t, int) for t in g["tokens"])
            assert g["seed"] == st["seed"] == sweep.prompt_seed(rec["config"]["seed"], g["prompt_index"])
            assert st["method"] == rec["config"]["method"] and st["max_new_tokens"] == 6
            if rec["config"]["method"] == "ar":
                assert st["target_calls"] == st["new_tokens"]
            else:
                assert st["target_calls"] == len(st["accepted_lengths"]) >= 1
        s = rec["summary"]
        assert s["n_generations"] == 2 and s["method"] == rec["config"]["method"]
        assert s["new_tokens"] == sum(g["stats"]["new_tokens"] for g in gens)
        assert rec["wall_seconds"] > 0
        methods.add((rec["config"]["method"], rec["config"]["K"], rec["config"]["L"]))
        if rec["config"]["method"] == "ar":
            assert s["block_efficiency_mean"] == 1.0 and rec["config"]["K"] is None
            assert s["block_efficiency_ci95"] == 0.0 or s["block_efficiency_ci95"] is None
        else:
            assert 1.0 <= s["block_efficiency_mean"] <= rec["config"]["L"] + 1
    assert methods == {("ar", None, None), ("sd", 1, 3), ("mdbv", 2, 3)}


def test_same_config_gives_same_tokens(finished: Path, tmp_path: Path) -> None:
    """The tiny pair and the per-prompt seeds are deterministic: a second sweep reproduces the tokens."""
    sweep.reset_model_cache()
    run(tiny_config(tmp_path, **{"dataset.names": ["gsm8k"]}))
    for path in (tmp_path / "cells").glob("*.json"):
        a, b = read_cell(path), read_cell(finished / "cells" / path.name)
        assert b is not None and a is not None
        assert [g["stats"]["accepted_lengths"] for g in a["generations"]] == \
               [g["stats"]["accepted_lengths"] for g in b["generations"]]
        assert [g["text"] for g in a["generations"]] == [g["text"] for g in b["generations"]]


def _panels_ok() -> bool:
    from mdv.models.panels import panel_kernel_status

    return panel_kernel_status()[0]


@pytest.mark.skipif(not _panels_ok(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_a_sweep_on_panel_linears_has_its_own_cells_and_the_same_greedy_tokens(finished: Path, tmp_path: Path) -> None:
    from mdv.sweep.config import LinearsKind
    from mdv.sweep.model_sets import load_models

    over = {"dataset.names": ["gsm8k"], "sampling.temperatures": [0.0], "models.linears": LinearsKind.panels}
    cfg = tiny_config(tmp_path, **over)
    plain_ids = {c.cell_id for c in expand_grid(tiny_config(tmp_path, **{**over, "models.linears": LinearsKind.plain}))}
    ids = {c.cell_id for c in expand_grid(cfg)}
    assert ids.isdisjoint(plain_ids)  # a resumed sweep never pairs a plain AR time with a panel cell's
    sweep.reset_model_cache()
    try:
        report = run(cfg)
        assert len(report.ok) == 3 and not report.failed
        pair = load_models(cfg.models)  # the loaded pair (cached): its linears on panels
        linears = [m for lm in (pair.target, pair.draft) for m in lm.model.modules() if type(m) is torch.nn.Linear]
        assert linears and all("forward" in m.__dict__ for m in linears)
    finally:
        sweep.reset_model_cache()
    assert not any("forward" in m.__dict__ for m in linears)  # reset_model_cache leaves the panels
    plain = run(tiny_config(tmp_path / "plain", **{**over, "models.linears": LinearsKind.plain}))
    assert len(plain.ok) == 3
    for path in (tmp_path / "cells").glob("*.json"):
        rec = read_cell(path)
        assert rec is not None and rec["config"]["models"] == "tiny_random-s0+panels"
        twin = [read_cell(p) for p in (tmp_path / "plain" / "cells").glob(path.name.split("__s0__")[0] + "__*.json")]
        assert len(twin) == 1
        assert [g["text"] for g in rec["generations"]] == [g["text"] for g in twin[0]["generations"]]  # T = 0


def test_a_sweep_on_the_lean_forward_has_its_own_cells_and_the_same_greedy_tokens(tmp_path: Path) -> None:
    from mdv.models.lean import LeanModel
    from mdv.sweep.config import ForwardKind
    from mdv.sweep.model_sets import load_models

    over = {"dataset.names": ["gsm8k"], "sampling.temperatures": [0.0], "models.forward": ForwardKind.lean}
    cfg = tiny_config(tmp_path, **over)
    hf_ids = {c.cell_id for c in expand_grid(tiny_config(tmp_path, **{**over, "models.forward": ForwardKind.hf}))}
    assert {c.cell_id for c in expand_grid(cfg)}.isdisjoint(hf_ids)  # never paired with transformers' timings
    sweep.reset_model_cache()
    try:
        report = run(cfg)
        assert len(report.ok) == 3 and not report.failed
        pair = load_models(cfg.models)
        assert isinstance(pair.target, LeanModel) and isinstance(pair.draft, LeanModel)
    finally:
        sweep.reset_model_cache()
    hf = run(tiny_config(tmp_path / "hf", **{**over, "models.forward": ForwardKind.hf}))
    assert len(hf.ok) == 3
    for path in (tmp_path / "cells").glob("*.json"):
        rec = read_cell(path)
        assert rec is not None and rec["config"]["models"] == "tiny_random-s0+lean"
        twin = [read_cell(p) for p in (tmp_path / "hf" / "cells").glob(path.name.split("__s0__")[0] + "__*.json")]
        assert len(twin) == 1
        assert [g["text"] for g in rec["generations"]] == [g["text"] for g in twin[0]["generations"]]  # T = 0


@pytest.mark.skipif(not _panels_ok(), reason="the panel kernel needs AVX2, FMA and a C compiler")
def test_a_draft_on_float16_panels_is_its_own_pair(tmp_path: Path) -> None:
    from mdv.sweep.config import LinearsKind, models_label
    from mdv.sweep.model_sets import load_models

    cfg = tiny_config(tmp_path, **{"dataset.names": ["gsm8k"], "method.names": ["sd"], "models.linears": LinearsKind.panels,
                                   "models.draft_panel_dtype": "float16"})
    assert models_label(cfg.models) == "tiny_random-s0+panels+draft_f16"
    sweep.reset_model_cache()
    try:
        assert len(run(cfg).ok) == 1
        pair = load_models(cfg.models)
        assert [p.dtype for p in pair.panels] == [torch.float32, torch.float16]  # the target's panels stay float32
        int8 = tiny_config(tmp_path / "int8", **{"dataset.names": ["gsm8k"], "method.names": ["sd"],
                                                 "models.linears": LinearsKind.panels, "models.draft_panel_dtype": "int8"})
        assert models_label(int8.models) == "tiny_random-s0+panels+draft_i8"
        assert len(run(int8).ok) == 1
        assert [p.dtype for p in load_models(int8.models).panels] == [torch.float32, torch.int8]
    finally:
        sweep.reset_model_cache()
    with pytest.raises(InvalidInputError, match="models.draft_panel_dtype must be one of float32, float16, int8; got 'int4'"):
        run(tiny_config(tmp_path / "bad", **{"models.draft_panel_dtype": "int4"}))
    for dtype in ("float16", "int8"):
        with pytest.raises(InvalidInputError, match=f"draft_panel_dtype={dtype} .*: set models.linears=panels"):
            run(tiny_config(tmp_path / "bad", **{"models.draft_panel_dtype": dtype}))
    assert not (tmp_path / "bad").exists()


def test_auto_linears_and_forward_resolve_to_what_runs_here_and_label_the_cells(tmp_path: Path, monkeypatch) -> None:
    from mdv.models.lean import LeanModel
    from mdv.sweep.config import ForwardKind, LinearsKind, ModelKind, enum_value, models_label, resolve_auto_models
    from mdv.sweep.model_sets import load_models

    auto = {"dataset.names": ["gsm8k"], "method.names": ["sd"], "sampling.temperatures": [0.0],
            "models.linears": LinearsKind.auto, "models.forward": ForwardKind.auto, "models.draft_panel_dtype": "float16"}
    cfg = tiny_config(tmp_path / "auto", **auto)
    sweep.reset_model_cache()
    try:
        assert len(run(cfg).ok) == 1
        panels = _panels_ok()
        assert enum_value(cfg.models.linears) == ("panels" if panels else "plain")
        assert enum_value(cfg.models.forward) == "lean"  # the tiny pair is a Llama pair
        assert cfg.models.draft_panel_dtype == ("float16" if panels else "float32")
        label = "tiny_random-s0" + ("+panels+draft_f16" if panels else "") + "+lean"
        assert models_label(cfg.models) == label
        assert isinstance(load_models(cfg.models).target, LeanModel)
        assert [read_cell(p)["config"]["models"] for p in (tmp_path / "auto" / "cells").glob("*.json")] == [label]
    finally:
        sweep.reset_model_cache()

    # no kernel here (a failing compiler, no AVX2): plain linears and float32 draft panels, one line saying why
    import mdv.models.panels as panels_module

    def no_kernel() -> None:
        raise InvalidInputError("the panel kernel needs an x86-64 CPU with AVX2 and FMA, which this machine lacks")

    monkeypatch.setattr(panels_module, "load_kernel_library", no_kernel)
    m = tiny_config(tmp_path / "x", **auto).models
    notes = resolve_auto_models(m)
    assert (enum_value(m.linears), m.draft_panel_dtype, models_label(m)) == ("plain", "float32", "tiny_random-s0+lean")
    assert any("plain (the panel kernel needs an x86-64 CPU with AVX2" in n for n in notes)
    # bfloat16 or a GPU: plain, without trying the kernel; a pair of your own: transformers' forward
    m = tiny_config(tmp_path / "y", **{**auto, "models.dtype": "bfloat16"}).models
    m.kind = ModelKind.hub
    notes = resolve_auto_models(m)
    assert (enum_value(m.linears), enum_value(m.forward)) == ("plain", "hf")
    assert any("dtype=bfloat16" in n for n in notes) and any("models.forward=lean runs a Llama pair" in n for n in notes)
    # settings other than auto are kept as they are
    m = tiny_config(tmp_path / "z", **{"models.linears": LinearsKind.plain, "models.forward": ForwardKind.hf}).models
    assert resolve_auto_models(m) == [] and (enum_value(m.linears), enum_value(m.forward)) == ("plain", "hf")


def test_panel_linears_on_bfloat16_fail_before_any_work(tmp_path: Path) -> None:
    from mdv.sweep.config import LinearsKind

    with pytest.raises(InvalidInputError, match="models.linears=panels runs float32 models on the CPU"):
        run(tiny_config(tmp_path / "r", **{"models.linears": LinearsKind.panels, "models.dtype": "bfloat16"}))
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------- resume
def test_resume_after_interruption_recomputes_nothing_and_loses_nothing(tmp_path: Path, monkeypatch) -> None:
    cfg = tiny_config(tmp_path)
    real_run_cell = sweep.run_cell
    calls: list[str] = []

    def interrupting(cell: Cell, *a: Any, **k: Any) -> Any:
        calls.append(cell.cell_id)
        if len(calls) == 4:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the 4th cell
        return real_run_cell(cell, *a, **k)

    monkeypatch.setattr(runner, "run_cell", interrupting)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    before = snapshot(tmp_path)
    assert len(before) == 3  # the interrupted cell left no file
    assert not [p.name for p in (tmp_path / "cells").iterdir() if p.name.startswith(".")]  # nor its lock

    calls.clear()
    report = run(cfg)
    assert len(report.skipped) == 3 and len(report.ok) == 3 and not report.failed
    assert sorted(calls) == sorted(report.ok) and set(calls).isdisjoint(report.skipped)
    after = snapshot(tmp_path)
    assert len(after) == 6
    assert {k: after[k] for k in before} == before  # finished files untouched (bytes and mtime)


def test_rerun_runs_only_the_deleted_cell_and_ignores_leftovers(tmp_path: Path, monkeypatch) -> None:
    cfg = tiny_config(tmp_path)
    first = run(cfg)
    cells = tmp_path / "cells"
    deleted, truncated = first.ok[2], first.ok[4]
    (cells / f"{deleted}.json").unlink()
    # a write interrupted half-way leaves a temp file; a torn cell file must not count as finished either
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs: its temp file is stale
    stale = cells / f".{deleted}.json.{dead.pid}.tmp"
    stale.write_text('{"schema": "mdv.cell/1", "cell_id": "' + deleted + '", "sta')
    torn = b'{"schema": "mdv.cell/1", "status": "ok", "gen'
    (cells / f"{truncated}.json").write_bytes(torn)
    before = snapshot(tmp_path)

    ran: list[str] = []
    real_run_cell = sweep.run_cell
    monkeypatch.setattr(runner, "run_cell", lambda cell, *a, **k: (ran.append(cell.cell_id), real_run_cell(cell, *a, **k))[1])
    report = run(cfg)
    assert sorted(ran) == sorted([deleted, truncated]) == sorted(report.ok)
    assert len(report.skipped) == 4
    after = snapshot(tmp_path)
    assert set(after) == set(before) | {f"{deleted}.json"}
    assert {k: v for k, v in after.items() if k not in (f"{deleted}.json", f"{truncated}.json")} == \
           {k: v for k, v in before.items() if k != f"{truncated}.json"}
    assert read_cell(cells / f"{truncated}.json")["status"] == "ok"
    assert not stale.exists()  # never read as a result, removed: its writer is dead
    aside = list(cells.glob(f"{truncated}.json.corrupt-*"))  # the torn file was moved aside, not overwritten
    assert len(aside) == 1 and aside[0].read_bytes() == torn and report.moved_aside == [str(aside[0])]
    assert not [p.name for p in cells.iterdir() if p.name.startswith(".")]  # no temp or lock file left


def test_finished_sweep_loads_no_model_and_no_dataset(finished: Path, monkeypatch) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("nothing is pending: nothing must be loaded")

    monkeypatch.setattr(runner, "load_models", boom)
    before = snapshot(finished)
    report = run_sweep(tiny_config(finished), loader=boom, formatter=boom)
    assert len(report.skipped) == 6 and not report.ok and not report.failed
    assert snapshot(finished) == before


# ------------------------------------------------------------------------------- failures
def test_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path: Path, monkeypatch) -> None:
    import mdv.engine

    real_generate = mdv.engine.generate

    def flaky(target: Any, draft: Any, ids: Any, method: str, **kw: Any) -> Any:
        if method == "sd":
            raise RuntimeError("boom: sd is broken today")
        return real_generate(target, draft, ids, method, **kw)

    monkeypatch.setattr(mdv.engine, "generate", flaky)
    cfg = tiny_config(tmp_path)
    report = run(cfg)
    assert len(report.failed) == 2 and len(report.ok) == 4
    assert all("__sd__" in c for c in report.failed)
    for cid in report.failed:
        rec = _strict(cell_path(tmp_path, cid))
        assert set(rec) == TOP_KEYS
        assert rec["status"] == "failed" and "RuntimeError: boom: sd is broken today" in rec["error"]
        assert rec["generations"] == [] and rec["summary"] == {}
    # the failed cells are retried on the next run, the finished ones are not
    monkeypatch.setattr(mdv.engine, "generate", real_generate)
    again = run(cfg)
    assert sorted(again.ok) == sorted(report.failed) and len(again.skipped) == 4
    assert all(read_cell(cell_path(tmp_path, c))["status"] == "ok" for c in report.failed)


def test_unwritable_results_dir_fails_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    calls: list[str] = []

    def loader(name: str, n: int, source: str = "auto") -> Any:
        calls.append(name)
        return stub_prompts(name, n, source)

    with pytest.raises(InvalidInputError, match="results_dir .* is not writable"):
        run(tiny_config(blocker / "results"), loader=loader)
    assert calls == []


def test_unavailable_dataset_fails_before_any_model_loads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(runner, "load_models", lambda *a, **k: pytest.fail("models loaded before datasets"))
    with pytest.raises(MissingAssetError, match=r"dataset 'humaneval' .* unavailable: ConnectionError") as err:
        run(tiny_config(tmp_path), loader=unavailable_prompts)
    assert "\n" not in str(err.value)
    assert list((tmp_path / "cells").glob("*.json")) == []


def test_missing_models_fail_before_any_cell(tmp_path: Path) -> None:
    from mdv import assets

    if assets.is_available("qwen2.5-coder-1.5b-instruct"):
        pytest.skip("the optional Qwen2.5-Coder asset is present here; this test needs it absent")
    cfg = tiny_config(tmp_path)
    cfg.models = ModelsGroup(kind=ModelKind.assets, name="qwen", target="qwen2.5-coder-1.5b-instruct",
                             draft="qwen2.5-coder-0.5b-instruct")
    with pytest.raises(MissingAssetError, match="python -m mdv.assets fetch qwen2.5-coder-1.5b-instruct"):
        run(cfg)
    assert list((tmp_path / "cells").glob("*.json")) == []


# ------------------------------------------------------------------------------- tiny pair, tokenizer
def test_tiny_random_pair_is_deterministic_and_shares_a_vocabulary() -> None:
    t1, d1, tok = build_tiny_random_pair(64, seed=3)
    t2, d2, _ = build_tiny_random_pair(64, seed=3)
    t3, _, _ = build_tiny_random_pair(64, seed=4)
    assert t1.vocab_size == d1.vocab_size == tok.vocab_size == 64
    for a, b in zip(t1.model.parameters(), t2.model.parameters()):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(d1.model.parameters(), d2.model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(t1.model.parameters(), d1.model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(t1.model.parameters(), t3.model.parameters()))
    ids = tok.encode("héllo")
    assert ids[0] == tok.bos_token_id and all(3 <= i < 64 for i in ids[1:]) and len(ids) == 1 + len("héllo".encode())
    assert len(tok.decode(ids)) == len(ids) - 1


def test_real_formatter_with_tiny_tokenizer() -> None:
    data = pytest.importorskip("mdv.data", reason="mdv.data (datasets) is not in this checkout")
    tok = TinyTokenizer(64)
    for kind in ("math", "code", "chat", "text"):
        ids = data.format_prompt(data.Prompt(id="x/0", text="What is 2 + 3?", kind=kind), tok)
        assert ids and all(isinstance(i, int) and 0 <= i < 64 for i in ids)


# ------------------------------------------------------------------------------- W&B
def test_wandb_logger_writes_an_offline_run(finished: Path, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed")
    from mdv.tracking import WandbTracker, make_tracker
    from mdv.sweep import LoggerGroup, LoggerKind

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = make_tracker(LoggerGroup(kind=LoggerKind.wandb, project="mdv-test"), "test-run")
    assert isinstance(tracker, WandbTracker) and tracker.mode == "offline"
    cfg = tiny_config(finished)
    report = run_sweep(cfg, tracker)  # everything is done: the resumed cells are logged all the same
    assert len(report.skipped) == 6
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    assert glob.glob(os.path.join(runs[0], "run-*.wandb"))
    tables = glob.glob(os.path.join(runs[0], "files", "media", "table", "summary_table*.json"))
    assert len(tables) == 1
    table = json.loads(Path(tables[0]).read_text())
    assert len(table["data"]) == 6
    col = table["columns"]
    rows = {r[col.index("cell_id")]: r for r in table["data"]}
    assert set(rows) == set(report.skipped)
    for cid, r in rows.items():
        summary = read_cell(cell_path(finished, cid))["summary"]
        assert r[col.index("block_efficiency_mean")] == pytest.approx(summary["block_efficiency_mean"])
        speed = r[col.index("speedup_decode_mean")]
        assert speed is not None and speed > 0  # every method pairs with its AR cell


def test_tracked_speedup_is_the_analysis_pairing(finished: Path) -> None:
    """The W&B speedup is the analysis's: AR decode s ÷ method decode s over the timed prompts (warm-up
    excluded) against the AR cell of the same dataset and machine, computed here from the raw records; a
    cell whose AR ran on another machine gets none, as in ``analysis.report``."""
    import copy

    from mdv.tracking import TABLE_COLUMNS, ar_cells, decode_speedup, summary_rows

    records = [read_cell(p) for p in sorted((finished / "cells").glob("*.json"))]
    assert len(records) == 6
    ars = ar_cells(records)
    assert len(ars) == 2
    for rec in records:
        config = rec["config"]
        ar = next(r for r in records if r["config"]["method"] == "ar" and r["config"]["dataset"] == config["dataset"])
        ar_decode = {g["prompt_index"]: g["stats"]["decode_s"] for g in ar["generations"]}
        warm = config.get("warmup_prompts", 1)
        ratios = [ar_decode[g["prompt_index"]] / g["stats"]["decode_s"] for g in rec["generations"]
                  if g["prompt_index"] >= warm]
        assert ratios
        expected = 1.0 if config["method"] == "ar" else sum(ratios) / len(ratios)
        assert decode_speedup(rec, ars) == pytest.approx(expected, rel=1e-12)
    moved = copy.deepcopy(next(r for r in records if r["config"]["method"] == "sd"))
    moved["environment"]["cpu"] = "another machine's cpu"
    assert decode_speedup(moved, ars) is None
    column = TABLE_COLUMNS.index("speedup_decode_mean")
    rows = summary_rows(records + [moved])
    assert rows[-1][column] is None and all(r[column] is not None for r in rows[:-1])


def test_tracker_gets_cell_file_records_that_pair_like_the_analysis(tmp_path: Path) -> None:
    """Freshly computed cells reach the tracker as their cell files hold them, so every method cell gets the
    speedup the files give (the test above covers resumed cells)."""
    from mdv.tracking import NullTracker, ar_cells, decode_speedup

    class Recording(NullTracker):
        def __init__(self) -> None:
            self.logged: list[dict[str, Any]] = []

        def log_cell(self, record: dict[str, Any], resumed: bool) -> None:
            assert not resumed
            self.logged.append(record)

    tracker = Recording()
    report = run_sweep(tiny_config(tmp_path), tracker)
    assert len(report.ok) == 6 and len(tracker.logged) == 6
    files = {cid: read_cell(cell_path(tmp_path, cid)) for cid in report.ok}
    live, on_disk = ar_cells(tracker.logged), ar_cells(files.values())
    assert len(live) == len(on_disk) == 2
    for record in tracker.logged:
        assert record == files[record["cell_id"]]
        speed = decode_speedup(record, live)
        assert speed is not None and speed == decode_speedup(files[record["cell_id"]], on_disk)


def test_logger_none_is_the_default() -> None:
    from mdv.tracking import NullTracker, make_tracker

    assert isinstance(make_tracker(RunConfig().logger), NullTracker)


# ------------------------------------------------------------------------------- Hydra multirun, end to end
def test_tiny_multirun_end_to_end(tmp_path: Path) -> None:
    """Two datasets x two draft lengths as four Hydra jobs (basic launcher) into one results folder.
    The AR cell of a dataset is computed by the first job and skipped by the second."""
    results = tmp_path / "results"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "experiments.run", "-m", "experiment=smoke", "models=tiny_random",
           "method=lossless", "dataset=humaneval,gsm8k", "sweep.L=[2],[3]", "sweep.K=[2]", "dataset.n_prompts=2",
           "sampling.max_new_tokens=5", "dataset.loader=tests.test_sweep:stub_prompts",
           "dataset.formatter=tests.test_sweep:stub_format", "threads=1", "progress=false",
           f"results_dir={results}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    files = sorted((results / "cells").glob("*.json"))
    # per dataset: 1 AR + (sd, bv, gbv at K = 1; spectr, mdbv, mpbv, select_gbv at K = 2) x L in {2, 3}
    assert len(files) == 2 * (1 + 7 * 2)
    recs = [_strict(p) for p in files]
    assert all(set(r) == TOP_KEYS and r["status"] == "ok" for r in recs)
    assert {r["config"]["dataset"] for r in recs} == {"humaneval", "gsm8k"}
    assert {r["config"]["L"] for r in recs} == {None, 2, 3}
    assert proc.stdout.count("already done") == 4 and "1 already done" in proc.stdout  # AR reused by job 2
    assert len(list((results / "hydra").glob("multirun_*/[0-3]/.hydra/config.yaml"))) == 4
