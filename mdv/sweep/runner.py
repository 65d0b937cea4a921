"""The sweep runner: every pending cell once, one result file per cell.

:func:`run_sweep` runs the cells.  At the start it removes temp files (``.<name>.<pid>@<host>.tmp``) and
unheld lock files left in ``cells/`` by processes of this host that died (e.g. SIGKILL), then, for each
cell, it

1. **skips** the cell when ``<results_dir>/cells/<cell_id>.json`` exists with ``"status": "ok"``
   (resume: a finished cell is never recomputed or overwritten);
2. otherwise takes the cell's **lock** (``cells/.<cell_id>.lock``, an exclusive ``flock``; the kernel
   releases it when its process dies, so the lock file of a killed sweep is simply taken over): a cell
   locked by another live sweep on the same results folder is left to it (reported as ``busy``), and a
   cell that another sweep finished in the meantime is skipped -- two sweeps never compute one cell;
3. looks at an existing file before replacing it: a previous **failed** record is retried and replaced
   (logged); a file that does not parse, is not ``mdv.cell/1`` or belongs to another cell id is **moved
   aside** to ``<cell_id>.json.corrupt-<UTC time>`` with a warning naming both paths -- a result file is
   never silently overwritten;
4. calls :func:`mdv.engine.generate` on each prompt of the dataset (the first prompt is a timing
   warm-up: analysis excludes it from speedups, not from block efficiency) and
5. writes the cell file **atomically** (temp file in the same folder + fsync + ``os.replace``), in the
   result-file contract ``mdv.cell/1`` (see :func:`cell_record`): a reader globbing ``cells/*.json``
   sees either no file or a complete one, whenever the process is killed.

Any exception inside a cell is recorded in its file (``"status": "failed"``, ``"error"``) and the sweep
goes on.  Everything that can be checked before the first cell runs is: the grid values
(:func:`validate`), that the results folder is writable, that every dataset of a pending cell loads,
and that the models exist -- each failure is one :class:`~mdv.errors.MdvError` with a fix.  Models are
loaded once per process (:func:`load_models` caches them) and only when some cell is pending.

Locks need ``fcntl.flock`` (POSIX; on NFS it maps to NFS byte-range locks).  Where it is unavailable
the sweep logs a warning and runs without locks (then concurrent sweeps on one folder may both compute
a cell; the second one keeps the first one's file and discards its own result).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from mdv.progress import progress_bar
from mdv.sweep.config import RunConfig, validate
from mdv.sweep.grid import Cell, expand_grid, prompt_seed
from mdv.sweep.model_sets import LoadedModels, check_models_available, load_models
from mdv.sweep.prompts import format_prompts, import_callable, load_prompt_set, prompt_id
from mdv.sweep.store import (SCHEMA, cell_done, cell_path, cells_dir, check_existing, environment, json_safe,
                             lock_cell, lock_path, prepare_results_dir, read_cell, remove_stale_locks,
                             remove_stale_temp_files, write_json_atomic)

log = logging.getLogger(__name__)


def _safe_decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    if tokenizer is None or not hasattr(tokenizer, "decode"):
        return ""
    try:
        return str(tokenizer.decode(list(tokens), skip_special_tokens=True))
    except Exception:  # decoding is for reading only; a tokenizer quirk must not fail the cell
        return ""


def run_cell(cell: Cell, models: LoadedModels, prompt_set: Any, prompt_ids: list[list[int]],
             progress: bool = False) -> tuple[list[dict[str, Any]], float]:
    """Generate on every prompt of ``prompt_set`` for ``cell``.  -> (generations, wall seconds).

    Prompt ``i`` uses ``seed = prompt_seed(cell.seed, i)``; each generation record holds prompt_index,
    prompt_id, seed, tokens (the generated ids), stats (``GenerationResult.stats``) and text."""
    from mdv.engine import generate

    gens: list[dict[str, Any]] = []
    start = time.perf_counter()
    draft = None if cell.method == "ar" else models.draft
    bar = progress_bar(progress, total=len(prompt_ids), desc=f"  {cell.label} prompts", leave=False, position=1)
    try:
        for i, ids in enumerate(prompt_ids):
            seed = prompt_seed(cell.seed, i)
            res = generate(models.target, draft, ids, cell.method, K=cell.K or 1, L=cell.L or 1,
                           temperature=cell.temperature, top_k=cell.top_k, top_p=cell.top_p,
                           max_new_tokens=cell.max_new_tokens, seed=seed, drafter=cell.drafter,
                           drafter_options=dict(cell.drafter_options))
            gens.append({"prompt_index": i, "prompt_id": prompt_id(prompt_set.prompts[i], cell.dataset, i),
                         "seed": seed, "tokens": [int(t) for t in res.tokens], "stats": res.stats,
                         "text": _safe_decode(models.tokenizer, res.tokens)})
            bar.update(1)
    finally:
        bar.close()
    return gens, time.perf_counter() - start


def dataset_block(prompt_set: Any) -> dict[str, Any]:
    """The ``dataset`` block of a cell file, from a PromptSet: name (the honest short name of the data
    actually loaded), label, source, size, plus ``PromptSet.record()`` extras when offered (requested
    key, total, selection, prompt ids)."""
    extra = prompt_set.record() if callable(getattr(prompt_set, "record", None)) else {}
    return {**extra, "name": str(prompt_set.name), "label": str(prompt_set.label),
            "source": str(prompt_set.source), "size": int(prompt_set.size)}


def cell_record(cell: Cell, *, status: str, error: Optional[str], dataset: dict[str, Any],
                models: dict[str, str], env: dict[str, Any], generations: list[dict[str, Any]],
                wall_seconds: float) -> dict[str, Any]:
    """A cell file's content (schema ``mdv.cell/1``)."""
    from mdv.metrics import aggregate

    summary = aggregate([g["stats"] for g in generations]) if status == "ok" else {}
    return {"schema": SCHEMA, "cell_id": cell.cell_id, "status": status, "error": error,
            "config": cell.config(), "dataset": dataset, "models": models, "environment": env,
            "generations": generations, "summary": summary, "wall_seconds": float(wall_seconds)}


