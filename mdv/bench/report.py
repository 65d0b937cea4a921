"""Bench report: Markdown tables and plots from the records ``experiments.bench`` writes (issue 5, Output).

    python -m analysis.bench_report <bench output folder> [<folder> ...] [--out DIR] [--K 4] [--L 8]

Input: one or more folders holding ``bench_<name>.json`` records (schema ``mdv.bench/<version>``, written by
:func:`mdv.bench.run`; e.g. ``outputs/bench/<time>/``).  A folder with no record of its own is searched one
level down, so ``outputs/bench`` itself works.  Of each benchmark the **newest** record with status ``ok``
is used (by ``environment.timestamp``, else the file's modification time); older ones are listed as
superseded.  A corrupt or wrongly shaped file is skipped with one warning line naming it; when nothing
usable is left the report fails with one :class:`BenchReportError` line (``error: ...``, exit 2 in the CLI).

Output (``--out``, default ``<first folder>/report``):

* ``bench_report.md``: the environment of every record used (CPU, cores, threads, torch, dtype, device, load
  average), every goal of every record with its verdict (met / missed / not measured: the verdicts, limits and
  values are the records' own, see :func:`mdv.bench.records.goal_record`), and a table of every figure per
  benchmark;
* ``verify_cost_vs_vocab.png``: the verifier fast path's cost vs V (log x) at one (K, L), one line per method
  (single-draft methods at K = 1), as ms per call and as a fraction of one target decode step;
* ``e2e_speedup_vs_L.png``: end-to-end decode speedup over AR vs L, one line per (method, K), one panel per
  temperature;
* ``e2e_time_split.png``: the draft / target / verify / other share of decode time per (method, K, L),
  stacked bars, when the e2e record carries ``time_split``.

A plot whose benchmark is absent is skipped with a one-line reason (printed, and listed in the report).
Nothing here measures anything: every number comes from the records.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from mdv._fs import ensure_writable_dir
from mdv.analysis.tables import METHOD_ORDER  # rows in the sweep tables' order
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


# =============================================================================================== formatting
def fmt(x: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits (as ``mdv.bench`` prints); None / NaN -> "-"."""
    if x is None or isinstance(x, bool):
        return "-" if x is None else str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3e}"
    return str(x)


def pct(x: Any, digits: int = 3) -> str:
    """A fraction as a percentage: 0.05694 -> "5.69%"."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.{digits}g}%"


def rng(s: dict[str, Any] | None, digits: int = 3, percent: bool = False) -> str:
    """A spread ``{median, min, max, n}`` as "median [min, max]"; "-" when nothing was measured."""
    if not s or not s.get("n") or s.get("median") is None:
        return "-"
    f = (lambda v: pct(v, digits)) if percent else (lambda v: fmt(v, digits))
    return f"{f(s['median'])} [{f(s.get('min'))}, {f(s.get('max'))}]"


def _md(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(c) for c in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(_md(c if isinstance(c, str) else fmt(c)) for c in row) + " |" for row in rows]
    return out


def _method_rank(m: str) -> tuple:
    return (METHOD_ORDER.index(m), "") if m in METHOD_ORDER else (len(METHOD_ORDER), m)


def _color(method: str) -> str:
    i = METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER) + sum(map(ord, method)) % 3
    return PALETTE[i]


def verdict(met: Any) -> str:
    return {True: "**met**", False: "**missed**"}.get(met, "not measured")


def goal_rows(rec: Record) -> list[list[str]]:
    """benchmark | goal | measured | target | verdict | note, from the record's own goal verdicts."""
    rows = []
    for g in rec.goals:
        unit = g.get("unit") or ""
        op = "≤" if g.get("at_most", True) else "≥"
        value = "-" if g.get("value") is None else f"{fmt(g['value'], 4)}{unit}"
        limit = "-" if g.get("limit") is None else f"{op} {fmt(g['limit'], 4)}{unit}"
        rows.append([rec.benchmark, g["goal"], value, limit, verdict(g.get("met")), g.get("why") or ""])
    return rows


def _load(env: dict) -> str:
    la = env.get("loadavg_1_5_15")
    return " / ".join(fmt(x) for x in la) if isinstance(la, list) and la else "-"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# =============================================================================================== verifier
