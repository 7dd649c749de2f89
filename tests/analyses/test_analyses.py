"""Every registered analysis: one module with its options dataclass, compute(run, options) and its command; the
command line's options are made from the dataclass, so a flag, its Python keyword and the function's keyword are
the same word with the same default."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

import attnviz
from attnviz import analyses
from attnviz.cli import COMMANDS, command_group
from helpers import one_line_error, run

# registered analyses without a top-level function of their name: serve is attnviz.load(...).serve() (attnviz.serve
# is the app's package)
METHOD_ONLY = {"serve": "Model"}


def test_every_command_is_a_registered_analysis_in_the_command_lines_order():
    assert analyses.available() == tuple(COMMANDS)


@pytest.mark.parametrize("name", analyses.available())
def test_the_options_are_the_flags_and_the_keywords(name):
    analysis = analyses.get(name)
    assert analysis.name == name and analysis.summary
    fields = {f.name: f.default for f in dataclasses.fields(analysis.options)}
    command = command_group().commands[name]
    flags = {p.name: p.default for p in command.params if not p.hidden}
    assert set(fields) <= set(flags)
    assert {k: flags[k] for k in fields} == fields  # the same word, the same default
    assert command.help == analysis.summary
    if name in METHOD_ONLY:  # the options are the method's only definition: nothing to drift from
        assert callable(getattr(getattr(attnviz, METHOD_ONLY[name]), name))
        return
    function = inspect.signature(getattr(attnviz, name.replace("-", "_")))
    assert {k: function.parameters[k].default for k in fields} == fields  # the function's keywords too


def test_an_old_spelling_still_works_hidden(minilm):
    from attnviz.cli.options import parameters

    hidden = [p for p in parameters(analyses.get("heads").options) if p.name.startswith("descending__")]
    assert hidden and all(p.annotation.__metadata__[0].hidden for p in hidden)
    shown = run("heads", "--help", env={"COLUMNS": "200"}).stdout
    assert "--descending" in shown and "--desc " not in shown
    runs = {flag: json.loads(run("heads", "the cat sat", "--sort", "entropy", "--top", "2", flag, "--json").stdout)
            for flag in ("--desc", "--descending", "--asc", "--ascending")}
    assert runs["--desc"] == runs["--descending"] != runs["--asc"] == runs["--ascending"]


def test_circuits_top_is_pairs_and_listed_is_its_flag(tiny_lm_dir):
    """circuits had --top (the heads listed) on the command line and top= (the QK pairs kept) in Python, with
    different defaults; now --pairs/pairs= and --listed/listed=, --top a hidden alias of --listed, top= of pairs=
    with a DeprecationWarning."""
    folder = tiny_lm_dir("llama")
    model = attnviz.load_model(folder, lm_head="auto")
    new = attnviz.circuits(model=model, tokens=20, pairs=2, listed=3).to_dict()
    with pytest.warns(DeprecationWarning, match="pairs"):
        old = attnviz.circuits(model=model, tokens=20, top=2, listed=3).to_dict()
    assert old == new
    flags = {flag: json.loads(run("circuits", "-m", folder, "--tokens", "20", "--pairs", "2", flag, "3",
                                  "--json").stdout) for flag in ("--listed", "--top")}
    assert flags["--listed"] == flags["--top"] == json.loads(json.dumps(new))
    assert attnviz.load(model).circuits(tokens=20, pairs=2, listed=3).to_dict() == new


def test_a_run_asks_the_registry(tiny_model_dir):
    m = attnviz.load(tiny_model_dir("bert"))
    run_ = m.run("the cat sat on the mat")
    assert analyses.get("heads")(run_, sort="entropy", top=3).to_dict() == run_.heads(sort="entropy", top=3).to_dict()
    with pytest.raises(TypeError):
        run_.heads(no_such_option=1)  # an option the analysis does not have: Python's own error


def test_the_registry_is_attnviz_analyses_and_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, attnviz\nprint(len(attnviz.analyses.available()), 'torch' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    assert shown == [str(len(analyses.available())), "False"]


def test_importing_the_registry_imports_no_analysis():
    import subprocess
    import sys

    code = ("import sys, attnviz.analyses\n"
            "print(sorted(m for m in sys.modules if m.startswith('attnviz.analyses.')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


@pytest.mark.parametrize("name, flags, keywords", [
    ("heatmap", ["--layer", "all", "--head", "0-1"], {"layer": "all", "head": "0-1"}),
    ("norms", ["--layer", "0-1", "--head", "mean"], {"layer": "0-1", "head": "mean"}),
    ("steps", ["--layer", "-1", "--head", "1"], {"layer": -1, "head": 1}),
])
def test_a_selection_reaches_the_function_as_the_flag_gave_it(name, flags, keywords, tiny_model_dir):
    """Layers and heads: a selection of several stays one (heatmap --layer all), a one-index option gives the
    index (steps --layer -1)."""
    folder = tiny_model_dir("bert")
    printed = run(name, "the cat sat on the mat", *flags, "-m", folder, "--json")
    assert printed.exit_code == 0, printed.output
    expected = getattr(attnviz, name)("the cat sat on the mat", model=attnviz.load(folder), **keywords).to_dict()
    from attnviz.base.records import to_json

    assert json.loads(printed.stdout) == json.loads(to_json(expected))


@pytest.mark.parametrize("args, both", [
    (["heads", "the cat", "--sort", "entropy", "--top", "2", "--desc", "--ascending"], "--ascending and --desc"),
    (["patch", "the cat sat", "the dog sat", "--noise", "--direction", "denoise"], "--direction and --noise"),
    (["circuits", "--top", "3", "--listed", "4"], "--listed and --top"),
])
def test_an_option_given_two_ways_that_disagree_is_refused(args, both):
    """An old spelling beside the new one: the same value is taken, different ones are a usage error (exit 2)
    before anything loads."""
    line = one_line_error(run(*args, "-m", "no-such-model-folder"), 2)
    assert both in line and "disagree" in line


@pytest.mark.parametrize("command, argument, spelled", [
    ("verify", "source", "--from"), ("heatmap", "text", "TEXT"), ("explain", "term", "TERM"),
    ("export", "out_dir", "--out-dir"), ("generate", "output", "--output"), ("heatmap", "cell", "--cell"),
    ("corpus", "batch_size", "--batch-size"), ("heads", "descending", "--descending"),
    ("heads", "max_length", "--max-length"), (None, "max_length", "--max-length")])
def test_an_error_names_the_argument_as_the_running_command_spells_it(command, argument, spelled):
    """No table of renames: the spelling is the running command's own parameter of that name (its first long
    flag, or an argument's metavar); outside a command, --the-argument-name."""
    from typer._click import Context

    from attnviz.cli.output import flag

    if command is None:
        assert flag(argument) == spelled
        return
    with Context(command_group().commands[command]):
        assert flag(argument) == spelled


