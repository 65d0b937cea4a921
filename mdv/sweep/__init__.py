"""Sweeps: a typed grid of cells, each run once into its own result file, resumable and safe to share.

    config.py      the typed Hydra schema (``run_schema``): enums, one dataclass per group, validate
    grid.py        Cell, expand_grid (the AR baseline and single-draft collapse of K), prompt seeds
    store.py       result files written atomically, per-cell locks, stale files of dead processes, the
                   machine description every record carries
    model_sets.py  the model sets (default, tiny_random, assets, hub), loaded once per process
    prompts.py     dataset loaders and prompt token ids, checked before the first cell
    runner.py      run_cell, run_sweep: every pending cell once, failures recorded, the sweep goes on

>>> from mdv.sweep import RunConfig, expand_grid
>>> cfg = RunConfig()
>>> cfg.method.names = ["ar", "sd"]; cfg.dataset.names = ["humaneval"]
>>> [c.cell_id.rsplit("__", 1)[0] for c in expand_grid(cfg)]
['humaneval__ar__T0.4__s0', 'humaneval__sd__K1_L4_T0.4__s0']
"""
from mdv.sweep.config import (DatasetGroup, DatasetName, LoggerGroup, LoggerKind, Method, MethodGroup, ModelKind,
                              ModelsGroup, RunConfig, SamplingGroup, SweepGroup, Task, to_run_config, validate)
from mdv.sweep.grid import Cell, expand_grid, prompt_seed
from mdv.sweep.model_sets import LoadedModels, load_models, reset_model_cache
from mdv.sweep.prompts import format_dataset_prompts, import_callable, load_prompt_set
from mdv.sweep.runner import SweepReport, cell_record, run_cell, run_sweep
from mdv.sweep.store import (CellLock, cell_done, cell_path, check_existing, check_writable_dir, environment,
                             json_safe, lock_cell, prepare_results_dir, read_cell, remove_stale_locks,
                             remove_stale_temp_files, write_json_atomic)

__all__ = [
    "Cell", "CellLock", "DatasetGroup", "DatasetName", "LoadedModels", "LoggerGroup", "LoggerKind", "Method",
    "MethodGroup", "ModelKind", "ModelsGroup", "RunConfig", "SamplingGroup", "SweepGroup", "SweepReport", "Task",
    "cell_done", "cell_path", "cell_record", "check_existing", "check_writable_dir", "environment", "expand_grid",
    "format_dataset_prompts", "import_callable", "json_safe", "load_models", "load_prompt_set", "lock_cell",
    "prepare_results_dir", "prompt_seed", "read_cell", "remove_stale_locks", "remove_stale_temp_files",
    "reset_model_cache", "run_cell", "run_sweep", "to_run_config", "validate", "write_json_atomic",
]
