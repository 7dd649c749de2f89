"""The head-statistics commands: heads, entropy, compare and rollout on the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SENTENCE, make_capture, run


def test_entropy_layers_and_the_american_spelling(tiny_model_dir):
    data = json.loads(run("entropy", SENTENCE, "-m", tiny_model_dir("bert"), "--layer", "1", "--json").stdout)["heads"]
    assert {r["layer"] for r in data} == {1}
    full = json.loads(run("entropy", SENTENCE, "-m", tiny_model_dir("bert"), "--json", "--normalized").stdout)["heads"]
    same = json.loads(run("entropy", SENTENCE, "-m", tiny_model_dir("bert"), "--json", "--normalised").stdout)["heads"]
    assert full == same and {r["uniform"] for r in full} == {1.0}


def test_compare_and_token_write_csv(tiny_model_dir):
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(run("compare", SENTENCE, "-m", tiny_model_dir("bert"), "--layers",
                                               "0,1", "--csv").stdout)))
    panels = json.loads(run("compare", SENTENCE, "-m", tiny_model_dir("bert"), "--layers", "0,1", "--json").stdout)
    assert [int(r["layer"]) for r in rows] == [p["layer"] for p in panels["panels"]]
    assert float(rows[0]["entropy"]) == pytest.approx(panels["panels"][0]["entropy"])
    data = json.loads(run("token", SENTENCE, "cat", "-m", tiny_model_dir("bert"), "--json").stdout)
    rows = list(csv.DictReader(io.StringIO(run("token", SENTENCE, "cat", "-m", tiny_model_dir("bert"),
                                               "--csv").stdout)))
    T = len(data["tokens"])
    assert len(rows) == len(data["layers"]) * 4 * T
    row = rows[T + 3]  # layer 0, head 1, other token 3
    assert float(row["attends_to"]) == pytest.approx(data["attends_to"][0][1][3], abs=1e-6)
    assert float(row["attended_by"]) == pytest.approx(data["attended_by"][0][1][3], abs=1e-6)


def test_compare_json_rows_window_and_panels_per_row(tmp_path):
    rng = np.random.default_rng(4)
    T = 12
    cap = make_capture(rng.dirichlet(np.ones(T), size=(4, 2, T)).astype(np.float32)).save(tmp_path / "c.npz")
    data = json.loads(run("compare", "--from", cap, "--layers", "0,3", "--json").stdout)
    assert [p["layer"] for p in data["panels"]] == [0, 3]
    np.testing.assert_allclose(np.array(data["panels"][1]["alpha"]), np.load(cap)["attentions"][3].mean(0),
                               rtol=1e-6)
    text = run("compare", "--from", cap, "--layers", "0-3", "--rows", "2-4", env={"NO_COLOR": "1", "COLUMNS": "80"})
    assert text.exit_code == 0 and "showing queries 2–4" in text.stdout
    rows = [line for line in text.stdout.splitlines() if line.split()[:2] in (["2", "t2"], ["3", "t3"], ["4", "t4"])]
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    assert len(rows) == 3 * 2  # 3 query rows, in two rows of panels


@pytest.mark.slow
def test_one_repeated_word_labels_no_induction_head_on_minilm():
    """"The cat sat on the mat" repeats one token ("the"): too few to test for induction or duplicate-token
    heads, so no head is labelled so (MiniLM's layer 5 stripes on "cat" among them), and the table says why."""
    done = run("heads", SENTENCE, "--json")
    labels = {r["label"] for r in json.loads(done.stdout)["heads"]}
    assert done.exit_code == 0 and not labels & {"induction", "duplicate-token"} and "vertical" in labels
    table = run("heads", SENTENCE, env={"COLUMNS": "200"})
    assert "not enough repeats to test (1 token of the text occurred before; the tests need 4)" in table.stdout


def test_the_sort_column_is_always_shown_and_top_says_of_how_many(tmp_path):
    """At 80 columns the table leaves columns out, never the one the rows are sorted by; --top N says which N
    of how many heads it shows."""
    import re

    from attnviz.render.tables import head_columns

    rng = np.random.default_rng(5)
    cap = make_capture(rng.dirichlet(np.ones(6), size=(2, 4, 6)).astype(np.float32)).save(tmp_path / "c.npz")
    wide = run("heads", "--from", cap, env={"COLUMNS": "80", "NO_COLOR": "1"}).stdout
    hidden = re.search(r"not shown at this width: ([^(]+)", wide).group(1).replace(",", " ").split()
    last = hidden[-1]  # the last column of the registry, left out at 80 columns
    key = next(k for k, header, _w, _t in head_columns() if header == last)
    sorted_table = run("heads", "--from", cap, "--sort", last, "--top", "3", env={"COLUMNS": "80", "NO_COLOR": "1"})
    lines = sorted_table.stdout.splitlines()
    header = next(line for line in lines if "label" in line.split() or last in line.split())
    assert last in header.split() and max(len(line) for line in lines) <= 80
    assert last not in re.search(r"not shown at this width: ([^(]+)", sorted_table.stdout).group(1)
    assert f"highest 3 of 8 heads by {key}" in sorted_table.stdout
    shown = json.loads(run("heads", "--from", cap, "--sort", last, "--top", "3", "--json").stdout)["heads"]
    values = [r[key] for r in shown]
    assert values == sorted(values, reverse=True)[:3]


def test_the_rollout_picture_shows_the_input_text(tiny_model_dir):
    import attnviz

    drawn = attnviz.rollout(SENTENCE, model=tiny_model_dir("bert"), device="cpu").figure(cmap="magma")
    texts = [t.get_text() for t in drawn.figure.texts]
    assert any(f"“{SENTENCE}”" in t for t in texts), texts
    assert drawn.images[0].get_cmap().name == "magma"


def random_capture(L: int, H: int, T: int, seed: int):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(L, H, T, T)) * 2
    alpha = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return make_capture(alpha)


