"""sinks of a long input, streamed (engine/stream.stream_sinks): where α and the value-weighted norms would not
fit the memory budget, each key's mean α and mean share of ‖α_ij f_h(x_j)‖ are folded a block of query rows at a
time — equal to the full path at about 1,030 tokens on every family the streamed path covers; no T × T tensor
per head; said; the same from TEXT, `-` and --text-file."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
from helpers import build_tiny_model, largest, run, story


def _same(full, long) -> None:
    """Every head's largest sink score within 1e-5 (see below), the same sink heads, each sink's score and norm
    score within 1e-5 (the key may differ where two keys' scores tie within rounding: the story repeats)."""
    assert np.abs(full.best - long.best).max() <= 1e-5
    assert [(r["layer"], r["head"]) for r in full.sinks] == [(r["layer"], r["head"]) for r in long.sinks]
    for a, b in zip(full.sinks, long.sinks):
        assert abs(a["sink_score"] - b["sink_score"]) <= 1e-5
        if a["key"] == b["key"]:
            assert abs(a["norm_score"] - b["norm_score"]) <= 1e-5


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen3", "mistral-window", "gemma2", "gpt_oss"])
def test_streamed_sinks_equal_the_full_path_at_1000_tokens(kind, tiny, monkeypatch):
    """Each key's sink score by α and by norm share (its mean over the queries that can see it), every layer and
    head, within 1e-4 relative (+1e-7) of the full path's: the full path recomputes α in float64 from the
    model's float32 Q and K, the streamed path folds float32 rows, each entry relatively off by about
    eps32 · |score| (1.2e-7 × scores of up to ~100 in these tiny models' peaked attention: ~1e-5), which the
    mean over a sliding window's few queries does not average away (measured: 3.1e-5 with Mistral's window of 4,
    ≤ 7e-6 elsewhere); the sinks the same; no tensor larger than a block of α rows (BLOCK_BYTES in float64, or
    MIN_ROWS rows); said in the report and the JSON."""
    from attnviz.base.blocks import row_shares
    from attnviz.engine.families import layer_windows
    from attnviz.metrics import sink_scores, Tokens
    from attnviz.engine.forward import encode
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.scratch.norms import value_norms
    from attnviz.engine.interface import BLOCK_BYTES, MIN_ROWS
    from attnviz.engine.stream import stream_sinks

    loaded = tiny(kind)
    text = story(540)
    encoded = encode(loaded, text)
    base = loaded.model.base_model
    with largest() as seen:
        by_alpha, by_norm = stream_sinks(loaded.model, encoded.inputs, adapter_for(base).out_projections(base))
    T, H = len(encoded.tokens), loaded.shape[1]
    block = max(BLOCK_BYTES // 8, H * MIN_ROWS * T)
    assert T >= 1024 and seen.most <= block + H * T < H * T * T // 2, seen.shape
    reference = value_norms(loaded.model, encoded.inputs)
    tokens = Tokens(tuple(encoded.tokens), np.asarray(encoded.special, bool), np.array(encoded.special_kind), True)
    windows = layer_windows(loaded.model.config, len(by_alpha))
    top = 0.0
    for n in range(len(by_alpha)):  # the sink scores: each key's mean over the queries that can see it
        seen = tokens.at_layer(windows, n)
        for got, want in ((by_alpha[n] / T, reference.alpha[n, 0].mean(axis=-2)),
                          (by_norm[n] / T, row_shares(reference.norms[n, 0]).mean(axis=-2))):
            got, want = sink_scores(got, seen), sink_scores(want, seen)
            assert (np.abs(got - want) <= 1e-7 + 1e-4 * want).all()
            top = max(top, float(want.max()))
    assert top > 0.005  # not compared at zero (a uniform key gets about 1/T = 0.001)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.sinks(text, model=loaded, threshold=0.03)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "40M")
    long = attnviz.sinks(text, model=loaded, threshold=0.03)
    assert long.streamed and not full.streamed and long.tokens == full.tokens
    _same(full, long)
    assert long.to_dict()["streamed"] is True and full.to_dict()["streamed"] is False
    said = " ".join(str(getattr(item, "text", "")) for item in long.report())
    assert f"Streamed: {T:,} tokens" in said and "L·H·T²" in said


def test_an_encoder_streams_its_sinks_too(tiny, monkeypatch):
    loaded = tiny("bert")
    text = story(150)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.sinks(text, model=loaded, threshold=0.03)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "1M")
    long = attnviz.sinks(text, model=loaded, threshold=0.03)
    assert long.streamed and not full.streamed and full.sinks
    _same(full, long)


def test_the_command_streams_from_every_input(tmp_path):
    folder = build_tiny_model("llama", tmp_path / "llama", positions=1200)
    text = story(540)
    file = tmp_path / "long.txt"
    file.write_text(text, encoding="utf-8")
    common = ["-m", folder, "--max-memory", "40M", "--threshold", "0.03", "--json"]
    outputs = [run("sinks", "--text-file", file, *common), run("sinks", text, *common),
               run("sinks", "-", *common, input=text)]
    for done in outputs:
        assert done.exit_code == 0, done.output
    data = [json.loads(done.stdout) for done in outputs]
    assert data[0] == data[1] == data[2]
    assert data[0]["streamed"] is True and len(data[0]["tokens"]) > 1000
    full = json.loads(run("sinks", "--text-file", file, "-m", folder, "--threshold", "0.03", "--json").stdout)
    assert full["streamed"] is False and full["tokens"] == data[0]["tokens"]
    assert [(s["layer"], s["head"], s["key"]) for s in full["sinks"]] == \
        [(s["layer"], s["head"], s["key"]) for s in data[0]["sinks"]]
