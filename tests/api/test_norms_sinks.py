"""Value-weighted norms (Kobayashi et al. 2020) and attention sinks (Gu et al. 2024), each checked against
an independent computation."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SENTENCE, make_capture, one_line_error, run

from attnviz.data.capture import Capture
from attnviz.metrics import Tokens, head_values, sink_scores

FAMILIES = ["bert", "roberta", "distilbert", "gpt2", "llama", "qwen2"]


@pytest.mark.parametrize("kind", FAMILIES)
def test_parts_add_up_to_the_attention_output(kind, tiny_model_dir):
    """Σ_h Σ_j α_ij f_h(x_j) + b_O equals the output the attention block's projection itself returns."""
    result = run("verify", SENTENCE, "-m", tiny_model_dir(kind), "--norms", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and data["max_abs_diff"] < 1e-5 and len(data["layers"]) == 2


def test_the_norm_check_can_fail(tiny_model_dir, monkeypatch):
    """Each head through the wrong slice of W_O: the parts no longer add up to the block's output, and verify
    --norms says FAIL (exit 3) with the size of the miss; untouched, the same check passes."""
    import torch

    from attnviz.engine.scratch import norms as scratch

    folder = tiny_model_dir("bert")
    honest = json.loads(run("verify", SENTENCE, "-m", folder, "--norms", "--json").stdout)
    assert honest["passed"] and honest["max_rel_diff"] <= honest["tolerance"]
    real = scratch.head_outputs

    def heads_swapped(v, weight):  # each head through the wrong slice of W_O
        return real(torch.flip(v, dims=[1]), weight)

    monkeypatch.setattr(scratch, "head_outputs", heads_swapped)
    result = run("verify", SENTENCE, "-m", folder, "--norms")
    assert result.exit_code == 3 and "FAIL means: the parts do not add up" in result.stdout
    broken = json.loads(run("verify", SENTENCE, "-m", folder, "--norms", "--json").stdout)
    assert not broken["passed"] and broken["max_rel_diff"] > 100 * broken["tolerance"]


def test_norms_are_alpha_times_the_value_vector_norm(load_tiny):
    """Independently: for one head, f_h from the module's own Linear layers, then ‖α_ij f_h(x_j)‖."""
    import torch

    from attnviz.engine.forward import encode
    from attnviz.engine.scratch.norms import value_norms
    from attnviz.engine.hooks import recording_inputs

    loaded = load_tiny("bert")
    encoded = encode(loaded, SENTENCE)
    result = value_norms(loaded.model, encoded.inputs)
    layer = loaded.model.encoder.layer[1]
    with recording_inputs([layer.attention.self]) as seen, torch.inference_mode():
        loaded.model(**encoded.inputs)
    assert not layer.attention.self._forward_pre_hooks  # the hook is gone after the block
    x = seen[0].hidden[0].double().numpy()  # (T, D)
    heads, d = layer.attention.self.num_attention_heads, layer.attention.self.attention_head_size
    value = layer.attention.self.value
    v = x @ value.weight.detach().double().numpy().T + value.bias.detach().double().numpy()  # (T, D)
    W_O = layer.attention.output.dense.weight.detach().double().numpy()  # (D, D)
    for h in range(heads):
        f = v[:, h * d:(h + 1) * d] @ W_O[:, h * d:(h + 1) * d].T  # (T, D)
        expected = result.alpha[1, 0, h] * np.linalg.norm(f, axis=-1)[None, :]  # α_ij ‖f_h(x_j)‖
        np.testing.assert_allclose(result.norms[1, 0, h], expected, rtol=1e-6, atol=1e-9)


def test_norm_captures_through_the_viewers(tiny_model_dir, tmp_path):
    path = tmp_path / "n.npz"
    assert run("capture", SENTENCE, "-m", tiny_model_dir("gpt2"), "--norms", "-o", path).exit_code == 0
    norms = Capture.load(path)
    assert norms.quantity == "norm" and norms.meta["norm_check"] < 1e-5
    assert (norms.attentions >= 0).all() and np.abs(np.triu(norms.attentions, 1)).max() == 0  # causal
    shares = norms.as_distribution().attentions
    np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-5)
    rows = json.loads(run("heads", "--from", path, "--json").stdout)["heads"]
    assert all(0 <= r["max_weight"] <= 1 for r in rows)
    rolled = json.loads(run("rollout", "--from", path, "--json").stdout)
    assert abs(sum(rolled["rollout"]) - 1) < 1e-6
    assert "‖α·f(x)‖" in run("heatmap", "--from", path, "-t", env={"NO_COLOR": "1"}).stdout
    summary = json.loads(run("norms", SENTENCE, "-m", tiny_model_dir("bert"), "--json", "-o", tmp_path / "n.png"
                             ).stdout)
    assert len(summary) == 2 and all(r["output_check"] < 1e-5 for r in summary)
    assert (tmp_path / "n.png").exists()


