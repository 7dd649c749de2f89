"""How the command line prints, in one place: a command's result handed to `emit` (its files written first,
then its report, --json or --csv, then where the files went), plain text (never markup, control characters
made visible), one-line errors, progress on stderr, where -o writes, and how a library argument is spelled as a
flag. A closed standard output (`| head`) ends the output quietly.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from attnviz.base.text import visible
from attnviz.errors import spell
from attnviz.progress import Reporter

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


class TrimmedConsole(Console):
    """A Console that, writing to a pipe or a file, leaves no spaces at the ends of lines (a table's cells are
    padded to its width, which a script reading the output does not want). In a terminal nothing changes."""

    def _render_buffer(self, buffer) -> str:
        text = super()._render_buffer(buffer)
        return text if self.is_terminal else _TRAILING.sub("", text)

    def on_broken_pipe(self) -> None:
        """The reader closed the pipe (`attnviz … | head -3`): the output ends here, quietly, and the command goes
        on to its own end and exit code (Rich would exit with 1 and no word of why)."""
        self.quiet = True
        _closed_stdout(sys.stderr if self.stderr else sys.stdout)


_TRAILING = re.compile(r"[ \t]+(?=\n|$)")
out = TrimmedConsole()
err = TrimmedConsole(stderr=True)
# --- printing ----------------------------------------------------------------------------------------


def say(*parts: Any, console: Console | None = None, style: str = "", wrap: bool = False, keep: str = "") -> None:
    """Print plain text (never markup), control characters made visible (but those in `keep`): on one logical
    line (paths), or wrapped to the terminal's width (sentences)."""
    if "\t" in keep:  # a text's own tabs and lines, to a file: written as they are (Rich would turn tabs to spaces)
        (console or out).file.write(visible(" ".join(str(p) for p in parts), keep) + "\n")
        return
    text = Text(visible(" ".join(str(p) for p in parts), keep), style=style)
    (console or out).print(text, soft_wrap=not wrap, highlight=False)


def flag(name: str) -> str:
    """The command line's spelling of the library argument `name`, as the running command declares it: an
    option's first long spelling (source -> --from), an argument's metavar (text -> TEXT); any other argument
    by its own name (max_length -> --max-length)."""
    from typer._click import globals as click_globals

    context = click_globals.get_current_context(silent=True)
    for param in getattr(getattr(context, "command", None), "params", ()):
        if param.name == name and not getattr(param, "hidden", False):
            if param.param_type_name == "argument":
                return param.metavar or param.name.upper()
            return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return "--" + name.replace("_", "-")


def error_line(message: str, label: str = "Error", console: Console | None = None) -> None:
    """One error or warning: one line for a pipe or a log; in a terminal narrower than the message, wrapped
    between words (a terminal left to itself breaks it mid-word)."""
    console = console or err
    line = Text.assemble((f"{label}:", "red" if label == "Error" else "yellow"), " ", visible(message))
    console.print(line, soft_wrap=not console.is_terminal, highlight=False)


# --- output helpers ----------------------------------------------------------------------------------


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

# --- the one emitter ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class File:
    """A file a command writes when asked: `value` is its option's value (None: not asked for; a folder gets
    `default` inside: a name, or what gives it), `write(path)` writes it atomically and returns the path written,
    `note(path)` is the line that says where it went."""

    value: str | None
    default: str | Callable[[], str]
    write: Callable[[Path], Path]
    note: Callable[[Path], str] = field(default=str)
    wanted: bool | None = None  # None: when a value is given

    @property
    def asked(self) -> bool:
        return self.value is not None if self.wanted is None else self.wanted

    @property
    def named_by_default(self) -> bool:
        """The file takes its default name (no -o, or -o a folder): a file already there is said to be replaced."""
        return self.value is None or _folder_like(self.value)

    @property
    def path(self) -> Path:
        return output_path(self.value, self.default if isinstance(self.default, str) else self.default())


def figure_file(value: str | None, result: Any, *, default: str | None = None, wanted: bool | None = None,
                **style: Any) -> File:
    """-o for a result's picture: result.figure(**style), in the format of the suffix."""
    def write(path: Path) -> Path:
        from attnviz.render.png import save_figure

        return save_figure(result.figure(**style), path)

    return File(value, default or (lambda: result.figure_name), write, wanted=wanted)


def page_file(value: str | None, result: Any, *, default: str | None = None, wanted: bool | None = None,
              **options: Any) -> File:
    """--html (or view's -o) for a result's interactive page: result.html(**options)."""
    def write(path: Path) -> Path:
        from attnviz.base.files import atomic_output, check_suffix

        path = check_suffix(path, (".html", ".htm"))
        page = result.html(**options)
        with atomic_output(path) as tmp:
            tmp.write_text(page, encoding="utf-8")
        return path

    return File(value, default or (lambda: result.page_name), write, wanted=wanted)


