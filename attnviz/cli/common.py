"""What every command shares: the Typer app, option types and groups, error handling, printing.

Library errors (AttnvizError) become one line on stderr and their exit code (1, or 2 for an option that
does not fit the data); malformed options are usage errors, also one line, exit 2. Everything printed
that came from a user, a file or a model is plain Text with control characters made visible, never
markup. Heavy imports (torch, transformers, matplotlib) happen inside commands so `--help` stays quick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import re
import os
import signal
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, get_type_hints
from collections.abc import Callable, MutableMapping

import typer
from rich.console import Console
from rich.text import Text
from typer._click import exceptions as click_errors  # typer ≥ 0.29 carries its own click
from typer.core import TyperCommand, TyperGroup

from attnviz._version import __version__
from attnviz.progress import Reporter
from attnviz.errors import AttnvizError, AttnvizWarning, spell
from attnviz.devices import DEVICE_ALIASES, DEVICES, DTYPE_ALIASES, DTYPES  # one definition of each (no torch)
from attnviz.selection import Selection
from attnviz.text import visible

out = Console()
err = Console(stderr=True)
TERMINATED_EXIT = 143  # 128 + SIGTERM
INTERRUPTED_EXIT = 130  # 128 + SIGINT


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


@contextlib.contextmanager
def usage_errors():
    """A library UsageError about one argument, as the command line's usage error about its flag (one line,
    "Invalid value for '--part': …", exit 2), where a command checks that argument only through the library."""
    from attnviz.errors import UsageError

    try:
        yield
    except UsageError as exc:
        raise typer.BadParameter(exc.spelled(flag), param_hint=flag(exc.field) if exc.field else None) from None


def error_line(message: str, label: str = "Error") -> None:
    line = Text.assemble((f"{label}:", "red" if label == "Error" else "yellow"), " ", visible(message))
    err.print(line, soft_wrap=True, highlight=False)


# --- one-line usage errors ---------------------------------------------------------------------------


# name -> (the module of attnviz.cli that defines it, its line in `attnviz --help`), in the order a newcomer
# needs them. A command's module is imported only when that command runs (or its own --help is asked for), so
# the top-level help and every command start without importing the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "heatmap": ("view", "Draw α as a heatmap: PNG/SVG/PDF, or in the terminal (-t)."),
    "token": ("view", "One token in every layer and head: what it attends to, who attends to it."),
    "steps": ("steps", "One head step by step: Q, K, Q·Kᵀ, ÷√d_k, mask, softmax → α, α·V."),
    "positions": ("steps", "Shuffle the words, with and without position embeddings."),
    "compare": ("stats", "Layers (or two models) side by side in the terminal."),
    "heads": ("stats", "A table of every head's statistics and pattern label."),
    "entropy": ("stats", "Mean attention entropy, layers × heads."),
    "rollout": ("stats", "Attention rollout: what reaches a token through all layers."),
    "norms": ("norms", "Value-weighted norms: what each key actually moves (Kobayashi et al.)."),
    "sinks": ("norms", "Attention sinks: tokens that soak up attention, and whether they move anything."),
    "ablate": ("ablate", "Remove heads: what changes in predictions, embeddings, later α."),
    "importance": ("ablate", "Every head removed alone, ranked, beside its gradient estimate."),
    "detect": ("ablate", "Induction and other heads found, then tested by removing them."),
    "explain": ("stats", "What every column, label and term means."),
    "verify": ("verify", "Recompute α from the model's weights and compare (exit 3 if not equal)."),
    "scaling": ("verify", "Why divide by √d_k: the softmax with and without it."),
    "capture": ("view", "Save α and tokens as a .npz for --from."),
    "generate": ("generate", "A causal LM writes; its attention kept step by step."),
    "export": ("export", "Every head as an image, a grid, the data and an offline gallery."),
    "view": ("view", "An interactive page (one offline HTML file): head, model and matrix views."),
    "corpus": ("corpus", "Head statistics over many texts, batched; shards merged."),
    "cost": ("cost", "Time and memory against T: the full path beside the streamed one."),
}


class AttnvizGroup(TyperGroup):
    """Typer's group, with commands listed in the order a newcomer needs them and loaded when used, plain
    metavars in help, and every usage error as one line on stderr (exit 2) that says what to do, like every
    other error."""

    _listing = False  # True while the top-level help lists the commands (their one line is enough)

    def list_commands(self, ctx):
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            if self._listing:
                return TyperCommand(name=name, short_help=COMMANDS[name][1], help=COMMANDS[name][1])
            self._load(COMMANDS[name][0])
        command = self.commands.get(name)
        if command is not None:  # built here, or by Typer when the module was imported before the group was made
            _plain_metavars(command)
            if name in COMMANDS:
                command.short_help = COMMANDS[name][1]
        return command

    def _load(self, module: str) -> None:
        """Import a command module (it registers its commands on `app`) and build the commands it added."""
        import importlib

        import typer.main

        importlib.import_module(f"attnviz.cli.{module}")
        for info in app.registered_commands:
            name = info.name or typer.main.get_command_name(info.callback.__name__)  # type: ignore[union-attr]
            if name in self.commands:
                continue
            self.commands[name] = typer.main.get_command_from_info(
                info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode)

    def load_all(self) -> MutableMapping:
        """Every command, built (for tests and tools that look at all of them)."""
        for name in self.list_commands(None):
            self.get_command(None, name)
        return self.commands

    def format_help(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click_errors.UsageError as exc:  # Typer suggests from the commands loaded so far: suggest from all
            if args and "Did you mean" not in exc.message:
                import difflib

                matches = difflib.get_close_matches(args[0], list(COMMANDS))
                if matches:
                    exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        _plain_metavars(self)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:
            out.print(Text(exc.format_message()), highlight=False)
            sys.exit(0)
        except click_errors.ClickException as exc:
            error_line(_usage_message(exc))
            sys.exit(exc.exit_code)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _usage_message(exc) -> str:
    """A click usage error as one line that points the right way."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "attnviz"
    if message.startswith("Got unexpected extra argument"):
        return (f"{message.rstrip('.')}: put the text in quotes, e.g. {command} \"The cat sat on the mat\"")
    if message.startswith("No such command") and "Did you mean" not in message:
        name = message.split("'")[1] if "'" in message else ""
        if name:
            return (f"{message.rstrip('.')}; to look at a text, name a command first: "
                    f"attnviz heatmap \"{name}\" (attnviz --help lists them)")
    return f"{message} (see '{command} --help')"