def test_the_docs_command_table_is_the_registry():
    """docs/commands.md's table of commands is made from the registry (python scripts/make_samples.py --tables)."""
    import re
    from pathlib import Path

    from attnviz.cli.reference import command_table

    text = (Path(__file__).resolve().parents[2] / "docs" / "commands.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- commands:start -->\n(.*?)<!-- commands:end -->", text, re.S)
    assert block is not None, "docs/commands.md lost its commands markers"
    assert block.group(1) == command_table()
    assert all(f"| `{name}` |" in block.group(1) for name in analyses.available())


def test_an_analysis_that_does_not_intervene_reads_the_runs_one_pass(tiny_lm_dir, tmp_path):
    """The registry's word that an analysis reads the run (intervenes=False) is what the model's own counter says:
    each of them, asked of a run that has made its pass, leaves it at that one pass; every one declared to
    intervene makes more."""
    m = attnviz.load(tiny_lm_dir("gpt2"))
    inputs = {"token": ("cat",), "compare": ()}
    reading = [n for n in analyses.available() if analyses.get(n).reads == "run" and not analyses.get(n).intervenes]
    assert {"heads", "contributions", "logit-attr", "export", "token"} <= set(reading)
    for name in reading:
        run_ = m.run("the cat sat on the mat")
        assert run_.capture is not None and run_.passes == 1
        options = {"out_dir": tmp_path / name, "workers": 1} if name == "export" else {}
        analyses.get(name)(run_, *inputs.get(name, ()), **options)
        assert run_.passes == 1, name
    intervening = {"steps": {}, "verify": {}, "scaling": {}, "massive": {}, "importance": {},
                   "ablate": {"heads": "0.0"}, "faithfulness": {"methods": ["attention"], "sanity": 0}}
    assert set(intervening) <= {n for n in analyses.available() if analyses.get(n).intervenes}
    for name, options in intervening.items():
        run_ = m.run("the cat sat on the mat")
        assert run_.capture is not None and run_.passes == 1
        analyses.get(name)(run_, **options)
        assert run_.passes > 1, name
