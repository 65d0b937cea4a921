"""Distil the embedded default draft from its target (Hydra entry point; config ``mdv/conf/train_draft.yaml``).

    python experiments/train_draft.py [overrides]          # or: python -m experiments.train_draft

The recipe itself (steps 1-6, the report) is :mod:`mdv.distill`; this entry point parses the config,
runs :func:`mdv.distill.run_recipe` and prints the report's headline figures.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import hydra
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python experiments/train_draft.py` from anywhere
    sys.path.insert(0, str(REPO))

from mdv.cli.errors import clean_errors, hydra_cli  # noqa: E402
from mdv.distill import run_recipe  # noqa: E402


@hydra.main(version_base=None, config_path="../mdv/conf", config_name="train_draft")
@clean_errors
def main(cfg: DictConfig) -> None:
    """Run the recipe (:mod:`mdv.distill`) into ``output.dir`` (relative: to the repository)."""
    out_dir = Path(cfg.output.dir)
    out_dir = out_dir if out_dir.is_absolute() else REPO / out_dir
    report = run_recipe(cfg, out_dir, command="python experiments/train_draft.py " + " ".join(sys.argv[1:]))
    _hydra_copy(report)
    if cfg.head_subset_only:
        _print_head_subset(report["head_subset"])
        print(f"report: {out_dir / cfg.output.report}")
        return
    ev = report["evaluation"]
    print(f"greedy agreement (held-out, {ev['agreement']['positions']} positions): "
          f"{ev['agreement']['greedy_agreement']:.3f}  by source {ev['agreement']['by_source']}")
    print(f"cost per step: draft {ev['cost_per_step']['draft_ms']:.1f} ms / target "
          f"{ev['cost_per_step']['target_ms']:.1f} ms = {ev['cost_per_step']['ratio']:.3f}")
    be = ev["sd_block_efficiency"]
    if be and "block_efficiency_mean_over_prompts" in be:
        print(f"sd L={be['L']} T={be['temperature']}: block efficiency {be['block_efficiency_mean_over_prompts']:.2f}")
    if "head_subset" in report:
        _print_head_subset(report["head_subset"])
    print(f"report: {out_dir / cfg.output.report}  (wall {report['total_wall_seconds']:.0f} s, "
          f"cpu {report['total_cpu_seconds']:.0f} s)")


def _hydra_copy(report: dict[str, Any]) -> None:
    try:
        from hydra.core.hydra_config import HydraConfig

        (Path(HydraConfig.get().runtime.output_dir) / "metrics.json").write_text(json.dumps(report, indent=2))
    except Exception:  # noqa: BLE001 - the copy in the Hydra folder is a convenience
        pass


def _print_head_subset(hs: dict[str, Any]) -> None:
    print(f"head subset ({hs['file']}): {hs['size']} of {hs['vocab_size']} rows")
    for row in hs["sizes"]:
        ms = " / ".join(f"{v:.1f}" for v in row["draft_step_ms"].values())
        print(f"  {row['size']:6d} rows: held-out coverage {row['heldout_coverage']:.3f}, greedy agreement"
              f" {row['greedy_agreement']:.3f}, draft step {ms} ms (rows {'/'.join(row['draft_step_ms'])})")
    f = hs["full_head"]
    ms = " / ".join(f"{v:.1f}" for v in f["draft_step_ms"].values())
    print(f"  full head: greedy agreement {f['greedy_agreement']:.3f}, draft step {ms} ms;"
          f" target {' / '.join(f'{v:.1f}' for v in hs['step_cost']['ms']['target'].values())} ms")


if __name__ == "__main__":
    hydra_cli(main)
