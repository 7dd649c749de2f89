"""The teaching commands: steps (one head step by step), positions (shuffled words, with and without
position embeddings) and scaling (why divide by √d_k); each quantity against an independent computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import SENTENCE, one_line_error, run


@pytest.mark.slow
def test_scaling_at_the_chosen_d_k(tiny_model_dir):
    data = json.loads(run("scaling", SENTENCE, "-m", tiny_model_dir("bert"), "--dk", "16,64,256", "--json").stdout)
    rows = {r["d_k"]: r for r in data["synthetic_dk"]}
    assert set(rows) == {data["d_k"], 16, 64, 256}
    for d, r in rows.items():
        assert r["std_raw"] == pytest.approx(np.sqrt(d), rel=0.05) and r["std_scaled"] == pytest.approx(1, rel=0.05)
    assert rows[256]["entropy_raw"] < rows[16]["entropy_raw"] < rows[16]["entropy_scaled"]
    for bad in ("0", "5000", "a,b", ",".join(["8"] * 9)):
        assert "--dk" in one_line_error(run("scaling", SENTENCE, "-m", tiny_model_dir("bert"), "--dk", bad), 2)


@pytest.mark.slow
def test_positions_shows_the_position_embeddings_similarity(tiny_model_dir, load_tiny, tmp_path):
    data = json.loads(run("positions", SENTENCE, "-m", tiny_model_dir("bert"), "--json").stdout)
    similarity = np.array(data["position_similarity"])
    table = load_tiny("bert").model.embeddings.position_embeddings.weight.detach().double().numpy()
    n = len(similarity)
    by_hand = np.array([[table[i] @ table[j] / np.linalg.norm(table[i]) / np.linalg.norm(table[j])
                         for j in range(n)] for i in range(n)])
    np.testing.assert_allclose(similarity, by_hand, atol=1e-6)
    assert n == min(64, len(table))
    assert run("positions", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "p.png").exit_code == 0


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_steps_intermediates_follow_the_formula_and_match_the_model(kind, tiny_model_dir):
    result = run("steps", SENTENCE, "-m", tiny_model_dir(kind), "--layer", "1", "--head", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    q, k, v = (np.array(data[x]) for x in ("q", "k", "v"))
    scores, scaled, alpha = np.array(data["scores"]), np.array(data["scaled"]), np.array(data["alpha"])
    allowed = np.array(data["allowed"], bool)
    T, d_k = q.shape
    assert data["d_k"] == d_k and len(data["tokens"]) == T
    np.testing.assert_allclose(scores, q @ k.T, atol=1e-9)
    np.testing.assert_allclose(scaled, scores / math.sqrt(d_k), atol=1e-9)
    logits = np.where(allowed, scaled, -np.inf)  # an independent softmax, in numpy
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(alpha, expected, atol=1e-12)
    np.testing.assert_allclose(np.array(data["out"]), alpha @ v, atol=1e-9)
    np.testing.assert_allclose(alpha, np.array(data["model_alpha"]), atol=1e-5)
    assert data["max_abs_diff"] < 1e-5
    if kind != "bert":  # causal: the mask hides every later key
        assert (allowed == np.tril(np.ones((T, T), bool))).all() and np.abs(np.triu(alpha, 1)).max() == 0


@pytest.mark.slow
def test_steps_terminal_figure_and_one_token(tiny_model_dir, tmp_path):
    result = run("steps", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "s.png", env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    for text in ("Q·Kᵀ", "√d_k", "softmax", "α·V", "max |Δ|"):
        assert text in result.stdout
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    result = run("steps", SENTENCE, "-m", tiny_model_dir("bert"), "--token", "cat")
    assert result.exit_code == 0 and "the query 'cat'" in result.stdout and "out(cat) =" in result.stdout
    assert "one index" in one_line_error(run("steps", SENTENCE, "-m", tiny_model_dir("bert"), "--layer", "0-1"), 2)


@pytest.mark.slow
def test_steps_on_minilm_layer0_head2_matches_the_model():
    data = json.loads(run("steps", SENTENCE, "--layer", "0", "--head", "2", "--json").stdout)
    assert data["max_abs_diff"] < 1e-5 and data["d_k"] == 32
    alpha = np.array(data["alpha"])
    assert alpha[2, 1] > 0.99  # "cat" looks at "the": the previous-token head


def test_positions_without_embeddings_alpha_is_permuted_exactly(tiny_model_dir):
    result = run("positions", "the quick brown fox jumps over the lazy dog", "-m", tiny_model_dir("bert"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert sorted(data["shuffled"]) == sorted(data["words"]) and data["shuffled"] != data["words"]
    permutation = np.array(data["permutation"])
    assert sorted(permutation.tolist()) == list(range(len(data["tokens"])))
    assert data["without_positions"]["max_abs_diff"] < 1e-5
    assert data["with_positions"]["max_abs_diff"] > 1e-2
    assert len(data["with_positions"]["per_layer"]) == 2


def test_positions_independent_check_on_the_shuffled_tokens(load_tiny):
    """The permutation maps the shuffled text's tokens onto the original's, token for token."""
    from attnviz.engine.forward import encode
    from attnviz.engine.scratch.positions import positions_experiment

    loaded = load_tiny("bert")
    result = positions_experiment(loaded, "the cat sat on the mat", seed=3)
    shuffled = encode(loaded, " ".join(result.shuffled))
    assert [result.tokens[o] for o in result.permutation] == shuffled.tokens


@pytest.mark.parametrize("kind,message", [("gpt2", "causal"), ("llama", "causal")])
def test_positions_refuses_causal_and_rotary_models(kind, message, tiny_model_dir):
    assert message in one_line_error(run("positions", SENTENCE, "-m", tiny_model_dir(kind)))
