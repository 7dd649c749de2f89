"""Every command's output at 80 columns and through a pipe: no word cut in two, no line padded with spaces.

A word is cut in two where a line ends in a piece and the next begins with the rest ("defaul" / "t"), or a
table cell is folded onto the next row ("norm_e" / "nt" in one column): the two pieces joined make a word of
the same command's output at 400 columns, and one of them alone does not."""

from __future__ import annotations

import re

import pytest
from helpers import run

BOX = re.compile(r"[\s│┃┆┊║╎─━┄┈═┼╋┿╂┬┴├┤┌┐└┘┏┓┗┛┡┩╇┯┷╭╮╯╰╞╡╪╤╧╘╛╒╕]+")


def words(text: str) -> set[str]:
    return {w for w in BOX.split(text) if w}


def pieces(line: str) -> list[tuple[int, str]]:
    """(column, word) of each word of a line."""
    return [(m.start(), m.group()) for m in re.finditer(r"[^\s│┃┆┊║╎─━┄┈═┼╋┿╂┬┴├┤┌┐└┘┏┓┗┛┡┩╇┯┷╭╮╯╰]+", line)]


def cut_words(narrow: str, wide: str) -> list[str]:
    known = words(wide)

    def cut(a: str, b: str) -> bool:  # (shading like ░▒ is not a word)
        return a + b in known and (a not in known or b not in known) and any(c.isalpha() for c in a + b)

    found = []
    lines = narrow.splitlines()
    for above, below in zip(lines, lines[1:]):
        top, bottom = pieces(above), pieces(below)
        if top and bottom and cut(top[-1][1], bottom[0][1]):  # a line's last word and the next line's first
            found.append(f"{top[-1][1]} / {bottom[0][1]}")
        starts = dict(top)
        found += [f"{starts[column]} / {word}" for column, word in bottom  # a table cell folded onto the next row
                  if column in starts and cut(starts[column], word)]
    return found


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("width")
    path = folder / "c.npz"
    assert run("capture", "The cat sat on the mat and the dog ran in the park", "-m", tiny_model_dir("bert"),
               "-o", path).exit_code == 0
    return path


def commands(saved, model):
    text = "The cat sat on the mat"
    return {
        "heatmap": ["heatmap", "--from", saved, "-t", "--layer", "0", "--head", "0"],
        "heads": ["heads", "--from", saved],
        "heads sorted": ["heads", "--from", saved, "--sort", "induct"],
        "entropy": ["entropy", "--from", saved],
        "rollout": ["rollout", "--from", saved],
        "token": ["token", "cat", "--from", saved],
        "compare": ["compare", "--from", saved, "--layers", "0-1"],
        "explain": ["explain"],
        "explain term": ["explain", "induction"],
        "verify": ["verify", text, "-m", model],
        "scaling": ["scaling", text, "-m", model],
        "steps": ["steps", text, "-m", model, "--layer", "0", "--head", "0"],
        "norms": ["norms", text, "-m", model],
        "sinks": ["sinks", text, "-m", model],
        "positions": ["positions", text, "-m", model],
        "error": ["heatmap", "--from", saved, "--layer", "9"],
    }


NAMES = list(commands("x", "y"))


@pytest.mark.parametrize("name", NAMES)
def test_no_word_is_cut_in_two_at_80_columns_and_no_line_is_padded(name, saved, tiny_model_dir):
    args = commands(saved, tiny_model_dir("bert"))[name]
    wide = run(*args, env={"COLUMNS": "400", "NO_COLOR": "1"}, terminal_width=400)
    narrow = run(*args, env={"COLUMNS": "80", "NO_COLOR": "1"}, terminal_width=80)
    assert narrow.exit_code == wide.exit_code
    for stream in ("stdout", "stderr"):
        seen = getattr(narrow, stream)
        cut = cut_words(seen, getattr(wide, stream))
        assert not cut, f"{name} {stream} at 80 columns cuts words: {cut[:8]}\n{seen}"
        if stream == "stdout":  # (an error is one line in a pipe, for grep and logs; a terminal wraps it)
            assert all(len(line) <= 80 for line in seen.splitlines()), seen
        padded = [line for line in seen.splitlines() if line != line.rstrip()]
        assert not padded, f"{name} {stream}: lines padded with spaces: {padded[:3]}"


def test_the_detector_finds_a_cut_word_and_a_folded_cell():
    wide = "the default value\n norm_ent  max \n"
    assert cut_words("the defaul\nt value", wide) == ["defaul / t"]
    assert cut_words(" norm_e  max\n nt       0.1", wide) == ["norm_e / nt"]
    assert cut_words("the default\nvalue", wide) == []


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_progress_line_fits_the_terminal_with_its_timer(width):
    """detect's label ("Removing the induction heads, then as many random heads") at 80 columns cut the timer
    off; the line now fits, the counts, unit and elapsed time whole, the label shortened with … if it must."""
    import io

    from rich.console import Console

    from attnviz.cli.output import progress_bar

    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None, record=True)
    label = "Removing the induction heads, then as many random heads"
    bar = progress_bar(label, 120, "runs", console)
    task = bar.add_task(label, total=120)
    bar.advance(task, 7)
    console.print(bar.get_renderable())
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) <= width
    assert re.search(r"7/120 runs 0:00:0\d$", lines[0].rstrip())
    assert lines[0].startswith(label if width >= 120 else label[:10])


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_conversions_bar_keeps_its_step_and_shortens_the_model(width, monkeypatch):
    """`…GGUF, once: Joini…` at 80 columns lost the step's name: the model's name is shortened first, and where
    even the step does not fit, the step is what is shown."""
    import io

    from rich.console import Console

    from attnviz.cli import output
    from attnviz.cli.params import Converting

    model, step = "Qwen2.5-Coder-1.5B-Instruct.GGUF", "Joining the 22 parts into one GGUF file"
    asked = []
    monkeypatch.setattr(output.CliReporter, "progress", lambda self, what, total, unit, keep="", joiner="":
                        asked.append((what, keep, joiner)))
    Converting(model).progress(step, 22, "parts")
    assert asked == [(model, step, ", once: ")]
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None, record=True)
    bar = output.progress_bar(model, 22, "parts", console, keep=step, joiner=", once: ")
    task = bar.add_task("", total=22)
    bar.advance(task, 3)
    console.print(bar.get_renderable())
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) <= width and re.search(r"3/22 parts 0:00:0\d$", lines[0].rstrip())
    assert (step in lines[0]) == (width >= 80) and lines[0].startswith("Joining" if width < 80 else "Qwen")
    assert (f"{model}, once: {step}" in lines[0]) == (width >= 120)
