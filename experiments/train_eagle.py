"""Train the ``eagle`` drafter (Hydra entry point; config ``mdv/conf/train_eagle.yaml``).

    python experiments/train_eagle.py [overrides]          # or: python -m experiments.train_eagle

The recipe itself (text, target features, training, the report) is :mod:`mdv.distill.eagle`; this entry
point parses the config, runs :func:`mdv.distill.eagle.run_recipe` and prints the report's headline figures.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hydra
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/train_eagle.py` from anywhere
    sys.path.insert(0, str(REPO))

from mdv.cli.errors import clean_errors, hydra_cli  # noqa: E402
from mdv.distill.eagle import run_recipe  # noqa: E402


@hydra.main(version_base=None, config_path="../mdv/conf", config_name="train_eagle")
@clean_errors
def main(cfg: DictConfig) -> None:
    """Run the recipe into ``output.dir`` (relative: to the repository)."""
    out_dir = Path(cfg.output.dir)
    out_dir = out_dir if out_dir.is_absolute() else REPO / out_dir
    report = run_recipe(cfg, out_dir, command="python experiments/train_eagle.py " + " ".join(sys.argv[1:]))
    ev = report["evaluation"]
    print(f"greedy agreement (held-out, {ev['positions']} positions): first drafted token"
          f" {ev['greedy_agreement_first_token']:.3f}, second {ev['greedy_agreement_second_token']:.3f}")
    print("expected acceptance of the first drafted token: "
          + ", ".join(f"T={T} {a:.3f}" for T, a in ev["expected_acceptance_first_token"].items()))
    sc = ev["step_cost"]
    print(f"cost per step: target {sc['ms']['target']:.1f} ms, eagle {sc['ms']['eagle_1']:.1f} ms (1 row) ="
          f" {sc['ratio_to_target']['eagle_1']:.3f}, {sc['ms']['eagle_3']:.1f} ms (3 rows)")
    print(f"report: {out_dir / cfg.output.report}  (wall {report['total_wall_seconds']:.0f} s)")


if __name__ == "__main__":
    hydra_cli(main)
