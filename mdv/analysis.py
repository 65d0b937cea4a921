"""Analysis of a sweep's result files: tables in the SpecTr-GBV Table 1 layout, plots, and a claims report.

Input: a results folder in the cell-file contract (``<results_dir>/cells/<cell_id>.json``, schema
``mdv.cell/1``, one file per sweep cell, written by the sweep runner).  Every file is loaded and validated;
a corrupt, truncated or wrongly shaped file is skipped with one warning line naming it, and failed cells
are listed, not tabulated.  Entry point: ``python -m analysis.report <results_dir> [--out DIR]``.

Conventions (stated in every caption):

* **BE** (block efficiency) = emitted tokens ÷ target calls, the bonus/correction token included, per
  prompt; AR = 1.00.  All prompts count (the warm-up prompt too).
* **SR** (speedup ratio) = AR decode seconds ÷ method decode seconds, per prompt, the method's cell paired
  with the ``method="ar"`` cell of the same dataset, temperature, top-k, top-p, max_new_tokens, seed,
  prompt count, models and machine; the first ``warmup_prompts`` prompts of each cell (default 1) are
  excluded.  End-to-end SR (prefill included: ``total_s``) is reported separately.
* Entries are the mean over prompts with the half-width of a 95% Student-t confidence interval
  (:func:`mdv.metrics.mean_ci`); cells of one setting that differ only in the seed are pooled.  The
  average column is the unweighted mean over datasets, its half-width ``sqrt(Σ h_d²) / n_datasets``
  (independent datasets).
* Single-draft methods (and AR) run with K = 1; they appear in every K table of their setting.
"""
from __future__ import annotations

import csv
import json
import math
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from mdv._fs import ensure_writable_dir
from mdv.errors import InvalidInputError
from mdv.metrics import mean_ci, position_reach

SCHEMA = "mdv.cell/1"
AR = "ar"
#: Row order of the tables (the paper's Table 1 order, mdv's extra verifiers in between).
METHOD_ORDER = ["ar", "sd", "spectr", "bv", "gbv", "mdbv", "spectr_gbv"]
#: The paper's claimed ordering, best first (SpecTr-GBV > SpecTr > GBV > SD).
PAPER_ORDER = ["spectr_gbv", "spectr", "gbv", "sd"]
#: Column order of the paper's datasets (matched on the start of the dataset name).
DATASET_ORDER = ["humaneval", "gsm8k", "mgsm", "lm1b", "alpaca"]
LOSSY_MARK = "†"
THEORY_POINTER = ("`python -m experiments.theory` (see README) writes"
                  " `outputs/theory/<time>/theory.md`: the exact E[tau] of every verifier on toy pairs, the exact"
                  " valid/greedy LP optima, the paper's claimed φ-sum, and each method's exactness verdict (TV)")

_CONFIG_KEYS = ("method", "K", "L", "temperature", "top_k", "top_p", "max_new_tokens", "seed", "dataset", "n_prompts")
_STATS_KEYS = ("block_efficiency", "decode_s", "total_s", "new_tokens", "target_calls")


class AnalysisError(InvalidInputError):
    """The results folder cannot be analysed (absent, or no usable cell file)."""


# ----------------------------------------------------------------------------------------------- loading
class CellFileError(ValueError):
    """One cell file is unreadable or does not follow the contract (the message says why)."""


def _num(x: Any) -> float:
    """A JSON number as float; None (NaN written as null) and non-numbers become NaN."""
    if isinstance(x, bool) or x is None:
        return float("nan")
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _round_t(t: Any) -> float:
    return round(_num(t), 6)


def _top_p(x: Any) -> float:
    """top-p as a comparable float: None or >= 1 (no top-p) is -1.0, so that keys never hold NaN."""
    return -1.0 if x is None or _num(x) >= 1.0 else round(_num(x), 6)


