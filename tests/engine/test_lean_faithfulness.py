"""faithfulness on the long path (a text of more than MAX_FAITHFULNESS_TOKENS tokens): the gradient methods, the
erasure bins, the random orders and the sanity check without α, on the model's own SDPA attention, and attention
from the explained rows alone — equal to the full path on the same text; no T × T tensor made at about 1,000
tokens; the methods that read every layer's α and leave-one-out refused by name, or left out and said."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
import attnviz.api.attribution.faithfulness as faith
from attnviz.errors import InputError
from helpers import build_tiny_model, largest, one_line_error, run, story

@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "bert"])
def test_the_long_path_equals_the_full_path(kind, tiny, monkeypatch):
    """The same text (under 256 tokens) on the full path and, with the long path's threshold lowered, without α:
    every method's scores within 1e-4 of the largest (gradients in float32 through eager and SDPA attention,
    which sum the keys in different orders: as AtP's), every AOPC and the random orders' within 1e-5 (f is a
    probability or a cosine), integrated gradients' completeness too; the sanity check's ρ within 0.05 (a rank
    correlation: near-equal scores of the randomised model may swap). τ with leave-one-out is the full path's
    alone, said. (Qwen2's tiny tokenizer knows more tokens than its embedding has rows: integrated gradients'
    baseline is one it has.) An encoder's gradient × input is left out here: its f (the cosine with the full text's
    embedding) is at its maximum, so that gradient is rounding noise on both paths. On the long path every block
    is recomputed in the backward pass, the first keeping its attention's output, as a tight budget says."""
    loaded = tiny(kind)
    causal = kind != "bert"
    methods = (["grad-x-input"] if causal else []) + ["attention", "integrated-gradients", "random"]
    text = story(80 if causal else 60)
    full = attnviz.faithfulness(text, model=loaded, methods=methods, orders=20, steps=8)
    monkeypatch.setattr(faith, "MAX_FAITHFULNESS_TOKENS", 8)
    checked, plans = faith.check_lean_faithfulness, []

    def tight(loaded, *args, **kwargs):
        checked(loaded, *args, **kwargs)
        plans.append((loaded.shape[0], 1))
        return plans[-1]

    monkeypatch.setattr(faith, "check_lean_faithfulness", tight)
    long = attnviz.faithfulness(text, model=loaded, methods=methods, orders=20, steps=8)
    assert plans == [(loaded.shape[0], 1)] and loaded.shape[0] >= 2
    assert not full.lean and long.lean and len(full.tokens) > 60
    assert [m.name for m in long.methods] == [m.name for m in full.methods] == methods[:-1]
    for a, b in zip(full.methods, long.methods):
        assert np.abs(a.scores - b.scores).max() <= 1e-4 * np.abs(a.scores).max(), a.name
        if a.name == "attention":  # the explained rows of the last layer's α, recomputed in float64 from the
            # layer's Q and K: the model's float32 α within 1e-6 (each weight ≤ 1, float32 rounding ~1e-7)
            assert np.abs(a.scores - b.scores).max() <= 1e-6 and a.scores.max() > 0
        assert abs(a.comprehensiveness_aopc - b.comprehensiveness_aopc) <= 1e-5, a.name
        assert abs(a.sufficiency_aopc - b.sufficiency_aopc) <= 1e-5, a.name
        assert [layer for layer, _ in a.sanity] == [layer for layer, _ in b.sanity]
        assert abs(a.sanity[-1][1] - b.sanity[-1][1]) <= 0.05, a.name
        assert a.kendall_tau_loo is not None and b.kendall_tau_loo is None
    assert full.random is not None and long.random is not None
    assert np.allclose(full.random.comprehensiveness_aopc, long.random.comprehensiveness_aopc, atol=1e-5)
    assert np.allclose(full.random.sufficiency_aopc, long.random.sufficiency_aopc, atol=1e-5)
    assert full.completeness is not None and long.completeness is not None
    assert np.allclose(full.completeness, long.completeness, atol=1e-5 * max(1.0, abs(full.completeness[1])))
    assert any("leave-one-out" in s for s in long.skipped) and not full.skipped
    assert long.to_dict()["without_alpha"] is True and full.to_dict()["without_alpha"] is False


