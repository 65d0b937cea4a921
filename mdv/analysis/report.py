"""The sweep report: :func:`analyze` loads a results folder and writes report.md, claims.md, the CSV tables
and the plots.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from mdv._fs import ensure_writable_dir
from mdv.analysis.cells import AnalysisError, Loaded, first_line, load_results
from mdv.analysis.claims import Claim, THEORY_POINTER, claims, claims_markdown, overall_verdict
from mdv.analysis.plots import plot_be_vs_k, plot_per_position, plot_sr_vs_l, plot_vs_temperature
from mdv.analysis.speedup import lossless
from mdv.analysis.tables import (LOSSY_MARK, Table, build_tables, caption, environment_lines, markdown_table,
                                 md_escape, method_label, method_rank, write_long_csv, write_table_csv)


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
        lines += ["", f"### Table {i}: {md_escape(t.setting.title())}", "", caption(t, i), ""]
        lines += markdown_table(t)
        lines += ["", f"End-to-end SR (prefill included), Table {i}:", ""]
        lines += markdown_table(t, (("sr_e2e", "SR e2e"),))
        lines += ["", "Datasets (column header: honest label, source):", ""]
        lines += [f"- {md_escape(t.header(d))}: {md_escape(d)}; source: {t.sources.get(d, '?')}" for d in t.datasets]
        lines += ["", f"CSV: `{csv_path.name}`."]
        notes = sorted({f"{m} / {d}: {e.sr_note}" for (m, d), e in t.entries.items() if e.sr_note})
        unequal = sum(e.unequal_tokens for e in t.entries.values())
        if notes:
            lines += ["", "SR not available for: " + "; ".join(md_escape(n) for n in notes) + "."]
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
            rows = [f"{method_label(m)} / {md_escape(t.header(d))}: {e.acceptance_rate_kl:.3f} / {e.acceptance_rate_l:.3f}"
                    for (m, d), e in sorted(t.entries.items(), key=lambda kv: (method_rank(kv[0][0]), kv[0][1]))
                    if not math.isnan(e.acceptance_rate_l)]
            if rows:
                lines.append(f"- Table {i}: " + "; ".join(rows))
    lines += ["", "## Claims", "", "See `claims.md`. Summary:", ""]
    lines += [f"- {c.statement}: **{overall_verdict(c)}**" for c in cl]
    lines += [f"- Optimality / exactness: exact, see {THEORY_POINTER}."]
    if loaded.failed:
        lines += ["", "## Failed cells (not tabulated)", "", "| cell | method | dataset | error |", "|---|---|---|---|"]
        for c in loaded.failed:
            lines.append(f"| {c.cell_id} | {c.method} | {md_escape(str(c.config.get('dataset')))} |"
                         f" {md_escape(first_line(c.error))} |")
    all_warn = loaded.warnings + extra_warnings
    if all_warn:
        lines += ["", "## Warnings", ""] + [f"- {md_escape(w)}" for w in all_warn]
    paths["report"] = out / "report.md"
    paths["report"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return AnalysisResult(out_dir=out, paths=paths, tables=tables, claims=cl, loaded=loaded, plot_notes=plot_notes)
