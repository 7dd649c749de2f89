#!/usr/bin/env bash
# Lint and type-check (configured in pyproject.toml). Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check attnviz tests benchmarks scripts
.venv/bin/mypy