def emit(result: Any, *, as_json: bool = False, as_csv: bool = False, files: Sequence[File] = (),
         report: bool = True, style: dict | None = None) -> None:
    """Show a command's result: write the files asked for (first, so that a reader who closes the pipe early
    still gets them), then print its --json, its --csv or its terminal report (`report=False`: none), then the
    lines that say where the files went (on stderr beside --json and --csv). Exits with the result's code."""
    from attnviz.base.records import to_csv, write_json

    written = [(f, f.path.exists() and f.named_by_default, f.write(f.path)) for f in files if f.asked]
    try:
        if as_json or as_csv:
            from attnviz.api.result import Line

            notes = [item for item in result.report(width=out.width, color=use_color(), tty=out.is_terminal,
                                                    **(style or {}))
                     if isinstance(item, Line) and item.stderr] if report else []
            for note in notes:  # what the run read or did, said on stderr whatever the format
                show(note)
            if as_json:  # written a piece at a time: α of a long text is tens of millions of numbers
                write_json(result.to_dict(), sys.stdout)
                sys.stdout.write("\n")
            else:
                sys.stdout.write(to_csv(result.to_rows() or [], result.csv_columns()))
        elif report:
            for item in result.report(width=out.width, color=use_color(), tty=out.is_terminal, **(style or {})):
                show(item)
        for f, replaced, path in written:
            say(f.note(path) + (" (replacing the file of that name)" if replaced else ""),
                console=err if as_json or as_csv else out)
        sys.stdout.flush()
    except BrokenPipeError:
        _closed_stdout()
    code = result.exit_code
    if code:
        import typer

        raise typer.Exit(code)


def show(item: Any) -> None:
    """One item of a report: a Line (plain text, wrapped or on one logical line, stdout or stderr) or a Rich
    renderable."""
    from attnviz.api.result import Line

    if isinstance(item, Line):
        say(spell(item.text, flag), console=err if item.stderr else out, style=item.style, wrap=item.wrap,
            keep="\n\t" if item.lines else "")
    else:
        out.print(item)


def _closed_stdout(stream=None) -> None:
    """The reader closed standard output (`attnviz … | head`): what was written stays, nothing more is said,
    and Python's own flush at exit must not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, (stream or sys.stdout).fileno())
    except (OSError, ValueError):
        pass


def use_color() -> bool:
    return out.color_system is not None and not out.no_color


# --- long work, on stderr -------------------------------------------------------------------------------------


class CliReporter(Reporter):
    """Long work as the command line shows it, on stderr: a spinner, a progress bar, a note."""

    @contextlib.contextmanager
    def status(self, text: str):
        with err.status(Text(text)):
            yield

    @contextlib.contextmanager
    def progress(self, what: str, total: int, unit: str, keep: str = "", joiner: str = ""):
        """`keep`: the end of the label, never cut while it fits (a conversion's step, after `what` and `joiner`);
        `what` is shortened first."""
        bar = progress_bar(what, total, unit, err, keep=keep, joiner=joiner)
        with bar:
            task = bar.add_task(what, total=total or None)
            yield lambda n: bar.advance(task, n)

    def note(self, text: str) -> None:
        say(spell(text, flag), console=err, style="cyan", wrap=True)


def progress_bar(what: str, total: int, unit: str, console: Console, keep: str = "", joiner: str = ""):
    """A Rich progress bar whose one line fits the console: the counts, the unit and the elapsed time always
    shown, the bar narrowed (to 10 cells) and then the label shortened with … to make room (`what` first: the
    label's end `keep` stays whole while it fits)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.base.text import cells, fit

    digits = len(str(max(int(total or 0), 1)))
    tail = (2 * digits + 1) + 1 + cells(unit) + 1 + 7 + 4  # "12/120", the unit, "0:00:07", the gaps between
    room = console.width - tail
    whole = visible(what + joiner + keep)
    bar_width = max(10, min(40, room - cells(whole) - 1))
    space = max(room - bar_width - 1, 8)
    kept = visible(keep)
    if not kept or cells(whole) <= space:
        label = fit(whole, space)
    elif cells(kept) + 4 <= space:  # "Qwen2.5-C…: Joining the parts": the step whole, the name cut
        label = fit(visible(what), space - cells(kept) - 2) + ": " + kept
    else:
        label = fit(kept, space)
    return Progress(TextColumn(label), BarColumn(bar_width=bar_width), MofNCompleteColumn(), TextColumn(unit),
                    TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal)
