"""What every command shares: the Typer app, option types and groups, error handling, printing.

Library errors (AttnvizError) become one line on stderr and their exit code (1, or 2 for an option that
does not fit the data); malformed options are usage errors, also one line, exit 2. Everything printed
that came from a user, a file or a model is plain Text with control characters made visible, never
markup. Heavy imports (torch, transformers, matplotlib) happen inside commands so `--help` stays quick.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import signal
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, get_type_hints
from collections.abc import Callable

import typer
from rich.console import Console
from rich.text import Text
from typer._click import exceptions as click_errors  # typer ≥ 0.29 carries its own click
from typer.core import TyperGroup

from attnviz import __version__
from attnviz.errors import AttnvizError, AttnvizWarning
from attnviz.selection import Selection
from attnviz.text import visible

out = Console()
err = Console(stderr=True)
TERMINATED_EXIT = 143  # 128 + SIGTERM
INTERRUPTED_EXIT = 130  # 128 + SIGINT


# --- printing ----------------------------------------------------------------------------------------


def say(*parts: Any, console: Console | None = None, style: str = "") -> None:
    """Print plain text (never markup), control characters made visible, on one logical line."""
    text = Text(visible(" ".join(str(p) for p in parts)), style=style)
    (console or out).print(text, soft_wrap=True, highlight=False)


def error_line(message: str, label: str = "Error") -> None:
    line = Text.assemble((f"{label}:", "red" if label == "Error" else "yellow"), " ", visible(message))
    err.print(line, soft_wrap=True, highlight=False)


# --- one-line usage errors ---------------------------------------------------------------------------


class AttnvizGroup(TyperGroup):
    """Typer's group, but a usage error is one line on stderr (exit 2), like every other error."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:
            out.print(Text(exc.format_message()), highlight=False)
            sys.exit(0)
        except click_errors.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            error_line(exc.format_message() + where)
            sys.exit(exc.exit_code)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(cls=AttnvizGroup, help="See what a transformer's self-attention does: heatmaps, head statistics, "
                                          "and a from-scratch cross-check, from the command line.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["--help", "-h"]})


# --- option types ------------------------------------------------------------------------------------


def selection_parser(what: str, keywords: tuple[str, ...] = (), option: str | None = None) -> Callable:
    """A --layer/--head parser: indices, negative indices, ranges, lists, 'all' (and 'mean'/'max' for heads),
    by attnviz.selection; anything malformed is a usage error that says what is valid."""
    option = option or f"--{what}"

    def parse(value: Any) -> Selection:
        if isinstance(value, Selection):
            return value
        from attnviz.errors import SelectionError

        try:
            return Selection.parse(str(value), what, keywords=keywords, option=option)
        except SelectionError as exc:
            raise typer.BadParameter(str(exc).removeprefix(f"{option}: ")) from None

    return parse


def choice_parser(choices: tuple[str, ...], aliases: dict[str, str]) -> Callable:
    """One of `choices`, or an alias users type (gpu -> cuda, fp16 -> float16); case-insensitive."""

    def parse(value: Any) -> str:
        key = str(value).strip().lower()
        key = aliases.get(key, key)
        if key not in choices:
            raise typer.BadParameter(f"{visible(str(value))!r} is not one of {', '.join(choices)}")
        return key

    return parse


def colormap_parser(value: Any) -> str:
    """A matplotlib colormap name, checked when the options are parsed (before any model work)."""
    from attnviz.errors import ColormapError
    from attnviz.render.colors import colormap

    try:
        colormap(str(value))
    except ColormapError as exc:
        raise typer.BadParameter(str(exc)) from None
    return str(value)


def finite_float(minimum: float = -math.inf) -> Callable:
    """A finite float (no nan, no inf), at least `minimum`."""

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{visible(str(value))!r} is not a number") from None
        if not math.isfinite(number) or number < minimum:
            raise typer.BadParameter(f"{visible(str(value))!r} must be a finite number ≥ {minimum:g}")
        return number

    return parse


DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("float32", "float16", "bfloat16")
DEVICE_ALIASES = {"gpu": "cuda"}
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32", "fp16": "float16", "f16": "float16",
                 "half": "float16", "bf16": "bfloat16"}

# --- shared options ----------------------------------------------------------------------------------

TextArg = Annotated[Optional[str], typer.Argument(help="The text to look at (in quotes).", show_default=False)]
FromOpt = Annotated[Optional[Path], typer.Option("--from", help="Read a saved capture (.npz) instead of running "
                                                                "a model.", dir_okay=False, show_default=False)]
LayerSel = Annotated[Selection, typer.Option(
    "--layer", "--layers", "-l", parser=selection_parser("layer"), metavar="LAYERS",
    help="Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.")]
HeadSel = Annotated[Selection, typer.Option(
    "--head", "--heads", "-H", parser=selection_parser("head", ("mean", "max")), metavar="HEADS",
    help="Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's heads.")]
HideOpt = Annotated[bool, typer.Option("--hide-special", help="Leave out [CLS], [SEP], <s> and other special "
                                                             "tokens (rows are not renormalised).")]
