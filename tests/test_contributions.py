"""Direct logit attribution (attnviz logit-attr, attnviz.logit_attribution): the logit of the next token split
into heads, MLPs, embeddings and biases, each check against an independent computation."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from helpers import TODAYS, build_tiny_model, one_line_error, require_real, run

import attnviz
from attnviz.engine import offline

TEXT = "The cat sat on the mat"
SPLITS = ("gpt2", "llama", "mistral", "qwen2", "mistral-window", "qwen3", "phi3", "smollm3", "cohere2", "gpt_oss")
POST_NORMS = ("gemma2", "gemma3", "olmo2")  # blocks that normalise what they add: refused


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made: dict = {}

    def folder(kind: str):
        if kind not in made:
            made[kind] = str(build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind,
                                              lm=kind in ("gpt2", "llama")))
        return made[kind]

    return folder


def attribute(folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a bare decoder gets a random head: the split holds all the same
        return attnviz.logit_attribution(TEXT, model=folder, **kwargs)


@pytest.mark.parametrize("kind", SPLITS)
def test_the_parts_add_up_to_the_models_own_logit(kind, folders):
    """Σ heads + biases + MLPs + embeddings + final bias = the logit the model computes (float64 sums of
    float32 parts: 1e-4 of max(1, |logit|)); each output projection is rebuilt from the recomputed α and
    values, the stream from the parts, the final norm's output from its frozen-scale form."""
    result = attribute(folders(kind))
    assert result.passed and abs(result.rebuilt - result.logit) <= 1e-4 * max(1.0, abs(result.logit))
    assert result.output_diff < 1e-4 and result.stream_diff < 1e-5 and result.norm_diff < 1e-4
    np.testing.assert_allclose(result.by_source.sum(-1), result.heads, atol=1e-9)  # the split over sources


def test_a_heads_effect_equals_its_slice_of_the_models_own_output_projection(folders):
    """Independently of the recomputed α and values: what the model's own output projection receives (a
    hook), head h's slice through W_O, then the final norm with its scale frozen and the target's row of
    W_U, written out here for GPT-2's LayerNorm."""
    import torch

    from attnviz.engine.forward import encode
    from attnviz.engine.loading import load

    loaded = load(folders("gpt2"), device="cpu", lm_head=True)
    result = attnviz.logit_attribution(TEXT, model=loaded)
    model = loaded.model
    received, final = {}, {}
    hooks = [block.attn.c_proj.register_forward_pre_hook(lambda module, args, n=n: received.__setitem__(n, args[0]))
             for n, block in enumerate(model.transformer.h)]
    hooks.append(model.transformer.ln_f.register_forward_pre_hook(lambda m, args: final.__setitem__("x", args[0])))
    with torch.no_grad():
        model(**encode(loaded, TEXT).inputs)
    for hook in hooks:
        hook.remove()
    x = final["x"][0, -1].double()
    sigma = torch.sqrt(x.var(unbiased=False) + model.transformer.ln_f.eps)
    gamma = model.transformer.ln_f.weight.double()
    row = model.lm_head.weight[result.target_id].double()
    H = model.config.n_head
    d = model.config.n_embd // H
    for layer, z in received.items():
        W = model.transformer.h[layer].attn.c_proj.weight.double()  # Conv1D: x @ W, W (D_in, D_out)
        for head in range(H):
            c = z[0, -1, head * d:(head + 1) * d].double() @ W[head * d:(head + 1) * d]  # (D,)
            by_hand = float((row * gamma * (c - c.mean()) / sigma).sum())
            assert result.heads[layer, head] == pytest.approx(by_hand, abs=1e-6)


