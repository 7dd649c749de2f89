"""attnviz token --tokens: several tokens at once, their rows and columns summed (and averaged), equal to the sum of
each token's own, on every input path; one token's output as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
from attnviz.base.records import to_json
from attnviz.errors import SelectionError
from helpers import one_line_error, run

TEXT = "the cat sat on the mat because the cat was tired"


def _json(printed) -> dict:
    assert printed.exit_code == 0, printed.output
    return json.loads(printed.stdout)


def test_several_tokens_are_the_sum_of_each(tiny_model_dir):
    folder = tiny_model_dir("bert")
    capture = attnviz.capture(TEXT, model=folder)
    both = attnviz.token(capture, tokens="2,3").to_dict()
    alone = [attnviz.token(capture, tokens=str(j)).to_dict() for j in (2, 3)]
    for side in ("attends_to", "attended_by"):
        np.testing.assert_allclose(both[f"{side}_sum"], alone[0][f"{side}_sum"] + alone[1][f"{side}_sum"], atol=1e-6)
        np.testing.assert_allclose(both[f"{side}_mean"], both[f"{side}_sum"] / 2, atol=1e-7)
    one = attnviz.token(capture, 2).to_dict()  # a group of one is that token's own row and column
    np.testing.assert_array_equal(alone[0]["attends_to_sum"], one["attends_to"])
    np.testing.assert_array_equal(alone[0]["attended_by_sum"], one["attended_by"])
    np.testing.assert_allclose(np.asarray(alone[0]["attends_to_sum"]).sum(-1), 1.0, atol=1e-5)  # a row of α
    assert attnviz.token(capture, tokens=[2, "3"]).group == (2, 3)
    assert attnviz.token(capture, tokens="cat#2,2-4,3").group == (9, 2, 3, 4)  # texts, ranges; each once
    assert attnviz.token(capture, tokens="-2--1").group == (len(capture.tokens) - 2, len(capture.tokens) - 1)


def test_each_input_path_gives_the_functions_json(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("bert")
    expected = json.loads(to_json(attnviz.token(TEXT, model=folder, tokens="cat#1,sat").to_dict()))
    file = tmp_path / "t.txt"
    file.write_text(TEXT, encoding="utf-8")
    saved = attnviz.capture(TEXT, model=folder).save(tmp_path / "c.npz")
    for args, stdin in (([TEXT], None), (["-"], TEXT), (["--text-file", file], None), (["--from", saved], None)):
        shown = _json(run("token", *args, "-m", folder, "--tokens", "cat#1,sat", "--json", input=stdin))
        assert shown == expected and shown["group"] == [2, 3] and shown["tokens"] == expected["tokens"]
    drawn = run("token", TEXT, "-m", folder, "--tokens", "2-3", "-o", tmp_path / "t.png")
    assert drawn.exit_code == 0 and "tokens 2, 3" in drawn.stdout and (tmp_path / "t.png").exists()
    rows = run("token", TEXT, "-m", folder, "--tokens", "2-3", "--csv").stdout.splitlines()
    assert rows[0].startswith("layer,head,other") and len(rows) > 1


@pytest.mark.parametrize("args, words", [
    (["--tokens", ","], "empty"), (["--tokens", "40"], "out of range"), (["--tokens", "4-2"], "reversed"),
    (["2", "--tokens", "2,3"], "not both"), (["--tokens", "dog"], "no token 'dog'"),
])
def test_refusals_are_one_line(args, words, tiny_model_dir):
    assert words in one_line_error(run("token", TEXT, *args, "-m", tiny_model_dir("bert")), 2)


def test_a_run_asks_it_too(tiny_model_dir):
    m = attnviz.load(tiny_model_dir("bert"))
    r = m.run(TEXT)
    assert json.loads(to_json(r.token(tokens="2,3").to_dict())) == json.loads(
        to_json(attnviz.token(TEXT, model=m, tokens="2,3").to_dict()))
    assert r.passes == 1


# --- heatmap --tokens -----------------------------------------------------------------------------------------


def test_heatmap_selection_is_the_selected_rows_and_columns_of_alpha(tiny_model_dir):
    """heatmap --tokens: each panel one row more, the mean of the selected rows, and one column more, the sum of
    the selected columns (as numpy takes them from the capture's α); the JSON's α is α without them, with both
    sums and means; the labels of the selected tokens marked."""
    capture = attnviz.capture(TEXT, model=tiny_model_dir("bert"))
    shown = attnviz.heatmap(capture, layer="0,1", head="0,mean", tokens="cat#1,sat")
    alpha = capture.attentions.astype(np.float64)  # (L, H, T, T)
    assert shown.selection == (2, 3) and len(shown.page.panels) == 4
    for panel, record in zip(shown.page.panels, shown.to_dict()["panels"]):
        a = alpha[panel.layer].mean(0) if panel.head == "mean" else alpha[panel.layer, panel.head]
        T = a.shape[0]
        assert panel.matrix.shape == (T + 1, T + 1) and panel.summary
        np.testing.assert_allclose(panel.matrix[:T, :T], a, atol=1e-6)
        np.testing.assert_allclose(panel.matrix[T, :T], a[[2, 3]].mean(0), atol=1e-6)
        np.testing.assert_allclose(panel.matrix[:T, T], a[:, [2, 3]].sum(1), atol=1e-6)
        assert panel.rows[2].startswith("▸") and panel.cols[3].startswith("▸") and not panel.rows[4].startswith("▸")
        assert panel.rows[T] == "mean ▸" and panel.cols[T] == "Σ ▸"
        np.testing.assert_allclose(record["alpha"], a, atol=1e-6)
        assert len(record["rows"]) == T and not record["rows"][2].startswith("▸")
        chosen = record["selection"]
        np.testing.assert_allclose(chosen["rows_sum"], a[2] + a[3], atol=1e-6)
        np.testing.assert_allclose(chosen["rows_mean"], (a[2] + a[3]) / 2, atol=1e-6)
        np.testing.assert_allclose(chosen["cols_sum"], a[:, 2] + a[:, 3], atol=1e-6)
        np.testing.assert_allclose(chosen["cols_mean"], (a[:, 2] + a[:, 3]) / 2, atol=1e-6)
    # the same rows as token --tokens sums, head by head
    group = attnviz.token(capture, tokens="2,3", layer=0).to_dict()
    np.testing.assert_allclose(group["attends_to_sum"][0][0], shown.to_dict()["panels"][0]["selection"]["rows_sum"],
                               atol=1e-6)


def test_heatmap_selection_with_special_tokens_hidden_and_a_causal_mask(tiny_model_dir):
    bert = attnviz.capture(TEXT, model=tiny_model_dir("bert"))
    shown = attnviz.heatmap(bert, layer=0, head=1, tokens="2,3", hide_special=True)
    a = bert.attentions[0, 1][1:-1, 1:-1].astype(np.float64)  # [CLS] and [SEP] left out
    assert shown.local == (1, 2)
    np.testing.assert_allclose(shown.page.panels[0].matrix[-1, :-1], a[[1, 2]].mean(0), atol=1e-6)
    with pytest.raises(SelectionError, match="special token"):
        attnviz.heatmap(bert, tokens="0,2", hide_special=True)
    gpt = attnviz.capture(TEXT, model=tiny_model_dir("gpt2"))
    panel = attnviz.heatmap(gpt, layer=0, head=0, tokens="1,3").page.panels[0]
    T = gpt.n_tokens
    # the mean row hides the keys every selected row hides (after token 3); the sum column hides nothing
    assert panel.hidden[T, :T].tolist() == [j > 3 for j in range(T)] and not panel.hidden[:, T].any()
    np.testing.assert_allclose(panel.matrix[T, :4].sum(), 1.0, atol=1e-5)  # the mean of two rows of α


def test_heatmap_selection_on_every_input_path_and_drawn(tiny_model_dir, tmp_path):
    folder = tiny_model_dir("bert")
    expected = json.loads(to_json(attnviz.heatmap(TEXT, model=folder, tokens="cat#1,sat").to_dict()))
    file = tmp_path / "t.txt"
    file.write_text(TEXT, encoding="utf-8")
    for args, stdin in (([TEXT], None), (["-"], TEXT), (["--text-file", file], None)):
        shown = _json(run("heatmap", *args, "-m", folder, "--tokens", "cat#1,sat", "--json", input=stdin))
        assert shown == expected and shown["selection"]["tokens"] == [2, 3]
        assert shown["selection"]["texts"] == ["cat", "sat"]
    drawn = run("heatmap", TEXT, "-m", folder, "--tokens", "2-3", "-t", "--values")
    assert drawn.exit_code == 0 and "mean ▸" in drawn.stdout and "▸ selected: 'cat' + 'sat'" in drawn.stdout
    assert run("heatmap", TEXT, "-m", folder, "--tokens", "2,3", "-o", tmp_path / "h.png").exit_code == 0
    assert (tmp_path / "h.png").stat().st_size > 0


@pytest.mark.parametrize("args, words", [
    (["--tokens", ","], "empty"), (["--tokens", "40"], "out of range"), (["--tokens", "dog"], "no token 'dog'"),
    (["--tokens", "2", "--rows", "0-3"], "window"),
])
def test_heatmap_selection_refusals_are_one_line(args, words, tiny_model_dir):
    assert words in one_line_error(run("heatmap", TEXT, *args, "-m", tiny_model_dir("bert")), 2)
