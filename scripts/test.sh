#!/usr/bin/env bash
# Set up, then run the whole test suite (the real bundled models included): about 18 minutes of pytest on an
# idle 2-core machine, one line per test file as it runs. Arguments go to pytest; the fast loop:
#   bash scripts/test.sh -m "not slow and not ray and not browser and not kernel"    (about 4 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest "$@"
