"""Option types and the options commands share: one typed selection for every layer/head/token option
(bounds checked before anything is expanded), the model options as one object, scales, parts, -o.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional
from collections.abc import Callable

import typer
from rich.text import Text

from attnviz.base.sizes import MAX_NEW_TOKENS  # noqa: F401 (the options' bound; inputs imports it here)
from attnviz.base.devices import DEVICE_ALIASES, DEVICES, DTYPE_ALIASES, DTYPES  # one definition of each (no torch)
from attnviz.base.selection import Selection
from attnviz.base.text import visible
from attnviz.cli.output import CliReporter, err, flag, say

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

# Most of a run is this (torch and transformers starting, benchmarks/bench_startup.py): said while it runs, with the
# way to pay it once (a capture saved with -o, read with --from: no model at all).
LOADING = "Loading the model… (a few seconds)"
LOADING_FROM = "Loading the model… (a few seconds; --from a saved capture skips this)"  # commands that take --from


def loading_line() -> str:
    """The spinner's line while a model loads: it offers --from only where the command running takes it (and on
    capture, which writes what --from reads)."""
    from typer._click import globals as click_globals

    context = click_globals.get_current_context(silent=True)
    takes_from = context is not None and (context.info_name == "capture" or  # capture saves what --from reads
                                          any("--from" in getattr(p, "opts", ()) for p in context.command.params))
    return LOADING_FROM if takes_from else LOADING


# --- option types ------------------------------------------------------------------------------------


def selection_parser(what: str, keywords: tuple[str, ...] = (), field: str | None = None) -> Callable:
    """A --layer/--head parser: indices, negative indices, ranges, lists, 'all' (and 'mean'/'max' for heads),
    by attnviz.base.selection; anything malformed is a usage error that says what is valid."""
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
    from attnviz.base.sizes import parse_size

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
                              "Chinese, … ), smollm2, gemma3, qwen2.5-coder-0.5b or -1.5b (causal LMs), a .gguf "
                              "file; or a Hugging Face id or "
                              "local folder. Default: $ATTNVIZ_MODEL, else minilm.",
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

    def require_causal(self, command: str) -> None:
        """Refuse, before anything loads or any other argument is asked for, a model that its config.json says is
        not a causal language model, for a command that reads next-token logits (discover)."""
        from attnviz.api import model_kind
        from attnviz.errors import InputError

        kind = model_kind(self.model)
        if kind in ("encoder", "vision", "speech", "seq2seq"):
            from attnviz.api.models import default_model_name

            shown = visible(self.model or default_model_name())
            raise InputError(f"{command} needs a causal language model (e.g. -m smollm2, qwen2.5-coder-0.5b or "
                             f"gemma3, offline); {shown} is {'an' if kind in ('encoder',) else 'a'} "
                             f"{dict(seq2seq='encoder-decoder', vision='vision', speech='speech').get(kind, kind)} "
                             f"model")

    def spec(self):
        """The model options as an attnviz.ModelSpec (for workers that load their own copy)."""
        from attnviz.api import ModelSpec

        return ModelSpec(self.model, self.revision, self.device, self.dtype, self.trust_remote_code, self.max_memory)

    # The command's layer and head selections (set by @takes): checked against the model's config before its
    # weights load, where the config says its shape cheaply (attnviz.model_shape).
    _checked_first: tuple = ()

    def load_for(self, given: Any, *, lm_head: bool | str = False):
        """The model for an input (Source.resolve()): none for a saved capture (nothing runs), -m if given, else
        the input's own default (a picture: dinov2, a sound: whisper, text: the default text model)."""
        from attnviz.api import Capture, Parts
        from attnviz.api.capturing import default_model

        if isinstance(given, (Capture, Parts)):
            return None
        if self.model is None and default_model(given) is not None:
            from dataclasses import replace

            return replace(self, model=default_model(given)).load(lm_head=lm_head)
        return self.load(lm_head=lm_head)

    def later_for(self, given: Any):
        """What a command hands an API function as `model=`: the model of load_for, loaded only when the function
        asks for it (after checking its own arguments), with the head the function needs; None for a saved
        capture."""
        from attnviz.api import Capture, Parts
        from attnviz.api.models import Deferred

        if isinstance(given, (Capture, Parts)):
            return None
        return Deferred(lambda lm_head: self.load_for(given, lm_head=lm_head))

    def later(self):
        """The -m model (or the default), loaded when the API function asks for it: see later_for."""
        from attnviz.api.models import Deferred

        return Deferred(lambda lm_head: self.load(lm_head=lm_head))

    def load(self, *, lm_head: bool | str = False):
        """The model, loaded once (with a spinner on stderr); `lm_head`: with its language-model head. A layer
        or head selection out of range is refused before the weights load."""
        from attnviz.api import conversion_pending, model_shape
        from attnviz.base.devices import refuse_early

        refuse_early(self.device)  # a device this install cannot have: before torch loads
        shape = model_shape(self.model) if self._checked_first else None
        if shape is not None:
            layers, heads = shape
            for selection in self._checked_first:
                selection.resolve(layers if selection.what == "layer" else heads)  # SelectionError: exit 2

        from attnviz.api import load_model

        options = dict(revision=self.revision, device=self.device, dtype=self.dtype,
                       trust_remote_code=self.trust_remote_code, memory_budget=self.max_memory, lm_head=lm_head)
        converting = conversion_pending(self.model)
        if converting:  # once: each phase a bar or a spinner (joining, dequantizing, writing), then the load
            start = time.perf_counter()
            loaded = load_model(self.model, reporter=Converting(converting), **options)
            if err.is_terminal:  # the bars are gone: one line says what happened (scripts and pipes get none)
                say(f"Converted {converting} once into attnviz's model cache in {time.perf_counter() - start:.0f} s "
                    f"(later runs load it at once)", console=err, style="cyan")
            return loaded
        with err.status(Text(loading_line())):
            return load_model(self.model, **options)


