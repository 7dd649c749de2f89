"""Fixtures: tiny random models of each family (built by tests/helpers.py into temp folders, once per
session), the real bundled MiniLM, and matplotlib figures closed after each test."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist: the cores shared out, each worker's torch (and every
    # process it starts) takes its share, so that two workers on two cores do not fight over four threads
    _share = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, str(_share))
    for _name in ("COLUMNS", "LINES"):  # xdist sets them for its workers: a Console made then would keep that size,
        os.environ.pop(_name, None)  # where a test's own COLUMNS must reach the command it runs

from helpers import (SENTENCE, TEXTS, browser_missing, build_tiny_model, build_tiny_seq2seq, chromium_path, once,
                     run)  # after the environment is set


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (--dist loadgroup), the tests that start a local Ray cluster run on one worker, one
    after another, as they do without it."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


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


# --- tiny vision models of every family, and the browser (shared by several layers' tests) ---------------------


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory):
    made: dict = {}

    def folder(kind: str):
        if kind not in made:
            import torch
            import transformers as tf

            torch.manual_seed(0)
            shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         image_size=56, patch_size=14)
            config, model = {
                "dinov2": (tf.Dinov2Config, tf.Dinov2Model),
                "dinov2_with_registers": (tf.Dinov2WithRegistersConfig, tf.Dinov2WithRegistersModel),
                "vit": (tf.ViTConfig, tf.ViTModel), "deit": (tf.DeiTConfig, tf.DeiTModel),
                "clip_vision_model": (tf.CLIPVisionConfig, tf.CLIPVisionModel),
                "siglip_vision_model": (tf.SiglipVisionConfig, tf.SiglipVisionModel)}[kind]
            extra = {"num_register_tokens": 3} if kind == "dinov2_with_registers" else {}
            built = model(config(**shape, **extra))
            if kind == "dinov2":  # DINOv2's layer scale, made to matter
                for layer in built.encoder.layer:
                    layer.layer_scale1.lambda1.data.uniform_(0.2, 2.0)
            path = tmp_path_factory.mktemp(kind) / kind
            built.save_pretrained(path)
            made[kind] = str(path)
        return made[kind]

    return folder


@pytest.fixture(scope="module")  # Playwright's sync API holds an event loop while it runs: one module at a time
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        browser_missing("browser tests need Playwright for Python: pip install playwright (in the test extra)")
    path = chromium_path()
    if path is None:
        browser_missing("browser tests need Chromium: apt-get install chromium (or set ATTNVIZ_CHROMIUM to its path); "
                 ".ci/run installs it")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()