def _verifier_multi(rec: Record) -> set[str]:
    """Methods the record ran at some K > 1 (multi-draft); single-draft methods only run at K = 1."""
    return {r["method"] for r in rec.results if r["K"] > 1}


def _closest(want: int, have: Sequence[int]) -> int:
    return min(have, key=lambda v: (abs(v - want), -v))


def verifier_cell(rec: Record, K: int, L: int) -> tuple[int, int, str]:
    """The (K, L) of the verifier grid nearest to the requested one, and a note when it differs."""
    Ks = sorted({r["K"] for r in rec.results})
    Ls = sorted({r["L"] for r in rec.results})
    k, l_ = _closest(K, Ks), _closest(L, Ls)
    notes = []
    if k != K:
        notes.append(f"K={K} not in the grid {Ks}: K={k} shown")
    if l_ != L:
        notes.append(f"L={L} not in the grid {Ls}: L={l_} shown")
    return k, l_, "; ".join(notes)


def verifier_series(rec: Record, K: int, L: int) -> dict[str, list[dict[str, Any]]]:
    """method -> its rows at (K, L) sorted by V; single-draft methods from their K = 1 rows."""
    multi = _verifier_multi(rec)
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rec.results:
        k_want = K if r["method"] in multi else 1
        if r["K"] == k_want and r["L"] == L:
            out.setdefault(r["method"], []).append(r)
    return {m: sorted(rows, key=lambda r: r["V"]) for m, rows in sorted(out.items(), key=lambda kv: _method_rank(kv[0]))}


def _method_k_label(m: str, multi: set[str], K: int) -> str:
    return f"{m} (K={K})" if m in multi else f"{m} (K=1)"


def section_verifier(rec: Record, K: int, L: int) -> list[str]:
    cfg, summ, env = rec.config, rec.summary, rec.env
    k, l_, note = verifier_cell(rec, K, L)
    multi = _verifier_multi(rec)
    step = summ.get("target_step_ms")
    yard = (f"one decode step of {summ.get('target') or 'the target'} with {summ.get('target_step_context', '?')}"
            f" cached tokens: {rng(step)} ms")
    if summ.get("target_step_reason"):
        yard += f" (no step fraction: {summ['target_step_reason']})"
    lines = ["## verifier: fast-path cost", "",
             f"`Verifier.sample` on synthetic blocks (B = 1), device {env.get('device', '?')}, dtype"
             f" {env.get('dtype', '?')}; yardstick: {yard}. Median [min, max] over {cfg.get('repeats', '?')}"
             f" interleaved repeats ({cfg.get('warmup', '?')} warm-up); single-draft methods run at K = 1 only.", ""]
    series = verifier_series(rec, k, l_)
    Vs = sorted({r["V"] for r in rec.results})
    lines += [f"### ms per call (share of a target step) at K={k}, L={l_}" + (f" ({note})" if note else ""), ""]
    rows = []
    for m, rs in series.items():
        by_v = {r["V"]: r for r in rs}
        cells = []
        for V in Vs:
            r = by_v.get(V)
            if r is None:
                cells.append("-")
            else:
                frac = r["step_fraction"]["median"] if r["step_fraction"].get("n") else None
                cells.append(f"{fmt(r['ms']['median'])} ({pct(frac)})" if frac is not None else fmt(r["ms"]["median"]))
        rows.append([_method_k_label(m, multi, k)] + cells)
    lines += md_table(["method"] + [f"V={V}" for V in Vs], rows)
    vs = summ.get("vs_spectr_at_goal_cell") or {}
    if vs:
        lines += ["", f"Relative to `spectr` at the goal cell V={cfg.get('goal_V')}, K={cfg.get('goal_K')},"
                      f" L={cfg.get('goal_L')}: " + "; ".join(f"{m} {rng(s)}x" for m, s in vs.items()) + "."]
    lines += ["", "### Full grid", ""]
    grid = sorted(rec.results, key=lambda r: (r["V"], r["K"], r["L"], _method_rank(r["method"])))
    lines += md_table(["V", "K", "L", "method", "ms / call", "of a target step", "× spectr"],
                      [[r["V"], r["K"], r["L"], r["method"], rng(r["ms"]), rng(r["step_fraction"], percent=True),
                        rng(r.get("vs_spectr"))] for r in grid])
    return lines