def test_heads_top_keeps_the_highest_unless_asked_for_the_lowest(tmp_path):
    """--top N with --sort: the N highest of that column, highest first (--asc: the N lowest); --top without
    --sort is a usage error."""
    path = random_capture(3, 4, 7, 11).save(tmp_path / "c.npz")
    every = json.loads(run("heads", "--from", path, "--json").stdout)["heads"]
    prev = sorted(r["prev"] for r in every)
    assert len(set(prev)) == 12  # twelve different values: an order that ignored them would show
    top = run("heads", "--from", path, "--sort", "prev", "--top", "3", "--json")
    assert [r["prev"] for r in json.loads(top.stdout)["heads"]] == prev[::-1][:3]
    low = run("heads", "--from", path, "--sort", "prev", "--top", "3", "--asc", "--json")
    assert [r["prev"] for r in json.loads(low.stdout)["heads"]] == prev[:3]
    both = json.loads(run("heads", "--from", path, "--sort", "prev", "--desc", "--json").stdout)["heads"]
    assert [r["prev"] for r in both] == prev[::-1]
    ascending = json.loads(run("heads", "--from", path, "--sort", "prev", "--json").stdout)["heads"]
    assert [r["prev"] for r in ascending] == prev
    table = run("heads", "--from", path, "--sort", "prev", "--top", "3", env={"COLUMNS": "120"}).stdout
    assert "highest 3 of 12 heads by prev" in table
    assert "lowest 3 of 12 heads by prev" in run("heads", "--from", path, "--sort", "prev", "--top", "3",
                                                 "--asc").stdout
    bare = run("heads", "--from", path, "--top", "3")
    assert bare.exit_code == 2 and "--sort" in bare.stderr and bare.stdout == ""


def test_heads_sorts_a_missing_value_last_in_both_orders(monkeypatch):
    """A metric that does not apply to a head (NaN) sorts after every number, ascending and descending."""
    import attnviz
    from attnviz import metrics

    real = metrics.head_records

    def some_missing(capture, queries=None):
        records = real(capture, queries)
        for r in records[::3]:
            r["prev"] = float("nan")
        return records

    monkeypatch.setattr(metrics, "head_records", some_missing)
    capture = random_capture(2, 3, 7, 5)
    for descending in (False, True):
        values = [r["prev"] for r in attnviz.heads(capture, sort="prev", descending=descending).records]
        known = [v for v in values if v == v]
        assert len(known) == 4 and known == sorted(known, reverse=descending)
        assert all(v != v for v in values[4:])
