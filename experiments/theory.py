"""``python -m experiments.theory``: the exact theory tables (Hydra).

The same command as ``mdv theory``; the code is :mod:`mdv.cli.theory`.
"""
from mdv.cli.errors import hydra_cli
from mdv.cli.theory import main

if __name__ == "__main__":
    hydra_cli(main)