def _plain_metavars(command) -> None:
    """Help shows TEXT, N, FILE or nothing (for flags) instead of Typer's <str>, <bool>, <list[Path]>."""
    if not getattr(command, "_attnviz_help_option", False):
        make_help_option = command.get_help_option

        def get_help_option(ctx):
            option = make_help_option(ctx)
            if option is not None:
                option.metavar = ""
            return option

        command.get_help_option = get_help_option
        command._attnviz_help_option = True
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "argument":
            param.display_type_rich = lambda ctx: None  # the argument's name already says what it is
        if param.metavar is not None:
            continue
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        if getattr(param, "is_flag", False) or annotation is bool:
            param.metavar = ""
        elif annotation is int:
            param.metavar = "N"
        elif annotation is float:
            param.metavar = "NUMBER"
        elif "Path" in str(annotation):
            param.metavar = "FILE"
        else:
            param.metavar = "TEXT"


app = typer.Typer(cls=AttnvizGroup, help="See what a transformer's self-attention does: heatmaps, head statistics, "
                                          "and a from-scratch cross-check, from the command line.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["--help", "-h"]})


# --- option types ------------------------------------------------------------------------------------


def selection_parser(what: str, keywords: tuple[str, ...] = (), field: str | None = None) -> Callable:
    """A --layer/--head parser: indices, negative indices, ranges, lists, 'all' (and 'mean'/'max' for heads),
    by attnviz.selection; anything malformed is a usage error that says what is valid."""
    field = field or what

    def parse(value: Any) -> Selection:
        if isinstance(value, Selection):
            return value
        from attnviz.errors import SelectionError

        try:
            return Selection.parse(str(value), what, keywords=keywords, field=field)
        except SelectionError as exc:
            raise typer.BadParameter(exc.spelled(flag).removeprefix(f"{flag(field)}: ")) from None

    return parse


def one_index_parser(what: str, field: str | None = None) -> Callable:
    """A --layer/--head parser for commands that show one at a time (steps, positions): one index, negative
    counting from the end; a list, range, `all`, `mean` or `max` is a usage error saying so, before any model
    loads."""
    field = field or what

    def parse(value: Any) -> Selection:
        if isinstance(value, Selection):
            return value
        text = str(value).strip()
        if not re.fullmatch(r"-?[0-9]{1,9}", text):
            raise typer.BadParameter(f"this command shows one {what} at a time: give one index (0, 2, or -1 for "
                                     f"the last), not {visible(text)[:40]!r}")
        return Selection.parse(text, what, field=field)

    return parse


def whole_number(minimum: int, maximum: int | None = None) -> Callable:
    """A whole-number option checked here rather than by click's IntRange, whose "[1<=x<=4096]" would widen
    the help's type column past 80 terminal columns; the help text states the range instead."""
    def parse(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if not re.fullmatch(r"[+-]?[0-9]{1,30}", text):
                raise typer.BadParameter(f"{visible(text)[:40]!r} is not a whole number")
            number = int(text)
        if number < minimum or (maximum is not None and number > maximum):
            upper = f" to {maximum:,}" if maximum is not None else " or more"
            raise typer.BadParameter(f"{number} is out of range: give {minimum:,}{upper}")
        return number

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


def size_parser(value: Any) -> int:
    """A size in bytes: 512M, 2G, 1.5G or a number of bytes."""
    if isinstance(value, int):
        return value
    from attnviz.sizes import parse_size

    try:
        return parse_size(str(value))
    except (ValueError, IndexError):
        raise typer.BadParameter(f"{visible(str(value))!r} is not a size; write e.g. 512M, 2G or 16G") from None


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
OneLayer = Annotated[Selection, typer.Option(
    "--layer", "--layers", "-l", parser=one_index_parser("layer"), metavar="LAYER",
    help="One layer: an index (-1 is the last).")]
OneHead = Annotated[Selection, typer.Option(
    "--head", "--heads", "-H", parser=one_index_parser("head"), metavar="HEAD",
    help="One head: an index (-1 is the last).")]
HideOpt = Annotated[bool, typer.Option("--hide-special", help="Leave out [CLS], [SEP], <s> and other special "
                                                             "tokens (rows are not renormalised).")]
CmapOpt = Annotated[str, typer.Option("--cmap", parser=colormap_parser, help="Matplotlib colormap name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the data as JSON on stdout instead of a table.")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="Print the data as CSV on stdout instead of a table.")]


@dataclass(frozen=True)
class ModelOptions:
    """The options of every command that runs a model, passed on as one object."""

    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", help="Offline: minilm (English BERT, the default), multilingual (Korean, Japanese, "
                              "Chinese, … ), smollm2 (a causal LM), a .gguf file; or a Hugging Face id or local "
                              "folder. Default: $ATTNVIZ_MODEL, else minilm.",
        show_default=False)] = None
    revision: Annotated[Optional[str], typer.Option(help="Model revision (branch, tag or commit).",
                                                    show_default=False)] = None
    device: Annotated[str, typer.Option(parser=choice_parser(DEVICES, DEVICE_ALIASES), metavar="DEVICE",
                                        help="auto (CUDA, then MPS, then CPU), cpu, cuda (or gpu) or mps.")] = "auto"
    dtype: Annotated[str, typer.Option(parser=choice_parser(DTYPES, DTYPE_ALIASES), metavar="DTYPE",
                                       help="float32, float16 (fp16) or bfloat16 (bf16).")] = "float32"
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="Run the model repository's own code (only for repositories you trust).")] = False
    no_truncate: Annotated[bool, typer.Option(
        "--no-truncate",
        help="Refuse text longer than the model's maximum positions (default: cut it, with a warning).")] = False
    max_memory: Annotated[Optional[int], typer.Option(
        "--max-memory", parser=size_parser, metavar="SIZE", show_default=False,
        help="Memory the full attention tensor may take (512M, 8G); beyond it long inputs are streamed, or "
             "refused where they cannot be. Default: 2G, or the variable ATTNVIZ_MEMORY_BUDGET.")] = None

    @property
    def truncate(self) -> bool:
        """Cut a text longer than the model's maximum positions (with a warning) rather than refuse it."""
        return not self.no_truncate

    def spec(self):
        """The model options as an attnviz.ModelSpec (for workers that load their own copy)."""
        from attnviz.api import ModelSpec

        return ModelSpec(self.model, self.revision, self.device, self.dtype, self.trust_remote_code, self.max_memory)

    def load(self, *, lm_head: bool | str = False):
        """The model, loaded once (with a spinner on stderr); `lm_head`: with its language-model head."""
        from attnviz.api import conversion_pending

        converting = conversion_pending(self.model)
        what = (f"Converting {converting} once into attnviz's model cache (later runs load it at once)…"
                if converting else "Loading the model…")
        with err.status(Text(what)):
            from attnviz.api import load_model

            return load_model(self.model, revision=self.revision, device=self.device, dtype=self.dtype,
                              trust_remote_code=self.trust_remote_code, memory_budget=self.max_memory,
                              lm_head=lm_head)