class Converting(CliReporter):
    """A first conversion's phases on stderr, each a bar or a spinner that says which model is being converted
    once into the cache (nothing stays behind: a file refused on the way is one line, why)."""

    def __init__(self, model: str) -> None:
        self.model = model

    def status(self, text: str):
        return super().status(f"{self.model}, once: {text}")

    def progress(self, what: str, total: int, unit: str, keep: str = "", joiner: str = ""):
        """The model's name shortened first where the line is short: the step's name stays whole."""
        return super().progress(self.model, total, unit, keep=what + keep, joiner=", once: ")


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

    def options(self) -> dict:
        """The API's arguments: scale, norm, vmax."""
        return {"scale": self.scale, "norm": self.norm, "vmax": self.vmax}

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



ImageOut = Annotated[Optional[str], typer.Option(
    "--output", "-o", metavar="FILE", show_default=False,
    help="Also write a figure: .png, .svg or .pdf by the suffix; a folder gets the default name inside.")]


def answer_pair(value: Any) -> tuple[str, str]:
    """--answers A,B: two texts, split at the comma that is not inside quotes; quotes keep a leading space."""
    import csv

    if isinstance(value, (tuple, list)):
        return value[0], value[1]
    try:
        fields = next(csv.reader([value], quotechar="'", skipinitialspace=False))
    except (csv.Error, StopIteration):
        fields = []
    if len(fields) != 2 or not all(fields):
        raise typer.BadParameter(f"{value!r}: give two tokens, e.g. ' Paris',' Rome'", param_hint="--answers")
    return fields[0], fields[1]


TokenOpt = Annotated[Optional[str], typer.Option(
    "--token", metavar="TOKEN", show_default=False,
    help="A token: its index, its text (case-insensitive) or text#n for the n-th occurrence (the#2).")]


def dk_list(value) -> list[int]:
    """--dk 16,64,256: up to MAX_DK_VALUES whole numbers from 1 to MAX_DK."""
    from attnviz.api.scratch.scaling import MAX_DK, MAX_DK_VALUES  # here: --help loads no numpy

    if isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",")]
    if not 1 <= len(parts) <= MAX_DK_VALUES or not all(p.isascii() and p.isdigit() and 1 <= int(p) <= MAX_DK
                                                        for p in parts):
        raise typer.BadParameter(f"{visible(str(value))[:40]!r}: give up to {MAX_DK_VALUES} whole numbers from 1 to "
                                 f"{MAX_DK:,}, comma-separated (16,64,256)")
    return [int(p) for p in parts]


