"""``python -m experiments.run``: a sweep, the paired measurement or the theory tables (Hydra).

The same command as ``mdv run``; the code is :mod:`mdv.cli.run`.
"""
from mdv.cli.errors import hydra_cli
from mdv.cli.run import main

if __name__ == "__main__":
    hydra_cli(main)
