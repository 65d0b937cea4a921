#!/usr/bin/env bash
# Set up what the tests need (./.venv, offline) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The SLURM test (tests/test_launchers.py) starts a single-node cluster; as root with apt-get, install
# its two Debian packages when absent (MDV_SKIP_SLURM=1 skips this; without them that test skips).
if [ "${MDV_SKIP_SLURM:-0}" != "1" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
   && ! command -v slurmctld >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm munge; } >/dev/null 2>&1 \
    || echo "[mdv test] could not install slurm-wlm and munge: the SLURM test will skip"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
# One intra-op thread unless the caller chose: the tests run small tensors, and two spinning OpenMP
# threads on a 2-core machine that is doing anything else slow them down several-fold.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q --durations=10 "$@"
