"""Every command's --help prints its texts as they are written: a bracket is text, never Rich markup (which
dropped `[ray]` from `pip install "attnviz[ray]"`)."""

from __future__ import annotations

import re

import pytest
from helpers import run

from attnviz.cli.group import COMMANDS, app


def bracketed(text: str) -> list[str]:
    return re.findall(r"\[[^\]\n]*\]", text or "")


def squeezed(text: str) -> str:
    return re.sub(r"[\s│╭╮╰╯─]+", "", text)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_bracket_in_a_help_text_is_printed(name):
    import typer.main

    command = typer.main.get_command(app).get_command(None, name)
    texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
    shown = squeezed(run(name, "--help", env={"COLUMNS": "400"}).stdout)
    for part in (b for t in texts for b in bracketed(t)):
        assert squeezed(part) in shown, (name, part)
    assert "\\[" not in shown


def test_the_walk_finds_brackets_and_a_markup_reading_would_fail():
    """At least the --engine help holds one; and Rich's markup reading of it loses the bracket (what the test
    above catches)."""
    import typer.main
    from rich.text import Text

    command = typer.main.get_command(app).get_command(None, "faithfulness")
    engine = next(p.help for p in command.params if p.name == "engine")
    assert '"attnviz[ray]"' in engine and "[ray]" not in Text.from_markup(engine).plain
