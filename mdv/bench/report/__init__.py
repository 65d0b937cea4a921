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
  (single-draft methods at K = 1), as ms per call and as a fraction of one target decode step; a bar per method
  where the record has one V (``verifier.blocks=real``: the pair's vocabulary);
* ``e2e_speedup_vs_L.png``: end-to-end decode speedup over AR vs L, one line per (method, K), one panel per
  temperature;
* ``e2e_time_split.png``: the draft / target / verify / other share of decode time per (method, K, L),
  stacked bars, when the e2e record carries ``time_split``.

A plot whose benchmark is absent is skipped with a one-line reason (printed, and listed in the report).
Nothing here measures anything: every number comes from the records.

The package: :mod:`~mdv.bench.report.load` (records read back and checked), :mod:`~mdv.bench.report.format`,
:mod:`~mdv.bench.report.sections` (one Markdown section per benchmark), :mod:`~mdv.bench.report.plots`, and
:func:`write_report` here.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from mdv._fs import ensure_writable_dir
from mdv.bench.report.format import _load, _md, _rel, fmt, goal_rows, md_table, pct, rng
from mdv.bench.report.load import (BENCHMARKS, REPORT_NAME, BenchReportError, Loaded, Record, RecordError,
                                  find_record_files, load_record, load_records)
from mdv.bench.report.plots import _Skip, plot_e2e_speedup, plot_e2e_split, plot_verify_cost
from mdv.bench.report.sections import SECTIONS, best_per_method, verifier_cell, verifier_series


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


__all__ = ["BENCHMARKS", "SECTIONS", "BenchReport", "BenchReportError", "Loaded", "Record", "RecordError",
           "best_per_method", "find_record_files", "fmt", "load_record", "load_records", "pct", "rng", "verifier_cell",
           "verifier_series", "write_report"]
