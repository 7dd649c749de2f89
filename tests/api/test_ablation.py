"""What a head does, tested by removing it: the removal hook against a second mechanism (the output projection's
weights edited), removing nothing against the model's own output, batched importance against the loop, the
gradient against finite differences, the detectors against TransformerLens's definitions written out as loops,
and the three commands on every path."""

from __future__ import annotations

import contextlib
import json
import warnings

import numpy as np
import pytest
from helpers import TODAYS, make_capture, one_line_error, run

import attnviz

TEXT = "The cat sat on the mat. The cat sat on the mat"
FAMILIES = ("bert", "roberta", "electra", "distilbert", "gpt2", "llama", "qwen2", *TODAYS)


@pytest.fixture(scope="module")
def ablatable(tiny_model_dir):
    """kind -> (loaded, site, inputs): a tiny random model of the family, with a causal-LM head for decoders."""
    from helpers import once

    from attnviz.api.ablation.removing import ablation_model as _ablation_model
    from attnviz.engine.forward import encode
    from attnviz.engine.models import load

    def make(kind):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a base model saved without its head gets a random one
            loaded, where = _ablation_model(load(tiny_model_dir(kind), device="cpu", lm_head="auto"))
        return loaded, where, encode(loaded, TEXT).inputs

    return once(make)


def _outputs(where, inputs):
    import torch

    from attnviz.engine.ablation import is_causal_lm, outputs_of, run_model

    with torch.inference_mode():
        return outputs_of(run_model(where.model, inputs), is_causal_lm(where.model))


@pytest.mark.parametrize("kind", FAMILIES)
@pytest.mark.slow
def test_the_hook_equals_the_weights_edited(kind, ablatable):
    """Zero ablation: the pre-hook on W_O's input and W_O's columns zeroed give the same outputs within 1e-6 of
    their largest value; mean ablation (the mean moved into the bias) within 1e-5. Removing the head changes
    the output (so the comparison can fail), and the weights are put back afterwards."""
    import torch

    from attnviz.engine.ablation import editing, head_means, removal, weights_removed

    loaded, where, inputs = ablatable(kind)
    clean = _outputs(where, inputs)
    removed = [(0, 1), (where.layers - 1, where.heads - 1)]
    for fills, tolerance in ((None, 1e-6), (head_means(where, [inputs]), 1e-5)):
        with editing(where, removal(removed, fills)):
            hooked = _outputs(where, inputs)
        with weights_removed(where, removed, fills):
            edited = _outputs(where, inputs)
        scale = max(float(hooked.abs().max()), 1.0)
        assert float((hooked - edited).abs().max()) / scale <= tolerance
        assert float((hooked - clean).abs().max()) > 1e-4  # the head mattered
    assert torch.equal(_outputs(where, inputs), clean)  # the weights were put back


@pytest.mark.slow
@pytest.mark.parametrize("kind", FAMILIES)
def test_removing_nothing_is_the_model_itself(kind, ablatable):
    import torch

    from attnviz.engine.ablation import editing, removal

    _, where, inputs = ablatable(kind)
    clean = _outputs(where, inputs)
    with editing(where, removal([], None)):
        assert torch.equal(_outputs(where, inputs), clean)
    for module in where.projections:
        assert not module._forward_pre_hooks  # the hooks are gone


