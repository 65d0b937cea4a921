"""``python -m analysis.report``: tables, plots and verdicts of a results folder.

The same command as ``mdv report``; the code is :mod:`mdv.cli.report`.
"""
import sys

from mdv.cli.report import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m analysis.report"))
