"""Fixtures: tiny random models of each family (built by tests/helpers.py into temp folders, once per
session), the real bundled MiniLM, and matplotlib figures closed after each test."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

from helpers import SENTENCE, TEXTS, build_tiny_model, build_tiny_seq2seq, once, run  # after the environment is set


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir("gpt2") -> folder of a saved tiny random GPT-2 (built once per session)."""
    return once(lambda kind: str(build_tiny_model(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))))


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory):
    """tiny_lm_dir("llama") -> folder of a tiny random causal LM with its head (GPT-2 or Llama: RoPE, GQA).
    initializer_range 0.3: rows still peaked (mean largest weight ≈ 0.55), logits small enough that float32
    rounding stays near 1e-6."""
    return once(lambda kind: str(build_tiny_model(kind, tmp_path_factory.mktemp(f"tiny-lm-{kind}"), lm=True,
                                                  init=0.3)))


@pytest.fixture(scope="session")
def tiny_seq2seq_dir(tmp_path_factory):
    """tiny_seq2seq_dir("t5") -> folder of a tiny random T5, BART or Marian model (2 encoder layers, 3 decoder
    layers, 4 heads; T5 with 8 relative-position buckets up to distance 16, so buckets of both kinds,
    exact and logarithmic, occur in short inputs)."""
    return once(lambda kind: str(build_tiny_seq2seq(kind, tmp_path_factory.mktemp(f"tiny-{kind}"))))


@pytest.fixture(scope="session")
def load_tiny(tiny_model_dir):
    from attnviz.engine.models import load

    return once(lambda kind: load(tiny_model_dir(kind), device="cpu"))


@pytest.fixture(scope="session")
def minilm():
    """The real bundled all-MiniLM-L6-v2, loaded once."""
    from attnviz.engine.models import load

    return load("minilm", device="cpu")


@pytest.fixture(scope="session")
def cat_capture(minilm):
    from attnviz.engine.forward import capture_text

    return capture_text(SENTENCE, minilm)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(scope="module")
def shard(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("shard")
    (folder / "t.txt").write_text("\n".join(TEXTS) + "\n")
    assert run("corpus", folder / "t.txt", "-m", tiny_model_dir("bert"), "-o", folder / "a").exit_code == 0
    return folder / "a"