@pytest.mark.slow
@pytest.mark.parametrize("kind", FAMILIES)
def test_batched_importance_equals_the_loop(kind, ablatable):
    """The one growing batch gives every head's effect, loss change and gradient as one forward pass per head."""
    from attnviz.engine.ablation import importance

    _, where, inputs = ablatable(kind)
    batched = importance(where, [inputs])
    loop = importance(where, [inputs], batched=False)
    assert batched.effect.shape == (where.layers, where.heads)
    np.testing.assert_allclose(batched.effect, loop.effect, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(batched.estimated, loop.estimated, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(batched.gradient, loop.gradient, rtol=1e-9)
    assert batched.effect.max() > 0


def test_batched_importance_in_chunks_equals_one_batch(ablatable, monkeypatch):
    from attnviz.engine import ablation
    from attnviz.engine.ablation import seam

    _, where, inputs = ablatable("llama")
    whole = ablation.importance(where, [inputs], mode="mean")
    monkeypatch.setattr(seam, "OUTPUT_BYTES", 1)  # one head per pass
    chunked = ablation.importance(where, [inputs], mode="mean")
    np.testing.assert_allclose(chunked.effect, whole.effect, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_the_gradient_is_the_derivative_of_the_gated_model(kind, ablatable):
    """Michel et al.'s gate, checked by a central difference on ξ_h: the next-token loss of a causal LM, or for
    an encoder the norm of ê's derivative along ξ_h, each head of layer 0 and the last layer, at ε = 1e-3. On a
    float64 copy of the model on SDPA attention (eager attention takes its softmax in float32 whatever the
    dtype): in float32 the loss moved by about 1e-6 at ξ = 1 ± ε for a weak head, its own rounding, and the check
    failed or passed with the random head the test order drew. Llama's RMSNorm still computes in float32: the
    loss (about 8) carries about 8 · 1.2e-7 = 1e-6 of rounding, 5e-4 over 2ε (abs.); the truncation,
    ε² · |f'''| / 6, is covered by rel. 1e-2 (measured: ≤ 1.2e-4 abs.)."""
    import copy

    import torch

    from attnviz.engine.ablation import site

    from attnviz.engine.ablation import (
        editing,
        embedding,
        gradient_scores,
        is_causal_lm,
        next_token_loss,
        outputs_of,
        run_model,
    )
    from attnviz.engine.ablation.seam import gated

    _, shared, inputs = ablatable(kind)
    model = copy.deepcopy(shared.model).double()
    model.set_attn_implementation("sdpa")  # eager attention takes its softmax in float32 whatever the model's dtype
    where = site(model)
    causal = is_causal_lm(where.model)
    grad = gradient_scores(where, inputs, causal, None)
    eps = 1e-3

    def at(layer, head, value):
        gate = torch.ones(1, where.layers, where.heads, dtype=torch.float64)
        gate[0, layer, head] = value
        with editing(where, gated(where, gate, None)), torch.inference_mode():
            out = outputs_of(run_model(where.model, inputs), causal)
        return next_token_loss(out, inputs["input_ids"])[0] if causal else embedding(out)[0].double()

    for layer in (0, where.layers - 1):
        for head in range(where.heads):
            diff = (at(layer, head, 1 + eps) - at(layer, head, 1 - eps)) / (2 * eps)
            expected = float(diff.abs() if causal else diff.norm())
            assert grad[layer, head] == pytest.approx(expected, rel=1e-2, abs=5e-4)


def test_an_ablation_reports_what_changed(ablatable):
    """The next-token numbers against their definitions, computed here from the two runs' logits."""
    import torch

    from attnviz.engine.ablation import ablate, editing, removal

    _, where, inputs = ablatable("gpt2")
    result = ablate(where, inputs, [(0, 2)])
    clean = _outputs(where, inputs)[0].double()
    with editing(where, removal([(0, 2)], None)):
        after = _outputs(where, inputs)[0].double()
    p, q = torch.softmax(clean, -1), torch.softmax(after, -1)
    kl = (p * (p.log() - q.log())).sum(-1).numpy()
    np.testing.assert_allclose(result.kl, kl, rtol=1e-6, atol=1e-9)
    top = p.argmax(-1)
    assert list(result.top_before) == top.tolist() and list(result.top_after) == q.argmax(-1).tolist()
    np.testing.assert_allclose(result.p_top[:, 1], q[torch.arange(len(top)), top].numpy(), rtol=1e-6)
    ids = inputs["input_ids"][0]
    loss = -(torch.log_softmax(after, -1)[torch.arange(len(ids) - 1), ids[1:]]).mean()
    assert result.loss[1] == pytest.approx(float(loss), rel=1e-9)
    assert result.alpha_clean.shape == result.alpha_removed.shape
    np.testing.assert_array_equal(result.alpha_clean[0], result.alpha_removed[0])  # layer 0's α is before W_O
    assert np.abs(result.alpha_clean[1] - result.alpha_removed[1]).max() > 1e-4
    np.testing.assert_allclose(result.alpha_removed.sum(-1), 1.0, atol=1e-5)


def test_an_encoder_ablation_pools_as_sentence_transformers_does(ablatable):
    import torch

    from attnviz.engine.ablation import ablate, editing, removal

    _, where, inputs = ablatable("bert")
    result = ablate(where, inputs, [(1, 0), (1, 3)])
    clean = _outputs(where, inputs)[0].double()
    with editing(where, removal([(1, 0), (1, 3)], None)):
        after = _outputs(where, inputs)[0].double()
    e0, e1 = clean.mean(0), after.mean(0)
    assert result.cosine == pytest.approx(float(torch.dot(e0, e1) / (e0.norm() * e1.norm())), abs=1e-6)
    np.testing.assert_allclose(result.token_cosine, torch.cosine_similarity(clean, after, -1).numpy(), atol=1e-6)


# --- the detectors against TransformerLens's definitions written out -----------------------------------------


def _tl_patterns(ids):
    """TransformerLens's detection patterns, as its head_detector builds them, in loops."""
    T = len(ids)
    prev = np.zeros((T, T))
    dup = np.zeros((T, T))
    for i in range(T):
        if i >= 1:
            prev[i, i - 1] = 1
        for j in range(i):
            if ids[j] == ids[i]:
                dup[i, j] = 1
    induction = np.zeros((T, T))
    for i in range(T):
        for j in range(1, i + 1):
            induction[i, j] = dup[i, j - 1]
    return {"previous-token": prev, "duplicate-token": dup, "induction": induction}


def test_the_detector_scores_are_transformerlens_s():
    from attnviz.metrics import detector_scores

    rng = np.random.default_rng(0)
    ids = np.array([7, 1, 2, 3, 4, 1, 2, 3, 4, 5, 1, 1])
    T = len(ids)
    alpha = rng.random((2, 3, T, T)) * np.tril(np.ones((T, T)))
    alpha /= alpha.sum(-1, keepdims=True)
    scores = detector_scores(alpha, ids)
    for name, pattern in _tl_patterns(ids).items():
        rows = pattern.any(axis=1)
        for layer in range(2):
            for head in range(3):
                a = alpha[layer, head]
                tl = (a * pattern).sum() / a.sum()
                assert scores[name][0][layer, head] == pytest.approx(tl, rel=1e-12)
                share = np.mean([(a[i] * pattern[i]).sum() for i in range(T) if rows[i]])
                assert scores[name][1][layer, head] == pytest.approx(share, rel=1e-12)


def test_the_heads_table_labels_induction_and_duplicate_heads():
    """A hand-made head that attends to the token after an earlier occurrence is labelled induction; one that
    attends to the earlier occurrence itself, duplicate-token; the columns appear only when a token repeats."""
    from attnviz.metrics import head_records

    ids = [0, 1, 2, 3, 4, 1, 2, 3, 4]  # four tokens occur again: what the label tests need (MIN_REPEATS)
    T = len(ids)
    induction = np.eye(T)
    dup = np.eye(T)
    for i in range(5, T):
        induction[i] = 0
        induction[i, i - 3] = 1  # token i repeats i − 4; the token after it is i − 3
        dup[i] = 0
        dup[i, i - 4] = 1
    alpha = np.stack([induction, dup])[None]
    capture = make_capture(alpha, [f"t{i}" for i in ids], causal=True)
    capture = capture.__class__(**{**capture.__dict__, "token_ids": np.array(ids)})
    records = head_records(capture)
    assert [r["label"] for r in records] == ["induction", "duplicate-token"]
    assert records[0]["induction"] == pytest.approx(1.0) and records[1]["duplicate"] == pytest.approx(1.0)
    plain = head_records(make_capture(alpha))  # distinct ids: nothing repeats
    assert "induction" not in plain[0] and plain[0]["label"] != "induction"


def test_spearman_against_its_formula():
    from attnviz.metrics import spearman

    a = np.array([0.1, 0.5, 0.3, 0.9, 0.7])
    b = np.array([1.0, 3.0, 2.0, 4.0, 5.0])
    d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
    assert spearman(a, b) == pytest.approx(1 - 6 * (d ** 2).sum() / (5 * 24))
    tied = spearman(np.array([1.0, 1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0]))
    ranks = np.array([0.5, 0.5, 2.0, 3.0])
    assert tied == pytest.approx(np.corrcoef(ranks, np.arange(4))[0, 1])
    assert np.isnan(spearman(np.ones(3), np.arange(3.0)))


def test_detection_and_the_causal_test(ablatable):
    from attnviz.engine.ablation import detection

    loaded, where, _ = ablatable("llama")
    result = detection(loaded, where, length=8, sequences=2, draws=3)
    for name, share in result.shares.items():
        passed = {tuple(p) for p in np.argwhere(share >= result.thresholds[name]).tolist()}
        assert set(result.detected[name]) == passed
    assert len(result.tokens) == 1 + 2 * 8


def test_the_causal_test_removes_what_it_says(ablatable):
    from attnviz.engine.ablation import Repeated, causal_test, repeat_loss

    loaded, where, _ = ablatable("llama")
    import torch

    seq = Repeated([1, 5, 6, 7, 5, 6, 7], 3, True, 0)
    inputs = {"input_ids": torch.tensor([seq.ids])}
    test = causal_test(where, inputs, seq.second_half, [(1, 0)], draws=2)
    assert test.removed == pytest.approx(repeat_loss(where, inputs, seq.second_half, [(1, 0)]))
    assert test.removed != test.clean
    assert len(test.random) == 2 and all(len(h) == 1 and h[0] != (1, 0) for h in test.random_heads)


# --- the commands ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm(tiny_lm_dir):
    return tiny_lm_dir("llama")


@pytest.mark.parametrize("how", ["text", "stdin", "file"])
def test_ablate_reads_text_stdin_and_a_file(how, lm, tmp_path):
    from attnviz.engine.forward import encode
    from attnviz.engine.models import load

    args = ["ablate", "-m", lm, "--heads", "0.1,1.2", "--json"]
    kwargs = {}
    if how == "text":
        args.insert(1, TEXT)
    elif how == "stdin":
        args.insert(1, "-")
        kwargs["input"] = TEXT
    else:
        path = tmp_path / "t.txt"
        path.write_text(TEXT, encoding="utf-8")
        args += ["--text-file", path]
    result = run(*args, **kwargs)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    tokens = encode(load(lm, device="cpu", lm_head=True), TEXT).tokens
    assert data["tokens"] == tokens and len(data["positions"]) == len(tokens)
    assert [p["token"] for p in data["positions"]] == tokens
    assert data["removed"] == [[0, 1], [1, 2]] and data["kind"] == "causal"
    assert [r["layer"] for r in data["later_layers"]] == [1]
    assert data["check"]["relative"] <= 1e-6


@pytest.mark.slow
def test_ablate_on_an_encoder_and_its_picture(tiny_model_dir, tmp_path):
    out = tmp_path / "delta.png"
    result = run("ablate", TEXT, "-m", tiny_model_dir("bert"), "--layer", "0", "--mode", "mean", "-o", out, "-t")
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cosine" in result.stdout and "removed 0.all" in result.stdout


def test_ablate_at_a_position_and_over_a_corpus(lm, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("A dog ran.\n\nThe bird sang in the tree.\n", encoding="utf-8")
    result = run("ablate", TEXT, "-m", lm, "--heads", "1.all", "--mode", "mean", "--mean-over", corpus, "--at", "-1",
                 "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["means_from"] == "2 texts" and data["removed"] == [[1, h] for h in range(4)]
    assert data["at"]["position"] == len(data["tokens"]) - 1 and len(data["at"]["before"]) == 5
    assert data["later_layers"] == []  # nothing follows the last layer


@pytest.mark.parametrize("args, code, words", [
    (["--heads", "0.9"], 2, "head 9 is out of range"),
    (["--heads", "5.0"], 2, "layer 5 is out of range"),
    (["--heads", "0-1"], 2, "need --layer"),
    (["--heads", "x.1"], 2, "not a layer.head pair"),
    ([], 2, "name the heads"),
    (["--heads", "0.1", "--layer", "0"], 2, "leave out --layer"),
    (["--heads", "0.1", "--mean-over", "README.md"], 2, "add --mode mean"),
    (["--heads", "0.1", "--mode", "max"], 2, "not one of zero, mean"),
])
def test_ablate_refuses_in_one_line(args, code, words, lm):
    line = one_line_error(run("ablate", TEXT, "-m", lm, *args), code)
    assert words in line


def test_ablate_refuses_at_for_an_encoder_and_encoder_decoders(tiny_model_dir, tiny_seq2seq_dir):
    line = one_line_error(run("ablate", TEXT, "-m", tiny_model_dir("bert"), "--heads", "0.1", "--at", "0"), 2)
    assert "encoder" in line
    line = one_line_error(run("ablate", TEXT, "-m", tiny_seq2seq_dir("bart"), "--heads", "0.1"), 1)
    assert "encoder-decoder" in line


@pytest.mark.parametrize("how", ["text", "stdin", "file", "corpus"])
def test_importance_on_every_input(how, lm, tmp_path):
    args = ["importance", "-m", lm, "--json"]
    kwargs = {}
    path = tmp_path / "t.txt"
    if how == "text":
        args.insert(1, TEXT)
    elif how == "stdin":
        args.insert(1, "-")
        kwargs["input"] = TEXT
    elif how == "file":
        path.write_text(TEXT, encoding="utf-8")
        args += ["--text-file", path]
    else:
        path.write_text(f"{TEXT}\nA dog ran in the park.\n", encoding="utf-8")
        args += ["--corpus", path]
    result = run(*args, **kwargs)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["texts"] == (2 if how == "corpus" else 1)
    assert len(data["heads"]) == 2 * 4 and [h["rank"] for h in data["heads"]] == list(range(1, 9))
    effects = [h["effect"] for h in data["heads"]]
    assert effects == sorted(effects, reverse=True)
    assert -1 <= data["spearman_gradient_vs_estimated"] <= 1


@pytest.mark.slow
def test_importance_batched_equals_loop_on_the_command_line(tiny_model_dir, tmp_path):
    model = tiny_model_dir("bert")
    batched = json.loads(run("importance", TEXT, "-m", model, "--json").stdout)
    loop = json.loads(run("importance", TEXT, "-m", model, "--json", "--loop").stdout)
    assert [(h["layer"], h["head"]) for h in batched["heads"]] == [(h["layer"], h["head"]) for h in loop["heads"]]
    np.testing.assert_allclose([h["effect"] for h in batched["heads"]], [h["effect"] for h in loop["heads"]],
                               rtol=1e-5)
    out = tmp_path / "imp.png"
    csv = run("importance", TEXT, "-m", model, "--csv", "-o", out)
    assert csv.exit_code == 0 and csv.stdout.splitlines()[0] == "rank,layer,head,effect,gradient"
    assert out.is_file()


def test_importance_refuses_text_and_corpus_together(lm, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("x\n")
    assert "not both" in one_line_error(run("importance", TEXT, "-m", lm, "--corpus", path), 2)
    empty = tmp_path / "e.txt"
    empty.write_text("\n\n")
    assert "holds no text" in one_line_error(run("importance", "-m", lm, "--corpus", empty), 1)


@pytest.mark.slow
def test_detect_on_the_command_line(lm, tmp_path):
    out = tmp_path / "d.png"
    result = run("detect", "-m", lm, "--length", "8", "--sequences", "2", "--draws", "2", "--json", "-o", out)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data["scores"]) == {"previous-token", "duplicate-token", "induction"}
    assert np.asarray(data["shares"]["induction"]).shape == (2, 4)
    for name, heads in data["detected"].items():
        assert all(data["shares"][name][a][b] >= data["thresholds"][name] for a, b in heads)
    assert out.is_file()
    line = one_line_error(run("detect", "-m", lm, "--length", "100"), 1)
    assert "at most 128 positions" in line


# --- the real models -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_minilm_hook_and_weights_agree_and_the_gradient_ranks_like_removal(minilm):
    """On the real MiniLM: zero ablation through the hook equals the weights edited exactly; the gradient
    estimate ranks the heads as removing them does (Spearman ρ > 0.8 on this sentence)."""
    from attnviz.api.ablation.removing import ablation_model as _ablation_model
    from attnviz.engine.ablation import ablate, importance
    from attnviz.engine.forward import encode
    from attnviz.metrics import spearman

    loaded, where = _ablation_model(minilm)
    inputs = encode(loaded, "The cat sat on the mat because it was tired").inputs
    result = ablate(where, inputs, [(0, 2), (3, 5)])
    assert result.check <= 1e-6 * max(result.scale, 1.0) and result.cosine < 1
    ranked = importance(where, [inputs])
    assert spearman(ranked.gradient, ranked.estimated) > 0.8


@pytest.mark.slow
def test_smollm2_has_induction_heads_and_removing_them_hurts_the_repeat():
    """On the real SmolLM2: induction heads are found on repeated random tokens, and removing them raises the
    loss on the repeated half more than removing as many random heads does on average."""
    from helpers import require_real

    from attnviz.engine import offline

    require_real(offline.SMOLLM2)
    import attnviz

    result = attnviz.detect(model="smollm2", length=30, sequences=2, draws=5)
    assert len(result.detected["induction"]) >= 3
    assert result.causal is not None
    assert result.causal.removed > result.causal.clean + 1.0
    assert result.causal.removed > np.mean(result.causal.random)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["multilingual", "smollm2"])
def test_the_hook_equals_the_weights_edited_on_real_weights(which):
    """The multilingual encoder (Korean) and SmolLM2: zero ablation through the hook and through the weights
    agree within 1e-6 of the outputs' largest value, mean ablation within 1e-5; batched importance equals the
    loop on a short text."""
    from helpers import require_real

    from attnviz.api.ablation.removing import ablation_model as _ablation_model
    from attnviz.engine import offline
    from attnviz.engine.ablation import ablate, importance
    from attnviz.engine.forward import encode
    from attnviz.engine.models import load

    require_real(offline.MULTILINGUAL if which == "multilingual" else offline.SMOLLM2)
    loaded, where = _ablation_model(load(which, device="cpu", lm_head="auto"))
    inputs = encode(loaded, "나는 사과를 먹었다").inputs
    zero = ablate(where, inputs, [(0, 1), (2, 3)])
    mean = ablate(where, inputs, [(0, 1), (2, 3)], mode="mean")
    assert zero.check <= 1e-6 * max(zero.scale, 1.0)
    assert mean.check <= 1e-5 * max(mean.scale, 1.0)
    assert zero.kind == ("encoder" if which == "multilingual" else "causal")
    if which == "smollm2":  # 22 byte-level tokens: the loop's 270 runs on a text of five (the same per-head check)
        inputs = encode(loaded, "I ate an apple").inputs
    batched, loop = importance(where, [inputs], gradient=False), importance(where, [inputs], gradient=False,
                                                                           batched=False)
    np.testing.assert_allclose(batched.effect, loop.effect, rtol=1e-4, atol=1e-6)


def test_the_encoder_jacobian_in_small_batches_is_the_same(ablatable, monkeypatch):
    from attnviz.engine import ablation
    from attnviz.engine.ablation import ranking, seam

    _, where, inputs = ablatable("bert")
    whole = ablation.gradient_scores(where, inputs, False, None)
    monkeypatch.setattr(ranking, "JACOBIAN_BATCH", 3)  # 32 dimensions in 11 backward passes
    np.testing.assert_allclose(ablation.gradient_scores(where, inputs, False, None), whole, rtol=1e-6, atol=1e-9)
    monkeypatch.setattr(seam, "ATTENTION_BYTES", 1)  # the memory bound: one copy per pass
    assert ablation.copies_that_fit(where, 12, 32, backward=True) == 1
    np.testing.assert_allclose(ablation.gradient_scores(where, inputs, False, None), whole, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("command", ["importance", "ablate"])
def test_a_text_list_that_is_not_a_file_is_refused_in_one_line(command, lm, tmp_path):
    option = ["--corpus"] if command == "importance" else [TEXT, "--heads", "0.1", "--mode", "mean", "--mean-over"]
    assert "is a directory" in one_line_error(run(command, "-m", lm, *option, tmp_path), 2)
    missing = tmp_path / "missing.txt"
    assert str(missing) in one_line_error(run(command, "-m", lm, *option, missing), 1)
    huge = tmp_path / "many.txt"
    huge.write_text("x\n" * 1001, encoding="utf-8")
    if command == "importance":
        assert "more than 1,000 texts" in one_line_error(run(command, "-m", lm, "--corpus", huge), 1)


def test_importance_mean_mode_and_top(lm):
    import re

    data = json.loads(run("importance", TEXT, "-m", lm, "--mode", "mean", "--json").stdout)
    assert data["mode"] == "mean" and len(data["heads"]) == 8
    zero = json.loads(run("importance", TEXT, "-m", lm, "--json").stdout)
    assert [h["effect"] for h in data["heads"]] != [h["effect"] for h in zero["heads"]]
    table = run("importance", TEXT, "-m", lm, "--top", "3")
    assert table.exit_code == 0
    assert len([line for line in table.stdout.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s", line)]) == 3


def test_detect_seed_and_mode(lm):
    args = ["detect", "-m", lm, "--length", "6", "--sequences", "1", "--draws", "1", "--json"]
    first = json.loads(run(*args).stdout)
    again = json.loads(run(*args).stdout)
    other = json.loads(run(*args, "--seed", "1").stdout)
    assert first["scores"] == again["scores"] and first["scores"] != other["scores"]
    assert run(*args, "--mode", "mean").exit_code == 0


def test_the_causal_test_in_mean_mode_uses_the_means(ablatable):
    import torch

    from attnviz.engine.ablation import Repeated, causal_test, head_means

    _, where, _ = ablatable("llama")
    seq = Repeated([1, 5, 6, 7, 5, 6, 7], 3, True, 0)
    inputs = {"input_ids": torch.tensor([seq.ids])}
    zero = causal_test(where, inputs, seq.second_half, [(1, 0)], draws=1)
    mean = causal_test(where, inputs, seq.second_half, [(1, 0)], draws=1, fills=head_means(where, [inputs]))
    assert mean.clean == zero.clean and mean.removed != zero.removed


class _Phases(attnviz.Reporter):
    """Records each bar: what it names, its total and the steps it was given."""

    def __init__(self):
        self.bars: list[list] = []

    @contextlib.contextmanager
    def progress(self, what, total, unit):
        bar = [what, total, 0]
        self.bars.append(bar)

        def step(n):
            bar[2] += n

        yield step


def test_every_long_phase_names_itself_and_its_bar_ends(tiny_lm_dir):
    """importance shows the removals (counted in heads) and the gradient pass as two named bars; detect the
    scoring and, where it finds induction heads, the causal test, each run counted; every bar reaches its
    total."""
    lm = attnviz.load_model(tiny_lm_dir("llama"), device="cpu", lm_head=True)
    phases = _Phases()
    attnviz.importance(["the cat sat on the mat", "a dog ran"], model=lm, reporter=phases)
    L, H = lm.shape
    assert [(what, total) for what, total, _ in phases.bars] == [("Removing every head", 2 * L * H),
                                                                  ("The gradient estimate (Michel et al.)", 2)]
    phases = _Phases()
    found = attnviz.detect(model=lm, length=8, sequences=2, draws=3, reporter=phases)
    expected = [("Scoring the heads", 2)]
    if found.causal is not None:
        expected.append(("Removing the induction heads, then as many random heads", 2 * (2 + 3)))
    assert [(what, total) for what, total, _ in phases.bars] == expected
    assert all(done == total for _, total, done in phases.bars)


def test_the_importance_figure_says_what_was_read(tiny_model_dir, tmp_path, monkeypatch):
    from attnviz.render import png

    drawn = []
    real = png.save_figure
    monkeypatch.setattr(png, "save_figure", lambda figure, path, **kw: (drawn.append(figure), real(figure, path,
                                                                                                  **kw))[1])
    assert run("importance", TEXT, "-m", tiny_model_dir("bert"), "-o", tmp_path / "imp.png").exit_code == 0
    # the header's words, its lines joined (a long folder name wraps it anywhere)
    header = [" ".join(" ".join(t.get_text() for t in figure.figure.texts).split()) for figure in drawn]
    assert TEXT in header[0] and (tmp_path / "imp.png").is_file()
    corpus = tmp_path / "texts.txt"
    corpus.write_text("The cat sat.\nA dog ran.\n")
    assert run("importance", "--corpus", corpus, "-m", tiny_model_dir("bert"), "-o", tmp_path / "c.png").exit_code == 0
    header = [" ".join(" ".join(t.get_text() for t in figure.figure.texts).split()) for figure in drawn]
    assert "2 texts of" in header[1] and "The cat sat." in header[1]


def test_importance_states_each_correlation_once(lm, tiny_model_dir):
    """A causal LM: ρ with |Δloss| (what the gradient estimates) and with the effect (KL), two numbers; an encoder:
    what the gradient estimates is the effect (‖Δê‖), so one ρ, said once."""
    import re

    from attnviz.metrics import spearman

    def spearman_line(output: str) -> str:  # the sentence, its wrapped lines joined
        return " ".join(output[output.index("Spearman"):].split("\n\n")[0].split())

    causal = run("importance", TEXT, "-m", lm, env={"COLUMNS": "200"})
    line = spearman_line(causal.stdout)
    assert len(re.findall(r"-?\d\.\d{3}", line)) == 2
    encoder = run("importance", TEXT, "-m", tiny_model_dir("bert"), env={"COLUMNS": "200"})
    line = spearman_line(encoder.stdout)
    numbers = re.findall(r"-?\d\.\d{3}", line)
    result = attnviz.importance(TEXT, model=tiny_model_dir("bert"))
    assert numbers == [f"{spearman(result.gradient, result.effect):.3f}"] and "‖Δê‖" in line