@dataclass(frozen=True)
class ScaleOptions:
    """How weights map to colours, for every command that draws attention."""

    scale: Annotated[str, typer.Option(
        "--scale", parser=choice_parser(("shared", "per-head"), {"per_head": "per-head", "each": "per-head"}),
        metavar="SCALE", help="shared or per-head: one colour scale for every panel (shared), or each its own "
                              "(per-head).")] = "shared"
    norm: Annotated[str, typer.Option(
        "--norm", parser=choice_parser(("auto", "linear", "sqrt", "log"), {"power": "sqrt"}),
        metavar="NORM",
        help="auto, linear, sqrt or log: how weights map to colours (sqrt or log show small weights; auto is "
             "linear up to 64 tokens, log beyond). Not --norms (value-weighted norms).")] = "auto"
    vmax: Annotated[Optional[float], typer.Option(
        "--vmax", parser=finite_float(0.0), metavar="NUMBER", show_default=False,
        help="Top of the colour scale (default: the largest weight shown).")] = None

    def choice(self):
        from attnviz.panels import ScaleChoice

        if self.vmax is not None and self.vmax <= 0:
            raise typer.BadParameter("must be above 0", param_hint="--vmax")
        return ScaleChoice(kind=self.scale, norm=self.norm, vmax=self.vmax)


