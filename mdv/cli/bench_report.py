"""Bench report from the records ``experiments.bench`` writes (thin entry point over :mod:`mdv.bench.report`).

    python -m analysis.bench_report <bench output folder> [<folder> ...] [--out DIR] [--K 4] [--L 8]

Reads ``bench_<name>.json`` from each folder (or one level down, e.g. ``outputs/bench``), keeps the newest
record of each benchmark and writes ``bench_report.md`` (environment, goals met / missed, every figure) and
the plots ``verify_cost_vs_vocab.png``, ``e2e_speedup_vs_L.png``, ``e2e_time_split.png`` to DIR (default
``<first folder>/report``).  A corrupt record is skipped with one warning line; unusable input gives one
``error:`` line and exit status 2 (the full trace with ``MDV_FULL_ERROR=1``).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence


def main(argv: Sequence[str] | None = None, prog: str = "mdv bench-report") -> int:
    """Write the bench report; returns the exit status (0 ok, 2 unusable input)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", metavar="FOLDER",
                        help="bench output folder(s) holding bench_<name>.json (outputs/bench/<time>/, or outputs/bench)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <first folder>/report)")
    parser.add_argument("--K", type=int, default=4, help="drafts K of the verifier-cost plot (default 4)")
    parser.add_argument("--L", type=int, default=8, help="draft length L of the verifier-cost plot (default 8)")
    args = parser.parse_args(argv)
    from mdv.errors import MdvError

    try:
        from mdv.bench.report import write_report

        result = write_report(args.folders, args.out, K=args.K, L=args.L)
    except MdvError as err:
        if os.environ.get("MDV_FULL_ERROR") == "1" or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    loaded = result.loaded
    print(f"bench report: {len(loaded.used)} benchmark(s) from {len(loaded.files)} file(s)"
          f" ({', '.join(loaded.used) or 'none'}) -> {result.report}")
    for b in loaded.missing:
        why = (f"record {loaded.not_ok[b].status}: {loaded.not_ok[b].data.get('reason')}" if b in loaded.not_ok
               else "no record")
        print(f"  missing benchmark {b} ({why}): python -m experiments.bench benchmarks=[{b}]")
    for note in result.plot_notes.values():
        print(f"  {note}")
    return 0
