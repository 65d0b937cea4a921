#!/usr/bin/env bash
# Set everything up (./.venv, offline assets), run mdv's main job -- experiment=main: the paired
# exact-conditional measurement of every verifier on every dataset on the embedded default pair, a
# calibration of this machine and short real generations that check the predicted speedups -- then turn
# its results into verdicts (claims.md), tables and plots.
# Extra arguments are Hydra overrides (e.g. paired.n_prompts=4).
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
  case "$arg" in
    results_dir=*|+results_dir=*|++results_dir=*)
      # the analysis step reads $MDV_RESULTS, so an override here would analyse another directory
      echo "error: $arg: the analysis would read another directory; set the results directory with MDV_RESULTS=${arg#*=} bash scripts/main.sh" >&2
      exit 2 ;;
  esac
done
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
RESULTS="${MDV_RESULTS:-outputs/main}"
.venv/bin/python -m experiments.run experiment=main results_dir="$RESULTS" "$@"
.venv/bin/python -m analysis.report "$RESULTS"
echo "[mdv] verdicts, tables and plots: $RESULTS/analysis/ (claims.md, paired_report.md)"
