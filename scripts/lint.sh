#!/usr/bin/env bash
# Lint, type-check (configured in pyproject.toml) and build the docs site, strictly. Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check attnviz tests benchmarks scripts
.venv/bin/mypy
# A broken link, a missing page or an API name mkdocstrings cannot find fails the build.
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
# Every warning is shown (no --quiet): --strict turns each into a failure.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d "$site"
