"""Experiment tracking for sweeps: W&B (offline by default) or nothing.

``logger=wandb`` (``mdv/conf/logger/wandb.yaml``) makes :func:`mdv.sweep.run_sweep` log, in one W&B run per
sweep process (``job_type="sweep"``, grouped by experiment name):

* the whole sweep config as the run config;
* per cell, one ``wandb.log`` step: ``cell_id``, status, the cell's config under ``config/``, its
  aggregated metrics under ``metrics/`` (block efficiency mean and 95% CI, tokens/s, acceptance rates,
  mean accepted length, decode/prefill seconds, and the decode speedup over the paired AR cell when it
  exists) and the accepted-length histogram as a ``wandb.Histogram`` (``accepted_length_histogram``);
  cells skipped on resume are logged too (``resumed=1``), so a resumed run is complete;
* at the end, a ``summary_table`` (``wandb.Table``, one row per cell of the grid) and the counts of
  ok / failed cells in the run summary.

Offline by default: the mode is ``logger.mode``, else ``$WANDB_MODE``, else ``offline``; runs land in
``logger.dir``, else ``$WANDB_DIR``, else the results folder (``<dir>/wandb/offline-run-*``).  Upload
them later with ``wandb sync <dir>/wandb/offline-run-*`` (or ``wandb sync --sync-all`` from ``<dir>``).
Off unless the user asks for it (``logger=none`` is the default).

The decode speedup shown here is the analysis's own (:func:`mdv.analysis.find_ar` pairs the cell with its
AR cell: same dataset, sampling, seed, prompt count, models, machine and environment;
:func:`mdv.analysis.speedups` gives AR decode seconds ÷ method decode seconds per prompt, the warm-up
prompt(s) excluded), averaged over prompts: the number ``analysis.report`` tabulates for a single cell.
It is absent where the analysis has no pairing (no AR cell yet, another machine, a failed cell).
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Protocol, Sequence

from mdv.analysis import AR, Cell, CellFileError, find_ar, parse_cell, speedups
from mdv.errors import InvalidInputError

#: Per-cell metrics copied from a cell's ``summary`` into W&B (when present).
METRIC_KEYS = (
    "block_efficiency_mean", "block_efficiency_ci95", "block_efficiency_pooled", "tokens_per_second_mean",
    "tokens_per_second_ci95", "tokens_per_second_e2e_mean", "mean_accepted_length_mean", "acceptance_rate_kl",
    "acceptance_rate_l", "new_tokens", "target_calls", "prefill_s", "decode_s", "total_s",
)
TABLE_COLUMNS = ["cell_id", "status", "dataset", "dataset_label", "dataset_source", "method", "K", "L",
                 "temperature", "top_k", "top_p", "max_new_tokens", "seed", "n_prompts", "models",
                 "block_efficiency_mean", "block_efficiency_ci95", "tokens_per_second_mean", "acceptance_rate_kl",
                 "acceptance_rate_l", "mean_accepted_length_mean", "speedup_decode_mean", "wall_seconds", "error"]


class Tracker(Protocol):
    """What :func:`mdv.sweep.run_sweep` calls: ``start`` once, ``log_cell`` per cell (run or resumed) with
    the record its cell file holds, ``finish`` once with every cell record on disk."""

    def start(self, cfg: Any, cells: Sequence[Any]) -> None: ...

    def log_cell(self, record: dict[str, Any], resumed: bool) -> None: ...

    def finish(self, records: Sequence[dict[str, Any]]) -> None: ...

    def start_paired(self, cfg: Any, n_records: int) -> None: ...

    def log_paired(self, record: dict[str, Any], resumed: bool) -> None: ...

    def finish_paired(self, report: Any) -> None: ...


class NullTracker:
    """Tracks nothing (``logger=none``)."""

    def start(self, cfg: Any, cells: Sequence[Any]) -> None:
        pass

    def log_cell(self, record: dict[str, Any], resumed: bool) -> None:
        pass

    def finish(self, records: Sequence[dict[str, Any]]) -> None:
        pass

    def start_paired(self, cfg: Any, n_records: int) -> None:
        pass

    def log_paired(self, record: dict[str, Any], resumed: bool) -> None:
        pass

    def finish_paired(self, report: Any) -> None:
        pass


def _num(x: Any) -> Optional[float]:
    """A finite float, or None (W&B tables and charts reject NaN inconsistently)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def ar_cells(records: Iterable[dict[str, Any]]) -> list[Cell]:
    """The usable AR cells among ``records`` as :class:`mdv.analysis.Cell` (invalid or failed ones dropped)."""
    cells = []
    for r in records:
        if r.get("config", {}).get("method") == AR and r.get("status") == "ok":
            try:
                cells.append(parse_cell(r))
            except CellFileError:
                continue
    return cells