def _top_k(x: Any) -> int:
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
        return (self.dataset_name, self.dataset_label, self.temperature, _top_k(c.get("top_k")), _top_p(c.get("top_p")),
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
        _ = (cell.K, cell.L, _top_k(config.get("top_k")), int(config.get("max_new_tokens")))
    except (TypeError, ValueError):
        raise CellFileError("config K, L, top_k, max_new_tokens or warmup_prompts is not an integer") from None
    if math.isnan(cell.temperature) or math.isnan(_top_p(config.get("top_p"))):
        raise CellFileError("config temperature or top_p is not a number")
    bad = [f"{k}={config.get(k)!r}" for k, ok in (
        ("K", cell.K is None or cell.K >= 1), ("L", cell.L is None or cell.L >= 1),
        ("temperature", 0 <= cell.temperature < math.inf),
        ("top_p", config.get("top_p") is None or 0 < _num(config.get("top_p")) <= 1),
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
    cell.wall_seconds = _num(data["wall_seconds"])
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
            detail += f" (first error: {_first_line(failed[0].error)})"
        raise AnalysisError(f"no usable cell file in {str(cells_dir)!r}: {detail}; run a sweep that writes"
                            f" <results_dir>/cells/<cell_id>.json first")
    return Loaded(cells_dir=cells_dir, ok=ok, failed=failed, warnings=warnings)


def _first_line(text: Any) -> str:
    s = str(text or "").strip().splitlines()
    return s[0][:200] if s else "(no message)"


# ----------------------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Stat:
    """Mean with the half-width of its 95% confidence interval, over n samples."""

    mean: float
    ci: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> "Stat":
        xs = [v for v in (_num(x) for x in values) if not math.isnan(v)]
        m, h = mean_ci(xs)
        return Stat(m, h, len(xs))

    @property
    def lo(self) -> float:
        return self.mean - self.ci

    @property
    def hi(self) -> float:
        return self.mean + self.ci

    @property
    def valid(self) -> bool:
        return self.n > 0 and not math.isnan(self.mean)

    def fmt(self, digits: int = 2) -> str:
        if not self.valid:
            return "—"
        if math.isnan(self.ci):
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.ci:.{digits}f}"


EMPTY = Stat(float("nan"), float("nan"), 0)


def average_stat(stats: Sequence[Stat]) -> Stat:
    """Unweighted mean over datasets; half-width sqrt(Σh²)/n (NaN if any part has no CI)."""
    if not stats or not all(s.valid for s in stats):
        return EMPTY
    n = len(stats)
    return Stat(sum(s.mean for s in stats) / n, math.sqrt(sum(s.ci ** 2 for s in stats)) / n,
                sum(s.n for s in stats))


def compare_greater(a: Stat, b: Stat) -> str:
    """Verdict on "a > b": supported / contradicted when the 95% CIs are disjoint, else inconclusive."""
    if not (a.valid and b.valid):
        return "not measured"
    if math.isnan(a.ci) or math.isnan(b.ci):
        return "inconclusive (no CI: fewer than 2 prompts)"
    if a.lo > b.hi:
        return "supported"
    if a.hi < b.lo:
        return "contradicted"
    return "inconclusive (CIs overlap)"


def combine_verdicts(verdicts: Sequence[str]) -> str:
    """A chain of comparisons: contradicted if any link is, supported if all are, else inconclusive."""
    if not verdicts or any(v == "not measured" for v in verdicts):
        return "not measured"
    if any(v == "contradicted" for v in verdicts):
        return "contradicted"
    if all(v == "supported" for v in verdicts):
        return "supported"
    return "inconclusive (CIs overlap)"


# ----------------------------------------------------------------------------------------------- speedup
@dataclass
class Speedup:
    """Per-prompt speedups of one method cell against its AR cell."""

    decode: list[float]
    e2e: list[float]
    ar_cell: Cell
    unequal_tokens: int = 0


def lossless(method: str) -> bool | None:
    """The registry's flag (AR is lossless by definition); None for an unknown method."""
    if method == AR:
        return True
    from mdv.verify.registry import VERIFIERS

    cls = VERIFIERS.get(method)
    return None if cls is None else bool(cls.lossless)


def multi_draft(method: str) -> bool:
    """Whether the method uses K drafts (unknown methods are treated as multi-draft: their K is kept)."""
    if method == AR:
        return False
    from mdv.verify.registry import VERIFIERS

    cls = VERIFIERS.get(method)
    return True if cls is None else bool(cls.multi_draft)


def find_ar(cell: Cell, ar_cells: Sequence[Cell]) -> tuple[Cell | None, str]:
    """The AR cell to pair ``cell`` with, or (None, why not)."""
    same = [a for a in ar_cells if a.pair_key() == cell.pair_key() and (not a.draft or a.draft == cell.draft)]
    if not same:
        return None, "no AR cell with the same dataset, sampling, seed, prompt count and models"
    machine = [a for a in same if a.env_key() == cell.env_key()]
    if not machine:
        return None, "the AR cell was measured on a different machine/environment"
    ts = str(cell.environment.get("timestamp", ""))
    machine.sort(key=lambda a: (str(a.environment.get("timestamp", "")) != ts, a.cell_id))
    return machine[0], ""


def speedups(cell: Cell, ar: Cell) -> Speedup:
    """Per prompt (paired by prompt_index, warm-up of both cells excluded): AR ÷ method decode seconds and
    AR ÷ method end-to-end seconds."""
    ar_by = {int(g["prompt_index"]): g["stats"] for g in ar.timed()}
    out = Speedup([], [], ar)
    for g in cell.timed():
        a = ar_by.get(int(g["prompt_index"]))
        if a is None:
            continue
        s = g["stats"]
        d_m, d_a = _num(s["decode_s"]), _num(a["decode_s"])
        t_m, t_a = _num(s["total_s"]), _num(a["total_s"])
        if d_m > 0 and d_a > 0:
            out.decode.append(d_a / d_m)
        if t_m > 0 and t_a > 0:
            out.e2e.append(t_a / t_m)
        if _num(s["new_tokens"]) != _num(a["new_tokens"]):
            out.unequal_tokens += 1
    return out


# ----------------------------------------------------------------------------------------------- tables
@dataclass(frozen=True, order=True)
class Setting:
    """One table: models, K, L, temperature (+ top-k, top-p, max_new_tokens)."""

    target: str
    draft: str
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    K: int
    L: int

    def base(self) -> tuple:
        return (self.target, self.draft, self.temperature, self.top_k, self.top_p, self.max_new_tokens)

    def title(self) -> str:
        extra = []
        if self.top_k >= 0:
            extra.append(f"top-k {self.top_k}")
        if self.top_p >= 0:
            extra.append(f"top-p {self.top_p:g}")
        k = "—" if self.K < 0 else str(self.K)
        l_ = "—" if self.L < 0 else str(self.L)
        return (f"target {self.target}, draft {self.draft}, K = {k}, L = {l_}, T = {self.temperature:g}"
                + "".join(f", {e}" for e in extra) + f", max_new_tokens {self.max_new_tokens}")

    def slug(self) -> str:
        s = f"K{self.K}_L{self.L}_T{self.temperature:g}"
        if self.top_k >= 0:
            s += f"_k{self.top_k}"
        if self.top_p >= 0:
            s += f"_p{self.top_p:g}"
        s += f"_n{self.max_new_tokens}__{self.target}__{self.draft}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)[:150]


def _base_of(cell: Cell) -> tuple:
    c = cell.config
    return (cell.target, cell.draft, cell.temperature, _top_k(c.get("top_k")), _top_p(c.get("top_p")),
            int(c.get("max_new_tokens") or 0))


def _base_eq(a: tuple, b: tuple) -> bool:
    """Bases equal; an empty draft (an AR cell that records none) matches any draft."""
    return all(x == y or (i == 1 and (not x or not y)) for i, (x, y) in enumerate(zip(a, b)))


@dataclass
class Entry:
    """One table cell: a method on a dataset in one setting (cells differing only in seed pooled)."""

    method: str
    dataset: str  # column key: the honest label
    cells: list[Cell]
    be: Stat
    sr: Stat
    sr_e2e: Stat
    sr_note: str = ""
    unequal_tokens: int = 0
    reach: list[float] = field(default_factory=list)
    acceptance_rate_kl: float = float("nan")
    acceptance_rate_l: float = float("nan")
    tokens_per_second: Stat = EMPTY


@dataclass
class Table:
    setting: Setting
    datasets: list[str]  # honest labels, column order
    sources: dict[str, str]
    methods: list[str]
    entries: dict[tuple[str, str], Entry]
    headers: dict[str, str] = field(default_factory=dict)  # full label -> short column header

    def header(self, dataset: str) -> str:
        """The short column header of a dataset (its label up to the first parenthesis, stand-ins marked)."""
        return self.headers.get(dataset, dataset)

    def get(self, method: str, dataset: str) -> Entry | None:
        return self.entries.get((method, dataset))

    def average(self, method: str, metric: str, datasets: Sequence[str] | None = None) -> Stat:
        """Mean over ``datasets`` (default: all datasets of the table); EMPTY if the method misses one."""
        parts = []
        for d in self.datasets if datasets is None else datasets:
            e = self.get(method, d)
            if e is None:
                return EMPTY
            parts.append(getattr(e, metric))
        return average_stat(parts)


def _method_rank(m: str) -> tuple:
    return (METHOD_ORDER.index(m), m) if m in METHOD_ORDER else (len(METHOD_ORDER), m)


def _dataset_rank(name: str, label: str) -> tuple:
    low = name.lower()
    for i, prefix in enumerate(DATASET_ORDER):
        if low.startswith(prefix):
            return (i, label)
    return (len(DATASET_ORDER), label)


def short_label(label: str, source: str) -> str:
    """A column header from an honest label: the part before the first " (", with ``[stand-in]`` added
    for a stand-in whose short name does not already say so."""
    short = label.split(" (")[0].strip() or label
    if source == "stand-in" and not re.search(r"stand.?in", short, re.I):
        short += " [stand-in]"
    return short


def _headers(labels: Sequence[str], sources: dict[str, str]) -> dict[str, str]:
    """Short headers; labels whose short forms collide keep their full label."""
    short = {d: short_label(d, sources.get(d, "")) for d in labels}
    counts: dict[str, int] = {}
    for v in short.values():
        counts[v] = counts.get(v, 0) + 1
    return {d: (v if counts[v] == 1 else d) for d, v in short.items()}


def _entry(method: str, label: str, cells: list[Cell], ar_cells: Sequence[Cell], warn: Callable[[str], None]) -> Entry:
    # one cell per seed: a duplicate seed (e.g. a different prompt count) keeps the larger cell
    by_seed: dict[Any, Cell] = {}
    for c in sorted(cells, key=lambda c: (-len(c.generations), c.cell_id)):
        s = c.config.get("seed")
        if s in by_seed:
            warn(f"warning: {c.cell_id}: same setting and seed as {by_seed[s].cell_id}; keeping the larger cell")
            continue
        by_seed[s] = c
    cells = [by_seed[s] for s in sorted(by_seed, key=str)]
    be = Stat.of([g["stats"]["block_efficiency"] for c in cells for g in c.generations])
    tps = Stat.of([g["stats"].get("tokens_per_second") for c in cells for g in c.timed()])
    taus = [int(t) for c in cells for g in c.generations for t in (g["stats"].get("accepted_lengths") or [])]
    L = cells[0].L
    reach = position_reach(taus, L) if (method != AR and L and taus) else []
    rate_kl = rate_l = float("nan")
    if taus and L and cells[0].K:
        rate_kl = sum(taus) / (cells[0].K * L * len(taus))
        rate_l = sum(taus) / (L * len(taus))
    dec: list[float] = []
    e2e: list[float] = []
    notes: list[str] = []
    unequal = 0
    for c in cells:
        if method == AR:
            sp = speedups(c, c)
        else:
            ar, why = find_ar(c, ar_cells)
            if ar is None:
                notes.append(why)
                continue
            sp = speedups(c, ar)
        dec += sp.decode
        e2e += sp.e2e
        unequal += sp.unequal_tokens
    return Entry(method=method, dataset=label, cells=cells, be=be, sr=Stat.of(dec), sr_e2e=Stat.of(e2e),
                 sr_note="; ".join(sorted(set(notes))), unequal_tokens=unequal, reach=reach,
                 acceptance_rate_kl=rate_kl, acceptance_rate_l=rate_l, tokens_per_second=tps)


def build_tables(cells: Sequence[Cell], warn: Callable[[str], None] | None = None) -> list[Table]:
    """One table per (models, K, L, temperature, top-k, top-p, max_new_tokens) setting.

    Multi-draft methods define the K values of a setting; single-draft methods join every K table with
    their L, and AR joins every table with its models and sampling (its own K and L are ignored).
    """
    warn = warn or (lambda line: print(line, file=sys.stderr))
    ar_cells = [c for c in cells if c.method == AR]
    spec = [c for c in cells if c.method != AR]
    settings: set[Setting] = set()
    bases = {}
    for c in spec:
        bases.setdefault(_base_of(c), []).append(c)
    for base, group in bases.items():
        for L in sorted({c.L for c in group if c.L is not None}):
            ks = {c.K for c in group if c.L == L and multi_draft(c.method) and c.K is not None}
            if not ks:
                ks = {c.K if c.K is not None else 1 for c in group if c.L == L}
            settings |= {Setting(*base, K=int(k), L=int(L)) for k in ks}
    for c in ar_cells:  # AR cells without any speculative cell of their setting get their own table
        if not any(_base_eq(_base_of(c), s.base()) for s in settings):
            settings.add(Setting(*_base_of(c), K=-1, L=-1))
    tables = []
    for s in sorted(settings):
        members: dict[tuple[str, str], list[Cell]] = {}
        labels: dict[str, tuple] = {}
        sources: dict[str, str] = {}
        for c in cells:
            if not _base_eq(_base_of(c), s.base()):
                continue
            if c.method != AR:
                if c.L != s.L or (multi_draft(c.method) and c.K != s.K):
                    continue
            members.setdefault((c.method, c.dataset_label), []).append(c)
            labels.setdefault(c.dataset_label, _dataset_rank(c.dataset_name, c.dataset_label))
            sources[c.dataset_label] = str(c.dataset.get("source", "?"))
        if s.K >= 0 and not any(m != AR for m, _ in members):
            continue
        entries = {key: _entry(key[0], key[1], group, ar_cells, warn) for key, group in members.items()}
        datasets = sorted(labels, key=lambda d: labels[d])
        methods = sorted({m for m, _ in members}, key=_method_rank)
        tables.append(Table(setting=s, datasets=datasets, sources=sources, methods=methods, entries=entries,
                            headers=_headers(datasets, sources)))
    return tables


def method_label(method: str) -> str:
    """Row label: a lossy method carries the dagger."""
    return method + (LOSSY_MARK if lossless(method) is False else "")


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def environment_lines(cells: Sequence[Cell]) -> list[str]:
    """The environment header: one row per distinct environment."""
    keys = ("cpu", "threads", "torch", "transformers", "dtype", "device", "mdv", "python")
    envs: dict[tuple, list[Cell]] = {}
    for c in cells:
        envs.setdefault(tuple(str(c.environment.get(k, "?")) for k in keys), []).append(c)
    lines = ["| " + " | ".join(keys) + " | cells | timestamps |", "|" + "---|" * (len(keys) + 2)]
    for env, group in envs.items():
        ts = sorted(str(c.environment.get("timestamp", "")) for c in group)
        lines.append("| " + " | ".join(_md_escape(v) for v in env) + f" | {len(group)} | {ts[0]} … {ts[-1]} |")
    if len(envs) > 1:
        lines += ["", "**Several environments**: speedup pairs a method only with an AR cell of its own environment."]
    return lines


def caption(table: Table, index: int) -> str:
    lossy = [m for m in table.methods if lossless(m) is False]
    unknown = [m for m in table.methods if lossless(m) is None]
    ns = [e.be.n for e in table.entries.values()]
    s = table.setting
    text = (f"**Table {index}.** {s.title()}. Single-draft methods run with K = 1. Entries: mean ± half-width of the 95%"
            f" Student-t CI over prompts (n = {_range(ns)} per entry, seeds pooled). **BE** = emitted tokens ÷"
            f" target calls, bonus/correction token included (AR = 1.00; at most L + 1), all prompts. **SR** = AR"
            f" decode time ÷ method decode time per prompt, paired by prompt with the AR cell of the same prompts,"
            f" machine and run, warm-up prompt excluded, prefill excluded (end-to-end SR with prefill: next table)."
            f" Avg = unweighted mean over the datasets, half-width √(Σh²)/n; — where a dataset is missing."
            f" Column headers are the datasets' honest labels (a stand-in is never named as the real dataset).")
    if lossy:
        text += (f" {LOSSY_MARK} {', '.join(lossy)}: not lossless per the exact oracle (experiments/theory): BE not"
                 f" comparable with the lossless methods'.")
    if unknown:
        text += f" Unknown method(s) {', '.join(unknown)}: losslessness not known to mdv."
    return text


def _range(ns: Sequence[int]) -> str:
    return f"{min(ns)}" if min(ns) == max(ns) else f"{min(ns)}–{max(ns)}"


def markdown_table(table: Table, metrics: Sequence[tuple[str, str]] = (("be", "BE"), ("sr", "SR"))) -> list[str]:
    head = ["method"]
    for d in table.datasets:
        head += [f"{_md_escape(table.header(d))} {name}" for _, name in metrics]
    head += [f"avg {name}" for _, name in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in table.methods:
        row = [method_label(m)]
        for d in table.datasets:
            e = table.get(m, d)
            row += [getattr(e, key).fmt() if e else "—" for key, _ in metrics]
        row += [table.average(m, key).fmt() for key, _ in metrics]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def write_table_csv(table: Table, path: Path) -> None:
    """The paper layout as CSV: one row per method, per dataset BE/SR mean, CI and n, then the average."""
    fields = ["method", "lossless"]
    for d in table.datasets:
        for key in ("be", "sr", "sr_e2e"):
            h = table.header(d)
            fields += [f"{h} {key} mean", f"{h} {key} ci95", f"{h} {key} n"]
    for key in ("be", "sr", "sr_e2e"):
        fields += [f"avg {key} mean", f"avg {key} ci95"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for m in table.methods:
            row: list[Any] = [m, lossless(m)]
            for d in table.datasets:
                e = table.get(m, d)
                for key in ("be", "sr", "sr_e2e"):
                    st = getattr(e, key) if e else EMPTY
                    row += [_csv_num(st.mean), _csv_num(st.ci), st.n]
            for key in ("be", "sr", "sr_e2e"):
                st = table.average(m, key)
                row += [_csv_num(st.mean), _csv_num(st.ci)]
            w.writerow(row)


def _csv_num(x: float) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.6g}"


LONG_FIELDS = ["setting", "method", "lossless", "dataset_label", "dataset_source", "target", "draft", "K", "L",
               "temperature", "top_k", "top_p", "max_new_tokens", "seeds", "cells", "n_be", "be_mean", "be_ci95",
               "n_sr", "sr_mean", "sr_ci95", "sr_e2e_mean", "sr_e2e_ci95", "tokens_per_second_mean",
               "acceptance_rate_kl", "acceptance_rate_l", "per_position_acceptance", "unequal_token_pairs", "sr_note"]


def write_long_csv(tables: Sequence[Table], path: Path) -> None:
    """Every table entry as one tidy row (all settings together)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=LONG_FIELDS)
        w.writeheader()
        for t in tables:
            s = t.setting
            for (m, d), e in sorted(t.entries.items(), key=lambda kv: (_method_rank(kv[0][0]), kv[0][1])):
                w.writerow({
                    "setting": s.slug(), "method": m, "lossless": lossless(m), "dataset_label": d,
                    "dataset_source": t.sources.get(d, ""), "target": s.target, "draft": s.draft,
                    "K": e.cells[0].K if m != AR else "", "L": e.cells[0].L if m != AR else "",
                    "temperature": s.temperature, "top_k": "" if s.top_k < 0 else s.top_k,
                    "top_p": "" if s.top_p < 0 else s.top_p, "max_new_tokens": s.max_new_tokens,
                    "seeds": " ".join(str(c.config.get("seed")) for c in e.cells),
                    "cells": " ".join(c.cell_id for c in e.cells), "n_be": e.be.n,
                    "be_mean": _csv_num(e.be.mean), "be_ci95": _csv_num(e.be.ci), "n_sr": e.sr.n,
                    "sr_mean": _csv_num(e.sr.mean), "sr_ci95": _csv_num(e.sr.ci),
                    "sr_e2e_mean": _csv_num(e.sr_e2e.mean), "sr_e2e_ci95": _csv_num(e.sr_e2e.ci),
                    "tokens_per_second_mean": _csv_num(e.tokens_per_second.mean),
                    "acceptance_rate_kl": _csv_num(e.acceptance_rate_kl),
                    "acceptance_rate_l": _csv_num(e.acceptance_rate_l),
                    "per_position_acceptance": " ".join(f"{r:.4g}" for r in e.reach),
                    "unequal_token_pairs": e.unequal_tokens, "sr_note": e.sr_note,
                })


# ----------------------------------------------------------------------------------------------- plots
@dataclass
class PlotResult:
    path: Path | None
    note: str


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(method: str) -> str:
    """One fixed colour per method across all plots."""
    palette = ["#7f7f7f", "#1f77b4", "#ff7f0e", "#8c564b", "#2ca02c", "#9467bd", "#d62728", "#e377c2", "#17becf",
               "#bcbd22"]
    i = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER) + sum(map(ord, method)) % 3
    return palette[i]


Series = dict[str, list[tuple[float, Stat]]]


def _series(tables: Sequence[Table], x: str, fixed: Callable[[Setting], tuple],
            metric: str) -> dict[tuple, tuple[str, Series]]:
    """groups (the fixed part of the setting) -> (which datasets were averaged, method -> [(x, stat)]).

    A method's line averages, at every point, the same datasets: those it was measured on at every x of
    its group (so a line never mixes different dataset sets).
    """
    groups: dict[tuple, list[Table]] = {}
    for t in tables:
        xv = getattr(t.setting, x)
        if not (isinstance(xv, int) and xv < 0):
            groups.setdefault(fixed(t.setting), []).append(t)
    out: dict[tuple, tuple[str, Series]] = {}
    for g, ts in groups.items():
        series: Series = {}
        sizes: set[int] = set()
        for m in sorted({m for t in ts for m in t.methods if m != AR}, key=_method_rank):
            with_m = [t for t in ts if m in t.methods]
            common = sorted(set.intersection(*({d for d in t.datasets if t.get(m, d)} for t in with_m)))
            if not common:
                continue
            for t in with_m:
                stat = t.average(m, metric, common)
                if stat.valid:
                    series.setdefault(m, []).append((getattr(t.setting, x), stat))
            if m in series:
                sizes.add(len(common))
        if series:
            n = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}–{max(sizes)}"
            out[g] = (n, series)
    return out


def _varied(groups: dict[tuple, tuple[str, Series]], need: Callable[[str], bool] = lambda m: True
            ) -> dict[tuple, tuple[str, Series]]:
    """Keep the groups where some method (passing ``need``) has at least two distinct x values."""
    return {g: v for g, v in groups.items()
            if any(need(m) and len({x for x, _ in pts}) >= 2 for m, pts in v[1].items())}


def _grid(n: int):
    plt = _plt()
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows + 0.6), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return plt, fig, flat[:n]


def _finish(plt, fig, axes, path: Path) -> None:
    """One legend for the whole figure (every method of every panel), then save."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    labels = sorted(handles, key=lambda lab: _method_rank(lab.rstrip(LOSSY_MARK)))
    fig.legend([handles[lab] for lab in labels], labels, loc="lower center", ncol=min(len(labels), 7), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.1 if len(axes) <= 3 else 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_lines(ax, series: Series) -> None:
    for m in sorted(series, key=_method_rank):
        pts = sorted(series[m], key=lambda p: p[0])
        style = "--" if not multi_draft(m) else "-"
        ax.errorbar([p[0] for p in pts], [p[1].mean for p in pts],
                    yerr=[0.0 if math.isnan(p[1].ci) else p[1].ci for p in pts], marker="o", linestyle=style,
                    capsize=3, color=_color(m), label=method_label(m))
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.grid(alpha=0.3)


def _fixed_title(names: Sequence[str], g: tuple, n_datasets: str) -> str:
    parts = []
    for n, v in zip(names, g):
        if n in ("target", "draft") or (n in ("top_k", "top_p") and v < 0):
            continue
        parts.append(f"{n}={v:g}" if isinstance(v, float) else f"{n}={v}")
    return ", ".join(parts) + f"\n(mean over the {n_datasets} dataset(s) each method has at every point)"


def _line_plot(tables: Sequence[Table], x: str, metric: str, path: Path, x_label: str, y_label: str,
               need: Callable[[str], bool], what: str, skip_reason: str) -> PlotResult:
    names = tuple(n for n in ("target", "draft", "K", "L", "temperature", "top_k", "top_p", "max_new_tokens")
                  if n != x)
    groups = _varied(_series(tables, x, lambda s: tuple(getattr(s, n) for n in names), metric), need)
    if not groups:
        return PlotResult(None, f"{what}: skipped ({skip_reason})")
    items = list(groups.items())
    more = f"; first 6 of {len(items)} settings" if len(items) > 6 else ""
    plt, fig, axes = _grid(min(len(items), 6))
    for ax, (g, (n_ds, series)) in zip(axes, items):
        _draw_lines(ax, series)
        ax.set_title(_fixed_title(names, g, n_ds), fontsize=8)
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
    _finish(plt, fig, axes, path)
    return PlotResult(path, what + more)


def plot_be_vs_k(tables: Sequence[Table], path: Path) -> PlotResult:
    return _line_plot(tables, "K", "be", path, "K (drafts)", "block efficiency", multi_draft,
                      "block efficiency vs K (single-draft methods dashed: K = 1, drawn across as a reference)",
                      "no multi-draft method measured at two or more K values in one setting")


def plot_sr_vs_l(tables: Sequence[Table], path: Path) -> PlotResult:
    return _line_plot(tables, "L", "sr", path, "L (draft length)", "speedup vs AR (decode)", lambda m: True,
                      "speedup (decode) vs L", "no method with a speedup at two or more L values in one setting;"
                      " speedup needs the AR cell")


def plot_vs_temperature(tables: Sequence[Table], path: Path) -> PlotResult:
    names = ("target", "draft", "K", "L", "top_k", "top_p", "max_new_tokens")
    fixed = lambda s: tuple(getattr(s, n) for n in names)  # noqa: E731
    be = _varied(_series(tables, "temperature", fixed, "be"))
    sr = _varied(_series(tables, "temperature", fixed, "sr"))
    if not be:
        return PlotResult(None, "block efficiency and speedup vs T: skipped (no method measured at two or more"
                                " temperatures in one setting)")
    items = list(be.items())[:3]
    panels = [(g, "block efficiency", v) for g, v in items]
    panels += [(g, "speedup vs AR (decode)", sr[g]) for g, _ in items if g in sr]
    plt, fig, axes = _grid(len(panels))
    for ax, (g, ylabel, (n_ds, series)) in zip(axes, panels):
        _draw_lines(ax, series)
        ax.set_title(_fixed_title(names, g, n_ds), fontsize=8)
        ax.set_xlabel("temperature T")
        ax.set_ylabel(ylabel)
    _finish(plt, fig, axes, path)
    note = "block efficiency and speedup vs T"
    if any(g not in sr for g, _ in items):
        note += " (speedup panel missing where no AR pairing exists at two temperatures)"
    if len(be) > 3:
        note += f"; first 3 of {len(be)} settings"
    return PlotResult(path, note)


def plot_per_position(tables: Sequence[Table], path: Path) -> PlotResult:
    panels = []
    for t in tables:
        lines = {}
        for m in t.methods:
            taus = [int(x) for d in t.datasets if (e := t.get(m, d)) for c in e.cells for g in c.generations
                    for x in (g["stats"].get("accepted_lengths") or [])]
            if m != AR and taus and t.setting.L > 0:
                lines[m] = position_reach(taus, t.setting.L)
        if lines:
            panels.append((t.setting, lines))
    if not panels:
        return PlotResult(None, "per-position acceptance: skipped (no speculative cell with accepted lengths)")
    more = f" (first 6 of {len(panels)} settings)" if len(panels) > 6 else ""
    panels = panels[:6]
    plt, fig, axes = _grid(len(panels))
    for ax, (s, lines) in zip(axes, panels):
        for m in sorted(lines, key=_method_rank):
            ax.plot(range(1, len(lines[m]) + 1), lines[m], marker="o", color=_color(m), label=method_label(m))
        ax.set_ylim(0, 1.02)
        ax.set_xticks(range(1, s.L + 1))
        ax.set_xlabel("draft position i")
        ax.set_ylabel("P(tau ≥ i)")
        ax.set_title(f"K={s.K}, L={s.L}, T={s.temperature:g} (datasets pooled)", fontsize=8)
        ax.grid(alpha=0.3)
    _finish(plt, fig, axes, path)
    return PlotResult(path, "per-position acceptance P(tau ≥ i)" + more)


# ----------------------------------------------------------------------------------------------- claims
@dataclass
class Finding:
    """One comparison behind a claim."""

    scope: str  # e.g. "Table 1 / humaneval (package)" or "Table 1 / average"
    verdict: str
    evidence: str


@dataclass
class Claim:
    name: str
    statement: str
    findings: list[Finding]
    note: str = ""

    @property
    def verdict(self) -> str:
        """Overall: counts per verdict over the findings."""
        if not self.findings:
            return "not measured"
        counts: dict[str, int] = {}
        for f in self.findings:
            key = f.verdict.split(" (")[0]
            counts[key] = counts.get(key, 0) + 1
        if len(counts) == 1:
            kinds = {f.verdict for f in self.findings}
            return kinds.pop() if len(kinds) == 1 else next(iter(counts))
        return "mixed: " + ", ".join(f"{k} in {v}" for k, v in sorted(counts.items())) + f" of {len(self.findings)}"


def ordering_claim(tables: Sequence[Table], metric: str, order: Sequence[str] = PAPER_ORDER) -> Claim:
    """The paper's ordering (best first) per table, per dataset and on average, link by link."""
    name = {"be": "block efficiency", "sr": "speedup"}[metric]
    findings = []
    full_order = list(order)
    for i, t in enumerate(tables, 1):
        if t.setting.K < 2:
            continue  # the claim is about multi-draft settings (at K = 1 SpecTr is SD)
        order = [m for m in full_order if m in t.methods]
        missing = [m for m in full_order if m not in t.methods]
        if len(order) < 2:
            continue
        suffix = f" (missing: {', '.join(missing)})" if missing else ""
        scopes = [(d, [t.get(m, d) for m in order]) for d in t.datasets] + [("average", None)]
        for d, entries in scopes:
            if entries is None:
                stats = [t.average(m, metric) for m in order]
            elif any(e is None for e in entries):
                lacking = [m for m, e in zip(order, entries) if e is None]
                findings.append(Finding(f"Table {i} / {t.header(d)}", "not measured", f"no cell for {', '.join(lacking)}"))
                continue
            else:
                stats = [getattr(e, metric) for e in entries]
            links = [compare_greater(stats[j], stats[j + 1]) for j in range(len(order) - 1)]
            verdict = combine_verdicts(links)
            ev = " > ".join(f"{method_label(m)} {st.fmt()}" for m, st in zip(order, stats))
            ev += "; links: " + ", ".join(f"{order[j]}>{order[j + 1]}: {v}" for j, v in enumerate(links)) + suffix
            findings.append(Finding(f"Table {i} / {t.header(d)}", verdict, ev))
    order = full_order
    note = ""
    if metric == "be" and lossless(order[0]) is False:
        note = (f"{order[0]} is not lossless per the exact oracle (experiments/theory): its BE can exceed what any"
                f" exact method can reach, so a 'supported' ordering involving it is not evidence of a better lossless"
                f" verifier. GBV here is mdv's `gbv` (greedy block verification with the target adjustment).")
    if metric == "sr":
        note = ("Speedup depends on this machine's draft/target cost ratio; tiny models are dominated by per-call"
                " overhead, so compare block efficiency first.")
    note = ("Checked in every table with K ≥ 2, over the methods of the ordering present there. " + note).strip()
    return Claim(f"ordering_{metric}", f"Ordering {' > '.join(order)} in {name} (per dataset and on average)",
                 findings, note)


def monotonic_claim(tables: Sequence[Table], axis: str) -> Claim:
    """BE non-decreasing in ``axis`` (K or L) per method and dataset: supported when every step is a
    significant increase, contradicted when some step is a significant decrease."""
    fixed_names = [n for n in ("target", "draft", "K", "L", "temperature", "top_k", "top_p", "max_new_tokens")
                   if n != axis]
    groups: dict[tuple, dict[int, Table]] = {}
    for t in tables:
        v = getattr(t.setting, axis)
        if v >= 0:
            groups.setdefault(tuple(getattr(t.setting, n) for n in fixed_names), {})[v] = t
    findings = []
    for g, by_x in groups.items():
        if len(by_x) < 2:
            continue
        xs = sorted(by_x)
        methods = sorted({m for t in by_x.values() for m in t.methods if m != AR}, key=_method_rank)
        for m in methods:
            if axis == "K" and not multi_draft(m):
                continue
            headers = {d: h for t in by_x.values() for d, h in t.headers.items()}
            datasets = sorted({d for t in by_x.values() for d in t.datasets})
            with_m = [t for t in by_x.values() if m in t.methods]
            common = sorted(set.intersection(*({d for d in t.datasets if t.get(m, d)} for t in with_m)))
            scopes = datasets + (["average"] if len(common) > 1 else [])
            for d in scopes:
                pts = []
                for x in xs:
                    t = by_x[x]
                    st = t.average(m, "be", common) if d == "average" else (e.be if (e := t.get(m, d)) else EMPTY)
                    if st.valid:
                        pts.append((x, st))
                if len(pts) < 2:
                    continue
                steps = [compare_greater(pts[j + 1][1], pts[j][1]) for j in range(len(pts) - 1)]
                if any(s == "contradicted" for s in steps):
                    verdict = "contradicted"
                elif all(s == "supported" for s in steps):
                    verdict = "supported"
                else:
                    verdict = "inconclusive (CIs overlap)"
                fix = ", ".join(f"{n}={v:g}" if isinstance(v, float) else f"{n}={v}"
                                for n, v in zip(fixed_names, g) if n not in ("target", "draft", "top_k", "top_p")
                                and not (isinstance(v, int) and v < 0))
                ev = ", ".join(f"{axis}={x}: {st.fmt()}" for x, st in pts)
                scope = (f"average of {len(common)} datasets" if d == "average" else headers.get(d, d))
                findings.append(Finding(f"{method_label(m)} / {scope} ({fix})", verdict, ev))
    statement = {"K": "Block efficiency is non-decreasing in K (the number of drafts), per method",
                 "L": "Block efficiency grows with L (the draft length), per method (paper's ablation)"}[axis]
    note = ("Verdict per (method, dataset; the average is over the datasets the method has at every point):"
            " supported when every step up in the axis is a significant increase"
            " (disjoint 95% CIs), contradicted when some step is a significant decrease, else inconclusive.")
    if axis == "K":
        note += (" Single-draft methods have K = 1 and are not listed. The exact (not sampled) answer is in the"
                 " theory tables: the published SpecTr-GBV rule is not monotone in K on some toy pairs.")
    return Claim(f"monotone_{axis}", statement, findings, note)


def quality_claim(cells: Sequence[Cell]) -> Claim:
    """Lossless methods at T = 0 must reproduce AR's text exactly (same prompts, same seed)."""
    ar_cells = [c for c in cells if c.method == AR]
    findings = []
    for c in sorted(cells, key=lambda c: (_method_rank(c.method), c.cell_id)):
        if c.method == AR or c.temperature != 0.0:
            continue
        ar = next((a for a in ar_cells if a.pair_key() == c.pair_key()), None)
        if ar is None:
            continue
        ar_text = {int(g["prompt_index"]): g.get("text") for g in ar.generations}
        pairs = [(g.get("text"), ar_text.get(int(g["prompt_index"]))) for g in c.generations]
        pairs = [(a, b) for a, b in pairs if isinstance(a, str) and isinstance(b, str)]
        if not pairs:
            continue
        equal = sum(a == b for a, b in pairs)
        flag = lossless(c.method)
        if flag is False:
            verdict = "not applicable (not lossless per the exact oracle)"
        else:
            verdict = "supported" if equal == len(pairs) else "contradicted"
        short = short_label(c.dataset_label, str(c.dataset.get("source", "")))
        findings.append(Finding(f"{method_label(c.method)} / {short} / {c.cell_id}", verdict,
                                f"{equal} of {len(pairs)} prompts give exactly AR's text at T = 0"))
    note = ("At T = 0 a lossless method must emit the target's greedy text, so its text must equal AR's (small"
            " numerical differences between batched and one-token target passes can flip exact ties of real"
            " models; a contradicted row names the cell to inspect). At T > 0 losslessness is a statement about"
            " distributions; it is established exactly by the oracle (tests/test_exactness.py, experiments/theory),"
            " not from samples here. spectr_gbv (the published rule) is not lossless per the exact oracle.")
    findings.sort(key=lambda f: f.verdict.startswith("not applicable"))  # lossless methods first
    return Claim("quality", "Output quality is preserved (lossless methods reproduce AR at T = 0)", findings, note)


def claims(tables: Sequence[Table], cells: Sequence[Cell]) -> list[Claim]:
    """Every checked claim of the SpecTr-GBV paper, with its findings."""
    return [ordering_claim(tables, "be"), ordering_claim(tables, "sr"), monotonic_claim(tables, "K"),
            monotonic_claim(tables, "L"), quality_claim(cells)]


def overall_verdict(claim: Claim) -> str:
    """The verdict of a claim over its findings that could be measured."""
    used = [f for f in claim.findings if not f.verdict.startswith(("not applicable", "not measured"))]
    if not used:
        return "not measured (the results lack the cells this claim needs)"
    return Claim(claim.name, claim.statement, used).verdict


def claims_markdown(claims_: Sequence[Claim], tables: Sequence[Table]) -> str:
    lines = ["# Claims of the SpecTr-GBV paper, checked against these results", "",
             "Verdicts compare 95% confidence intervals over prompts: **supported** (CIs disjoint, in the claimed"
             " direction), **contradicted** (disjoint, the other way), **inconclusive (CIs overlap)**. Tables are"
             " numbered as in report.md.", "", "## Summary", "", "| claim | verdict |", "|---|---|"]
    for c in claims_:
        lines.append(f"| {c.statement} | {overall_verdict(c)} |")
    lines.append(f"| Expected accepted length of SpecTr-GBV is optimal for fixed K | exact, not sampled: see the"
                 f" theory tables below |")
    for i, c in enumerate(claims_, 1):
        lines += ["", f"## {i}. {c.statement}", "", f"**Verdict: {overall_verdict(c)}.**"]
        if c.note:
            lines += ["", c.note]
        if c.findings:
            lines += ["", "| scope | verdict | evidence |", "|---|---|---|"]
            lines += [f"| {_md_escape(f.scope)} | {f.verdict} | {_md_escape(f.evidence)} |" for f in c.findings]
        else:
            lines += ["", "No cell of these results can test this claim."]
    lines += ["", f"## {len(claims_) + 1}. Optimality and exactness (exact theory tables)", "",
              f"Whether SpecTr-GBV's expected accepted length is optimal, and whether each verifier is lossless, are"
              f" exact statements about the algorithms; sampled results cannot settle them. {THEORY_POINTER}."
              f" Its finding: the published SpecTr-GBV rule is biased (TV > 0), so its block efficiency is not"
              f" comparable with the lossless methods' ({LOSSY_MARK} in the tables)."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- report
@dataclass
class AnalysisResult:
    out_dir: Path
    paths: dict[str, Path]
    tables: list[Table]
    claims: list[Claim]
    loaded: Loaded
    plot_notes: list[str]


def analyze(results_dir: Path | str, out_dir: Path | str | None = None,
            warn: Callable[[str], None] | None = None) -> AnalysisResult:
    """Load ``results_dir``, write report.md, claims.md, CSV tables and plots to ``out_dir`` (default
    ``<results_dir>/analysis``).  Raises AnalysisError when nothing is usable."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    loaded = load_results(results_dir, warn)
    out = Path(out_dir) if out_dir is not None else Path(results_dir) / "analysis"
    try:
        ensure_writable_dir(out)
    except OSError as err:
        raise AnalysisError(f"cannot write the analysis to {str(out)!r} ({err.strerror or err}); pass a writable"
                            " folder with --out DIR") from None
    extra_warnings: list[str] = []

    def warn2(line: str) -> None:
        extra_warnings.append(line)
        warn(line)

    for c in loaded.ok:
        if lossless(c.method) is None:
            warn2(f"warning: {c.cell_id}: unknown method {c.method!r}; tabulated, losslessness unknown")
    tables = build_tables(loaded.ok, warn2)
    paths: dict[str, Path] = {}
    plots = [("be_vs_k", plot_be_vs_k), ("sr_vs_l", plot_sr_vs_l), ("vs_temperature", plot_vs_temperature),
             ("per_position", plot_per_position)]
    plot_notes = []
    for name, fn in plots:
        res = fn(tables, out / f"{name}.png")
        plot_notes.append(res.note)
        if res.path is not None:
            paths[name] = res.path
    cl = claims(tables, loaded.ok)
    paths["claims"] = out / "claims.md"
    paths["claims"].write_text(claims_markdown(cl, tables), encoding="utf-8")
    paths["long_csv"] = out / "results.csv"
    write_long_csv(tables, paths["long_csv"])

    lines = [f"# mdv results: {loaded.cells_dir.parent if loaded.cells_dir.name == 'cells' else loaded.cells_dir}",
             "", f"Analysed {datetime.now(timezone.utc).isoformat(timespec='seconds')} from {len(loaded.ok)} cell(s)"
             f" with status ok, {len(loaded.failed)} failed, {len(loaded.warnings)} file(s) skipped.", "",
             "## Environment", ""] + environment_lines(loaded.ok)
    lines += ["", "## Tables", "",
              "Conventions: BE = emitted tokens ÷ target calls incl. the bonus token (AR = 1.00). SR = AR decode"
              " time ÷ method decode time, same prompts, same machine, same run, warm-up prompt excluded; end-to-end"
              " SR (prefill included) is reported separately. Mean ± 95% CI over prompts."
              f" {LOSSY_MARK} = not lossless: BE not comparable."]
    for i, t in enumerate(tables, 1):
        csv_path = out / f"table_{i:02d}_{t.setting.slug()}.csv"
        write_table_csv(t, csv_path)
        paths[f"table_{i}"] = csv_path
        lines += ["", f"### Table {i}: {_md_escape(t.setting.title())}", "", caption(t, i), ""]
        lines += markdown_table(t)
        lines += ["", f"End-to-end SR (prefill included), Table {i}:", ""]
        lines += markdown_table(t, (("sr_e2e", "SR e2e"),))
        lines += ["", "Datasets (column header: honest label, source):", ""]
        lines += [f"- {_md_escape(t.header(d))}: {_md_escape(d)}; source: {t.sources.get(d, '?')}" for d in t.datasets]
        lines += ["", f"CSV: `{csv_path.name}`."]
        notes = sorted({f"{m} / {d}: {e.sr_note}" for (m, d), e in t.entries.items() if e.sr_note})
        unequal = sum(e.unequal_tokens for e in t.entries.values())
        if notes:
            lines += ["", "SR not available for: " + "; ".join(_md_escape(n) for n in notes) + "."]
        if unequal:
            lines += ["", f"Note: {unequal} timed prompt pair(s) emitted different token counts (EOS), so their SR"
                          f" compares unequal work."]
    lines += ["", "## Plots", ""]
    for (name, _), note in zip(plots, plot_notes):
        lines.append(f"- `{name}.png`: {note}" if name in paths else f"- {note}")
    per_setting = [t for t in tables if any(e.acceptance_rate_l == e.acceptance_rate_l for e in t.entries.values())]
    if per_setting:
        lines += ["", "## Acceptance rates", "",
                  "accepted ÷ (K·L·iterations) / accepted ÷ (L·iterations), pooled over prompts and seeds; per-position"
                  " rates in `results.csv`.", ""]
        for i, t in enumerate(tables, 1):
            rows = [f"{method_label(m)} / {_md_escape(t.header(d))}: {e.acceptance_rate_kl:.3f} / {e.acceptance_rate_l:.3f}"
                    for (m, d), e in sorted(t.entries.items(), key=lambda kv: (_method_rank(kv[0][0]), kv[0][1]))
                    if not math.isnan(e.acceptance_rate_l)]
            if rows:
                lines.append(f"- Table {i}: " + "; ".join(rows))
    lines += ["", "## Claims", "", "See `claims.md`. Summary:", ""]
    lines += [f"- {c.statement}: **{overall_verdict(c)}**" for c in cl]
    lines += [f"- Optimality / exactness: exact, see {THEORY_POINTER}."]
    if loaded.failed:
        lines += ["", "## Failed cells (not tabulated)", "", "| cell | method | dataset | error |", "|---|---|---|---|"]
        for c in loaded.failed:
            lines.append(f"| {c.cell_id} | {c.method} | {_md_escape(str(c.config.get('dataset')))} |"
                         f" {_md_escape(_first_line(c.error))} |")
    all_warn = loaded.warnings + extra_warnings
    if all_warn:
        lines += ["", "## Warnings", ""] + [f"- {_md_escape(w)}" for w in all_warn]
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return AnalysisResult(out_dir=out, paths=paths, tables=tables, claims=cl, loaded=loaded, plot_notes=plot_notes)
