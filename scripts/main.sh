#!/usr/bin/env bash
# Set everything up (./.venv, offline assets) and run mdv's main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m experiments.theory "$@"
