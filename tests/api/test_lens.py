"""attnviz lens: each layer's stream read through the final norm and the unembedding, against the model's own
hidden states read the same way by hand, the last row against the model's own output, on every input path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import attnviz
from attnviz.base.records import to_json
from attnviz.errors import AttnvizError
from helpers import one_line_error, run

PROMPT = "the cat sat on the mat and the cat"


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_every_layer_is_the_hidden_state_read_by_hand(kind, tiny_lm_dir):
    """Row n is HF's hidden_states[n] (the embeddings, then each block's output) through the final norm and the
    head, computed here from output_hidden_states: top tokens, their p, the target's p and rank; the last row
    is the model's own softmax (≤ LENS_TOLERANCE), as the result says."""
    folder = tiny_lm_dir(kind)
    m = attnviz.load_model(folder, lm_head=True)
    result = attnviz.lens(PROMPT, model=m, positions="all", top=3, target=" cat" if kind == "gpt2" else "cat")
    encoded = m.tokenizer(PROMPT, return_tensors="pt")
    with torch.inference_mode():
        out = m.model(**encoded, output_hidden_states=True)
    base = m.model.base_model
    norm = getattr(base, "norm", None) or base.ln_f
    states = list(out.hidden_states[:-1]) + [None]  # HF's last state has the final norm applied already
    L = len(out.hidden_states) - 1
    assert result.top.shape[:2] == (L + 1, len(result.tokens)) and result.positions == tuple(range(len(result.tokens)))
    target = m.tokenizer.convert_tokens_to_ids(m.tokenizer.tokenize(result.target))[0]
    for n, state in enumerate(states):
        with torch.inference_mode():
            logits = (out.logits[0] if state is None else m.model.get_output_embeddings()(norm(state))[0]).double()
        p = torch.softmax(logits, -1).numpy()
        order = np.argsort(-p, axis=-1, kind="stable")[:, :3]
        np.testing.assert_allclose(result.top_p[n], np.take_along_axis(p, order, -1), atol=1e-6)
        np.testing.assert_allclose(result.target_p[n], p[:, target], atol=1e-6)
        assert (result.target_rank[n] == (logits.numpy() > logits.numpy()[:, target:target + 1]).sum(-1)).all()
    assert result.model_diff <= attnviz.LENS_TOLERANCE
    js = result.to_dict()
    assert len(js["layers"]) == (L + 1) * len(result.tokens)
    assert js["layers"][0]["stream"] == "embeddings" and js["layers"][0]["layer"] is None
    assert js["layers"][-1]["layer"] == L - 1 and js["layers"][-1]["position"] == len(result.tokens) - 1
    assert json.loads(json.dumps(js)) == js  # plain JSON


def test_a_run_reads_its_one_pass(tiny_lm_dir):
    folder = tiny_lm_dir("llama")
    m = attnviz.load(folder)
    r = m.run(PROMPT)
    r.heads()
    on_run, alone = r.lens(top=4).to_dict(), attnviz.lens(PROMPT, model=m, top=4).to_dict()
    assert r.passes == 1  # the streams were kept by the run's first pass
    # the check differs by what it is checked against: the run's pass was made before the head was attached (the
    # head applied to the final norm's own output: 0), the function's with it (the model's logits)
    assert on_run.pop("model_diff") <= attnviz.LENS_TOLERANCE and alone.pop("model_diff") <= attnviz.LENS_TOLERANCE
    assert on_run == alone


def test_each_input_path_gives_the_functions_json(tiny_lm_dir, tmp_path):
    folder = tiny_lm_dir("gpt2")
    expected = json.loads(to_json(attnviz.lens(PROMPT, model=folder, positions="-2,-1").to_dict()))
    file = tmp_path / "t.txt"
    file.write_text(PROMPT, encoding="utf-8")
    for args, stdin in (([PROMPT], None), (["-"], PROMPT), (["--text-file", file], None)):
        printed = run("lens", *args, "-m", folder, "--positions", "-2,-1", "--json", input=stdin)
        assert printed.exit_code == 0, printed.output
        shown = json.loads(printed.stdout)
        assert shown == expected and shown["tokens"] == expected["tokens"]
    table = run("lens", PROMPT, "-m", folder, "--target", " cat", "-o", tmp_path / "l.png")
    assert table.exit_code == 0 and "what each layer predicts" in table.stdout and "embeddings" in table.stdout
    assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"


def test_refusals_are_one_line(tiny_model_dir, tiny_lm_dir):
    line = one_line_error(run("lens", PROMPT, "-m", tiny_model_dir("bert")), 1)
    assert "causal language model" in line
    folder = tiny_lm_dir("llama")
    assert "position 40 is out of range" in one_line_error(run("lens", PROMPT, "-m", folder, "--positions", "40"), 2)
    assert "5-2" in one_line_error(run("lens", PROMPT, "-m", folder, "--positions", "5-2"), 2)
    assert "--top" in one_line_error(run("lens", PROMPT, "-m", folder, "--top", "21"), 2)
    with pytest.raises(AttnvizError, match="target"):
        attnviz.lens(PROMPT, model=folder, target="")


def test_the_figure_draws_into_the_callers_axes(tiny_lm_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = attnviz.lens(PROMPT, model=tiny_lm_dir("llama"), positions="0-3")
    fig, ax = plt.subplots()
    assert result.figure(ax=ax) is ax and len(ax.images) == 1 and ax.images[0].get_array().shape == (3, 4)
    plt.close(fig)