def decode_speedup(record: dict[str, Any], ars: Sequence[Cell]) -> Optional[float]:
    """Mean over timed prompts of the decode speedup of ``record`` over the AR cell of ``ars`` (from
    :func:`ar_cells`) that :func:`mdv.analysis.find_ar` pairs it with (AR itself: 1.0); None when the
    analysis would pair nothing."""
    try:
        cell = parse_cell(record)
    except CellFileError:
        return None
    if cell.status != "ok":
        return None
    if cell.method == AR:
        return 1.0
    ar, _why = find_ar(cell, ars)
    if ar is None:
        return None
    decode = speedups(cell, ar).decode
    return sum(decode) / len(decode) if decode else None


def summary_rows(records: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """One row per cell record, columns :data:`TABLE_COLUMNS` (speedup paired with the AR cell)."""
    ars = ar_cells(records)
    rows = []
    for r in records:
        c, s, d = r.get("config", {}), r.get("summary", {}) or {}, r.get("dataset", {}) or {}
        speed = decode_speedup(r, ars)
        rows.append([r.get("cell_id"), r.get("status"), c.get("dataset"), d.get("label"), d.get("source"),
                     c.get("method"), c.get("K"), c.get("L"), c.get("temperature"), c.get("top_k"), c.get("top_p"),
                     c.get("max_new_tokens"), c.get("seed"), c.get("n_prompts"), c.get("models"),
                     _num(s.get("block_efficiency_mean")), _num(s.get("block_efficiency_ci95")),
                     _num(s.get("tokens_per_second_mean")), _num(s.get("acceptance_rate_kl")),
                     _num(s.get("acceptance_rate_l")), _num(s.get("mean_accepted_length_mean")), _num(speed),
                     _num(r.get("wall_seconds")), r.get("error")])
    return rows


def _plain(obj: Any) -> Any:
    """Dataclasses / enums / paths -> JSON-able builtins (for the W&B run config)."""
    from enum import Enum

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


class WandbTracker:
    """One W&B run per sweep process (see the module docstring)."""

    def __init__(self, project: str = "mdv", entity: Optional[str] = None, group: Optional[str] = None,
                 tags: Sequence[str] = (), mode: Optional[str] = None, dir: Optional[str] = None,
                 name: Optional[str] = None):
        mode = mode or os.environ.get("WANDB_MODE") or "offline"
        if mode not in ("offline", "online", "disabled"):
            raise InvalidInputError(f"logger.mode must be offline, online or disabled; got {mode!r}")
        self.project, self.entity, self.group, self.tags = project, entity, group, list(tags)
        self.mode, self.dir, self.name = mode, dir, name
        self.run: Any = None
        self._step = 0
        self._ar_cells: dict[str, Cell] = {}  # the AR cells logged so far, parsed once, by cell_id

    def start(self, cfg: Any, cells: Sequence[Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise InvalidInputError("logger=wandb needs the wandb package: pip install wandb") from None
        run_dir = Path(self.dir or os.environ.get("WANDB_DIR") or getattr(cfg, "results_dir", "."))
        run_dir.mkdir(parents=True, exist_ok=True)
        name = getattr(cfg, "name", None)
        self.run = wandb.init(project=self.project, entity=self.entity, group=self.group or name,
                              name=self.name, job_type="sweep", tags=self.tags or None, dir=str(run_dir),
                              mode=self.mode, config={**_plain(cfg), "n_cells": len(cells)})

    def log_cell(self, record: dict[str, Any], resumed: bool) -> None:
        import wandb

        if self.run is None:
            return
        self._ar_cells.update((c.cell_id, c) for c in ar_cells([record]))
        config, summary = record.get("config", {}), record.get("summary", {}) or {}
        data: dict[str, Any] = {"cell_id": record["cell_id"], "status": record.get("status"),
                                "resumed": int(resumed), "wall_seconds": _num(record.get("wall_seconds"))}
        data.update({f"config/{k}": v for k, v in config.items() if v is not None})
        data.update({f"metrics/{k}": _num(summary.get(k)) for k in METRIC_KEYS if _num(summary.get(k)) is not None})
        if config.get("method") != "ar":
            speed = decode_speedup(record, list(self._ar_cells.values()))
            if speed is not None:
                data["metrics/speedup_decode_mean"] = speed
        hist = summary.get("accepted_length_histogram")
        if hist and sum(hist) > 0:
            edges = [i - 0.5 for i in range(len(hist) + 1)]  # bins centred on tau = 0..L
            data["accepted_length_histogram"] = wandb.Histogram(np_histogram=(list(hist), edges))
        self.run.log(data, step=self._step)
        self._step += 1

    def finish(self, records: Sequence[dict[str, Any]]) -> None:
        import wandb

        if self.run is None:
            return
        try:
            table = wandb.Table(columns=TABLE_COLUMNS, data=summary_rows(records))
            self.run.log({"summary_table": table}, step=self._step)
            self.run.summary["cells_ok"] = sum(r.get("status") == "ok" for r in records)
            self.run.summary["cells_failed"] = sum(r.get("status") == "failed" for r in records)
        finally:
            self.run.finish()
            self.run = None

    def start_paired(self, cfg: Any, n_records: int) -> None:
        """Open the run of a paired measurement (``task=paired`` or ``paired.enabled``)."""
        self.start(cfg, [None] * n_records)

    def log_paired(self, record: dict[str, Any], resumed: bool) -> None:
        if self.run is None:
            return
        data: dict[str, Any] = {"record_id": record["record_id"], "resumed": int(resumed),
                                "wall_seconds": _num(record.get("wall_seconds")),
                                "contexts": len(record.get("contexts", []))}
        data.update(paired_metrics(record))
        self.run.log(data, step=self._step)
        self._step += 1

    def finish_paired(self, report: Any) -> None:
        """Log the verdict table and the plots (as images) of a :class:`mdv.paired.report.PairedReportResult`
        (None: no records), then close the run."""
        import wandb

        if self.run is None:
            return
        try:
            if report is not None:
                rows = [[c.name, where, v.outcome, v.effect.mean, v.effect.lo, v.effect.hi, v.text]
                        for c in report.claims for where, v in c.parts]
                self.run.log({"paired/verdicts": wandb.Table(
                    columns=["claim", "part", "outcome", "effect", "lo", "hi", "text"], data=rows)}, step=self._step)
                images = {f"paired/plots/{k}": wandb.Image(str(p)) for k, p in report.paths.items()
                          if str(p).endswith(".png")}
                if images:
                    self.run.log(images, step=self._step)
                for c in report.claims:
                    self.run.summary[f"paired/claim/{c.name}"] = c.outcome
        finally:
            self.run.finish()
            self.run = None


def paired_metrics(record: dict[str, Any]) -> dict[str, float]:
    """Per-record metrics of a paired record (``mdv.paired/2``): the mean block efficiency 1 + E[tau] over
    its contexts per method at (K_max, L_max) and (1, L_max), and the mean L = 1 optimum α*_K."""
    import numpy as np

    out: dict[str, float] = {}
    ctxs = record.get("contexts", [])
    if not ctxs:
        return out
    for m in record["config"]["methods"]:
        e = np.array([[[np.nan if x is None else x for x in row] for row in c["etau"][m]] for c in ctxs], dtype=float)
        K_max, L_max = e.shape[1], e.shape[2]
        for K in {1, K_max}:
            v = float(np.nanmean(e[:, K - 1, L_max - 1])) if not np.isnan(e[:, K - 1, L_max - 1]).all() else None
            if v is not None:
                out[f"paired/{m}/be_K{K}_L{L_max}"] = 1.0 + v
    alpha = np.array([c["alpha_star"] for c in ctxs], dtype=float)
    for K in range(1, alpha.shape[1] + 1):
        out[f"paired/alpha_star_K{K}"] = float(alpha[:, K - 1].mean())
    return out


def make_tracker(logger_cfg: Any, run_name: Optional[str] = None) -> Tracker:
    """The tracker for a :class:`mdv.sweep.LoggerGroup` (``kind`` none -> :class:`NullTracker`)."""
    kind = getattr(logger_cfg.kind, "value", logger_cfg.kind)
    if kind == "none":
        return NullTracker()
    if kind == "wandb":
        return WandbTracker(project=logger_cfg.project, entity=logger_cfg.entity, group=logger_cfg.group,
                            tags=logger_cfg.tags, mode=logger_cfg.mode, dir=logger_cfg.dir, name=run_name)
    raise InvalidInputError(f"unknown logger {kind!r}; valid loggers are: none, wandb")
