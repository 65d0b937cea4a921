"""``python -m analysis.bench_report``: the bench report of benchmark records.

The same command as ``mdv bench-report``; the code is :mod:`mdv.cli.bench_report`.
"""
import sys

from mdv.cli.bench_report import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m analysis.bench_report"))
