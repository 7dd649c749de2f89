"""importance on the long path (engine/ablation/ranking_lean.py): where α would not fit the memory budget, every
head is removed alone on the model's own SDPA attention, each removal starting from the clean run's kept state
below its layer, the next-token distributions made a block of positions at a time, and the gradient estimate
from one forward + backward pass with blocks recomputed — equal to the full path at about 1,030 tokens; no
T × T tensor; the refusal names the long path's parts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnviz
from attnviz.errors import InputError
from helpers import build_tiny_model, largest, one_line_error, run, story


def _given_back(loaded) -> None:
    model = loaded.model
    assert model.config._attn_implementation == "eager"
    assert all(p.grad is None for p in model.parameters())
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("kind, mode", [("gpt2", "zero"), ("llama", "zero"), ("llama", "mean"), ("qwen3", "zero")])
def test_the_long_path_equals_the_full_path_at_1000_tokens(kind, mode, tiny, monkeypatch):
    """About 1,030 tokens, every head of both layers removed alone: each head's mean KL and Δloss within 1e-5 of
    max(1, the value) of the full path's (float64 sums of float32 logits; eager and SDPA sum 1,000 keys in
    different orders: relative differences of about 1e-6 on the logits, measured ≤ 4e-7 here), the gradient
    estimate within 1e-4 of the largest (float32 gradients, as AtP), the clean loss within 1e-6 relative; no
    tensor the ops make holds H·T²/2 numbers; said in the report and the JSON; the model given back as it was."""
    loaded = tiny(kind)
    text = story(540)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.importance(text, model=loaded, mode=mode)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "40M")
    with largest() as seen:
        long = attnviz.importance(text, model=loaded, mode=mode)
    L, H = loaded.shape
    T = long.tokens
    assert T >= 1024 and long.lean and not full.lean and full.tokens == T
    assert seen.most < H * T * T // 2, seen.shape
    assert full.loss is not None and long.loss is not None
    assert (np.abs(full.effect - long.effect) <= 1e-5 * np.maximum(1.0, np.abs(full.effect))).all()
    assert (np.abs(full.loss - long.loss) <= 1e-5 * np.maximum(1.0, np.abs(full.loss))).all()
    assert np.abs(full.gradient - long.gradient).max() <= 1e-4 * np.abs(full.gradient).max()
    assert full.clean_loss is not None and long.clean_loss is not None
    assert abs(full.clean_loss - long.clean_loss) <= 1e-6 * full.clean_loss
    assert full.effect.max() > 1e-3 and np.abs(full.gradient).max() > 1e-3  # nothing compared at zero
    assert long.to_dict()["without_alpha"] is True and full.to_dict()["without_alpha"] is False
    said = " ".join(str(getattr(item, "text", "")) for item in long.report())
    assert "Ran without α" in said and "Ran without α" not in " ".join(str(getattr(i, "text", ""))
                                                                      for i in full.report())
    _given_back(loaded)


@pytest.mark.parametrize("every, copies, recomputed, keeping", [(1, 4, 0, 0), (1, 1, 2, 1), (2, 3, 1, 1)])
def test_every_plan_gives_the_same_numbers_and_skips_the_layers_below(every, copies, recomputed, keeping, tiny):
    """Keeping every block's output or none, one head at a time or several, recomputing no block, one or both
    (one keeping its attention's output):
    the same effects and gradients (≤ 1e-6 of the largest); the attention modules run L times for the clean
    run and, per batch of heads of layer l, once per layer from the kept output below l — the layers below it
    are not run again (seen failing with the skipped blocks running)."""
    from attnviz.engine.ablation import importance, site
    from attnviz.engine.ablation.ranking_lean import LeanPlan
    from attnviz.engine.forward import encode
    from attnviz.engine.hooks import counting_calls, hooked
    from attnviz.engine.scratch.adapters import adapter_for

    loaded = tiny("llama")
    where = site(loaded.model)
    where.lean = True
    inputs = encode(loaded, story(200)).inputs
    L, H = loaded.shape
    base = loaded.model.base_model
    hooks = [counting_calls(m) for m in adapter_for(base).modules(base)]
    reference = importance(where, [inputs], plan=LeanPlan(1, H, 0))
    with hooked([h for h, _ in hooks]):
        got = importance(where, [inputs], gradient=False, plan=LeanPlan(every, copies, recomputed, keeping))
    scores = importance(where, [inputs], plan=LeanPlan(every, copies, recomputed, keeping)).gradient
    assert np.abs(got.effect - reference.effect).max() <= 1e-6 * reference.effect.max()
    assert np.abs(scores - reference.gradient).max() <= 1e-6 * np.abs(reference.gradient).max()
    batches = -(-H // copies)
    expected = [1 + sum(batches for layer in range(L) if every * (layer // every) <= n) for n in range(L)]
    assert [c[0] for _, c in hooks] == expected
    _given_back(loaded)


def test_an_encoder_takes_the_long_path_too(tiny, monkeypatch):
    """BERT: each head's ‖Δê‖ and the gradient estimate's exact Jacobian within 1e-5 of the full path's."""
    loaded = tiny("bert")
    text = story(100)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.importance(text, model=loaded)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "300K")
    long = attnviz.importance(text, model=loaded)
    assert long.lean and not full.lean and long.loss is None
    assert np.abs(full.effect - long.effect).max() <= 1e-5 * max(1.0, full.effect.max())
    assert np.abs(full.gradient - long.gradient).max() <= 1e-5 * max(1.0, full.gradient.max())
    _given_back(loaded)


