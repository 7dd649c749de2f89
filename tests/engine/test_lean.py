"""The long path (attnviz.engine.lean): patching and AtP where α would not fit — the model's own SDPA attention,
each block recomputed in the backward pass — equal to the full path at T = 1,024 on tiny models of each family;
no α asked of the model and no T × T tensor made; the borrowed model given back as it was; the memory it holds
grows linearly in T where the full path's grows with T²."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnviz
from attnviz.errors import InputError
from helpers import build_tiny_model, largest, one_line_error, run, story_pair as prompts

@pytest.fixture(scope="module")
def long_models(tmp_path_factory):
    made: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in made:
            made[kind] = str(build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind, positions=4200,
                                              lm=kind in ("gpt2", "llama")))
        return made[kind]
    return get


def _patch(folder: str, n: int, method: str, budget: str | None, monkeypatch, **options):
    if budget is None:
        monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    else:
        monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", budget)
    clean, corrupt = prompts(n)
    return attnviz.patch(clean, corrupt, model=folder, method=method, align="auto", answers=(5, 6), **options)


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "gemma3", "mistral-window", "qwen3"])
def test_atp_at_1024_tokens_without_alpha_equals_the_full_path(kind, long_models, monkeypatch):
    """AtP at T = 1,024 over every head, every layer's attention and residual stream: the long path (budget too
    small for α; every block recomputed in the backward pass, half of them keeping their attention's output)
    equals the full path within 1e-4 of the largest
    estimate; no head's T × T is made on the long path (the full path's eager attention makes H·T² per layer)."""
    loaded = attnviz.load_model(long_models(kind), lm_head=True)  # once: a decoder saved without its head gets a
    full = _patch(loaded, 560, "atp", None, monkeypatch)          # random one at each load
    T, H = len(full.tokens), loaded.shape[1]
    assert T >= 1024
    import attnviz.engine.patching as patching

    checked = patching.check_lean

    def every_block_recomputed(loaded, where, T):  # as a budget too small to keep any block's activations says;
        checked(loaded, where, T)                  # the lower half keep their attention's output
        where.recomputed, where.keeping = where.layers, where.layers // 2

    monkeypatch.setattr(patching, "check_lean", every_block_recomputed)
    with largest() as seen:
        lean = _patch(loaded, 560, "atp", "24M", monkeypatch)
    # no head's T × T: a sliding window's mask, (1, 1, T, T), shared by the heads, is the largest there is
    assert seen.most < H * T * T // 2, (seen.most, seen.shape)
    assert "_scaled_dot_product_flash_attention_for_cpu" in seen.ops or \
        "_scaled_dot_product_efficient_attention" in seen.ops or "scaled_dot_product_attention" in seen.ops, seen.ops
    for name in ("heads", "attention", "residual"):
        a, b = np.asarray(getattr(full, name)), np.asarray(getattr(lean, name))
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max()), name
    assert full.patterns and not lean.patterns and lean.lean and not full.lean  # the long path draws no α
    said = " ".join(str(line) for line in lean.report())
    assert "Ran without α" in said and lean.to_dict()["without_alpha"] is True


def test_the_full_path_would_make_the_square(long_models, monkeypatch):
    """The same probe on the full path sees eager attention's (1, H, T, T): the check above can fail."""
    with largest() as seen:
        full = _patch(long_models("llama"), 300, "atp", None, monkeypatch)
    T = len(full.tokens)
    assert seen.most >= 4 * T * T  # (1, H, T, T), H = 4


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_exact_patching_without_alpha_equals_the_full_path(kind, long_models, monkeypatch):
    loaded = attnviz.load_model(long_models(kind), lm_head=True)
    full = _patch(loaded, 40, "exact", None, monkeypatch)
    lean = _patch(loaded, 40, "exact", "600K", monkeypatch)
    for name in ("heads", "attention", "residual"):
        a, b = np.asarray(getattr(full, name)), np.asarray(getattr(lean, name))
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max()), name
    assert full.all_patched == pytest.approx(lean.all_patched, abs=1e-5)


def test_the_borrowed_model_is_given_back_as_it_was(long_models, monkeypatch):
    loaded = attnviz.load_model(long_models("llama"), lm_head=True)
    model = loaded.model

    def state():
        return (model.config._attn_implementation, model.training, [b.__dict__.get("forward") for b in
                                                                     model.model.layers],
                [len(b._forward_hooks) + len(b._forward_pre_hooks) for b in model.modules()])

    before = state()
    _patch(loaded, 200, "atp", "3M", monkeypatch)
    after = state()
    assert before == after and before[0] == "eager"
    assert all(p.grad is None for p in model.parameters())