DkOpt = Annotated[Optional[str], typer.Option(  # the parser gives the list of whole numbers
    "--dk", metavar="LIST", show_default=False, parser=dk_list,
    help="The random-vector check also at these d_k (e.g. 16,64,256; each 1 to 4,096, at most 8), beside the "
         "model's own.")]


ModeOpt = Annotated[str, typer.Option(
    "--mode", parser=choice_parser(("zero", "mean"), {"zeros": "zero", "average": "mean"}), metavar="MODE",
    help="zero: the head's output α·V becomes 0; mean: its mean over the text's tokens (or over --mean-over).")]


def lengths_parser(value: Any) -> list[int] | None:
    if value is None or isinstance(value, (list, tuple)):
        return None if value is None else list(value)
    import re

    items = [v.strip() for v in str(value).split(",")]
    if not items or any(not re.fullmatch(r"[0-9]{1,7}", v) for v in items):
        raise typer.BadParameter(f"{value[:40]!r} is not a list of lengths; write e.g. 128,256,512",
                                 param_hint="--lengths")
    lengths = sorted({int(v) for v in items})
    if lengths[0] < 2:
        raise typer.BadParameter("a length is at least 2 tokens", param_hint="--lengths")
    return lengths


LengthsOpt = Annotated[Optional[str], typer.Option(  # the parser gives the sorted list of lengths
    "--lengths", metavar="LENGTHS", show_default=False, parser=lengths_parser,
    help="The lengths to measure (default: powers of two from 64).")]


def _heads_parser(value: Any) -> str:
    """--heads as typed, its syntax checked here: layer.head pairs (5.11,3.0; 2.all), or head indices."""
    from attnviz.base.selection import looks_like_pairs, parse_pairs
    from attnviz.errors import SelectionError

    spec = str(value)
    try:
        if looks_like_pairs(spec):
            parse_pairs(spec)
        else:
            Selection.parse(spec, "head", field="heads")
    except SelectionError as exc:
        raise typer.BadParameter(exc.spelled(flag).removeprefix("--heads: ")) from None
    return spec


HeadsOpt = Annotated[Optional[str], typer.Option(
    "--heads", "--head", "-H", parser=_heads_parser, metavar="HEADS", show_default=False,
    help="The heads to remove: layer.head pairs (5.11,3.0; 2.all), or head indices (0,3 or 0-2 or all) for "
         "the layers of --layer.")]
LayersOpt = Annotated[Optional[Selection], typer.Option(
    "--layer", "--layers", "-l", parser=selection_parser("layer"), metavar="LAYERS", show_default=False,
    help="With --heads as indices (default all): remove those heads of these layers (-1 is the last).")]


AnswersOpt = Annotated[Optional[str], typer.Option(  # the parser gives the pair
    "--answers", metavar="A,B", show_default=False, parser=answer_pair,
    help="The answer and the other, two tokens of the vocabulary as text (a word's leading space is part of its "
         "token): ' Paris',' Rome'.")]


def cell_parser(value: Any) -> tuple[int, int] | None:
    """--cell ROW,COL as two whole numbers (checked against the grid once the capture is known)."""
    if value is None or isinstance(value, tuple):
        return value
    pieces = value.replace(" ", "").split(",")
    if len(pieces) != 2 or not all(p.isdigit() and len(p) <= 6 for p in pieces):
        raise typer.BadParameter(f"{value!r}: give the cell as ROW,COL, e.g. 3,7", param_hint="--cell")
    return int(pieces[0]), int(pieces[1])



CellOpt = Annotated[Optional[str], typer.Option(  # the parser gives (row, col)
    "--cell", metavar="ROW,COL", show_default=False, parser=cell_parser,
    help="A picture's capture: draw where this cell of its grid looks (its row of α) instead of [CLS].")]
