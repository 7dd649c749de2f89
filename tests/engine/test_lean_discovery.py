"""discover on the long path (engine/discovery_lean.py): where the full path's scoring would not fit the memory
budget, every edge scored without α and without a copy of the stream per receiver, and the circuits run one
layer's receivers at a time — equal to the full path at about 1,030 tokens on tiny models of each family it
reads; no T × T tensor made; the budget's refusal names the long path's parts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnviz
from attnviz.errors import InputError
from helpers import build_tiny_model, largest, one_line_error, run, story_pair

def _both(loaded, n: int, method: str, monkeypatch, budget: str = "16M"):
    clean, corrupt = story_pair(n)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.discover(clean, corrupt, answers=(" cat", " dog"), model=loaded, method=method, steps=3)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", budget)
    with largest() as seen:
        long = attnviz.discover(clean, corrupt, answers=(" cat", " dog"), model=loaded, method=method, steps=3)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET")
    return full, long, seen


@pytest.mark.parametrize("kind, method", [("gpt2", "eap"), ("llama", "eap"), ("llama", "eap-ig"),
                                          ("qwen3", "eap"), ("mistral-window", "eap")])
def test_the_long_path_equals_the_full_path_at_1000_tokens(kind, method, tiny, monkeypatch):
    """About 1,030 tokens, the budget under the full path's estimate: every edge's score within 2e-4 of the
    largest, the clean and corrupted logit differences and every circuit's (the curve un-normalised: a random
    model's small gap between the runs would magnify it) within 1e-4 of max(1, |LD|) — float32, eager and SDPA
    summing over 1,000 keys in different orders, through weights drawn at 0.5 (peaked α): relative differences
    of about 2e-5 on the logits, and the scores are their gradients times the changes; no tensor the ops make,
    forward or backward, holds H·T²/2 numbers (the full path's eager attention keeps H·T² per layer)."""
    loaded = tiny(kind)
    full, long, seen = _both(loaded, 540, method, monkeypatch)
    T, H = len(loaded.tokenizer(story_pair(540)[0])["input_ids"]), loaded.shape[1]
    assert T >= 1024 and not full.lean and long.lean
    assert np.abs(full.scores - long.scores).max() <= 2e-4 * np.abs(full.scores).max()
    scale = 1e-4 * max(1.0, abs(full.clean_diff), abs(full.corrupt_diff))
    assert abs(full.clean_diff - long.clean_diff) <= scale and abs(full.corrupt_diff - long.corrupt_diff) <= scale
    assert [n for n, _ in full.curve] == [n for n, _ in long.curve]
    for (_, f), (_, g) in zip(full.curve, long.curve):  # the circuits' logit differences
        assert abs(f * (full.clean_diff - full.corrupt_diff) - g * (long.clean_diff - long.corrupt_diff)) <= scale
    assert long.passed and long.to_dict()["without_alpha"] is True
    assert seen.most < H * T * T // 2, seen.shape
    assert loaded.model.config._attn_implementation == "eager"
    assert not any(p.grad is not None for p in loaded.model.parameters())
    assert all("forward" not in b.__dict__ for b in loaded.model.model.layers) if kind != "gpt2" else \
        all("forward" not in b.__dict__ for b in loaded.model.transformer.h)


def test_the_budget_refuses_the_long_path_in_one_line(tiny, monkeypatch):
    """Below even the long path's parts: one line naming them and what grows linearly."""
    loaded = tiny("llama")
    clean, corrupt = story_pair(515)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "1M")
    with pytest.raises(InputError, match=r"without α .*one run's changes at every node .*"
                                         r"grows linearly"):
        attnviz.discover(clean, corrupt, answers=(" cat", " dog"), model=loaded, method="eap")