# =============================================================================================== target pass
def section_target_pass(rec: Record) -> list[str]:
    res, env = rec.results, rec.env
    ms = res["ms"]
    lines = ["## target_pass: verification pass of K drafts", "",
             f"{rec.summary.get('target') or 'target'}; K={res['K']}, L={res['L']}, {res['context']} cached tokens,"
             f" {res.get('shared', 0)} shared draft tokens; device {env.get('device', '?')}, dtype {env.get('dtype', '?')};"
             f" {rec.config.get('repeats', '?')} interleaved repeats, ratios formed within a repeat.", ""]
    rows = [["single draft", res.get("single_tokens", res["L"] + 1), rng(ms["single"]), "1"],
            ["K full rows (fork + pass + keep; target_pass=rows)", res.get("k_rows_tokens", res["K"] * (res["L"] + 1)),
             rng(ms["k_rows"]), rng(res["k_rows_vs_single"])],
            ["token tree (shared prefixes once; the engine's default)" if rec.schema_version >= 2 else
             "tree attention (shared prefixes once; benchmark only)", res.get("tree_nodes", "-"), rng(ms["tree"]),
             rng(res["tree_vs_single"])]]
    if "fork_keep" in ms:
        rows.append(["(of K full rows: fork + keep of the cache alone)", 0, rng(ms["fork_keep"]),
                     rng(res.get("fork_keep_vs_single"))])
    lines += md_table(["pass", "tokens", "ms", "× single"], rows)
    extra = []
    if "tree_vs_k_rows" in res:
        extra.append(f"tree ÷ K full rows: {rng(res['tree_vs_k_rows'])}")
    if res.get("tree_max_abs_logit_diff") is not None:
        extra.append(f"tree vs K-row logits: max |diff| = {fmt(res['tree_max_abs_logit_diff'])}")
    if extra:
        lines += ["", "; ".join(extra) + "."]
    return lines


# =============================================================================================== e2e
def _e2e_key(r: dict) -> tuple:
    return (_method_rank(r["method"]), r["K"] or 0, r["L"] or 0)


def best_per_method(rows: Sequence[dict]) -> dict[str, dict]:
    """method -> its row with the highest median decode speedup (rows without a measured speedup ignored)."""
    best: dict[str, dict] = {}
    for r in rows:
        s = r["speedup"]
        if r["method"] == "ar" or not s.get("n") or s.get("median") is None:
            continue
        if r["method"] not in best or s["median"] > best[r["method"]]["speedup"]["median"]:
            best[r["method"]] = r
    return best


def section_e2e(rec: Record) -> list[str]:
    summ, cfg, env = rec.summary, rec.config, rec.env
    n = summ.get("n_prompts", cfg.get("n_prompts"))
    lines = ["## e2e: end to end", "",
             f"{summ.get('target') or 'target'} + {summ.get('draft') or 'draft'}; prompts: {summ.get('prompts', '?')};"
             f" {n} prompt(s), the first a warm-up (excluded from timing), {cfg.get('max_new_tokens', '?')} new tokens"
             f" each (no EOS stop); device {env.get('device', '?')}, dtype {env.get('dtype', '?')}. Speedup = AR decode s"
             " ÷ method decode s per prompt, median [min, max]; e2e speedup includes the prefill; block efficiency ="
             " emitted tokens ÷ target calls (all prompts); time split = share of decode time.", ""]
    temps = sorted({r["temperature"] for r in rec.results})
    has_split = any("time_split" in r for r in rec.results)
    for T in temps:
        rows_T = sorted([r for r in rec.results if r["temperature"] == T], key=_e2e_key)
        cols = ["method", "K", "L", "tokens/s", "speedup vs AR", "mean speedup", "e2e speedup", "block eff."]
        if has_split:
            cols += ["draft", "target", "verify", "other"]
        cols.append("timed prompts")
        rows = []
        for r in rows_T:
            row = [r["method"], r["K"] if r["K"] is not None else "-", r["L"] if r["L"] is not None else "-",
                   rng(r["tokens_per_second"]), rng(r["speedup"]), fmt(r.get("speedup_mean")), rng(r.get("speedup_e2e")),
                   fmt(r.get("block_efficiency"))]
            if has_split:
                split = r.get("time_split") or {}
                row += [pct(split.get(k), 2) for k in SPLIT_KEYS]
            row.append(fmt(r.get("n_timed_prompts")))
            rows.append(row)
        lines += [f"### T = {fmt(T)}", ""] + md_table(cols, rows)
        best = best_per_method(rows_T)
        if best:
            lines += ["", f"Best setting per method at T = {fmt(T)} (highest median speedup):", ""]
            lines += md_table(["method", "K", "L", "speedup vs AR", "block eff."],
                              [[m, b["K"], b["L"], rng(b["speedup"]), fmt(b.get("block_efficiency"))]
                               for m, b in sorted(best.items(), key=lambda kv: _method_rank(kv[0]))])
        lines.append("")
    return lines[:-1]


