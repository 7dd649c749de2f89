#!/usr/bin/env bash
# Set up, then draw the attention of "The cat sat on the mat" with the bundled model (offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/attnviz heatmap "The cat sat on the mat" -o demo/cat_layer5_mean.png
.venv/bin/attnviz heatmap "The cat sat on the mat" --terminal --layer 0 --head 2
.venv/bin/attnviz view "The cat sat on the mat" -o demo/cat_view.html   # open it in any browser, offline
