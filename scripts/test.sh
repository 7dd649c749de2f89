#!/usr/bin/env bash
# Set up, then run the whole test suite (the real bundled models included) on every core, up to four pytest-xdist
# workers (each worker's torch takes its share of the cores: tests/conftest.py): about 10 minutes on an idle
# 2-core machine once set up. Arguments go to pytest (-n 0 runs in one process); the fast loop:
#   bash scripts/test.sh -m "not slow and not ray and not browser and not kernel"    (about 2 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=$(.venv/bin/python -c "import os; print(min(4, max(1, len(os.sched_getaffinity(0)))))")
.venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
