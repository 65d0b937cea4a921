#!/usr/bin/env bash
# Set everything up (./.venv, offline assets), run mdv's main job -- the smoke sweep: every method on
# every dataset on the embedded default pair -- then turn its results into tables, plots and claims.
# Extra arguments are Hydra overrides of the sweep (e.g. dataset.n_prompts=2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
RESULTS="${MDV_RESULTS:-outputs/smoke}"
.venv/bin/python -m experiments.run experiment=smoke results_dir="$RESULTS" "$@"
.venv/bin/python -m analysis.report "$RESULTS"
echo "[mdv] tables, plots and claims: $RESULTS/analysis/ (report.md, claims.md)"
