"""Hydra configs of ``experiments/run.py``: every option of every config group and every experiment
preset composes against the typed schema (``mdv.sweep.RunConfig``) and passes validation; the presets
hold the documented grids; a typo (unknown option, unknown key, unknown method in a list) fails at
compose time naming the valid choices; and the theory preset runs from the command line.

Bad input on the command line (unknown option, dataset, method or preset, K = 0, top-p outside (0, 1],
a negative temperature, a dataset unavailable offline, an unwritable results folder, HYDRA_FULL_ERROR=1)
is in ``tests/test_bad_input_matrix.py``; the grid values in-process in test_sweep.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException

import experiments.run  # noqa: F401  (registers the run_schema and the mdv_hydra_dir resolver)
from mdv.drafters import DRAFTERS
from mdv.sweep import RunConfig, Task, expand_grid, to_run_config, validate

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "mdv" / "conf"
GROUPS = ("method", "drafter", "models", "dataset", "sampling", "sweep", "logger", "paired", "experiment")
ALL_METHODS = ["ar", "bv", "gbv", "mdbv", "mpbv", "sd", "select_gbv", "spectr", "spectr_gbv"]  # the baseline, then the registry (name order)
ALL_DATASETS = ["gsm8k", "humaneval", "mgsm", "lm1b", "alpaca"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_run(overrides: list[str], hydra_cfg: bool = False) -> Any:
    with initialize_config_dir(version_base=None, config_dir=str(CONF), job_name="test"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_cfg)


def run_config(overrides: list[str]) -> RunConfig:
    return to_run_config(compose_run(overrides))


# ------------------------------------------------------------------------------- composition
def test_the_groups_hold_the_documented_options() -> None:
    assert set(options("method")) >= set(ALL_METHODS) | {"all", "lossless", "multi_draft"}
    assert set(options("models")) >= {"default", "tiny_random", "qwen_coder", "hub"}
    assert set(options("dataset")) >= set(ALL_DATASETS) | {"all"}
    assert set(options("experiment")) >= {"smoke", "paper_table", "ablation_k", "ablation_l", "ablation_temp", "theory"}
    assert set(options("logger")) == {"none", "wandb"}
    assert set(options("drafter")) == set(DRAFTERS) | {"all"}
    assert set(options("hydra/launcher")) >= {"processes", "slurm"}


@pytest.mark.parametrize("override", [f"{g}={o}" for g in GROUPS for o in options(g)])
def test_every_option_composes_and_validates(override: str) -> None:
    cfg = run_config([override])
    assert isinstance(cfg, RunConfig)
    group, option = override.split("=")
    if cfg.task == Task.theory:
        cfg.theory.validate()
        return
    validate(cfg)
    cells = expand_grid(cfg)
    assert cells and len({c.cell_id for c in cells}) == len(cells)
    if group == "method" and option in ALL_METHODS:
        assert [m.value for m in cfg.method.names] == [option]
    if group == "drafter":
        assert cfg.drafter.names == (list(DRAFTERS) if option == "all" else [option])
        assert {c.drafter for c in cells if c.method != "ar"} == set(cfg.drafter.names)
    if group == "dataset" and option in ALL_DATASETS:
        assert [d.value for d in cfg.dataset.names] == [option]
    if group == "models":
        assert cfg.models.kind.value == {"default": "default", "tiny_random": "tiny_random", "qwen_coder": "assets",
                                         "hub": "hub"}.get(option, cfg.models.kind.value)
        assert "${" not in cfg.models.name  # interpolations resolved into the recorded identity


def test_defaults_are_the_smoke_preset_with_tracking_off() -> None:
    cfg = run_config([])
    assert cfg.name == "smoke" and cfg.task == Task.sweep and cfg.results_dir == "outputs/smoke"
    assert cfg.models.kind.value == "default" and cfg.logger.kind.value == "none"
    assert [m.value for m in cfg.method.names] == ALL_METHODS
    assert [d.value for d in cfg.dataset.names] == ALL_DATASETS
    assert cfg.dataset.n_prompts == 3 and cfg.sampling.max_new_tokens == 32 and cfg.sampling.temperatures == [0.4]
    assert cfg.sweep.K == [3] and cfg.sweep.L == [4]
    assert len(expand_grid(cfg)) == 45  # 5 datasets x (ar + 8 verifiers)


@pytest.mark.parametrize("preset,K,L,T", [
    ("paper_table", [3], [8, 12], [0.4]),
    ("ablation_k", [1, 2, 3, 4, 5, 6, 7, 8], [8], [0.4]),
    ("ablation_l", [3], list(range(2, 13)), [0.4]),
    ("ablation_temp", [3], [8], [0.0, 0.1, 0.4, 0.7]),
    ("smoke", [3], [4], [0.4]),
])
def test_presets_hold_their_grids(preset: str, K: list[int], L: list[int], T: list[float]) -> None:
    cfg = run_config([f"experiment={preset}"])
    assert cfg.name == preset and cfg.results_dir == f"outputs/{preset}"
    assert cfg.sweep.K == K and cfg.sweep.L == L and cfg.sampling.temperatures == T
    assert [m.value for m in cfg.method.names] == ALL_METHODS  # ar included: speedups need it
    if preset in ("paper_table", "smoke"):
        assert [d.value for d in cfg.dataset.names] == ALL_DATASETS
    cells = expand_grid(cfg)
    assert {c.method for c in cells} == set(ALL_METHODS)
    assert {c.K for c in cells if c.method == "mdbv"} == set(K)


@pytest.mark.parametrize("preset,K_max,L_max", [("paper_table", 3, 12), ("ablation_k", 8, 8), ("ablation_l", 3, 12),
                                                ("ablation_temp", 3, 8)])
def test_presets_gain_the_paired_task(preset: str, K_max: int, L_max: int) -> None:
    cfg = run_config([f"experiment={preset}"])
    assert cfg.paired.enabled and (cfg.paired.K_max, cfg.paired.L_max) == (K_max, L_max)
    assert not run_config(["experiment=smoke"]).paired.enabled  # the smoke sweep stays as it was


def test_the_main_job_is_the_paired_task_with_its_speed_check() -> None:
    """experiment=main: the paired measurement alone (no sweep cells) at the issue's setting, its speedup
    check on prompts the paired run measures."""
    from mdv.paired.config import validate_paired

    cfg = run_config(["experiment=main"])
    p = cfg.paired
    assert cfg.task == Task.paired and (p.K_max, p.L_max) == (4, 8) and cfg.sampling.temperatures == [0.4]
    assert p.datasets == ALL_DATASETS and p.n_prompts >= 10 and p.workers == 2 and p.methods == ALL_METHODS[1:]
    check = p.speed_check
    assert check.enabled and set(check.datasets) <= set(p.datasets) and check.n_prompts <= p.n_prompts
    assert {"sd", "spectr"} <= set(check.methods) and set(check.L) <= set(range(1, 5))
    validate_paired(p)
    assert run_config(["task=paired", "paired.K_max=2"]).task == Task.paired
    # mdv's fast exact CPU path (README: two runs in a row met the 10% prediction goal unpaired in every
    # cell); "auto" falls back to the plain path where the panels or the lean forward cannot run
    assert (cfg.models.linears.value, cfg.models.forward.value, cfg.models.draft_panel_dtype) == ("auto", "auto", "float16")
    # the plain path is one override away and composes
    plain = run_config(["experiment=main", "models.linears=plain", "models.forward=hf", "models.draft_panel_dtype=float32"])
    assert (plain.models.linears.value, plain.models.forward.value, plain.models.draft_panel_dtype) == ("plain", "hf", "float32")


def test_the_ordering_check_preset_decides_the_multi_draft_ordering_without_timing() -> None:
    """experiment=ordering_check: the main job's contexts on 50 prompts per dataset, every verifier, no
    calibration and no speed check (block efficiencies and verdicts only)."""
    from mdv.paired.config import validate_paired

    cfg = run_config(["experiment=ordering_check"])
    p = cfg.paired
    main = run_config(["experiment=main"]).paired
    assert cfg.task == Task.paired and p.datasets == ALL_DATASETS and p.n_prompts == 50
    assert (p.K_max, p.L_max, p.n_tokens, p.stride) == (main.K_max, main.L_max, main.n_tokens, main.stride)
    assert (p.headline_K, p.headline_L) == (3, 4) and {"select_gbv", "mpbv", "mdbv", "spectr"} <= set(p.methods)
    assert not p.calibrate and not p.speed_check.enabled
    validate_paired(p)


def test_theory_preset_points_at_the_oracle_tables() -> None:
    cfg = run_config(["experiment=theory", "theory.K=[1,2]"])
    assert cfg.task == Task.theory and cfg.theory.K == [1, 2]


def test_command_line_group_choice_beats_the_preset() -> None:
    cfg = run_config(["experiment=paper_table", "models=tiny_random", "dataset=gsm8k", "sweep.L=[5]"])
    assert cfg.models.kind.value == "tiny_random" and [d.value for d in cfg.dataset.names] == ["gsm8k"]
    assert cfg.sweep.L == [5] and cfg.sweep.K == [3]


def test_results_dir_is_stable_and_overridable() -> None:
    assert run_config(["experiment=ablation_k"]).results_dir == "outputs/ablation_k"
    assert run_config(["results_dir=/data/x"]).results_dir == "/data/x"


@pytest.mark.parametrize("launcher,target", [
    ("basic", "BasicLauncher"), ("processes", "JoblibLauncher"), ("joblib", "JoblibLauncher"),
    ("slurm", "SlurmLauncher"), ("submitit_slurm", "SlurmLauncher"), ("submitit_local", "LocalLauncher"),
])
def test_launchers_compose(launcher: str, target: str) -> None:
    if launcher in ("processes", "joblib"):
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="hydra-joblib-launcher is not installed")
    if "slurm" in launcher or "submitit" in launcher:
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed")
    cfg = compose_run([f"hydra/launcher={launcher}"], hydra_cfg=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    if launcher == "slurm":
        assert cfg.hydra.launcher.timeout_min == 240 and cfg.hydra.launcher.gpus_per_node == 1
    if launcher == "processes":
        assert cfg.hydra.launcher.n_jobs == 2


def test_default_launcher_is_basic() -> None:
    cfg = compose_run([], hydra_cfg=True)
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")


# ------------------------------------------------------------------------------- typos fail at compose time
@pytest.mark.parametrize("group", GROUPS)
def test_unknown_option_lists_the_valid_ones(group: str) -> None:
    with pytest.raises(MissingConfigException) as err:
        compose_run([f"{group}=no_such_option"])
    msg = str(err.value)
    assert f"'{group}/no_such_option'" in msg
    assert all(o in msg for o in options(group))


def test_unknown_method_in_a_list_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_run(["method.names=[sd,nope]"])
    msg = f"{err.value} {err.value.__cause__}"
    assert "nope" in msg and all(m in msg for m in ALL_METHODS)


@pytest.mark.parametrize("override", ["sampling.top_pp=0.9", "sweep.k=[1]", "models.vocab=3", "dataset.names=[gsm9k]",
                                      "sweep.K=[one]"])
def test_unknown_key_or_wrong_type_fails_at_compose_time(override: str) -> None:
    with pytest.raises(ConfigCompositionException):
        compose_run([override])


# ------------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def theory_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """``python -m experiments.run experiment=theory`` on a tiny grid (bad input on the command line:
    ``tests/test_bad_input_matrix.py``)."""
    out = tmp_path_factory.mktemp("cli") / "theory"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, "-m", "experiments.run", "models=tiny_random", "progress=false", "experiment=theory",
           "theory.K=[1,2]", "theory.L=[1]", "theory.seeds=[0]", "theory.temperatures=[1.0]", f"results_dir={out}"]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600), out


def test_theory_preset_runs(theory_run) -> None:
    proc, out = theory_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "theory.md").is_file() and (out / "theory.csv").is_file()
    assert len((out / "theory.csv").read_text().strip().splitlines()) > 1


def test_the_sr_check_preset_checks_the_prediction_at_the_e2e_budget() -> None:
    """experiment=sr_check: the speed check on every paired prompt of the five datasets, 64 tokens each."""
    from mdv.paired.config import validate_paired

    cfg = run_config(["experiment=sr_check"])
    p = cfg.paired
    assert cfg.task == Task.paired and p.datasets == ALL_DATASETS and p.n_prompts == p.speed_check.n_prompts == 10
    assert p.speed_check.enabled and p.speed_check.datasets is None and p.speed_check.n_tokens == p.n_tokens == 64
    assert {"sd", "spectr"} <= set(p.speed_check.methods) <= set(p.methods)
    validate_paired(p)
