#!/usr/bin/env bash
# Set up what the tests need (./.venv, offline) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
# One intra-op thread unless the caller chose: the tests run small tensors, and two spinning OpenMP
# threads on a 2-core machine that is doing anything else slow them down several-fold.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q --durations=10 "$@"
