"""``python -m experiments.audit sampler=package.module:function``: audit a verification rule (Hydra).

The same command as ``mdv audit``; the code is :mod:`mdv.cli.audit`.
"""
from mdv.cli.errors import hydra_cli
from mdv.cli.audit import main

if __name__ == "__main__":
    hydra_cli(main)
