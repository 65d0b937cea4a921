"""Sweep cell files read back for analysis: every file of ``<results_dir>/cells`` parsed and validated against
the ``mdv.cell/1`` contract; a corrupt, truncated or wrongly shaped file is skipped with one warning line
naming it, and failed cells are kept apart, listed but not tabulated.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from mdv.drafters.base import method_label
from mdv.errors import InvalidInputError


SCHEMA = "mdv.cell/1"
AR = "ar"
_CONFIG_KEYS = ("method", "K", "L", "temperature", "top_k", "top_p", "max_new_tokens", "seed", "dataset", "n_prompts")
_STATS_KEYS = ("block_efficiency", "decode_s", "total_s", "new_tokens", "target_calls")


class AnalysisError(InvalidInputError):
    """The results folder cannot be analysed (absent, or no usable cell file)."""


# ----------------------------------------------------------------------------------------------- loading


class CellFileError(ValueError):
    """One cell file is unreadable or does not follow the contract (the message says why)."""


def as_number(x: Any) -> float:
    """A JSON number as float; None (NaN written as null) and non-numbers become NaN."""
    if isinstance(x, bool) or x is None:
        return float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _round_t(t: Any) -> float:
    return round(as_number(t), 6)


def top_p_of(x: Any) -> float:
    """top-p as a comparable float: None or >= 1 (no top-p) is -1.0, so that keys never hold NaN."""
    return -1.0 if x is None or as_number(x) >= 1.0 else round(as_number(x), 6)


def top_k_of(x: Any) -> int:
    """top-k as an int: None or 0 (no top-k) is -1."""
    return -1 if x is None or int(x) <= 0 else int(x)


@dataclass
class Cell:
    """One validated cell file."""

    path: Path
    cell_id: str
    status: str
    error: str | None
    config: dict[str, Any]
    dataset: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    generations: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = float("nan")

    @property
    def method(self) -> str:
        return str(self.config.get("method"))

    @property
    def drafter(self) -> str:
        """The drafter (:mod:`mdv.drafters`); cells written before drafters existed used the draft model."""
        return str(self.config.get("drafter") or "model")

    @property
    def label(self) -> str:
        """The row label: the method, with its drafter where that is not the draft model (``sd+ngram``)."""
        return method_label(self.method, self.drafter)

    @property
    def K(self) -> int | None:
        k = self.config.get("K")
        return None if k is None else int(k)

    @property
    def L(self) -> int | None:
        v = self.config.get("L")
        return None if v is None else int(v)

    @property
    def temperature(self) -> float:
        return _round_t(self.config.get("temperature"))

    @property
    def warmup(self) -> int:
        return int(self.config.get("warmup_prompts", 1))

    @property
    def dataset_name(self) -> str:
        return str(self.dataset.get("name") or self.config.get("dataset"))

    @property
    def dataset_label(self) -> str:
        """The honest label the data module wrote (column headers shorten it: :func:`short_label`)."""
        return str(self.dataset.get("label") or self.dataset_name)

    @property
    def target(self) -> str:
        return str(self.models.get("target") or "?")

    @property
    def draft(self) -> str:
        return str(self.models.get("draft") or "")

    def env_key(self) -> tuple:
        """What "same machine" means for pairing with AR."""
        e = self.environment
        return tuple(str(e.get(k)) for k in ("cpu", "threads", "torch", "dtype", "device"))

    def pair_key(self) -> tuple:
        """Cells with the same key (models' draft aside) can be paired for speedup (the contract's list)."""
        c = self.config
        return (self.dataset_name, self.dataset_label, self.temperature, top_k_of(c.get("top_k")), top_p_of(c.get("top_p")),
                c.get("max_new_tokens"), c.get("seed"), c.get("n_prompts"), self.target)

    def ordered(self) -> list[dict[str, Any]]:
        return sorted(self.generations, key=lambda g: int(g["prompt_index"]))

    def timed(self) -> list[dict[str, Any]]:
        """Generations that count for timing: the warm-up prompts dropped."""
        return self.ordered()[self.warmup:]


def _require(obj: Any, keys: Iterable[str], where: str) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise CellFileError(f"{where} lacks {', '.join(repr(k) for k in missing)}")


def load_cell(path: Path) -> Cell:
    """Read and validate one cell file against the ``mdv.cell/1`` contract; raises CellFileError."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise CellFileError(f"unreadable ({err})") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise CellFileError(f"not valid JSON, truncated or corrupt ({err.msg} at line {err.lineno} column {err.colno})") from None
    return parse_cell(data, path)