def test_refusals_name_the_linear_estimate_and_what_runs_without_alpha(long_models, monkeypatch):
    folder = long_models("llama")
    clean, corrupt = prompts(400)
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "20K")
    line = one_line_error(run("patch", clean, corrupt, "-m", folder, "--method", "atp"), 1)
    assert "without α" in line and "one block recomputed" in line and "grows linearly" in line
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "1M")
    line = one_line_error(run("patch", clean, corrupt, "-m", folder, "--method", "atp*"), 1)
    assert "--method atp or exact run without α" in line


MEASURE = """
import json, sys
import attnviz
from attnviz.engine.costs import PeakMemory
folder = sys.argv[1]
loaded = attnviz.load_model(folder, lm_head=True)
peaks = []
for n in map(int, sys.argv[2:]):  # each run's peak above what the process held before it (VmHWM reset)
    body = " ".join(["the cat sat on the mat and the dog ran"] * (n // 10))
    with PeakMemory("cpu") as peak:
        done = attnviz.patch(body + " so the cat", body + " so the dog", model=loaded, method="atp", align="auto",
                             answers=(5, 6))
    peaks.append([peak.peak, len(done.tokens), done.lean])
print(json.dumps(peaks))
"""


def _grew(folder: str, budget: str, tmp_path: Path) -> int:
    """How much more AtP's peak memory above the process's rose at about 2,400 tokens than at about 600, in one
    process (the resident set's high-water mark reset before each run)."""
    script = tmp_path / "measure.py"
    script.write_text(MEASURE, encoding="utf-8")
    env = {**os.environ, "ATTNVIZ_MEMORY_BUDGET": budget}
    done = subprocess.run([sys.executable, str(script), folder, "500", "2000"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    short, long = json.loads(done.stdout.strip().splitlines()[-1])
    assert long[1] > 2000 and short[2] == long[2] == (budget != "8G"), (short, long)  # the path asked for
    if short[0] is None:
        pytest.skip("the resident set's high-water mark cannot be reset here (/proc/self/clear_refs)")
    return long[0] - short[0]


def test_peak_memory_grows_linearly_on_the_long_path(long_models, tmp_path):
    """Peak resident memory of AtP above the process's, from about 600 to about 2,400 tokens: on the long path it
    grows by much less than the T² term the full path adds (eager attention's backward keeps L·H·T² float32:
    about 180 MiB at 2,400 tokens for 2 layers × 4 heads), which the same measurement of the full path shows."""
    folder = long_models("llama")
    lean, full = _grew(folder, "64M", tmp_path), _grew(folder, "8G", tmp_path)
    square = 2 * 4 * 2400 ** 2 * 4  # L·H·T² float32
    assert full > square / 2, (full, lean)  # the probe sees a T² term where there is one
    assert lean < square / 4, lean


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2", "mistral-window"])
def test_logit_attribution_at_1024_tokens_without_alpha_equals_the_full_path(kind, long_models, monkeypatch):
    """Direct logit attribution at T ≈ 1,030 at a position inside the text: each head's effect, by source token,
    and the model's own logit on the long path (the row of α at the position recomputed, the model on its SDPA)
    equal the full path's within 1e-5 of their size; no head's T × T made; ALTI-Logit said to be left out."""
    loaded = attnviz.load_model(long_models(kind), lm_head=True)
    text = prompts(560)[0]
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.logit_attr(text, model=loaded, position=-5)
    T, H = len(full.tokens), loaded.shape[1]
    assert T >= 1024 and full.by_input is not None
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "24M")
    with largest() as seen:
        lean = attnviz.logit_attr(text, model=loaded, position=-5)
    assert seen.most < H * T * T // 2, (seen.most, seen.shape)
    for name in ("heads", "by_source", "mlps", "attention_bias"):
        a, b = np.asarray(getattr(full, name)), np.asarray(getattr(lean, name))
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max()), name
    assert lean.logit == pytest.approx(full.logit, abs=1e-5 * max(1.0, abs(full.logit)))
    assert lean.position == full.position == T - 5 and lean.target == full.target
    assert lean.by_input is None and "every layer's α" in lean.alti_note
    assert loaded.model.config._attn_implementation == "eager"