# =============================================================================================== oracle
def section_oracle(rec: Record) -> list[str]:
    res, cfg = rec.results, rec.config
    lines = ["## oracle: exact computations and Monte Carlo", "",
             "Exact enumeration and LPs at the largest size each supports per V (one run each, seconds):", ""]
    lines += md_table(["function", "method", "V", "K", "L", "tuples", "seconds"],
                      [[r["function"], r["method"], r.get("V", "-"), r.get("K", "-"), r.get("L", "-"),
                        r.get("tuples", "-"), fmt(r["seconds"])] for r in res["exact"]])
    lines += ["", f"Monte-Carlo throughput (`sample_iterations`), median [min, max] over {cfg.get('mc_repeats', '?')}"
                  " interleaved repeats:", ""]
    lines += md_table(["method", "V", "K", "L", "trials / call", "trials / s"],
                      [[r["method"], r.get("V", "-"), r.get("K", "-"), r.get("L", "-"), r.get("trials", "-"),
                        rng(r["trials_per_second"])]
                       for r in sorted(res["monte_carlo"], key=lambda r: _method_rank(r["method"]))])
    return lines


# =============================================================================================== memory
def section_memory(rec: Record) -> list[str]:
    res, cfg = rec.results, rec.config
    w = cfg.get("warmup_prompts", "?")
    lines = ["## memory: peak and growth", "",
             f"{rec.summary.get('target') or 'target'} + {rec.summary.get('draft') or 'draft'};"
             f" {res.get('method', cfg.get('method'))} K={res.get('K', cfg.get('K'))} L={res.get('L', cfg.get('L'))},"
             f" {res.get('n_prompts', cfg.get('n_prompts'))} prompts × {cfg.get('max_new_tokens', '?')} new tokens"
             f" ({res.get('prompts', '?')}); device {rec.env.get('device', '?')}.", ""]
    peak_note = ("since the start of the run" if res.get("peak_is_since_start_of_run")
                 else "process lifetime (peak reset not permitted)" if "peak_is_since_start_of_run" in res else "")
    rows = [[f"peak RSS (MiB){', ' + peak_note if peak_note else ''}", fmt(res.get("peak_rss_mib"), 5)],
            ["RSS before the run (MiB)", fmt(res.get("rss_before_mib"), 5)],
            [f"RSS after the warm-up ({w} prompts) (MiB)", fmt(res.get("rss_after_warmup_mib"), 5)],
            ["RSS at the end (MiB)", fmt(res.get("rss_end_mib"), 5)],
]
    if "rss_endpoint_growth_mib" in res:  # current records: rss_growth_mib is the median-based figure
        rows += [["RSS growth after the warm-up: median of the last quarter − median of the first (MiB)",
                  fmt(res.get("rss_growth_mib"))],
                 ["RSS growth, end − after the warm-up (MiB)", fmt(res.get("rss_endpoint_growth_mib"))]]
    else:  # records written before the median-based figure: rss_growth_mib was end − after the warm-up
        rows.append(["RSS growth, end − after the warm-up (MiB)", fmt(res.get("rss_growth_mib"))])
    rows += [
            ["RSS slope, least squares (MiB / prompt)", fmt(res.get("rss_slope_mib_per_prompt"))]]
    if res.get("cuda_peak_allocated_mib") is not None:
        rows.append(["CUDA peak allocated (MiB)", fmt(res["cuda_peak_allocated_mib"], 5)])
    lt = res.get("live_tensors") or []
    rows.append(["live tensors (prompt: count)", ", ".join(f"{i}: {c}" for i, c in lt) or "-"])
    rows.append(["live tensor growth after the warm-up", fmt(res.get("live_tensor_growth"))])
    lines += md_table(["figure", "value"], rows)
    return lines