def test_the_command_says_it_ran_without_alpha(tmp_path):
    folder = build_tiny_model("llama", tmp_path / "llama", positions=1200, lm=True)
    clean, corrupt = story_pair(300)
    result = run("discover", clean, corrupt, "--answers", "' cat',' dog'", "-m", folder, "--method", "eap",
                 "--max-memory", "16M", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["without_alpha"] is True and data["passed"] is True
    shown = run("discover", clean, corrupt, "--answers", "' cat',' dog'", "-m", folder, "--method", "eap",
                "--max-memory", "16M")
    assert shown.exit_code == 0 and "Ran without α" in shown.stdout
    line = one_line_error(run("discover", clean, corrupt, "--answers", "' cat',' dog'", "-m", folder, "--method", "eap",
                              "--max-memory", "100K"))
    assert "without α" in line and "--max-memory" in line


def test_a_budget_short_of_two_records_runs_the_curve_on_one(tiny, monkeypatch):
    """Where the budget holds the long path's parts but not the corrupted run's record beside a circuit's changes,
    each circuit records the corrupted run again and spends it layer by layer: the curve equal to the one that
    keeps the record whole (the same arithmetic: within 1e-6 of max(1, |LD|)), one forward pass more per circuit
    (counted), each spent record emptied; the scores unchanged."""
    from attnviz.engine import discovery_lean
    from attnviz.engine.discovery import graph
    from attnviz.engine.discovery_lean import lean_parts, record_bytes

    loaded = tiny("llama")
    clean, corrupt = story_pair(540)
    T = len(loaded.tokenizer(clean)["input_ids"])
    g = graph(loaded.model)
    parts, _ = lean_parts(g, T)
    results, records, spent = {}, {}, {}
    real_record, real_circuit = discovery_lean.record, discovery_lean.circuit_logits

    def counted(*args, **kwargs):
        records[hold] += 1
        return real_record(*args, **kwargs)

    def circuit(g, inputs, corrupt, keep, cached=0, consume=False):
        logits = real_circuit(g, inputs, corrupt, keep, cached, consume)
        spent[hold].append(all(z is None for z in corrupt.z) and all(m is None for m in corrupt.mlp))
        return logits

    monkeypatch.setattr(discovery_lean, "record", counted)
    monkeypatch.setattr(discovery_lean, "circuit_logits", circuit)
    for hold, spare in ((True, record_bytes(g, T) + 1), (False, 0)):
        records[hold], spent[hold] = 0, []
        monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", str(sum(parts.values()) + spare))
        results[hold] = attnviz.discover(clean, corrupt, answers=(" cat", " dog"), model=loaded, method="eap")
    kept_whole, once_each = results[True], results[False]
    assert kept_whole.lean and once_each.lean
    circuits = len(kept_whole.curve)
    assert records[True] == 2 and records[False] == 1 + circuits  # scoring's one, then the curve's
    assert spent[True] == [False] * circuits and spent[False] == [True] * circuits
    np.testing.assert_array_equal(kept_whole.scores, once_each.scores)
    gap = kept_whole.clean_diff - kept_whole.corrupt_diff
    for (n, a), (m, b) in zip(kept_whole.curve, once_each.curve):
        assert n == m and abs(a - b) * abs(gap) <= 1e-6 * max(1.0, abs(kept_whole.clean_diff))


def test_the_plan_stays_within_the_budget_at_every_step(tiny, monkeypatch):
    """lean_path's plan for budgets from the long path's parts upwards: the scoring's peak (the parts, the stream the
    backward pass keeps among them, its group of receivers' gradients, the blocks kept whole) and the curve's (the
    parts but the stream, the corrupted run's record if held, the writes) are each within the budget, the
    recomputed blocks' kept attention outputs counted; more budget never recomputes more blocks, keeps fewer
    attention outputs or holds fewer layers' gradients; the attention outputs are kept before a second layer's
    gradients are held."""
    from attnviz.api.patching.discovery import lean_path
    from attnviz.engine.discovery import graph
    from attnviz.engine.discovery_lean import group_bytes, lean_parts, receiver_bytes, record_bytes, write_bytes
    from attnviz.engine.lean import attention_kept_bytes, block_activation_bytes

    loaded = tiny("llama")
    g = graph(loaded.model)
    T = 1030
    parts, stream = lean_parts(g, T)
    fixed, record, writes = sum(parts.values()), record_bytes(g, T), write_bytes(g, T)
    block = block_activation_bytes(loaded.model.config, T)
    kept = attention_kept_bytes(loaded.model.config, T)
    L = len(g.layers)
    before, keeping_before, group_before = L, 0, 1
    plans = set()
    for budget in range(fixed, fixed + 2 * record + L * (writes + block), max(1, record // 7)):
        monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", str(budget))
        plan = lean_path(loaded, g, T, 1)
        if plan is None:  # the full path fits
            break
        plans.add((plan.recomputed, plan.keeping, plan.cached, plan.hold, plan.group))
        assert plan.keeping <= plan.recomputed and 1 <= plan.group <= L
        assert plan.group == 1 or plan.keeping == plan.recomputed  # every recomputed block keeps its attention
        scoring = fixed - receiver_bytes(g, T) + group_bytes(g, T, plan.group)
        assert scoring + (L - plan.recomputed) * block + plan.keeping * kept <= budget
        assert fixed - stream + plan.hold * record + plan.cached * writes <= budget
        assert plan.recomputed <= before and (plan.keeping >= keeping_before or plan.recomputed < before)
        assert plan.group >= group_before
        before, keeping_before, group_before = plan.recomputed, plan.keeping, plan.group
    assert len(plans) >= 3 and any(p[3] for p in plans) and not all(p[3] for p in plans), plans
    assert any(0 < p[1] < L for p in plans), plans  # some plans keep only some attention outputs
    assert any(p[4] == L for p in plans) and any(p[4] == 1 for p in plans), plans


@pytest.mark.parametrize("kind", ["gpt2", "qwen3"])
def test_the_receivers_scored_in_groups_give_the_same_scores(kind, tiny):
    """The scoring holds `group` layers' receivers' gradients and scores them together, a block of positions at a
    time (a group the layers never fill: scored after the backward pass): any group size and any block width give
    the same table (float64 sums of float32 products in other
    orders: within 1e-5 of the largest score), every receiver scored once (each row's nodes beyond its reach
    zero), and each layer's heads' writes made once per group per block of positions (counted)."""
    from attnviz.engine import discovery_lean
    from attnviz.engine.discovery import _logit_difference, graph
    from attnviz.engine.discovery_lean import Plan, record, scores
    from attnviz.engine.forward import encode

    loaded = tiny(kind)
    g = graph(loaded.model)
    L = len(g.layers)
    clean, corrupt = (encode(loaded, text).inputs for text in story_pair(60))
    T = clean["input_ids"].shape[1]

    def metric(logits):
        return _logit_difference(logits, 5, 7)

    made: list = []
    real = discovery_lean._writes
    tables = {}
    for group, rows in ((1, 10**6), (2, 3 * g.per_layer), (L, 10**6), (L, 2 * g.per_layer), (2, 200), (L + 1, 500)):
        made.clear()
        discovery_lean.ROWS, saved = rows, discovery_lean.ROWS
        discovery_lean._writes = lambda g, n, z, out=None: made.append(n) or real(g, n, z, out)
        try:
            tables[group, rows], _ = scores(g, clean, metric, plan=Plan(recomputed=L, keeping=1, group=group),
                                            corrupt=record(g, corrupt))
        finally:
            discovery_lean.ROWS, discovery_lean._writes = saved, real
        expected, layers = 0, list(range(L - 1, -1, -1))  # the backward pass's order
        for k in range(0, L, group):  # a flush: these layers' receivers (and the logits' first), nodes to the top's
            held = layers[k:k + group]
            top = len(g.nodes) if k == 0 else g.mlp_node(held[0])  # the nodes the flush's first row reads
            width = max(1, rows // (len(held) * (g.per_layer + 1) + (k == 0)))  # positions of gradients at once
            step = max(1, rows // top)  # positions of writes at once
            blocks = sum(-(-min(width, T - first) // step) for first in range(0, T, width))
            expected += (held[0] + 1) * blocks
        assert len(made) == expected, (group, rows)
    reference = tables[1, 10**6]
    scale = np.abs(reference.numpy()).max()
    allowed = torch.arange(len(g.nodes))[None, :] < torch.tensor(g.reach)[:, None]
    assert not reference[~allowed].any() and reference[allowed].abs().sum() > 0
    for key, table in tables.items():
        assert np.abs((table - reference).numpy()).max() <= 1e-5 * scale, key


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_the_scoring_holds_each_layers_attention_input_as_the_blocks_own_input_not_a_copy(kind, tiny):
    """layer_bytes counts a held layer's gradients but not its attention's input: that input is the block's own
    input (the stream the backward pass keeps, counted in lean_parts), held in its place. Every input the scoring
    pulls gradients back at is a slice of the storage some block was called with, and every layer's is used."""
    from attnviz.engine import discovery_lean
    from attnviz.engine.discovery import _logit_difference, graph
    from attnviz.engine.discovery_lean import Plan, record, scores
    from attnviz.engine.forward import encode

    loaded = tiny(kind)
    g = graph(loaded.model)
    clean, corrupt = (encode(loaded, text).inputs for text in story_pair(40))
    inputs: set = set()

    def called(module, args, kwargs):
        inputs.add((args[0] if args else kwargs["hidden_states"]).untyped_storage().data_ptr())

    handles = [layer.block.register_forward_pre_hook(called, with_kwargs=True) for layer in g.layers]
    pulled: list = []
    real = discovery_lean.Pullback

    class Seen(real):
        def __call__(self, x, cotangents, **kw):
            pulled.append((self.norm, x.untyped_storage().data_ptr()))
            return super().__call__(x, cotangents, **kw)

    discovery_lean.Pullback = Seen
    try:
        scores(g, clean, lambda logits: _logit_difference(logits, 5, 7),
               plan=Plan(recomputed=len(g.layers), keeping=1, group=2), corrupt=record(g, corrupt))
    finally:
        discovery_lean.Pullback = real
        for handle in handles:
            handle.remove()
    assert {id(norm) for norm, _ in pulled} == {id(layer.attention_norm) for layer in g.layers}
    assert all(pointer in inputs for _, pointer in pulled), (len(inputs), len(pulled))
