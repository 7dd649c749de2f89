"""How the command line prints: plain text (never markup, control characters made visible), one-line
errors, JSON/CSV records on stdout, where -o writes, and how a library argument is spelled as a flag.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from attnviz.base.text import visible

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


class TrimmedConsole(Console):
    """A Console that, writing to a pipe or a file, leaves no spaces at the ends of lines (a table's cells are
    padded to its width, which a script reading the output does not want). In a terminal nothing changes."""

    def _render_buffer(self, buffer) -> str:
        text = super()._render_buffer(buffer)
        return text if self.is_terminal else _TRAILING.sub("", text)


_TRAILING = re.compile(r"[ \t]+(?=\n|$)")
out = TrimmedConsole()
err = TrimmedConsole(stderr=True)
# --- printing ----------------------------------------------------------------------------------------


def say(*parts: Any, console: Console | None = None, style: str = "", wrap: bool = False) -> None:
    """Print plain text (never markup), control characters made visible: on one logical line (paths), or
    wrapped to the terminal's width (sentences)."""
    text = Text(visible(" ".join(str(p) for p in parts)), style=style)
    (console or out).print(text, soft_wrap=not wrap, highlight=False)


# How the command line spells a library argument that an error names: its flag (the few arguments that are
# not flags by their own name are listed).
FLAG_NAMES = {"token_argument": "TOKEN", "text": "TEXT", "sources": "SOURCE", "source": "--from"}


def flag(name: str) -> str:
    """The command line's spelling of the library argument `name`: max_length -> --max-length."""
    return FLAG_NAMES.get(name) or "--" + name.replace("_", "-")


def error_line(message: str, label: str = "Error", console: Console | None = None) -> None:
    """One error or warning: one line for a pipe or a log; in a terminal narrower than the message, wrapped
    between words (a terminal left to itself breaks it mid-word)."""
    console = console or err
    line = Text.assemble((f"{label}:", "red" if label == "Error" else "yellow"), " ", visible(message))
    console.print(line, soft_wrap=not console.is_terminal, highlight=False)


# --- output helpers ----------------------------------------------------------------------------------


def emit_records(records: list[dict], as_json: bool, as_csv: bool, columns: list[str] | None = None) -> bool:
    """Print records as JSON or CSV on stdout if asked; return whether it did."""
    from attnviz.base.records import to_csv, to_json

    if as_json:
        print(to_json(records))
        return True
    if as_csv:
        sys.stdout.write(to_csv(records, columns))
        return True
    return False


def _folder_like(value: str) -> bool:
    return value.endswith(("/", os.sep)) or Path(value).expanduser().is_dir()


def check_output(value: str | None, formats: tuple[str, ...]) -> None:
    """-o is checked before any model work: a folder is fine (the default name goes inside), a file needs
    one of `formats` as its suffix."""
    if value is not None and not _folder_like(value):
        from attnviz.base.files import check_suffix

        check_suffix(value, formats)


def output_path(value: str | None, default_name: str) -> Path:
    """Where to write: -o as given, or the default name inside -o when -o is a folder (existing, or written
    with a trailing /), or the default name in the current folder."""
    if value is None:
        return Path(default_name)
    if _folder_like(value):
        return Path(value).expanduser() / default_name
    return Path(value).expanduser()

def print_json(value: Any) -> None:
    from attnviz.base.records import to_json

    print(to_json(value))


def use_color() -> bool:
    return out.color_system is not None and not out.no_color