@dataclass
class SweepReport:
    """What :func:`run_sweep` did: cell ids by outcome, and its wall time.

    skipped: already finished (before this sweep started, or by another sweep meanwhile).  busy: left to
    another live sweep that held the cell's lock.  moved_aside: paths of unreadable / foreign files moved
    aside before their cell was computed again."""

    results_dir: Path
    cells: list[str]
    skipped: list[str]
    ok: list[str]
    failed: list[str]
    wall_seconds: float
    busy: list[str] = field(default_factory=list)
    moved_aside: list[str] = field(default_factory=list)

    def line(self) -> str:
        extra = f", {len(self.busy)} left to another running sweep (busy)" if self.busy else ""
        if self.moved_aside:
            extra += f", {len(self.moved_aside)} unreadable file(s) moved aside"
        return (f"{len(self.cells)} cells: {len(self.ok)} run, {len(self.skipped)} already done (skipped),"
                f" {len(self.failed)} failed{extra}; {self.wall_seconds:.1f} s; results in"
                f" {self.results_dir}/cells")


def run_sweep(cfg: RunConfig, tracker: Any = None, *, loader: Callable[..., Any] | None = None,
              formatter: Callable[..., Any] | None = None) -> SweepReport:
    """Run every pending cell of ``cfg`` and write its file (see the module docstring).

    tracker: an :class:`mdv.tracking.Tracker` (None: no tracking).  loader / formatter: override
    ``cfg.dataset.loader`` / ``cfg.dataset.formatter``.  Raises an :class:`~mdv.errors.MdvError` before
    any cell runs when the grid, the results folder, a dataset or the models are unusable.
    """
    import torch

    from mdv.tracking import NullTracker

    t0 = time.perf_counter()
    validate(cfg)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    tracker = tracker or NullTracker()
    results_dir = prepare_results_dir(cfg.results_dir)
    for folder in (results_dir, cells_dir(results_dir)):  # what writers killed on this host left behind
        remove_stale_temp_files(folder)
    remove_stale_locks(cells_dir(results_dir))
    cells = expand_grid(cfg)
    done = {c.cell_id for c in cells if cell_done(results_dir, c)}
    pending = [c for c in cells if c.cell_id not in done]

    # --- everything that can fail without running a cell, before the first one runs
    prompt_sets: dict[str, Any] = {}
    models: LoadedModels | None = None
    if pending:
        loader = loader or import_callable(cfg.dataset.loader, "dataset.loader")
        formatter = formatter or import_callable(cfg.dataset.formatter, "dataset.formatter")
        for name in dict.fromkeys(c.dataset for c in pending):
            prompt_sets[name] = load_prompt_set(loader, name, cfg.dataset.n_prompts, cfg.dataset.source)
        check_models_available(cfg.models)
        log.info("loading models (%s)", cfg.models.name)
        models = load_models(cfg.models)
    formatted = format_prompts(pending, prompt_sets, models, formatter) if pending else {}

    tracker.start(cfg, cells)
    skipped, ok, failed, busy, moved = [], [], [], [], []

    def finished_elsewhere(cell: Cell, path: Path, why: str, level: int = logging.INFO) -> None:
        skipped.append(cell.cell_id)
        log.log(level, "cell %s: %s; keeping its file", cell.cell_id, why)
        record = read_cell(path)
        if record is not None:
            tracker.log_cell(record, resumed=True)

    bar = progress_bar(cfg.progress, total=len(cells), desc=f"{cfg.name} cells", position=0)
    try:
        for cell in cells:
            path = cell_path(results_dir, cell.cell_id)
            if cell.cell_id in done:
                skipped.append(cell.cell_id)
                record = read_cell(path)
                if record is not None:
                    tracker.log_cell(record, resumed=True)
                bar.update(1)
                continue
            lock = lock_cell(results_dir, cell.cell_id)
            if lock is None:
                busy.append(cell.cell_id)
                log.warning("cell %s is being computed by another running sweep (it holds %s); left to it",
                            cell.cell_id, lock_path(results_dir, cell.cell_id).name)
                bar.update(1)
                continue
            try:
                state, aside = check_existing(path, cell)
                if aside is not None:
                    moved.append(str(aside))
                if state == "done":
                    finished_elsewhere(cell, path, "finished by another sweep after this one started")
                    bar.update(1)
                    continue
                assert models is not None
                bar.set_postfix_str(cell.cell_id.rsplit("__", 1)[0])
                ps = prompt_sets[cell.dataset]
                env = environment(models.dtype, models.device)
                gens: list[dict[str, Any]] = []
                wall, error = 0.0, None
                try:
                    gens, wall = run_cell(cell, models, ps, formatted[cell.dataset][:cell.n_prompts],
                                          cfg.progress)
                except Exception as e:  # recorded; the sweep goes on
                    error = f"{type(e).__name__}: {e}"
                    log.warning("cell %s failed: %s", cell.cell_id, error.splitlines()[0] if error else "")
                    log.debug("traceback of cell %s", cell.cell_id, exc_info=True)  # hydra.verbose=mdv.sweep
                record = cell_record(cell, status="ok" if error is None else "failed", error=error,
                                     dataset=dataset_block(ps), models={"target": models.target_name,
                                                                        "draft": models.draft_name},
                                     env=env, generations=gens if error is None else [], wall_seconds=wall)
                # look again right before writing: without working locks another sweep may have written it
                state, aside = check_existing(path, cell, announce=False)
                if aside is not None:
                    moved.append(str(aside))
                if state == "done":
                    finished_elsewhere(cell, path, "finished by another sweep while this one computed it (this"
                                       " result is discarded)", logging.WARNING)
                    bar.update(1)
                    continue
                write_json_atomic(path, record)
            finally:
                lock.release()
            (ok if error is None else failed).append(cell.cell_id)
            tracker.log_cell(json_safe(record), resumed=False)  # what the cell file holds (NaN -> null)
            be = record["summary"].get("block_efficiency_mean", float("nan")) if error is None else float("nan")
            msg = f"{cell.cell_id}: " + (f"block efficiency {be:.2f}, {wall:.1f} s" if error is None
                                         else f"FAILED ({error.splitlines()[0]})")
            if cfg.progress:
                bar.write(msg)
            else:
                log.info(msg)
            bar.update(1)
    finally:
        bar.close()
        records = [r for c in cells if (r := read_cell(cell_path(results_dir, c.cell_id))) is not None]
        tracker.finish(records)
    return SweepReport(results_dir, [c.cell_id for c in cells], skipped, ok, failed, time.perf_counter() - t0,
                       busy=busy, moved_aside=moved)