def section_paired(rec: Record) -> list[str]:
    res, cfg = rec.results, rec.config
    lines = ["## paired: the paired measurement, timed", "",
             f"{res.get('prompts', '?')} prompts ({', '.join(cfg.get('datasets', []))}), {cfg.get('n_tokens', '?')}"
             f" generated tokens each, a context every {cfg.get('stride', '?')}: {res.get('contexts', '?')} contexts;"
             f" K_max = {cfg.get('K_max', '?')}, L_max = {cfg.get('L_max', '?')}, {cfg.get('workers', 1)} process(es);"
             f" {fmt(res.get('wall_seconds'))} s, {fmt(res.get('contexts_per_second'))} contexts/s. Each context costs a"
             " K_max-row draft of L_max steps and one target tree pass of up to K_max·L_max + 1 nodes; each"
             " trajectory token off the drafts' paths one AR target step"
             + (f" ({res['trajectory_target_steps']} steps for {res['trajectory_tokens']} tokens, the rest read from"
                " the tree passes)." if "trajectory_tokens" in res else "."), ""]
    share, secs = res.get("share") or {}, res.get("seconds") or {}
    lines += md_table(["part", "seconds", "share"], [[k, fmt(secs.get(k)), f"{float(v):.1%}"] for k, v in share.items()])
    return lines


def section_audit(rec: Record) -> list[str]:
    res = rec.results
    lines = ["## audit: the audit's speed and power", "",
             f"Harness with a free rule: {rng(res.get('harness_instances_per_second'))} instances/s; per-instance"
             f" adapter: {rng(res.get('scalar_instances_per_second'))} instances/s. Sampler throughput on the"
             " first-iteration blocks of each default-grid case (instances/s):", ""]
    lines += md_table(["case", "method", "instances/s"],
                      [[r["case"], r["method"], rng(r["instances_per_second"])] for r in res.get("throughput", [])])
    lines += ["", "Detection of a rule biased by a known TV on one case, the whole default audit run until its verdict:", ""]
    lines += md_table(["rule", "perturbed case", "TV", "verdict", "seconds", "sequences on that case"],
                      [[d["rule"], d["perturbed_case"], fmt(d["epsilon"]), d["verdict"], fmt(d["seconds"]),
                        fmt(d.get("sequences_on_perturbed_case"))] for d in res.get("detection", [])])
    return lines


SECTIONS: dict[str, Callable[..., list[str]]] = {
    "verifier": section_verifier, "target_pass": section_target_pass, "e2e": section_e2e, "oracle": section_oracle,
    "memory": section_memory, "paired": section_paired, "audit": section_audit}


# =============================================================================================== plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _errbar(ax, xs, spreads, scale: float = 1.0, marker: str = "o", **kw) -> None:
    ys = [s["median"] * scale for s in spreads]
    lo = [max(0.0, (s["median"] - (s["min"] if s.get("min") is not None else s["median"])) * scale) for s in spreads]
    hi = [max(0.0, ((s["max"] if s.get("max") is not None else s["median"]) - s["median"]) * scale) for s in spreads]
    ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, marker=marker, **kw)