def _long_site(long_models, n: int):
    """(the tiny Llama, its site on the long path, the clean prompt's donor run, the corrupted prompt's inputs,
    their length) for the engine's AtP directly."""
    from attnviz.engine.ablation import site
    from attnviz.engine.patching import donor_run

    loaded = attnviz.load_model(long_models("llama"), lm_head=True)
    ids = [dict(loaded.tokenizer(t, return_tensors="pt")) for t in prompts(n)]
    where = site(loaded.model)
    where.lean = True
    return loaded, where, donor_run(where, ids[0]), ids[1], int(ids[1]["input_ids"].shape[1])


def test_the_long_gradient_pass_reports_each_block_forward_and_backward(long_models):
    """The long path's progress: one step per block in the forward pass and one per block in the backward
    pass (2·L), the estimate the same as without the count."""
    from attnviz.engine.patching import attributed

    loaded, where, donor, receiver, T = _long_site(long_models, 50)
    steps: list[int] = []

    def metric(read):
        return read[5] - read[6]

    quiet = attributed(where, receiver, donor, list(range(T)), metric)
    where.on_block = steps.append
    counted = attributed(where, receiver, donor, list(range(T)), metric)
    assert sum(steps) == 2 * where.layers
    assert torch.equal(quiet[0], counted[0]) and torch.equal(quiet[1], counted[1])


def test_the_long_path_gives_freed_memory_back_at_every_block_forward_and_backward(long_models, monkeypatch):
    """The heap freed so far is given back (malloc_trim) before each block runs and after the backward pass has
    gone through each block: 2·L − 1 times for AtP's own pass with every block recomputed (the first block's
    input is made AtP's leaf after the hook has seen it: the backward pass ends there), L for a forward pass
    alone; the estimate the same as without it."""
    import attnviz.engine.lean as lean_module
    from attnviz.engine.patching import attributed, donor_run

    loaded, where, donor, receiver, T = _long_site(long_models, 50)
    where.recomputed = where.layers

    def metric(read):
        return read[5] - read[6]

    before = attributed(where, receiver, donor, list(range(T)), metric)
    calls = [0]
    monkeypatch.setattr(lean_module, "give_back_memory", lambda: calls.__setitem__(0, calls[0] + 1))
    after = attributed(where, receiver, donor, list(range(T)), metric)
    assert calls[0] == 2 * where.layers - 1
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    calls[0] = 0
    donor_run(where, receiver)
    assert calls[0] == where.layers


def test_the_long_path_leaves_no_hook_behind(long_models):
    """The engine's own context (below the API's guard of a borrowed model, which puts hook tables back too): one
    trimming hook per block inside it, none after it, whether it ends normally or by an error; the forward
    methods and the attention implementation put back."""
    from attnviz.engine.lean import lean

    model = attnviz.load_model(long_models("llama"), lm_head=True).model
    blocks = list(model.model.layers)
    with lean(model, blocks, grad=True, keeping=1):
        assert [len(b._forward_pre_hooks) for b in blocks] == [1] * len(blocks)
    with pytest.raises(RuntimeError):
        with lean(model, blocks, grad=True):
            raise RuntimeError("stopped inside")
    assert all(not b._forward_pre_hooks for b in blocks) and all("forward" not in b.__dict__ for b in blocks)
    assert model.config._attn_implementation == "eager"


FUSED = "_scaled_dot_product_flash_attention_for_cpu"  # PyTorch's fused attention on CPU


