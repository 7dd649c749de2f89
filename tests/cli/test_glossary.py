"""attnviz explain: every header and legend abbreviation any command prints has an entry, and the terms a
newcomer looks for are found."""

from __future__ import annotations

import json
import re

import pytest
from helpers import explainable, one_line_error, run, TEXTS






@pytest.fixture(scope="module")
def every_output(tmp_path_factory, tiny_model_dir, tiny_lm_dir):
    folder = tmp_path_factory.mktemp("outputs")
    (folder / "t.txt").write_text("\n".join(TEXTS) + "\n")
    bert, lm = tiny_model_dir("bert"), tiny_lm_dir("gpt2")
    it = "The cat sat on the mat because it was tired"
    runs = [["heads", it, "-m", bert], ["entropy", it, "-m", bert], ["sinks", it, "-m", bert],
            ["norms", it, "-m", bert], ["verify", it, "-m", bert], ["scaling", it, "-m", bert],
            ["positions", it, "-m", bert], ["steps", it, "-m", bert], ["token", it, "it", "-m", bert],
            ["corpus", folder / "t.txt", "-m", bert], ["generate", "the cat", "-m", lm, "-n", "3", "--terminal"],
            ["heads", it, "-m", bert, "--words"], ["rollout", it, "-m", bert], ["compare", it, "-m", bert],
            ["logit-attr", "the cat sat", "-m", lm, "--top", "3"], ["contributions", it, "-m", bert],
            ["faithfulness", "the cat sat on the", "-m", lm, "--methods", "attention,loo,random"],
            ["faithfulness", "--corpus", folder / "six.txt", "-m", bert, "--methods", "attention,loo,random"],
            ["patch", "the cat sat on the", "the dog sat on the", "-m", lm],
            ["discover", "the cat sat on the", "the dog sat on the", "-m", lm, "--answers", " mat, cat",
             "--method", "eap"],
            ["ablate", it, "-m", lm, "--heads", "0.1"], ["importance", it, "-m", lm],
            ["detect", "-m", lm, "--length", "10"],
            ["circuits", "-m", lm], ["massive", it, "-m", lm]]
    (folder / "six.txt").write_text("\n".join(TEXTS[:3] + [t + " again" for t in TEXTS[:3]]) + "\n")
    outputs = []
    from rich.table import Table

    add_column = Table.add_column
    for args in runs:
        headers: list[str] = []

        def recording(self, header="", *rest, headers=headers, **options):  # every table's headers, as made
            headers.append(str(header))
            return add_column(self, header, *rest, **options)

        Table.add_column = recording
        try:
            result = run(*args, env={"NO_COLOR": "1", "COLUMNS": "250"})
        finally:
            Table.add_column = add_column
        assert result.exit_code == 0, (args, result.output)
        outputs.append((args[0], result.stdout, [h for h in headers if h]))
    return outputs


@pytest.mark.slow
def test_every_table_header_has_an_explanation(every_output):
    tokens = {"[CLS]", "[SEP]"} | {w.lower() for w in "The cat sat on the mat because it was tired".split()}
    missing = {(command, cell) for command, _, headers in every_output for cell in headers
               if not explainable(cell, tokens)}
    assert not missing, "; ".join(f"{c}: {h}" for c, h in sorted(missing))
    assert sum(len(headers) for _, _, headers in every_output) > 100  # the walk found the tables
    assert {"faithfulness", "patch", "discover", "ablate", "importance"} <= {c for c, _, h in every_output if h}


@pytest.mark.slow
def test_legend_abbreviations_have_explanations(every_output):
    from attnviz.metrics import lookup

    compare = next(o for c, o, _ in every_output if c == "compare")
    legend = next(line for line in compare.splitlines() if line.startswith("H:"))
    for abbreviation in re.findall(r"(?:^|· )(\S+):", legend):
        assert lookup(abbreviation), abbreviation


@pytest.mark.parametrize("term", ["H", "d_k", "softmax", "entropy_tokens", "tok-w", "label_share", "by norm",
                                  "stream", "lift", "stripe", "√d_k", "T"])
def test_the_terms_a_newcomer_looked_for(term):
    result = run("explain", term)
    assert result.exit_code == 0 and term.split()[0] in result.stdout


def test_the_glossary_walk_can_fail():
    assert not explainable("no-such-header", set())


@pytest.mark.parametrize("typed, entry", [("LD", "logit difference"), ("ld", "logit difference"),
                                          ("logit difference", "logit difference"), ("value zeroing", "value zeroing"),
                                          ("value-zeroing", "value zeroing")])
def test_the_terms_of_patching_and_contributions_are_found(typed, entry):
    import json

    found = json.loads(run("explain", typed, "--json").stdout)
    assert [row["term"] for row in found] == [entry] and len(found[0]["definition"]) > 80


@pytest.mark.parametrize("typo, meant", [("entropi", "entropy"), ("prevv", "prev"), ("alingment heads",
                                                                                    "alignment heads"),
                                         ("rolout", "rollout"), ("logit diference", "logit difference")])
def test_a_typo_gets_a_did_you_mean(typo, meant):
    error = one_line_error(run("explain", typo), 2)
    assert f"did you mean {meant!r}" in error or f"or {meant!r}" in error


def test_a_word_that_is_nothing_like_a_term_says_how_to_see_them_all():
    from attnviz.api.stats import commands
    from attnviz.metrics import glossary

    error = one_line_error(run("explain", "zzzzqq"), 2)
    assert "did you mean" not in error and f"lists all {len(glossary()) + len(commands())}" in error


def test_explain_reads_the_registry_of_analyses():
    """Every command is explained (its summary and its options, from attnviz.analyses); a command that is also a
    term (rollout) gives both."""
    import dataclasses

    from attnviz import analyses

    every = json.loads(run("explain", "--json").stdout)
    explained = {e["term"]: e["definition"] for e in every if e["other"] == "command"}
    assert list(explained) == list(analyses.available())
    for name, definition in explained.items():
        analysis = analyses.get(name)
        assert definition.startswith(analysis.summary)
        assert all("--" + f.name.replace("_", "-") in definition for f in dataclasses.fields(analysis.options))
    assert [e["other"] for e in json.loads(run("explain", "rollout", "--json").stdout)] == ["", "command"]
    assert "did you mean 'heatmap'" in one_line_error(run("explain", "heatmp"), 2)
