"""Analysis of a sweep's result files: tables in the SpecTr-GBV Table 1 layout, plots, and a claims report.

    cells.py    cell files read back and validated (``mdv.cell/1``)
    stats.py    per-prompt means with Student-t CIs, comparison verdicts
    speedup.py  a method's cell paired with its AR cell; decode-time speedups
    tables.py   Table 1 layout: settings, entries, captions, Markdown and CSV
    plots.py    BE vs K, SR vs L, vs temperature, per-position acceptance
    claims.py   the paper's claims checked: ordering, monotonicity in K and L, quality
    report.py   analyze(): report.md, claims.md, tables and plots of a results folder


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
from mdv.analysis.cells import (AR, AnalysisError, Cell, CellFileError, Loaded, SCHEMA, load_cell, load_results,
                                parse_cell)
from mdv.analysis.claims import Claim, Finding, PAPER_ORDER, claims, claims_markdown, overall_verdict
from mdv.analysis.plots import PlotResult, plot_be_vs_k, plot_per_position, plot_sr_vs_l, plot_vs_temperature
from mdv.analysis.report import AnalysisResult, analyze
from mdv.analysis.speedup import Speedup, find_ar, lossless, multi_draft, speedups
from mdv.analysis.stats import Stat, average_stat, combine_verdicts, compare_greater
from mdv.analysis.tables import (DATASET_ORDER, Entry, LOSSY_MARK, METHOD_ORDER, Setting, Table, build_tables,
                                 caption, markdown_table, method_label, write_long_csv, write_table_csv)

__all__ = [
    "AR", "DATASET_ORDER", "LOSSY_MARK", "METHOD_ORDER", "PAPER_ORDER", "SCHEMA", "AnalysisError", "AnalysisResult",
    "Cell", "CellFileError", "Claim", "Entry", "Finding", "Loaded", "PlotResult", "Setting", "Speedup", "Stat", "Table",
    "analyze", "average_stat", "build_tables", "caption", "claims", "claims_markdown", "combine_verdicts",
    "compare_greater", "find_ar", "load_cell", "load_results", "lossless", "markdown_table", "method_label",
    "multi_draft", "overall_verdict", "parse_cell", "plot_be_vs_k", "plot_per_position", "plot_sr_vs_l",
    "plot_vs_temperature", "speedups", "write_long_csv", "write_table_csv",
]
