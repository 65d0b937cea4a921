"""``python -m experiments.bench``: the benchmarks (Hydra).

The same command as ``mdv bench``; the code is :mod:`mdv.cli.bench`.
"""
from mdv.cli.errors import hydra_cli
from mdv.cli.bench import main

if __name__ == "__main__":
    hydra_cli(main)