def test_a_text_of_1000_tokens_runs_without_alpha(tiny):
    """About 1,030 tokens (the full path refuses beyond 256): unnamed, the methods that need no α in a few passes
    run (gradient × input, LONG_ORDERS random orders, the sanity check), and attention from the explained row of
    the last layer's α alone; no tensor the ops make, forward or
    backward, holds H·T²/2 numbers (eager attention's α is H·T² per layer); the rest said; the borrowed model
    given back on its own attention, with its own forward methods."""
    loaded = tiny("llama")
    text = story(520)
    with largest() as seen:
        found = attnviz.faithfulness(text, model=loaded)
    T, H = len(found.tokens), loaded.shape[1]
    assert T >= 1000 and found.lean
    assert seen.most < H * T * T // 2, seen.shape
    assert [m.name for m in found.methods] == ["attention", "grad-x-input"]
    row = found.methods[0].scores
    assert abs(row.sum() - 1) <= 1e-9 and (row >= 0).all()  # the explained row of α: a distribution over keys
    assert found.random is not None and found.random.orders == faith.LONG_ORDERS
    assert found.methods[0].sanity and found.methods[0].kendall_tau_loo is None
    said = " ".join(found.skipped)
    for name in ("rollout", "flow", "alti", "value-zeroing", "integrated-gradients", "leave-one-out"):
        assert name in said, name
    assert "attention" not in said.replace("attention's", "")
    assert found.erasable and len(found.methods[0].scores) == T
    assert loaded.model.config._attn_implementation == "eager"
    from attnviz.engine.lean import model_blocks

    assert all("forward" not in block.__dict__ for block in model_blocks(loaded.model))
    assert not any(p.grad is not None for p in loaded.model.parameters())


def test_what_a_long_text_cannot_run_is_refused_by_name(tiny, monkeypatch):
    loaded = tiny("gpt2")
    text = story(300)
    for method, said in (("rollout", "every layer's α"), ("loo", "once per token"), ("alti-logit", "α")):
        with pytest.raises(InputError, match=said) as caught:
            attnviz.faithfulness(text, model=loaded, methods=["grad-x-input", method])
        assert method in str(caught.value) and "attention, grad-x-input, integrated-gradients, random" in \
            str(caught.value)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "1M")
    with pytest.raises(InputError, match="without α.*the stream entering every block"):
        attnviz.faithfulness(text, model=loaded, methods=["grad-x-input"])


@pytest.mark.slow
def test_every_input_path_gives_the_same_long_result(tiny_lm_dir, tmp_path):
    """TEXT, - and --text-file: the same tokens, the same scores, each said to have run without α; a method
    that reads α refused in one line (exit 1)."""
    folder = build_tiny_model("llama", tmp_path / "llama", positions=1200, lm=True)
    text = story(200)
    file = tmp_path / "long.txt"
    file.write_text(text, encoding="utf-8")
    base = ["-m", str(folder), "--methods", "grad-x-input", "--sanity", "0", "--json"]
    outputs = [run("faithfulness", text, *base), run("faithfulness", "-", *base, input=text),
               run("faithfulness", "--text-file", file, *base)]
    found = []
    for result in outputs:
        assert result.exit_code == 0, result.output
        found.append(json.loads(result.stdout))
    assert len(found[0]["tokens"]) > faith.MAX_FAITHFULNESS_TOKENS
    for data in found:
        assert data["without_alpha"] is True and data["tokens"] == found[0]["tokens"]
        assert data["methods"]["grad-x-input"]["scores"] == found[0]["methods"]["grad-x-input"]["scores"]
    line = one_line_error(run("faithfulness", "--text-file", file, "-m", str(folder), "--methods", "flow"))
    assert "flow" in line and "without α" in line
    shown = run("faithfulness", "--text-file", file, "-m", str(folder), "--methods", "grad-x-input", "--sanity", "0")
    assert shown.exit_code == 0 and "Ran without α" in shown.stdout and f"{len(found[0]['tokens']):,} tokens" in \
        shown.stdout
