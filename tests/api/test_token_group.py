"""attnviz token --tokens: several tokens at once, their rows and columns summed (and averaged), equal to the sum of
each token's own, on every input path; one token's output as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnviz
from attnviz.base.records import to_json
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