ValuesOpt = Annotated[bool, typer.Option("--values", help="Write each weight in its cell (when cells are big "
                                                         "enough to read).")]
StartOpt = Annotated[int, typer.Option("--start", parser=whole_number(0), metavar="N",
                                       help="Terminal: the first key column shown when the matrix is wider than "
                                            "the terminal.")]


TOKEN_GROUPS = ("generated", "prompt")  # named token positions of a capture from attnviz generate
RowsOpt = Annotated[Optional[Selection], typer.Option(
    "--rows", parser=selection_parser("row", TOKEN_GROUPS, field="rows"), metavar="ROWS", show_default=False,
    help="Only these query rows, exactly: 0-40, 4000:4100 (a window into a long input), or generated / prompt "
         "(a capture from attnviz generate).")]
ColsOpt = Annotated[Optional[Selection], typer.Option(
    "--cols", parser=selection_parser("col", TOKEN_GROUPS, field="cols"), metavar="COLS", show_default=False,
    help="Only these key columns, exactly: 0-40, 0:8192, or generated / prompt.")]


MAX_TEXT_BYTES = 1_000_000  # text from a file or stdin


def read_text(source: Path | None) -> str:
    """The text of a file (or of stdin for None), as UTF-8, at most MAX_TEXT_BYTES."""
    from attnviz.errors import InputError

    name = "standard input" if source is None else str(source)
    try:
        if source is None:
            data = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        else:
            from attnviz.files import read_regular

            data = read_regular(source, MAX_TEXT_BYTES, "text")
    except OSError as exc:
        raise InputError(f"cannot read the text from {name}: {exc.strerror or exc}") from None
    if len(data) > MAX_TEXT_BYTES:
        raise InputError(f"the text in {name} is over {MAX_TEXT_BYTES:,} bytes; give a shorter one")
    try:
        return data.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise InputError(f"the text in {name} is not UTF-8 (byte {exc.start}); save it as UTF-8") from None


