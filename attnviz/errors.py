"""Errors a user can cause. The CLI prints their message as one line and exits with `exit_code`:
1 for what went wrong with an input or output, 2 for a malformed or out-of-range option (a usage error).

A message names the library's arguments, never the command line's flags. Where it names one, it writes
`arg("max_length")`; `str(error)` spells it as Python does (`max_length`), and the command line asks for
`error.spelled(spell)` with its own spelling (`--max-length`). `field` is the argument an error concerns.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_ARG = re.compile("\ue000([a-z_]+)(?:\ue002([^\ue001]*))?\ue001")


def arg(name: str, value: str | None = None) -> str:
    """The argument `name` (with a value to give it, if any), marked in a message so that each caller spells
    it its own way: `model='multilingual'` in Python, `--model multilingual` on the command line."""
    return f"\ue000{name}\ue001" if value is None else f"\ue000{name}\ue002{value}\ue001"


def _spelled(match: re.Match, spelling: Callable[[str], str]) -> str:
    name = spelling(match.group(1))
    value = match.group(2)
    if value is None:
        return name
    return f"{name} {value}" if name.startswith("-") or name.isupper() else f"{name}={value!r}"


def python_spelling(name: str) -> str:
    return name


def spell(text: str, spelling: Callable[[str], str] = python_spelling) -> str:
    """`text` with every argument marked by arg() spelled by `spelling` (notes and warnings carry marks too)."""
    return _ARG.sub(lambda m: _spelled(m, spelling), text)


class AttnvizError(Exception):
    """Base class: the message says what went wrong and what to do."""

    exit_code = 1

    def __init__(self, message: str = "", field: str | None = None):
        super().__init__(message)
        self.template = message
        self.field = field  # the library argument the error concerns ("layer", "part"), when known

    def spelled(self, spell: Callable[[str], str] = python_spelling) -> str:
        """The message with every argument it names spelled by `spell` (the command line: its flag)."""
        return _ARG.sub(lambda m: _spelled(m, spell), self.template)

    def __str__(self) -> str:
        return self.spelled()


class InputError(AttnvizError):
    """Bad text or an input that cannot be processed (empty, too long with --no-truncate, over a limit)."""


class UsageError(AttnvizError):
    """An argument value that is malformed or does not fit the data (exit code 2, like any usage error)."""

    exit_code = 2


class SelectionError(UsageError):
    """A layer, head or token selection that is malformed, empty, reversed or out of range."""


class ColormapError(UsageError):
    """A colormap name matplotlib does not know."""


class ModelLoadError(AttnvizError):
    """The model could not be found, downloaded or loaded."""


class AttentionCheckError(AttnvizError):
    """The model returned attention weights that fail the sanity checks."""


class CaptureFormatError(AttnvizError):
    """A capture file that is corrupt, foreign, over the size limits or of an unknown version."""


class CaptureMismatchError(AttnvizError):
    """Two captures that cannot be compared (different shapes or tokens)."""


class OutputError(AttnvizError):
    """An output path that cannot be written (permission, unknown suffix, existing folder, full disk)."""


class UnsupportedArchitectureError(AttnvizError):
    """The from-scratch path has no adapter for this architecture."""


class AttnvizWarning(UserWarning):
    """Something the user should know (truncation, missing glyphs); shown as one line on stderr. Arguments it
    names are spelled as Python's (the command line spells its flags from args[0])."""

    def __str__(self) -> str:
        return spell(str(self.args[0])) if self.args else ""


def warn(message: str, category: type[Warning] = AttnvizWarning) -> None:
    """Warn, attributed to the line that called into attnviz (the user's), not to the line of attnviz that noticed:
    the stack is walked to its outermost attnviz frame, and the warning names that frame's caller."""
    import sys
    import warnings

    frame: Any = sys._getframe(1)
    level, outermost = 2, 2
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).split(".")[0] == "attnviz":
            outermost = level
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=outermost + 1)