CmapOpt = Annotated[str, typer.Option("--cmap", parser=colormap_parser, help="Matplotlib colormap name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the data as JSON on stdout instead of a table.")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="Print the data as CSV on stdout instead of a table.")]


@dataclass(frozen=True)
class ModelOptions:
    """The options of every command that runs a model, passed on as one object."""

    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", help="Hugging Face id or local folder. Default: $ATTNVIZ_MODEL, else the bundled "
                              "'minilm' (sentence-transformers/all-MiniLM-L6-v2, works offline).",
        show_default=False)] = None
    revision: Annotated[Optional[str], typer.Option(help="Model revision (branch, tag or commit).",
                                                    show_default=False)] = None
    device: Annotated[str, typer.Option(parser=choice_parser(DEVICES, DEVICE_ALIASES), metavar="DEVICE",
                                        help="auto (CUDA, then MPS, then CPU), cpu, cuda (or gpu) or mps.")] = "auto"
    dtype: Annotated[str, typer.Option(parser=choice_parser(DTYPES, DTYPE_ALIASES), metavar="DTYPE",
                                       help="float32, float16 (fp16) or bfloat16 (bf16).")] = "float32"
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="Run the model repository's own code (only for repositories you trust).")] = False
    truncate: Annotated[bool, typer.Option(
        "--truncate/--no-truncate",
        help="Cut text longer than the model's maximum (with a warning), or refuse it.")] = True

    def load(self):
        """The model, loaded once (with a spinner on stderr)."""
        with err.status("Loading the model…"):
            from attnviz.model import load

            return load(self.model, revision=self.revision, device=self.device, dtype=self.dtype,
                        trust_remote_code=self.trust_remote_code)


@dataclass(frozen=True)
class TextInput(ModelOptions):
    """TEXT and the model to run it through."""

    text: TextArg = None

    def require_text(self) -> str:
        """TEXT is required (usage error if missing) and must not be blank (InputError)."""
        if self.text is None:
            raise typer.BadParameter("give the TEXT to look at, in quotes")
        from attnviz.model import check_text  # model.py imports torch only inside its functions

        return check_text(self.text)


@dataclass(frozen=True)
class CaptureInput(TextInput):
    """Where a command's Capture comes from: TEXT run through the model, or a saved --from capture."""

    source: FromOpt = None

    def capture(self):
        """A Capture from --from, or by running the model on TEXT."""
        from attnviz.capture import Capture

        if self.source is not None:
            if self.text:
                raise typer.BadParameter("give either TEXT or --from, not both")
            return Capture.load(self.source)
        if self.text is None:
            raise typer.BadParameter("give the TEXT to look at (in quotes), or --from CAPTURE.npz")
        text = self.require_text()
        loaded = self.load()
        from attnviz.model import capture_text

        with err.status("Running the model…"):
            return capture_text(text, loaded, truncate=self.truncate)


def takes(**groups: type) -> Callable:
    """Decorator: add the fields of each option-group dataclass to the command's options, and pass each
    group to the command as one object (the way simonw/llm shares option groups through decorators)."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        params = [p for p in signature.parameters.values() if p.name not in groups]
        for cls in groups.values():
            hints = get_type_hints(cls, include_extras=True)
            for f in dataclasses.fields(cls):
                params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                                annotation=hints[f.name]))

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for arg, cls in groups.items():
                kwargs[arg] = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls)})
            return func(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # Typer must see the new signature, not the function's own
        return wrapper

    return decorate


# --- errors and signals ------------------------------------------------------------------------------


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so cleanup (temporary files, worker processes) runs."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    error_line(str(message), "Warning" if issubclass(category, AttnvizWarning) else category.__name__)


def cli_errors(func: Callable) -> Callable:
    """Turn library errors into one line on stderr and their exit code; warnings into one line each;
    Ctrl-C and SIGTERM into a clean exit (130, 143) after cleanup."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        previous = warnings.showwarning
        warnings.showwarning = _print_warning
        old_term = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", AttnvizWarning)
                return func(*args, **kwargs)
        except AttnvizError as exc:
            error_line(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            error_line("interrupted; nothing half-written was left")
            raise typer.Exit(INTERRUPTED_EXIT) from None
        except Terminated:
            error_line("terminated; nothing half-written was left")
            raise typer.Exit(TERMINATED_EXIT) from None
        finally:
            warnings.showwarning = previous
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)

    return wrapper


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# --- output helpers ----------------------------------------------------------------------------------


def emit_records(records: list[dict], as_json: bool, as_csv: bool, columns: list[str] | None = None) -> bool:
    """Print records as JSON or CSV on stdout if asked; return whether it did."""
    from attnviz.records import to_csv, to_json

    if as_json:
        print(to_json(records))
        return True
    if as_csv:
        sys.stdout.write(to_csv(records, columns))
        return True
    return False


def print_json(value: Any) -> None:
    from attnviz.records import to_json

    print(to_json(value))


def use_color() -> bool:
    return out.color_system is not None and not out.no_color


def version_callback(value: bool) -> None:
    if value:
        say(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                       help="Show the version and exit.")] = False) -> None:
    """See what a transformer's self-attention does."""