MAX_NEW_TOKENS = 4096
PART_CHOICES = ("encoder", "decoder", "cross")
PART_ALIASES = {"enc": "encoder", "dec": "decoder", "cross-attention": "cross", "encoder-decoder": "cross"}
_PART_HELP = ("Encoder-decoder models (T5, BART, Marian): which attention — encoder (source × source), decoder "
              "(target × target, causal) or cross (target rows × source columns).")
PartOpt = Annotated[Optional[str], typer.Option(
    "--part", parser=choice_parser(PART_CHOICES, PART_ALIASES), metavar="PART", show_default=False,
    help=_PART_HELP + " Default: cross.")]
SelfPartOpt = Annotated[Optional[str], typer.Option(
    "--part", parser=choice_parser(PART_CHOICES, PART_ALIASES), metavar="PART", show_default=False,
    help=_PART_HELP + " Default: encoder.")]
AllPartsOpt = Annotated[Optional[str], typer.Option(
    "--part", parser=choice_parser(("all", *PART_CHOICES), PART_ALIASES), metavar="PART",
    show_default=False, help=_PART_HELP + " Or all. Default: all three.")]


@dataclass(frozen=True)
class TextSource(ModelOptions):
    """TEXT (or - for standard input, or --text-file) and the model to run it through: the commands that show
    one self-attention (steps, positions, norms, sinks, scaling) take only these."""

    text: TextArg = None
    text_file: Annotated[Optional[Path], typer.Option(
        "--text-file", help="Read the text from this file (UTF-8) instead of TEXT.", dir_okay=False,
        show_default=False, metavar="FILE")] = None

    def given_text(self) -> str | None:
        """TEXT, or the text of --text-file or standard input, read once however often it is asked for."""
        return self._given_text

    @functools.cached_property
    def _given_text(self) -> str | None:
        if self.text_file is not None:
            if self.text is not None:
                raise typer.BadParameter("give either TEXT or --text-file, not both")
            return read_text(self.text_file)
        if self.text == "-":
            return read_text(None)
        return self.text

    def require_text(self) -> str:
        """The text is required (usage error if missing) and must not be blank (InputError)."""
        text = self.given_text()
        if text is None:
            raise typer.BadParameter("give the TEXT to look at, in quotes (or - to read it from standard "
                                     "input, or --text-file FILE)")
        from attnviz.text import check_text

        return check_text(text)

    def load_single(self, what: str):
        """The model, for a command that shows one self-attention (steps, positions, norms, sinks)."""
        loaded = self.load()
        loaded.require_single(what)
        return loaded


@dataclass(frozen=True)
class TextInput(TextSource):
    """TEXT and the model, and for encoder-decoder models what the decoder reads or writes."""

    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="TEXT", show_default=False,
        help="Encoder-decoder models: the decoder reads this target text (teacher forcing); without it the "
             "decoder writes its own (greedy, --max-new-tokens).")] = None
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", parser=whole_number(1, MAX_NEW_TOKENS), metavar="N", show_default=False,
        help="Tokens to write, at most, 1 to 4,096 (attnviz generate, and encoder-decoder models without "
             "--target): default 20; the end-of-sequence token stops earlier.")] = None

    def check_model_kind(self, loaded, part: str | None, *, writes: bool = False) -> None:
        """--part, --target and --max-new-tokens are for encoder-decoder models (and --max-new-tokens for
        attnviz generate): refused in one line where they do not apply."""
        if loaded.seq2seq:
            if self.target is not None and self.max_new_tokens is not None:
                raise typer.BadParameter("give either --target (the decoder reads it) or --max-new-tokens (the "
                                         "decoder writes), not both")
            return
        if part is not None:
            raise typer.BadParameter(f"{loaded.name} has one kind of attention (self-attention); --part is for "
                                     f"encoder-decoder models (T5, BART, Marian)", param_hint="--part")
        if self.target is not None or (self.max_new_tokens is not None and not writes):
            raise typer.BadParameter(f"--target and --max-new-tokens are for encoder-decoder models; {loaded.name} "
                                     f"is not one (for a causal language model, attnviz generate writes text)")

    def parts(self, loaded, text: str, decoding=None):
        """All three attention parts of an encoder-decoder model: the decoder reads --target, or writes (a
        progress bar counts its tokens)."""
        from attnviz.api import capture

        if getattr(self, "stream", False):
            raise typer.BadParameter("--stream is for long inputs of encoder-only and decoder-only models; an "
                                     "encoder-decoder model's attention is kept whole (--max-memory bounds it)")
        return capture(text, model=loaded, target=self.target, max_new_tokens=self.max_new_tokens, decoding=decoding,
                       truncate=self.truncate, reporter=CliReporter())

    def capture(self, *, window: tuple | None = None, rollout_token: str | None = None, pictures: bool = True,
                part: str | None = None, default_part: str = "cross"):
        """The model's Capture of the text: the full α when it fits the memory budget; else (or with
        --stream, where the command offers it) a pooled capture streamed a block of rows at a time, with the
        exact window (rows, cols, layers selections) and rollout row asked for. `pictures=False` (a command
        that shows only statistics) skips the pooled matrices and rollout rows, and keeps no layer's input.
        For an encoder-decoder model: the `part` asked for (else `default_part`) of its three."""
        text = self.require_text()
        loaded = self.load()
        self.check_model_kind(loaded, part)
        if loaded.seq2seq:
            chosen = self.parts(loaded, text).part(part or default_part)
            return _as_words(chosen) if getattr(self, "words", False) else chosen
        from attnviz.api import Keep, capture

        streaming = getattr(self, "stream", None)  # None: this command does not stream
        rows, cols, layers = window if window is not None else (None, None, None)
        keep = Keep(pool=getattr(self, "pool", None) or 512, rows=rows, cols=cols, layers=layers,
                    rollout_token=rollout_token, pictures=pictures)
        return capture(text, model=loaded, words=getattr(self, "words", False), truncate=self.truncate,
                       stream=False if streaming is None else (True if streaming else None), keep=keep,
                       reporter=CliReporter())


