"""ablate on the long path (engine.ablation.removing.ablate_lean): where the two runs' α would not fit the memory
budget, the heads are removed on the model's own SDPA attention and the next-token distributions made a block
of positions at a time from the final states — equal to the full path at about 1,030 tokens; no T × T tensor;
no Δα, said; the refusal names the long path's parts."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
from attnviz.errors import InputError
from helpers import build_tiny_model, largest, one_line_error, run, story

@pytest.mark.parametrize("kind, mode", [("gpt2", "zero"), ("llama", "zero"), ("llama", "mean"), ("qwen3", "zero")])
def test_the_long_path_equals_the_full_path_at_1000_tokens(kind, mode, tiny, monkeypatch):
    """About 1,030 tokens, heads of both layers removed: every position's KL within 1e-4 of max(1, KL) and every
    probability within 1e-4 of the full path's, the losses within 1e-4 — float32 logits, eager and SDPA summing
    1,000 keys in different orders through weights drawn at 0.5 (peaked α): relative differences of about 1e-5
    on the logits; the same top tokens where the full path's top is clear of its second by 1e-3; the check of
    the second mechanism as small as the full path's; no tensor the ops make holds H·T²/2 numbers; no Δα,
    said."""
    loaded = tiny(kind)
    text = story(540)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.ablate(text, heads="0.1,1.2", model=loaded, mode=mode)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "40M")
    with largest() as seen:
        long = attnviz.ablate(text, heads="0.1,1.2", model=loaded, mode=mode)
    T, H = len(long.tokens), loaded.shape[1]
    assert T >= 1024 and long.lean and not full.lean and long.tokens == full.tokens
    assert seen.most < H * T * T // 2, seen.shape
    assert (np.abs(full.kl - long.kl) <= 1e-4 * np.maximum(1.0, full.kl)).all()
    assert np.abs(full.p_top - long.p_top).max() <= 1e-4
    assert np.abs(full.probs5 - long.probs5).max() <= 1e-4
    clear = full.probs5[:, 0, 0] - full.probs5[:, 0, 1] > 1e-3
    assert clear.sum() > T // 2 and (full.top_before[clear] == long.top_before[clear]).all()
    assert np.allclose(full.loss, long.loss, rtol=1e-4)
    assert long.relative_check <= max(1e-5, 10 * full.relative_check) and full.later_layers and not long.later_layers
    assert long.to_dict()["without_alpha"] is True and long.page() is None
    said = " ".join(str(getattr(item, "text", "")) for item in long.report())
    assert "Ran without α" in said and "Δα" in said
    assert loaded.model.config._attn_implementation == "eager"


def test_an_encoder_takes_the_long_path_too(tiny, monkeypatch):
    loaded = tiny("bert")
    text = story(100)
    full = attnviz.ablate(text, heads="0.1", model=loaded)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "300K")
    long = attnviz.ablate(text, heads="0.1", model=loaded)
    assert long.lean and not full.lean
    assert abs(full.cosine - long.cosine) <= 1e-6
    assert np.abs(full.token_cosine - long.token_cosine).max() <= 1e-5
    assert np.abs(full.token_change - long.token_change).max() <= 1e-5


def test_the_long_path_refuses_in_one_line(tiny, monkeypatch, tmp_path):
    loaded = tiny("llama")
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "100K")
    with pytest.raises(InputError, match=r"without α .*the three runs' final states .*grows linearly"):
        attnviz.ablate(story(540), heads="0.1", model=loaded)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET")
    folder = build_tiny_model("llama", tmp_path / "llama", positions=1200, lm=True)
    file = tmp_path / "long.txt"
    file.write_text(story(540), encoding="utf-8")
    done = run("ablate", "--text-file", file, "-m", folder, "--heads", "0.1", "--max-memory", "40M", "--json")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["without_alpha"] is True and data["later_layers"] == []
    assert len(data["positions"]) == len(data["tokens"]) > 1000
    line = one_line_error(run("ablate", "--text-file", file, "-m", folder, "--heads", "0.1", "--max-memory", "40M",
                              "-o", tmp_path / "a.png"), 2)
    assert "without α" in line and "Δα" in line
    assert not (tmp_path / "a.png").exists()
