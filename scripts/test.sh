#!/usr/bin/env bash
# Set up, then run the whole test suite (the real offline models included) on every core, up to four pytest-xdist
# workers (each worker's torch takes its share of the cores: tests/conftest.py). The whole suite first converts the
# offline models into attnviz's cache, once (scripts/prepare_models.py: about a minute the first time, a second
# after). Arguments go to pytest (-n 0 runs in one process); the fast loop:
#   bash scripts/test.sh -m "not slow and not ray and not browser and not kernel"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$#" -eq 0 ]; then
  .venv/bin/python scripts/prepare_models.py
fi
workers=$(.venv/bin/python -c "import os; print(min(4, max(1, len(os.sched_getaffinity(0)))))")
.venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
