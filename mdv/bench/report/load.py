"""Reading bench records back: the schema check of each benchmark's results, the newest usable record per benchmark."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from mdv.bench.config import Benchmark
from mdv.errors import InvalidInputError


#: The benchmarks of :class:`mdv.bench.config.Benchmark`, in its order.
BENCHMARKS = tuple(b.value for b in Benchmark)
SCHEMA_PREFIX = "mdv.bench/"
PALETTE = ["#7f7f7f", "#1f77b4", "#ff7f0e", "#8c564b", "#2ca02c", "#9467bd", "#d62728", "#e377c2", "#17becf",
           "#bcbd22"]
SPLIT_KEYS = ("draft", "target", "verify", "other")
SPLIT_COLORS = {"draft": "#1f77b4", "target": "#ff7f0e", "verify": "#d62728", "other": "#bbbbbb"}
REPORT_NAME = "bench_report.md"


class BenchReportError(InvalidInputError):
    """The folders cannot be reported on (absent, no record, nothing usable, output not writable)."""


class RecordError(ValueError):
    """One record file is unreadable or not shaped like an ``mdv.bench`` record (the message says why)."""


# =============================================================================================== loading
@dataclass
class Record:
    """One ``bench_<name>.json`` file."""

    path: Path
    data: dict[str, Any]
    when: datetime  # environment.timestamp, else the file's mtime (UTC)

    @property
    def benchmark(self) -> str:
        return self.data["benchmark"]

    @property
    def status(self) -> str:
        return self.data.get("status", "ok")

    @property
    def schema_version(self) -> int:
        """The N of ``mdv.bench/N`` (see :data:`mdv.bench.SCHEMA`), 1 when it is not a number."""
        tail = str(self.data.get("schema", "")).removeprefix(SCHEMA_PREFIX)
        return int(tail) if tail.isdigit() else 1

    @property
    def env(self) -> dict[str, Any]:
        return self.data.get("environment") or {}

    @property
    def config(self) -> dict[str, Any]:
        return self.data.get("config") or {}

    @property
    def results(self) -> Any:
        return self.data.get("results")

    @property
    def summary(self) -> dict[str, Any]:
        return self.data.get("summary") or {}

    @property
    def goals(self) -> list[dict[str, Any]]:
        return self.data.get("goals") or []


@dataclass
class Loaded:
    """What :func:`load_records` found: the record used per benchmark and everything else."""

    folders: list[Path]
    files: list[Path]
    used: dict[str, Record]
    superseded: list[Record] = field(default_factory=list)
    #: benchmark -> the newest record with a status other than ok, when no ok record exists.
    not_ok: dict[str, Record] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        return [b for b in BENCHMARKS if b not in self.used]


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise RecordError(what)


def _num_or_none(obj: dict, key: str, where: str, required: bool = True) -> None:
    if key not in obj:
        _check(not required, f"{where}: missing {key!r}")
        return
    _check(obj[key] is None or _is_num(obj[key]), f"{where}: {key!r} must be a number or null, got {obj[key]!r:.60}")


def _spread_ok(s: Any, where: str) -> None:
    _check(isinstance(s, dict), f"{where} must be an object {{median, min, max, n}}")
    for k in ("median", "min", "max"):
        _num_or_none(s, k, where)
    _check(isinstance(s.get("n"), int), f"{where}: 'n' must be an integer")


def _rows(results: Any, where: str) -> list[dict]:
    _check(isinstance(results, list) and all(isinstance(r, dict) for r in results), f"{where} must be a list of objects")
    return results


def _int_or_none(r: dict, key: str, where: str) -> None:
    _check(key in r and (r[key] is None or (isinstance(r[key], int) and not isinstance(r[key], bool))),
           f"{where}: {key!r} must be an integer or null")


def _validate_results(name: str, res: Any) -> None:
    """Raise RecordError unless ``res`` has what the report reads from a ``name`` record."""
    if name == "verifier":
        for i, r in enumerate(_rows(res, "results")):
            w = f"results[{i}]"
            for k in ("V", "K", "L"):
                _check(isinstance(r.get(k), int), f"{w}: {k!r} must be an integer")
            _check(isinstance(r.get("method"), str), f"{w}: 'method' must be a string")
            for k in ("ms", "step_fraction"):
                _spread_ok(r.get(k), f"{w}.{k}")
            if "vs_spectr" in r:
                _spread_ok(r["vs_spectr"], f"{w}.vs_spectr")
    elif name == "target_pass":
        _check(isinstance(res, dict), "results must be an object")
        for k in ("K", "L", "context"):
            _check(isinstance(res.get(k), int), f"results: {k!r} must be an integer")
        _check(isinstance(res.get("ms"), dict), "results.ms must be an object")
        for k in ("single", "k_rows", "tree"):
            _spread_ok(res["ms"].get(k), f"results.ms.{k}")
        for k in ("k_rows_vs_single", "tree_vs_single"):
            _spread_ok(res.get(k), f"results.{k}")
        for k in ("fork_keep_vs_single", "tree_vs_k_rows"):
            if k in res:
                _spread_ok(res[k], f"results.{k}")
        if "fork_keep" in res["ms"]:
            _spread_ok(res["ms"]["fork_keep"], "results.ms.fork_keep")
    elif name == "e2e":
        for i, r in enumerate(_rows(res, "results")):
            w = f"results[{i}]"
            _check(_is_num(r.get("temperature")), f"{w}: 'temperature' must be a number")
            _check(isinstance(r.get("method"), str), f"{w}: 'method' must be a string")
            _int_or_none(r, "K", w)
            _int_or_none(r, "L", w)
            _check(r["method"] == "ar" or (r["K"] is not None and r["L"] is not None), f"{w}: K and L must be set")
            for k in ("speedup", "tokens_per_second"):
                _spread_ok(r.get(k), f"{w}.{k}")
            if "speedup_e2e" in r:
                _spread_ok(r["speedup_e2e"], f"{w}.speedup_e2e")
            _num_or_none(r, "block_efficiency", w, required=False)
            if "time_split" in r:
                _check(isinstance(r["time_split"], dict), f"{w}.time_split must be an object")
                for k in SPLIT_KEYS:
                    _num_or_none(r["time_split"], k, f"{w}.time_split", required=False)
    elif name == "oracle":
        _check(isinstance(res, dict), "results must be an object {exact, monte_carlo}")
        for i, r in enumerate(_rows(res.get("exact"), "results.exact")):
            for k in ("function", "method"):
                _check(isinstance(r.get(k), str), f"results.exact[{i}]: {k!r} must be a string")
            _num_or_none(r, "seconds", f"results.exact[{i}]")
        for i, r in enumerate(_rows(res.get("monte_carlo"), "results.monte_carlo")):
            _check(isinstance(r.get("method"), str), f"results.monte_carlo[{i}]: 'method' must be a string")
            _spread_ok(r.get("trials_per_second"), f"results.monte_carlo[{i}].trials_per_second")
    elif name == "paired":
        _check(isinstance(res, dict), "results must be an object")
        for k in ("wall_seconds", "contexts", "prompts", "contexts_per_second", "seconds_per_context"):
            _num_or_none(res, k, "results")
        _check(isinstance(res.get("share"), dict), "results.share must be an object part -> fraction")
    elif name == "audit":
        _check(isinstance(res, dict), "results must be an object {throughput, detection, ...}")
        for i, r in enumerate(_rows(res.get("throughput"), "results.throughput")):
            _check(isinstance(r.get("method"), str), f"results.throughput[{i}]: 'method' must be a string")
            _spread_ok(r.get("instances_per_second"), f"results.throughput[{i}].instances_per_second")
        for i, r in enumerate(_rows(res.get("detection"), "results.detection")):
            _num_or_none(r, "seconds", f"results.detection[{i}]")
    elif name == "hf_compare":
        for i, r in enumerate(_rows(res, "results")):
            w = f"results[{i}]"
            _check(isinstance(r.get("contender"), str), f"{w}: 'contender' must be a string")
            for k in ("tokens_per_second", "speed_vs_hf_plain"):
                _spread_ok(r.get(k), f"{w}.{k}")
            if "speed_vs_hf_same_drafter" in r:
                _spread_ok(r["speed_vs_hf_same_drafter"], f"{w}.speed_vs_hf_same_drafter")
    elif name == "pass_limit":
        _check(isinstance(res, dict), "results must be an object {per_threads, weight_bytes, ...}")
        for k in ("weight_bytes", "flops_per_token", "max_abs_prob_diff_cached_vs_full"):
            _num_or_none(res, k, "results")
        for i, e in enumerate(_rows(res.get("per_threads"), "results.per_threads")):
            w = f"results.per_threads[{i}]"
            _check(isinstance(e.get("threads"), int), f"{w}: 'threads' must be an integer")
            for k in ("read_GBps", "gemm_GFLOPs"):
                _spread_ok(e.get(k), f"{w}.{k}")
            for j, r in enumerate(_rows(e.get("passes"), f"{w}.passes")):
                _check(isinstance(r.get("n"), int), f"{w}.passes[{j}]: 'n' must be an integer")
                _num_or_none(r, "limit_ms", f"{w}.passes[{j}]")
                for k in ("ms", "vs_limit"):
                    _spread_ok(r.get(k), f"{w}.passes[{j}].{k}")
    elif name == "draft_step":
        _check(isinstance(res, dict), "results must be an object {rows, read_GBps, ...}")
        _spread_ok(res.get("read_GBps"), "results.read_GBps")
        for i, r in enumerate(_rows(res.get("rows"), "results.rows")):
            w = f"results.rows[{i}]"
            _check(isinstance(r.get("dtype"), str), f"{w}: 'dtype' must be a string")
            _check(isinstance(r.get("K"), int), f"{w}: 'K' must be an integer")
            for k in ("limit_ms", "pack_bytes"):
                _num_or_none(r, k, w)
            for k in ("ms", "vs_limit"):
                _spread_ok(r.get(k), f"{w}.{k}")
    elif name == "memory":
        _check(isinstance(res, dict), "results must be an object")
        for k in ("rss_before_mib", "peak_rss_mib", "rss_after_warmup_mib", "rss_end_mib", "rss_growth_mib",
                  "rss_endpoint_growth_mib", "rss_slope_mib_per_prompt", "cuda_peak_allocated_mib"):
            _num_or_none(res, k, "results", required=False)
        if res.get("live_tensors") is not None:
            _check(isinstance(res["live_tensors"], list)
                   and all(isinstance(x, list) and len(x) == 2 for x in res["live_tensors"]),
                   "results.live_tensors must be a list of [prompt, count] pairs")


def load_record(path: Path) -> Record:
    """Read and check one record file.  Raises RecordError saying what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"cannot read it ({getattr(err, 'strerror', None) or err})") from None
    if not text.strip():
        raise RecordError("empty file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    _check(isinstance(data, dict), f"not a bench record: a JSON {type(data).__name__}, not an object")
    schema = data.get("schema")
    _check(isinstance(schema, str) and schema.startswith(SCHEMA_PREFIX),
           f"not a bench record: schema {schema!r}, expected {SCHEMA_PREFIX}<version>")
    name = data.get("benchmark")
    _check(name in BENCHMARKS, f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    _check(isinstance(data.get("status", "ok"), str), "'status' must be a string")
    for k in ("config", "environment", "summary"):
        _check(data.get(k) is None or isinstance(data[k], dict), f"{k!r} must be an object")
    goals = data.get("goals") or []
    _check(isinstance(goals, list), "'goals' must be a list")
    for i, g in enumerate(goals):
        _check(isinstance(g, dict) and isinstance(g.get("goal"), str), f"goals[{i}]: needs a 'goal' text")
        _check(g.get("met") in (True, False, None), f"goals[{i}]: 'met' must be true, false or null")
        _num_or_none(g, "value", f"goals[{i}]", required=False)
        _num_or_none(g, "limit", f"goals[{i}]", required=False)
    if data.get("status", "ok") == "ok":
        _validate_results(name, data.get("results"))
    return Record(path=path, data=data, when=_when(data, path))


def _when(data: dict, path: Path) -> datetime:
    stamp = (data.get("environment") or {}).get("timestamp")
    if isinstance(stamp, str):
        try:
            t = datetime.fromisoformat(stamp)
            return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
        except ValueError:
            pass
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)


def find_record_files(folder: Path) -> list[Path]:
    """``bench_*.json`` in ``folder``, else in its direct subfolders (e.g. ``outputs/bench``)."""
    files = sorted(p for p in folder.glob("bench_*.json") if p.is_file())
    if not files:
        files = sorted(p for p in folder.glob("*/bench_*.json") if p.is_file())
    return files


def load_records(folders: Sequence[Path | str], warn: Callable[[str], None] | None = None) -> Loaded:
    """Load every record in ``folders``; keep the newest ok record of each benchmark.

    A folder with no record, or a bad file, is skipped with one warning line (``warn``, default stderr) when
    something else is usable; otherwise BenchReportError (one line) says what was found.
    """
    warn_fn = warn or (lambda line: print(line, file=sys.stderr))
    if not folders:
        raise BenchReportError("no bench output folder given; pass the folder experiments.bench wrote"
                               " (outputs/bench/<time>/, it holds bench_<name>.json)")
    roots: list[Path] = []
    for f in folders:
        root = Path(f)
        if not root.is_dir():
            what = "is a file, not a folder" if root.exists() else "does not exist"
            raise BenchReportError(f"bench output folder {str(root)!r} {what}; pass the folder experiments.bench"
                                   " wrote (outputs/bench/<time>/, it holds bench_<name>.json)")
        if root.resolve() not in [r.resolve() for r in roots]:
            roots.append(root)
    warnings: list[str] = []
    problems: list[str] = []  # the reasons, for the error line when nothing is usable
    files: list[Path] = []
    records: list[Record] = []
    for root in roots:
        found = find_record_files(root)
        if not found:
            warnings.append(f"warning: no bench_*.json in {str(root)!r} (nor one level down); folder ignored")
            problems.append(f"{root}: no bench_*.json")
        for path in found:
            files.append(path)
            try:
                records.append(load_record(path))
            except RecordError as err:
                warnings.append(f"warning: skipping {path}: {err}")
                problems.append(f"{path}: {err}")
    if not records:
        where = ", ".join(repr(str(r)) for r in roots)
        if not files:
            raise BenchReportError(f"no bench_*.json record in {where} (nor one level down); run"
                                   " `python -m experiments.bench` first and pass its output folder")
        raise BenchReportError(f"no usable bench record in {where}: " + "; ".join(problems[:3])
                               + (f"; and {len(problems) - 3} more" if len(problems) > 3 else ""))
    for line in warnings:
        warn_fn(line)
    used: dict[str, Record] = {}
    not_ok: dict[str, Record] = {}
    superseded: list[Record] = []
    for rec in sorted(records, key=lambda r: (r.when, str(r.path)), reverse=True):  # newest first
        target = used if rec.status == "ok" else not_ok
        if rec.benchmark not in target:
            target[rec.benchmark] = rec
        else:
            superseded.append(rec)
    used = {b: used[b] for b in BENCHMARKS if b in used}
    not_ok = {b: not_ok[b] for b in BENCHMARKS if b in not_ok and b not in used}
    superseded += [r for r in records if r.status != "ok" and r.benchmark in used and r not in superseded]
    return Loaded(folders=roots, files=files, used=used, superseded=superseded, not_ok=not_ok, warnings=warnings)