def plot_verify_cost(rec: Record, path: Path, K: int, L: int) -> str:
    """Verifier cost vs V at (K, L): ms per call and share of a target step (when measured).  -> note."""
    k, l_, note = verifier_cell(rec, K, L)
    multi = _verifier_multi(rec)
    series = verifier_series(rec, k, l_)
    ms_pts = {m: [r for r in rs if r["ms"].get("n") and r["ms"].get("median") is not None] for m, rs in series.items()}
    fr_pts = {m: [r for r in rs if r["step_fraction"].get("n") and r["step_fraction"].get("median") is not None]
              for m, rs in series.items()}
    ms_pts = {m: v for m, v in ms_pts.items() if v}
    fr_pts = {m: v for m, v in fr_pts.items() if v}
    if not ms_pts:
        raise _Skip(f"no measured verifier cost at K={k}, L={l_}")
    plt = _plt()
    n = 2 if fr_pts else 1
    fig, axes = plt.subplots(1, n, figsize=(5.4 * n, 4.4), squeeze=False)
    axes = axes[0]
    for m, rs in ms_pts.items():
        _errbar(axes[0], [r["V"] for r in rs], [r["ms"] for r in rs], color=_color(m),
                linestyle="-" if m in multi else "--", label=_method_k_label(m, multi, k))
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("vocabulary size V")
    axes[0].set_ylabel("ms per call (median, min–max)")
    axes[0].set_title("verifier fast path, ms per call", fontsize=9)
    if fr_pts:
        ax = axes[1]
        for m, rs in fr_pts.items():
            _errbar(ax, [r["V"] for r in rs], [r["step_fraction"] for r in rs], scale=100.0, color=_color(m),
                    linestyle="-" if m in multi else "--", label=_method_k_label(m, multi, k))
        limits = sorted({g["limit"] for g in rec.goals if "target step" in g["goal"] and g.get("limit") is not None})
        for lim in limits:
            ax.axhline(100 * lim, color="grey", linestyle=":", linewidth=1)
            ax.annotate(f"goal {pct(lim)}", (1.0, 100 * lim), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=7, color="grey")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("vocabulary size V")
        ax.set_ylabel("% of one target decode step")
        target = rec.summary.get("target") or "target"
        ax.set_title(f"share of a decode step of {target}", fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"verifier cost vs V at K={k}, L={l_} (dashed: single-draft, K=1)"
                 + (f"\n{note}" if note else ""), fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    what = "ms per call" + (" and share of a target step" if fr_pts else " (no target step measured)")
    return f"verifier cost vs V at K={k}, L={l_}: {what}" + (f" ({note})" if note else "")


def plot_e2e_speedup(rec: Record, path: Path) -> str:
    """Decode speedup over AR vs L, one line per (method, K), one panel per temperature.  -> note."""
    temps = sorted({r["temperature"] for r in rec.results})
    panels = []
    for T in temps:
        lines: dict[tuple[str, int], list[dict]] = {}
        for r in rec.results:
            if (r["temperature"] == T and r["method"] != "ar" and r["speedup"].get("n")
                    and r["speedup"].get("median") is not None):
                lines.setdefault((r["method"], r["K"]), []).append(r)
        if lines:
            panels.append((T, lines))
    if not panels:
        raise _Skip("no measured speedup in the e2e record")
    plt = _plt()
    cols = min(len(panels), 2)
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.0 * cols, 4.6 * nrows + 1.0), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[len(panels):]:
        a.set_visible(False)
    Ks = sorted({K for _, ls in panels for (_, K) in ls})
    markers = "osD^vP*X"
    for ax, (T, lines) in zip(flat, panels):
        keys = sorted(lines, key=lambda mk: (_method_rank(mk[0]), mk[1]))
        for i, (m, K) in enumerate(keys):
            rs = sorted(lines[(m, K)], key=lambda r: r["L"])
            dodge = 1.0 + 0.012 * (i - (len(keys) - 1) / 2)  # keep the error bars of one L apart (log x)
            _errbar(ax, [r["L"] * dodge for r in rs], [r["speedup"] for r in rs], color=_color(m),
                    linestyle="-" if K > 1 else "--", marker=markers[Ks.index(K) % len(markers)], label=f"{m} K={K}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        Ls = sorted({r["L"] for rs in lines.values() for r in rs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ls)
        ax.set_xticklabels([str(x) for x in Ls])
        ax.minorticks_off()
        ax.set_xlabel("L (draft length)")
        ax.set_ylabel("decode speedup over AR (median, min–max)")
        ax.set_title(f"T = {fmt(T)} (grey line: AR)", fontsize=9)
        ax.grid(alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in flat[:len(panels)]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    n_lines = len(handles)
    fig.suptitle(f"end-to-end speedup vs L (dashed: K=1)\n{rec.summary.get('target') or 'target'} +"
                 f" {rec.summary.get('draft') or 'draft'}", fontsize=9)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(n_lines, 5), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, (0.35 + 0.2 * math.ceil(n_lines / 5)) / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"end-to-end speedup vs L, {n_lines} (method, K) line(s), T = {', '.join(fmt(T) for T, _ in panels)}"


def plot_e2e_split(rec: Record, path: Path) -> str:
    rows = [r for r in rec.results if isinstance(r.get("time_split"), dict)
            and any(r["time_split"].get(k) is not None for k in SPLIT_KEYS)]
    if not rows:
        raise _Skip("the e2e record has no time_split")
    temps = sorted({r["temperature"] for r in rows})
    plt = _plt()
    n_bars = max(sum(1 for r in rows if r["temperature"] == T) for T in temps)
    fig, axes = plt.subplots(len(temps), 1, figsize=(max(6.0, 0.42 * n_bars + 1.5), 3.6 * len(temps) + 0.8),
                             squeeze=False)
    for ax, T in zip(axes[:, 0], temps):
        rs = sorted([r for r in rows if r["temperature"] == T], key=_e2e_key)
        xs = list(range(len(rs)))
        bottom = [0.0] * len(rs)
        for k in SPLIT_KEYS:
            vals = [float(r["time_split"].get(k) or 0.0) for r in rs]
            ax.bar(xs, vals, bottom=bottom, color=SPLIT_COLORS[k], label=k, width=0.8)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(xs)
        ax.set_xticklabels(["AR" if r["method"] == "ar" else f"{r['method']} K{r['K']} L{r['L']}" for r in rs],
                           rotation=60, ha="right", fontsize=7)
        ax.set_ylim(0, 1.0)
        ax.set_ylabel("share of decode time")
        ax.set_title(f"T = {fmt(T)}", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    top = 1.0 - 0.6 / fig.get_figheight()  # room for the title and the legend (inches -> figure fraction)
    fig.suptitle("decode time split: draft / target / verify / other (share of decode time)", fontsize=9)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1.0 - 0.35 / fig.get_figheight()), ncol=4,
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"decode time split of {len(rows)} setting(s), T = {', '.join(fmt(T) for T in temps)}"


class _Skip(Exception):
    """A plot has nothing to draw (the message says why)."""


# =============================================================================================== report
@dataclass
class BenchReport:
    out_dir: Path
    report: Path
    plots: dict[str, Path]
    #: one line per plot: what it shows, or why it was skipped.
    plot_notes: dict[str, str]
    loaded: Loaded
    warnings: list[str]


def _writable(out: Path) -> None:
    try:
        ensure_writable_dir(out)
    except OSError as err:
        raise BenchReportError(f"cannot write the bench report to {str(out)!r} ({err.strerror or err}); pass a"
                               " writable folder with --out DIR") from None


def write_report(folders: Sequence[Path | str], out_dir: Path | str | None = None, *, K: int = 4, L: int = 8,
                 warn: Callable[[str], None] | None = None) -> BenchReport:
    """Load the records in ``folders``; write ``bench_report.md`` and the plots to ``out_dir`` (default
    ``<first folder>/report``).  Raises BenchReportError (one line) on unusable input."""
    warn_fn = warn or (lambda line: print(line, file=sys.stderr))
    for name, v in (("K", K), ("L", L)):
        if not isinstance(v, int) or v < 1:
            raise BenchReportError(f"{name} must be an integer >= 1; got {v!r}")
    loaded = load_records(folders, warn_fn)
    out = Path(out_dir) if out_dir is not None else Path(folders[0]) / "report"
    _writable(out)
    warnings = list(loaded.warnings)

    def warn2(line: str) -> None:
        warnings.append(line)
        warn_fn(line)

    used = loaded.used
    # ------------------------------------------------------------------ plots
    plots: dict[str, Path] = {}
    notes: dict[str, str] = {}
    specs = [("verify_cost_vs_vocab", "verifier", lambda r, p: plot_verify_cost(r, p, K, L)),
             ("e2e_speedup_vs_L", "e2e", plot_e2e_speedup), ("e2e_time_split", "e2e", plot_e2e_split)]
    for name, bench, fn in specs:
        path = out / f"{name}.png"
        if bench not in used:
            why = (f"the {bench} record was {loaded.not_ok[bench].status}: {loaded.not_ok[bench].data.get('reason')}"
                   if bench in loaded.not_ok else f"no {bench} record")
            notes[name] = f"{name}.png: skipped ({why})"
            path.unlink(missing_ok=True)  # never leave a stale plot from an earlier report
            continue
        try:
            notes[name] = f"{name}.png: " + fn(used[bench], path)
            plots[name] = path
        except _Skip as s:
            notes[name] = f"{name}.png: skipped ({s})"
            path.unlink(missing_ok=True)
    # ------------------------------------------------------------------ markdown
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = ["# mdv bench report", "",
             f"Written {now} from {len(loaded.files)} record file(s) in {len(loaded.folders)} folder(s):"
             f" {', '.join('`' + _rel(f) + '`' for f in loaded.folders)}. Of each benchmark the newest record with status"
             " ok is used. Every figure is the record's own: medians [min, max] over interleaved repeats on a shared"
             " machine (see the load average); goal verdicts are those the benchmark recorded.", ""]
    lines += ["## Records", ""]
    src_rows = []
    for b in BENCHMARKS:
        if b in used:
            r = used[b]
            src_rows.append([b, "used", f"`{_rel(r.path)}`", r.env.get("timestamp") or r.when.isoformat(timespec="seconds"),
                             fmt(r.data.get("wall_seconds"))])
        elif b in loaded.not_ok:
            r = loaded.not_ok[b]
            src_rows.append([b, f"{r.status}: {r.data.get('reason') or '?'}", f"`{_rel(r.path)}`",
                             r.env.get("timestamp") or "-", fmt(r.data.get("wall_seconds"))])
        else:
            src_rows.append([b, "**missing**", "-", "-", "-"])
    for r in sorted(loaded.superseded, key=lambda r: (BENCHMARKS.index(r.benchmark), r.when)):
        src_rows.append([r.benchmark, f"superseded ({r.status})", f"`{_rel(r.path)}`",
                         r.env.get("timestamp") or r.when.isoformat(timespec="seconds"), fmt(r.data.get("wall_seconds"))])
    lines += md_table(["benchmark", "record", "file", "timestamp (UTC)", "wall s"], src_rows)
    if loaded.missing:
        lines += ["", "Missing benchmarks (no usable record): " + ", ".join(f"`{b}`" for b in loaded.missing)
                  + f". Run `python -m experiments.bench threads=1 benchmarks=[{','.join(loaded.missing)}]`."]
    lines += ["", "## Environment", ""]
    lines += md_table(["benchmark", "CPU", "cores", "threads", "torch", "transformers", "dtype", "device",
                       "load avg 1 / 5 / 15", "python", "mdv"],
                      [[b, r.env.get("cpu", "-"), fmt(r.env.get("logical_cores")), fmt(r.env.get("threads")),
                        r.env.get("torch", "-"), r.env.get("transformers") or "-", r.env.get("dtype", "-"),
                        r.env.get("device", "-"), _load(r.env), r.env.get("python", "-"), r.env.get("mdv", "-")]
                       for b, r in sorted(used.items(), key=lambda kv: BENCHMARKS.index(kv[0]))])
    lines += ["", "## Goals", "",
              "Verdicts as recorded by each benchmark (met: the measured figure is on the right side of the limit;"
              " not measured: no figure).", ""]
    goal_rows_all = [row for b in BENCHMARKS if b in used for row in goal_rows(used[b])]
    met = sum(1 for row in goal_rows_all if row[4] == "**met**")
    missed = sum(1 for row in goal_rows_all if row[4] == "**missed**")
    lines += md_table(["benchmark", "goal", "measured", "limit", "verdict", "note"], goal_rows_all or [["-"] * 6])
    lines += ["", f"{met} met, {missed} missed, {len(goal_rows_all) - met - missed} not measured."]
    for b in BENCHMARKS:
        if b not in used:
            continue
        rec = used[b]
        try:
            body = SECTIONS[b](rec, K, L) if b == "verifier" else SECTIONS[b](rec)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:  # shape the checks let through
            warn2(f"warning: {rec.path}: cannot tabulate the {b} record ({type(err).__name__}: {err})")
            continue
        lines += ["", *body]
    lines += ["", "## Plots", ""]
    for name, _, _ in specs:
        what = notes[name].split(": ", 1)[1]
        lines.append(f"- `{name}.png`: {what}" if name in plots else f"- {name}.png: {what}")
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {_md(w)}" for w in warnings]
    report = out / REPORT_NAME
    report.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return BenchReport(out_dir=out, report=report, plots=plots, plot_notes=notes, loaded=loaded, warnings=warnings)


__all__ = ["BENCHMARKS", "BenchReport", "BenchReportError", "Loaded", "Record", "RecordError", "best_per_method",
           "find_record_files", "fmt", "load_record", "load_records", "pct", "rng", "verifier_cell", "verifier_series",
           "write_report"]