def test_blocks_are_recomputed_as_the_budget_says(long_models, monkeypatch):
    """The backward pass recomputes the first `recomputed` blocks (their MLP runs twice) and keeps the others'
    activations (once); of the recomputed, the first `keeping` keep their fused attention's output, so their
    attention runs once (the others' twice); the estimates are the same every way. The budget decides: a tight
    one recomputes every block, keeping no attention output or some, a roomy one recomputes none."""
    from attnviz.engine.hooks import Hook, hooked
    from attnviz.engine.lean import attention_kept_bytes, block_activation_bytes
    from attnviz.engine.patching import attributed, check_lean

    loaded, where, donor, receiver, T = _long_site(long_models, 300)
    L = where.layers
    results, calls, attention, products = {}, {}, {}, {}
    plans = [(0, 0), (1, 0), (L, 0), (L, 1), (L, L)]
    for plan in plans:
        where.recomputed, where.keeping = plan
        count = [0]

        def seen(module, args, count=count):
            count[0] += 1

        with hooked([Hook(b.mlp, "pre", seen) for b in where.blocks]), largest() as probe:
            results[plan] = attributed(where, receiver, donor, list(range(T)), lambda read: read[5] - read[6])
        calls[plan] = count[0]
        attention[plan] = probe.counts.get(FUSED, 0)
        products[plan] = sum(probe.counts.get(name, 0) for name in ("mm", "addmm", "bmm"))
    assert calls == {(0, 0): L, (1, 0): L + 1, (L, 0): 2 * L, (L, 1): 2 * L, (L, L): 2 * L}
    # the receiver's forward pass once per block, and again for each recomputed block not keeping its output
    assert attention == {(r, k): L + r - k for r, k in plans}, attention
    # keeping the attention's output keeps nothing else: the projections and the MLP are made again all the same
    assert products[(L, 0)] == products[(L, 1)] == products[(L, L)] > products[(1, 0)] > products[(0, 0)], products
    for plan in plans[1:]:
        assert torch.allclose(results[(0, 0)][0], results[plan][0], atol=1e-6) and \
            torch.allclose(results[(0, 0)][1], results[plan][1], atol=1e-6), plan
    config = loaded.model.config
    block, kept = block_activation_bytes(config, T), attention_kept_bytes(config, T)
    D = int(config.hidden_size)
    fixed = 2 * 4 * T * sum(where.heads * d + D for d in where.dims) + block  # what check_lean holds anyway
    for budget, expected in ((fixed - 1, None), (fixed, (L, 0)), (fixed + kept + kept // 2, (L, 1)),
                             (fixed + L * kept + block - kept, (L - 1, L - 1)), (64 << 20, (0, 0))):
        monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", str(budget))
        if expected is None:
            with pytest.raises(InputError):
                check_lean(loaded, where, T)
            continue
        check_lean(loaded, where, T)
        assert (where.recomputed, where.keeping) == expected, budget


def test_atp_on_the_long_path_runs_the_model_twice_and_gives_it_back_on_a_refusal(long_models, monkeypatch):
    """The receiver's run is AtP's own forward pass: two passes in all (the donor's and the receiver's, its
    backward pass from the same graph), counted at the embeddings. A refusal after the receiver's pass (the
    prompts give the same logit difference) ends its context: the model is back on eager attention with its
    own forward methods."""
    from attnviz.engine.hooks import Hook, hooked

    loaded = attnviz.load_model(long_models("llama"), lm_head=True)
    model = loaded.model
    calls = [0]

    def count(module, args):
        calls[0] += 1

    with hooked([Hook(model.get_input_embeddings(), "pre", count)]):
        _patch(loaded, 300, "atp", "3M", monkeypatch)
    assert calls[0] == 2
    clean, _ = prompts(300)
    with pytest.raises(InputError, match="same logit difference"):
        attnviz.patch(clean, clean, model=loaded, method="atp", answers=(5, 6))
    assert model.config._attn_implementation == "eager"
    assert all("forward" not in b.__dict__ for b in model.model.layers)


def test_retrieval_heads_without_alpha_equal_the_full_path(long_models, monkeypatch):
    """Retrieval heads where the prompt's attention would not fit: the prompt fills the KV cache on the model's
    SDPA (no layer's T × T), each decoding step's one row of α on eager; the removal runs on SDPA too. The same
    scores, answers and causal test as the full path."""
    loaded = attnviz.load_model(long_models("llama"), lm_head=True)
    options = dict(lengths=[900], depths=[0.5], remove=2, draws=1)
    monkeypatch.delenv("ATTNVIZ_MEMORY_BUDGET", raising=False)
    full = attnviz.retrieval(model=loaded, **options)
    T, H = full.prompts[0]["tokens"], loaded.shape[1]
    monkeypatch.setenv("ATTNVIZ_MEMORY_BUDGET", "8M")
    with largest() as seen:
        lean = attnviz.retrieval(model=loaded, **options)
    assert seen.most < H * T * T // 2, (seen.most, seen.shape)
    assert 4 * H * T * T * 4 > 8 << 20  # the full path's prompt would not have fitted
    np.testing.assert_allclose(lean.scores, full.scores, atol=1e-12)
    assert lean.prompts == full.prompts
    assert json.dumps(lean.causal, sort_keys=True) == json.dumps(full.causal, sort_keys=True) or \
        all(abs(lean.causal[k]["log_prob"] - full.causal[k]["log_prob"]) <= 1e-5 for k in ("none", "top"))
    assert loaded.model.config._attn_implementation == "eager"
