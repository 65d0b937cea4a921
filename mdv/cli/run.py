"""The experiment runner (Hydra app): ``mdv run`` = ``python -m experiments.run [experiment=<preset>] [overrides]``.

Presets (``mdv/conf/experiment/``): ``main`` (the README's main job: the paired measurement with its speed
check), ``smoke`` (every method on every dataset on the default pair, 3 prompts x 32 tokens, wall clock
only), ``paper_table``, ``ablation_k``, ``ablation_l``, ``ablation_temp`` and ``theory`` (the exact
oracle tables).  Config groups: ``method``, ``models``,
``dataset``, ``sampling``, ``sweep``, ``logger``, ``hydra/launcher``; the typed schema is
:class:`mdv.sweep.RunConfig`, so a misspelt option or key fails at compose time listing the choices.

Results: one JSON file per cell in ``outputs/<experiment>/cells/`` (``results_dir=...`` to move it);
rerunning the same command skips finished cells and retries failed ones.  Tables and plots:
``python -m analysis.report <results_dir>``.  A failed cell's traceback is logged at DEBUG level
(``hydra.verbose=mdv.sweep``).

Examples::

    python -m experiments.run                                        # experiment=smoke
    python -m experiments.run experiment=smoke method=lossless dataset=humaneval dataset.n_prompts=5
    python -m experiments.run experiment=ablation_k models=qwen_coder logger=wandb
    python -m experiments.run experiment=theory theory.K=[1,2]

Multirun (``-m``): every job runs its own slice of the grid, all into one results folder::

    # local processes (hydra-joblib-launcher), one dataset per process, 1 torch thread each
    python -m experiments.run -m experiment=paper_table dataset=gsm8k,humaneval,mgsm,lm1b,alpaca \\
        hydra/launcher=processes hydra.launcher.n_jobs=2 threads=1

    # a SLURM cluster (hydra-submitit-launcher): one SLURM job per (dataset, L), on a shared filesystem
    python -m experiments.run -m experiment=paper_table models=hub \\
        dataset=gsm8k,humaneval,mgsm,lm1b,alpaca sweep.L=[8],[12] \\
        hydra/launcher=slurm hydra.launcher.partition=gpu hydra.launcher.timeout_min=240 \\
        results_dir=/shared/mdv/paper_table

``hydra/launcher=slurm`` (``mdv/conf/hydra/launcher/slurm.yaml``) extends submitit's ``submitit_slurm``
(``partition``, ``account``, ``qos``, ``gpus_per_node``, ``cpus_per_task``, ``mem_gb``, ``timeout_min``,
``array_parallelism``, ``setup``); the submitting shell waits for the jobs and the logs land under
``<results_dir>/hydra/multirun_*/.submitit``.  A job that dies or times out loses only its unfinished
cell: resubmit the same command and finished cells are skipped.  Overlapping slices are safe: a per-cell
lock (``flock``) lets one job compute each cell and the others report it as busy (rerun to pick up cells
whose owner died); on filesystems without locks, give each job a disjoint slice.

Bad input (unknown option, K = 0, top-p outside (0, 1], a dataset unavailable offline, an unwritable
results folder): one line on stderr and a non-zero exit; ``HYDRA_FULL_ERROR=1`` shows the traceback.
Exit status 1 when a single run (not ``-m``) finished with failed cells (their files hold the errors).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from mdv.cli.errors import clean_errors
from mdv.errors import MdvError
from mdv.paired.measure import run_paired
from mdv.sweep import RunConfig, Task, check_writable_dir, run_sweep, to_run_config
from mdv.tracking import make_tracker

ConfigStore.instance().store(name="run_schema", node=RunConfig)


def hydra_log_dir(results_dir: str) -> str:
    """Resolver ``${mdv_hydra_dir:${results_dir}}`` (hydra.run.dir / hydra.sweep.dir in mdv/conf/config.yaml):
    Hydra's own log folder, ``<results_dir>/hydra`` when it can be written, else a temp folder -- so that
    an unwritable ``results_dir`` reaches :func:`mdv.sweep.run_sweep`, which reports it as one line,
    instead of failing inside Hydra with a traceback."""
    try:
        return str(check_writable_dir(Path(results_dir) / "hydra"))
    except MdvError:
        return str(Path(tempfile.gettempdir()) / "mdv-hydra")


if not OmegaConf.has_resolver("mdv_hydra_dir"):
    OmegaConf.register_new_resolver("mdv_hydra_dir", hydra_log_dir)


def run_theory(config: RunConfig) -> None:
    """``experiment=theory``: the exact oracle tables of :mod:`mdv.theory` into ``results_dir``."""
    from mdv.theory import compute, summary, write_outputs

    out = check_writable_dir(config.results_dir)
    start = time.perf_counter()
    rows = compute(config.theory, progress=config.progress)
    seconds = time.perf_counter() - start
    paths = write_outputs(rows, out, config.theory, seconds)
    s = summary(rows)
    print(f"theory: {len(rows)} rows in {seconds:.0f} s; monotonicity violations: {len(s['monotonicity'])}")
    for name, p in paths.items():
        print(f"  {name}: {p}")


@hydra.main(version_base=None, config_path="../conf", config_name="config")
@clean_errors
def main(cfg) -> None:
    config = to_run_config(cfg)  # typed: a wrong key, option or type already failed at compose time
    if config.task == Task.theory:
        run_theory(config)
        return
    job = HydraConfig.get().job
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    run_name = f"{config.name}-{job.num}" if multirun else config.name
    failed: list[str] = []
    if config.task == Task.sweep:
        report = run_sweep(config, make_tracker(config.logger, run_name))
        print(report.line())
        if report.failed:
            print(f"failed cells ({len(report.failed)}): {', '.join(report.failed)}; rerun the same command to"
                  " retry them", file=sys.stderr)
        failed += report.failed
    if config.task == Task.paired or config.paired.enabled:
        paired = run_paired(config, tracker=make_tracker(config.logger, f"{run_name}-paired"))
        print(paired.line())
        if paired.failed:
            print(f"failed paired records ({len(paired.failed)}): {', '.join(paired.failed)}; rerun the same"
                  " command to retry them", file=sys.stderr)
        failed += paired.failed
    if failed and not multirun:
        sys.exit(1)