def test_the_target_and_position_are_the_users_to_choose(folders):
    folder = folders("llama")
    top = attribute(folder)
    assert top.rank == 0 and top.probability > 0
    chosen = attribute(folder, target=top.target_id + 1 if top.target_id < 10 else 3)
    assert chosen.passed and chosen.target_id != top.target_id and chosen.rank > 0
    earlier = attribute(folder, position=2)
    assert earlier.position == 2 and earlier.passed and earlier.by_source[..., 3:].max() == 0  # causal: no future
    with pytest.raises(attnviz.AttnvizError, match="out of range"):
        attribute(folder, position=99)
    with pytest.raises(attnviz.AttnvizError, match="tokens for"):
        attribute(folder, target="unbelievably long words")
    with pytest.raises(attnviz.AttnvizError, match="not a token id"):
        attribute(folder, target=10**9)


@pytest.mark.parametrize("kind", POST_NORMS)
def test_blocks_that_normalise_what_they_add_are_refused_in_one_line(kind, folders):
    result = run("logit-attr", TEXT, "-m", folders(kind))  # (saved without a head: a warning says so first)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("Error: ") and "do not simply add" in lines[-1]
    assert all(line.startswith(("Warning: ", "Error: ")) for line in lines) and "Traceback" not in result.output


def test_an_encoder_is_refused_in_one_line(tiny_model_dir):
    assert "causal language model" in one_line_error(run("logit-attr", TEXT, "-m", tiny_model_dir("bert")))


def test_the_command_reads_text_standard_input_and_a_file_alike(folders, tmp_path):
    folder = folders("gpt2")
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    given = json.loads(run("logit-attr", TEXT, "-m", folder, "--json").stdout)
    piped = json.loads(run("logit-attr", "-", "-m", folder, "--json", input=TEXT).stdout)
    filed = json.loads(run("logit-attr", "--text-file", path, "-m", folder, "--json").stdout)
    assert given == piped == filed
    assert given["passed"] and given["tokens"][-1] == given["tokens"][given["position"]]
    assert abs(given["rebuilt"] - given["logit"]) <= 1e-4 * max(1.0, abs(given["logit"]))
    assert len(given["heads"]) == 2 and len(given["heads"][0]) == 4 and len(given["top"]) == 8  # every head
    csv = run("logit-attr", TEXT, "-m", folder, "--csv").stdout.splitlines()
    assert csv[0] == "layer,head,effect" and len(csv) == 1 + 2 * 4


def test_the_table_and_the_picture(folders, tmp_path):
    folder = folders("llama")
    shown = run("logit-attr", TEXT, "-m", folder, "--top", "3", "-o", tmp_path / "la.png",
                env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0, shown.output
    assert "PASS: the parts add up to the model's own logit" in shown.stdout and "layer.head" in shown.stdout
    assert (tmp_path / "la.png").is_file()
    result = attribute(folder, top=3)
    figure = result.figure()
    grid, sources = figure.axes
    np.testing.assert_allclose(np.asarray(grid.images[0].get_array()), result.heads, atol=1e-6)
    assert [t.get_text() for t in sources.get_yticklabels()] == [f"{e.layer}.{e.head}" for e in result.top]
    low, high = grid.images[0].get_clim()
    assert low == -high  # centred on 0
    assert "--top" in one_line_error(run("logit-attr", TEXT, "-m", folder, "--top", "0"), 2)


@pytest.mark.slow
def test_smollm2_writes_paris_through_france():
    """The real model: after "The capital of France is" SmolLM2 predicts " Paris"; its largest direct effect
    is a head reading " France" (layer 23, head 4 here), and the parts rebuild the logit."""
    require_real(offline.SMOLLM2)
    result = attnviz.logit_attribution("The capital of France is", model="smollm2")
    assert result.target == " Paris" and result.passed and result.difference < 1e-6
    first = result.top[0]
    assert (first.layer, first.head) == (23, 4) and first.sources[0][0] == "France" and first.effect > 2
    assert "France" in "".join(first.promotes)


assert set(POST_NORMS) | set(SPLITS) >= set(TODAYS) - {"modernbert"}  # every decoder family is tested
