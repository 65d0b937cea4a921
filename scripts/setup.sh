#!/usr/bin/env bash
# Set up mdv in ./.venv: idempotent, offline-safe apart from the package registry.
# - Keeps an existing torch (the venv sees the interpreter's site-packages when it has torch).
# - Otherwise installs the CPU build torch==2.13.0 (never an unpinned torch, which would pull CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${MDV_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[mdv setup] found torch in $PY: the venv will reuse it"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[mdv setup] installing torch==2.13.0 (CPU build)"
  "$VPY" -m pip install -q "torch==2.13.0"
fi
if ! "$VPY" -c "import mdv, ot, transformers, hydra, wandb, datasets, pytest, hypothesis" >/dev/null 2>&1 \
   || [ pyproject.toml -nt "$VENV/.mdv-installed" ] || [ constraints.txt -nt "$VENV/.mdv-installed" ]; then
  echo "[mdv setup] installing mdv and its dependencies"
  "$VPY" -m pip install -q -c constraints.txt -e ".[dev]"
  touch "$VENV/.mdv-installed"
fi
# Offline assets: the default target model and the offline dataset sources, sha256-checked, into
# $MDV_CACHE (default ~/.cache/mdv).  Set MDV_SKIP_ASSETS=1 to skip (real-model tests then skip).
if [ "${MDV_SKIP_ASSETS:-0}" != "1" ]; then
  if ! "$VPY" -m mdv.assets check >/dev/null 2>&1; then
    echo "[mdv setup] fetching the default model and dataset sources"
    "$VPY" -m mdv.assets fetch
  fi
  if ! "$VPY" -m mdv.data check >/dev/null 2>&1; then
    "$VPY" -m mdv.data fetch
  fi
fi
echo "[mdv setup] ready: $("$VPY" -c 'import torch, mdv; print("torch", torch.__version__, "| mdv", mdv.__version__)')"