def test_sink_scores_by_hand():
    T = 5
    causal = np.tril(np.ones((T, T)))
    alpha = causal / causal.sum(-1, keepdims=True)
    capture = make_capture(alpha[None, None].astype(np.float32), causal=True)
    tokens = Tokens.of(capture)
    scores = sink_scores(capture.attentions[0].mean(axis=-2), tokens)[0]  # (T,)
    for j in range(T):  # the mean over queries i ≥ j of α_ij, with a loop
        assert scores[j] == pytest.approx(np.mean([alpha[i, j] for i in range(j, T)]), rel=1e-6)
    vertical = np.zeros((T, T), np.float32)
    vertical[:, 0] = 1.0
    encoder = make_capture(vertical[None, None])
    assert head_values(encoder)["sink"][0, 0] == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_sinks_command_matches_alpha(kind, tiny_model_dir, load_tiny):
    from attnviz.engine.forward import capture_text

    capture = capture_text(SENTENCE, load_tiny(kind))
    data = json.loads(run("sinks", SENTENCE, "-m", tiny_model_dir(kind), "--json", "--threshold", "0.2").stdout)
    T = capture.n_tokens
    for record in data["sinks"]:
        alpha = capture.attentions[record["layer"], record["head"]].astype(np.float64)
        j = record["key"]
        queries = range(j, T) if capture.causal else range(T)
        assert record["sink_score"] == pytest.approx(np.mean([alpha[i, j] for i in queries]), abs=1e-5)
        assert record["sink_score"] > 0.2
    assert len(data["layers"]) == capture.n_layers
    assert all(layer["sink_heads"] == sum(1 for r in data["sinks"] if r["layer"] == layer["layer"])
               for layer in data["layers"])
    csv = run("sinks", SENTENCE, "-m", tiny_model_dir(kind), "--csv").stdout
    assert csv.splitlines()[0].startswith("layer,head,key,token,sink_score,norm_score")


@pytest.mark.slow
def test_minilm_norms_and_sinks():
    verify = run("verify", SENTENCE, "--norms", "--json")
    assert verify.exit_code == 0 and json.loads(verify.stdout)["max_abs_diff"] < 1e-5
    summary = json.loads(run("norms", SENTENCE, "--json").stdout)
    # Kobayashi et al.: much attention on special tokens, much less of the norm
    assert all(r["norm_on_special"] < r["alpha_on_special"] for r in summary)
    sinks = json.loads(run("sinks", SENTENCE, "--json").stdout)
    assert sinks["layers"][1]["tokens"].get("0:[CLS]", 0) >= 6
    assert "threshold" in one_line_error(run("sinks", SENTENCE, "--threshold", "2"), 2)


def test_sinks_draws_a_picture(tiny_model_dir, tmp_path):
    result = run("sinks", SENTENCE, "-m", tiny_model_dir("bert"), "-o", tmp_path / "s.png")
    assert result.exit_code == 0 and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
