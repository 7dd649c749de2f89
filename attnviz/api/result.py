"""What every command returns: a Result, which owns its output. The command line and the live app only choose
which output to show; they build none of it.

    result.to_dict()        exactly what the command's --json prints (and what `attnviz serve` answers)
    result.to_rows()        the records its --csv prints (None where the command has no --csv)
    result.report(...)      its terminal report: Rich renderables, and Lines of plain text
    result.figure(...)      its picture, a matplotlib Figure (where it draws); result.figure_name: -o's default
    result.html()           its interactive page (where it has one); result.page_name: --html's default

A notebook shows a result by its own `_repr_html_`; the default here is the report, as HTML.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["Line", "Result"]


@dataclass(frozen=True)
class Line:
    """One line of a report in words: a sentence wraps to the terminal's width (`wrap`), a path or a command
    stays on one logical line; `stderr` for a note about the run rather than its result. The text is data:
    printed as plain text, control characters made visible (but for its own lines and tabs, with `lines`)."""

    text: str
    style: str = ""
    wrap: bool = True
    stderr: bool = False
    lines: bool = False  # the text's own line breaks and tabs kept (a model's writing, to a file or a pipe)

    def __rich__(self):
        from rich.text import Text

        from attnviz.base.text import visible

        return Text(visible(self.text, "\n\t" if self.lines else ""), style=self.style)


class Result:
    """The base of every command's result (the results themselves are frozen dataclasses)."""

    command: ClassVar[str] = ""  # the command that prints it (and the API function of the same name)

    def to_dict(self) -> Any:
        """What the command's --json prints."""
        raise NotImplementedError

    def to_rows(self) -> list[dict] | None:
        """What the command's --csv prints, one record per row; None where it has no --csv."""
        return None

    def csv_columns(self) -> list[str] | None:
        """The CSV's columns, in order (default: the first record's keys)."""
        return None

    def report(self, *, width: int = 100, color: bool = False, **style: Any) -> list:
        """The terminal report: Rich renderables and Lines, in order. `width` the terminal's columns, `color`
        whether it shows colour; `style` the drawing options a command takes (cmap, start)."""
        raise NotImplementedError

    @property
    def exit_code(self) -> int:
        """0, or what the command exits with to say a check failed (3)."""
        return 0

    def _repr_html_(self) -> str:
        """In a notebook: the report, as HTML (plain text, escaped)."""
        return report_html(self.report(width=100, color=True))


def report_html(items: Sequence[Any]) -> str:
    """A report's renderables as one HTML fragment (Rich's own export, styles inline, text escaped)."""
    from rich.console import Console

    console = Console(record=True, width=100, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for item in items:
        console.print(item, soft_wrap=isinstance(item, Line) and not item.wrap, highlight=False)
    return console.export_html(inline_styles=True, code_format="<pre style=\"font-family: monospace\">{code}</pre>")