def parse_cell(data: Any, path: Path = Path("<record>")) -> Cell:
    """Validate one cell record (the parsed JSON of a cell file, or the sweep's record in memory) against the
    ``mdv.cell/1`` contract; raises CellFileError."""
    if not isinstance(data, dict):
        raise CellFileError(f"top level is a {type(data).__name__}, expected an object")
    if data.get("schema") != SCHEMA:
        raise CellFileError(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    _require(data, ("cell_id", "status", "config"), "the file")
    status = data["status"]
    if status not in ("ok", "failed"):
        raise CellFileError(f"status is {status!r}, expected 'ok' or 'failed'")
    config = data["config"]
    if not isinstance(config, dict):
        raise CellFileError("'config' is not an object")
    _require(config, ("method", "dataset"), "config")
    cell = Cell(path=path, cell_id=str(data["cell_id"]), status=status, error=data.get("error"), config=config)
    for name in ("dataset", "models", "environment", "summary"):
        value = data.get(name)
        if isinstance(value, dict):
            setattr(cell, name, value)
        elif status == "ok":
            raise CellFileError(f"'{name}' is missing or not an object")
    if status == "failed":
        return cell
    _require(data, ("generations", "wall_seconds"), "the file")
    _require(config, _CONFIG_KEYS, "config")
    _require(cell.dataset, ("name", "label", "source", "size"), "dataset")
    _require(cell.models, ("target", "draft"), "models")
    gens = data["generations"]
    if not isinstance(gens, list) or not gens:
        raise CellFileError("'generations' is empty or not a list (a cell with status 'ok' needs at least one)")
    for key in ("method", "dataset"):
        if not isinstance(config[key], str) or not config[key]:
            raise CellFileError(f"config {key} is {config[key]!r}, expected a non-empty string")
    try:
        int(config.get("warmup_prompts", 1))
        _ = (cell.K, cell.L, top_k_of(config.get("top_k")), int(config.get("max_new_tokens")))
    except (TypeError, ValueError):
        raise CellFileError("config K, L, top_k, max_new_tokens or warmup_prompts is not an integer") from None
    if math.isnan(cell.temperature) or math.isnan(top_p_of(config.get("top_p"))):
        raise CellFileError("config temperature or top_p is not a number")
    bad = [f"{k}={config.get(k)!r}" for k, ok in (
        ("K", cell.K is None or cell.K >= 1), ("L", cell.L is None or cell.L >= 1),
        ("temperature", 0 <= cell.temperature < math.inf),
        ("top_p", config.get("top_p") is None or 0 < as_number(config.get("top_p")) <= 1),
        ("top_k", config.get("top_k") is None or int(config.get("top_k")) >= 0),
        ("max_new_tokens", int(config.get("max_new_tokens")) >= 1),
        ("warmup_prompts", int(config.get("warmup_prompts", 1)) >= 0)) if not ok]
    if bad:
        raise CellFileError(f"config {', '.join(bad)} out of range (K, L, max_new_tokens >= 1; temperature >= 0;"
                            " top_p in (0, 1]; top_k, warmup_prompts >= 0)")
    seen_index: set[int] = set()
    for i, g in enumerate(gens):
        if not isinstance(g, dict) or not isinstance(g.get("stats"), dict) or "prompt_index" not in g:
            raise CellFileError(f"generations[{i}] lacks 'prompt_index' or a 'stats' object")
        stats = g["stats"]
        _require(stats, _STATS_KEYS, f"generations[{i}].stats")
        index = g["prompt_index"]
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise CellFileError(f"generations[{i}].prompt_index is {index!r}, expected an integer >= 0")
        if index in seen_index:
            raise CellFileError(f"generations[{i}].prompt_index {index} appears twice")
        seen_index.add(index)
        for key in _STATS_KEYS:
            v = stats[key]
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf):
                raise CellFileError(f"generations[{i}].stats.{key} is {v!r}, expected a finite number >= 0 (or null)")
        taus = stats.get("accepted_lengths")
        if taus is not None:
            top = cell.L if cell.L is not None else math.inf
            if not isinstance(taus, list) or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= top
                                                 for t in taus):
                raise CellFileError(f"generations[{i}].stats.accepted_lengths must be a list of integers in"
                                    f" [0, L={cell.L}]; got {str(taus)[:80]}")
    cell.generations = gens
    cell.wall_seconds = as_number(data["wall_seconds"])
    return cell


@dataclass
class Loaded:
    """All cell files of a results folder: usable cells, failed cells, and one warning per skipped file."""

    cells_dir: Path
    ok: list[Cell]
    failed: list[Cell]
    warnings: list[str]


def load_results(results_dir: Path | str, warn: Callable[[str], None] | None = None) -> Loaded:
    """Load every ``*.json`` under ``<results_dir>/cells`` (or ``results_dir`` itself if it has no ``cells``).

    A bad file is skipped with one warning line (passed to ``warn``, default: stderr).  Raises
    AnalysisError if the folder is absent or holds no usable cell with status ``ok``.
    """
    warn = warn or (lambda line: print(line, file=sys.stderr))
    root = Path(results_dir)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise AnalysisError(f"results folder {str(root)!r} {what}; pass the folder a sweep wrote"
                            " (it holds cells/<cell_id>.json)")
    cells_dir = root / "cells" if (root / "cells").is_dir() else root
    files = sorted(cells_dir.glob("*.json"))
    ok: list[Cell] = []
    failed: list[Cell] = []
    warnings: list[str] = []
    seen: dict[str, Path] = {}
    for path in files:
        try:
            cell = load_cell(path)
        except CellFileError as err:
            line = f"warning: skipping {path}: {err}"
            warnings.append(line)
            warn(line)
            continue
        if cell.cell_id in seen:
            line = f"warning: skipping {path}: duplicate cell_id {cell.cell_id!r} (also in {seen[cell.cell_id].name})"
            warnings.append(line)
            warn(line)
            continue
        seen[cell.cell_id] = path
        (ok if cell.status == "ok" else failed).append(cell)
    if not ok:
        detail = f"{len(files)} .json file(s) found, {len(warnings)} skipped as unreadable, {len(failed)} failed"
        if failed:
            detail += f" (first error: {first_line(failed[0].error)})"
        raise AnalysisError(f"no usable cell file in {str(cells_dir)!r}: {detail}; run a sweep that writes"
                            f" <results_dir>/cells/<cell_id>.json first")
    return Loaded(cells_dir=cells_dir, ok=ok, failed=failed, warnings=warnings)


def first_line(text: Any) -> str:
    """The first line of an error message, at most 200 characters (for one-line warnings and tables)."""
    s = str(text or "").strip().splitlines()
    return s[0][:200] if s else "(no message)"