class CliReporter(Reporter):
    """Long work as the command line shows it, on stderr: a spinner, a progress bar, a note."""

    @contextlib.contextmanager
    def status(self, text: str):
        with err.status(Text(text)):
            yield

    @contextlib.contextmanager
    def progress(self, what: str, total: int, unit: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn(),
                       console=err, transient=True, disable=not err.is_terminal)
        with bar:
            task = bar.add_task(what, total=total)
            yield lambda n: bar.advance(task, n)

    def note(self, text: str) -> None:
        say(spell(text, flag), console=err, style="cyan", wrap=True)


def _as_words(whole):
    from attnviz.api import to_words

    return to_words(whole)


@dataclass(frozen=True)
class LongTextInput(TextInput):
    """TEXT and the model, for commands that can stream a long input instead of holding L·H·T² weights."""

    stream: Annotated[bool, typer.Option(
        "--stream", help="Compute attention a block of query rows at a time (for long inputs): statistics exact, "
                         "pictures pooled. Chosen by itself when the full tensor exceeds --max-memory.")] = False
    pool: Annotated[int, typer.Option(
        "--pool", parser=whole_number(1, 4096), metavar="P",
        help="Streamed pictures: at most P × P cells (P from 1 to 4,096), each the mean over a block of "
             "tokens.")] = 512
    words: Annotated[bool, typer.Option(
        "--words", help="Attention between words instead of sub-word tokens: to a word, the sum over its pieces; "
                        "from a word, their mean (Clark et al. 2019).")] = False


@dataclass(frozen=True)
class CaptureInput(LongTextInput):
    """Where a command's Capture comes from: TEXT run through the model, or a saved --from capture."""

    source: FromOpt = None

    def capture(self, *, window: tuple | None = None, rollout_token: str | None = None, pictures: bool = True,
                part: str | None = None, default_part: str = "cross"):
        """A Capture from --from, or by running the model on the text; of an encoder-decoder model, the
        `part` asked for (else `default_part`)."""
        if self.source is not None:
            loaded = self.saved()
            capture = _chosen_part(loaded, part, default_part)
            return _as_words(capture) if self.words else capture
        self.require_source()
        return super().capture(window=window, rollout_token=rollout_token, pictures=pictures, part=part,
                               default_part=default_part)

    def require_source(self) -> None:
        if self.text is None and self.text_file is None and self.source is None:
            raise typer.BadParameter("give the TEXT to look at (in quotes), or --from CAPTURE.npz")

    def saved(self):
        """The --from file: a Capture, or an encoder-decoder model's Parts."""
        from attnviz.data.parts import load_capture

        if self.text is not None or self.text_file is not None:
            raise typer.BadParameter("give either TEXT or --from, not both")
        if self.target is not None or self.max_new_tokens is not None:
            raise typer.BadParameter("--target and --max-new-tokens choose what the model reads; with --from "
                                     "nothing is run")
        assert self.source is not None
        return load_capture(self.source)

    def whole(self):
        """Everything the input has: a Capture, or all parts of an encoder-decoder model (Parts)."""
        self.require_source()
        if self.source is not None:
            whole = self.saved()
        else:
            text = self.require_text()
            loaded = self.load()
            self.check_model_kind(loaded, None)
            if not loaded.seq2seq:
                return super().capture()  # --words applied there
            whole = self.parts(loaded, text)
        return _as_words(whole) if self.words else whole