def test_the_long_path_refuses_in_one_line_and_runs_from_every_input(tiny, monkeypatch, tmp_path):
    loaded = tiny("llama")
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "100K")
    with pytest.raises(InputError, match=r"every head removed alone on .* without α .*final states .*grows linearly"):
        attnviz.importance(story(540), model=loaded)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET")
    folder = build_tiny_model("llama", tmp_path / "llama", positions=1200, lm=True)
    text = story(540)
    file = tmp_path / "long.txt"
    file.write_text(text, encoding="utf-8")
    common = ["-m", folder, "--max-memory", "40M", "--json"]
    outputs = [run("importance", "--text-file", file, *common), run("importance", text, *common),
               run("importance", "-", *common, input=text)]
    for done in outputs:
        assert done.exit_code == 0, done.output
    data = [json.loads(done.stdout) for done in outputs]
    assert data[0]["without_alpha"] is True and data[0]["tokens"] > 1000
    assert data[0] == data[1] == data[2]
    looped = run("importance", "--text-file", file, *common, "--loop")  # each head a whole run of its own
    assert looped.exit_code == 0, looped.output
    by_head = {(h["layer"], h["head"]): h for h in json.loads(looped.stdout)["heads"]}
    for head in data[0]["heads"]:
        other = by_head[head["layer"], head["head"]]
        for key in ("effect", "delta_loss", "gradient"):
            assert abs(head[key] - other[key]) <= 1e-6 * max(1.0, abs(head[key])), (key, head, other)
    line = one_line_error(run("importance", "--text-file", file, "-m", folder, "--max-memory", "100K"))
    assert "without α" in line and "--max-memory" in line


def test_no_logits_of_every_position_are_made(tiny, monkeypatch):
    """The removals' distributions and the gradient's loss are made a block of positions at a time (the loss's
    blocks made again in the backward pass): no tensor with the vocabulary as its last axis holds more than a
    block's rows, forward or backward (seen failing with the loss over the whole (T, V) logits)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from attnviz.engine.ablation import removing

    loaded = tiny("gpt2")
    V = int(loaded.model.get_output_embeddings().weight.shape[0])
    monkeypatch.setattr(removing, "DISTRIBUTION_BYTES", 64 * 8 * V)  # 64 positions a block
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "40M")

    class Rows(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.ndim and t.shape[-1] == V:
                    Rows.most = max(Rows.most, t.numel() // V)
            return out

    with Rows():
        long = attnviz.importance(story(540), model=loaded)
    assert long.lean and long.tokens > 1000
    assert 0 < Rows.most <= 64, Rows.most


def test_the_gradient_step_gives_freed_memory_back_at_every_block_of_positions(tiny, monkeypatch):
    """The gradient step's next-token loss is made a block of positions at a time, each block's float64 logits
    freed before the next: the heap is given back before each block is made, in the forward pass and again where
    the backward pass makes it anew (a block's logits are tens of MB at long inputs; kept on the heap, they held
    about 1.3 GiB more at 3,944 tokens on SmolLM2). Counted: at least twice per block of positions; the gradient
    unchanged."""
    from attnviz.engine import lean as lean_module
    from attnviz.engine.ablation import removing, site
    from attnviz.engine.ablation.removing import distribution_positions
    from attnviz.engine.ablation.ranking_lean import gradient_lean
    from attnviz.engine.forward import encode

    loaded = tiny("llama")
    where = site(loaded.model)
    where.lean = True
    inputs = encode(loaded, story(200)).inputs
    T = int(inputs["input_ids"].shape[1])
    V = int(loaded.model.get_output_embeddings().weight.shape[0])
    monkeypatch.setattr(removing, "DISTRIBUTION_BYTES", 8 * V * 16)  # 16 positions a block, as a long text's
    blocks = -(-(T - 1) // distribution_positions(V))
    assert blocks >= 2
    reference = gradient_lean(where, inputs, None, 0)
    trims: list = []
    real = lean_module.give_back_memory
    monkeypatch.setattr(lean_module, "give_back_memory", lambda: trims.append(1) or real())
    found = gradient_lean(where, inputs, None, 0)
    assert len(trims) >= 2 * blocks, (len(trims), blocks)
    np.testing.assert_array_equal(found, reference)
    _given_back(loaded)
