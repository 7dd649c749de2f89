#!/usr/bin/env bash
# Create .venv and install attnviz with its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # Prefer the CPU build of torch 2.13.0 where one lies on local disk; else install torch the ordinary way.
  pip install "torch==2.13.0" 2>/dev/null || pip install "torch>=2.1"
fi
pip install -e ".[test,ray]"