def _chosen_part(loaded, part: str | None, default_part: str):
    """A saved Capture as it is (--part refused: it has one kind of attention), or one part of Parts."""
    from attnviz.data.parts import Parts

    if isinstance(loaded, Parts):
        return loaded.part(part or default_part)
    if part is not None:
        raise typer.BadParameter("this capture has one kind of attention (self-attention); --part is for captures "
                                 "of encoder-decoder models", param_hint="--part")
    return loaded


def with_progress(what: str, total: int, run: Callable):
    """Run `run(step)` with a progress bar of tokens on stderr that `step(n)` advances."""
    with CliReporter().progress(what, total, "tokens") as step:
        return run(step)


@functools.cache
def _group_parameters(cls: type) -> tuple[list[inspect.Parameter], list[inspect.Parameter]]:
    """An option group's fields as keyword parameters: (arguments, options). Once per group: evaluating the
    annotations is most of what defining the commands costs at start-up."""
    hints = get_type_hints(cls, include_extras=True)
    arguments: list[inspect.Parameter] = []
    options: list[inspect.Parameter] = []
    for f in dataclasses.fields(cls):
        metadata = getattr(hints[f.name], "__metadata__", ())
        is_argument = any(type(m).__name__ == "ArgumentInfo" for m in metadata)
        (arguments if is_argument else options).append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]))
    return arguments, options


def takes(**groups: type) -> Callable:
    """Decorator: add the fields of each option-group dataclass to the command's options, and pass each
    group to the command as one object (the way simonw/llm shares option groups through decorators)."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        keyword = inspect.Parameter.KEYWORD_ONLY
        own = [p.replace(kind=keyword) for p in signature.parameters.values() if p.name not in groups]
        arguments: list[inspect.Parameter] = []
        options: list[inspect.Parameter] = []
        for cls in groups.values():
            group_arguments, group_options = _group_parameters(cls)
            arguments += group_arguments
            options += group_options
        params = arguments + own + options  # TEXT comes first on the command line, the shared options last

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
    error_line(spell(str(message), flag), "Warning" if issubclass(category, AttnvizWarning) else category.__name__)


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
                # attnviz names missing glyphs once itself; matplotlib would repeat it for every label
                warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
                warnings.filterwarnings("ignore", message=r".*(missing from font|not found\. Falling back)")
                import logging

                logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
                return func(*args, **kwargs)
        except AttnvizError as exc:
            error_line(exc.spelled(flag))
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


def _folder_like(value: str) -> bool:
    return value.endswith(("/", os.sep)) or Path(value).expanduser().is_dir()


def check_output(value: str | None, formats: tuple[str, ...]) -> None:
    """-o is checked before any model work: a folder is fine (the default name goes inside), a file needs
    one of `formats` as its suffix."""
    if value is not None and not _folder_like(value):
        from attnviz.files import check_suffix

        check_suffix(value, formats)


def output_path(value: str | None, default_name: str) -> Path:
    """Where to write: -o as given, or the default name inside -o when -o is a folder (existing, or written
    with a trailing /), or the default name in the current folder."""
    if value is None:
        return Path(default_name)
    if _folder_like(value):
        return Path(value).expanduser() / default_name
    return Path(value).expanduser()


ImageOut = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FILE", show_default=False,
    help="Also write a figure: .png, .svg or .pdf by the suffix; a folder gets the default name inside.")]


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
