"""Tables, plots and the claims report from a sweep's results folder.

    python -m analysis.report <results_dir> [--out DIR]

Reads ``<results_dir>/cells/*.json`` (the ``mdv.cell/1`` contract) and writes ``report.md`` (tables in the
SpecTr-GBV Table 1 layout, environment, plots, failed cells), ``claims.md``, ``table_*.csv``,
``results.csv`` and PNG plots to ``DIR`` (default ``<results_dir>/analysis``).  When the folder holds paired
records (``<results_dir>/paired/``, :mod:`mdv.paired`) it also writes ``paired_report.md``, the paired
CSVs and plots, and ``claims.md`` leads with the paired (decisive) verdicts.  A corrupt cell file is
skipped with one warning line; an unusable folder gives one ``error:`` line and exit status 2 (the full
trace with ``MDV_FULL_ERROR=1`` or ``HYDRA_FULL_ERROR=1``).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from mdv.errors import MdvError


def main(argv: Sequence[str] | None = None, prog: str = "mdv report") -> int:
    """Run the analysis; returns the exit status (0 ok, 2 unusable input)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir", type=Path, help="folder a sweep wrote (holds cells/<cell_id>.json)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <results_dir>/analysis)")
    parser.add_argument("--delta", type=float, default=None,
                        help="equivalence margin of the paired verdicts (default: the run's paired.delta)")
    args = parser.parse_args(argv)
    try:
        from mdv.paired.report import analyze_results

        both = analyze_results(args.results_dir, args.out, delta=args.delta)
    except MdvError as err:
        if os.environ.get("MDV_FULL_ERROR") == "1" or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    result, paired = both["cells"], both["paired"]
    if result is not None:
        loaded = result.loaded
        print(f"analysis: {len(loaded.ok)} cell(s), {len(loaded.failed)} failed, {len(loaded.warnings)} skipped;"
              f" {len(result.tables)} table(s)")
        from mdv.analysis import overall_verdict

        for c in result.claims:
            print(f"  {c.name}: {overall_verdict(c)}")
        for name, path in result.paths.items():
            print(f"  {name}: {path}")
    if paired is not None:
        print("paired verdicts:")
        for line in paired.summary_lines:
            print(f"  {line}")
        for name, path in paired.paths.items():
            print(f"  paired {name}: {path}")
    return 0
