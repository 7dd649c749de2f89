"""What a command looks at, resolved once: one Source (TEXT, - for standard input, --text-file, --from, --image,
--audio, and how to read them), the texts of a file (read_texts), and the option groups a command takes
(@takes). The API does the rest: attnviz.capture routes text, pictures and sounds; a saved capture runs nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, get_type_hints

import typer

from attnviz.base.selection import Selection
from attnviz.cli.output import CliReporter
from attnviz.base.options import is_options
from attnviz.cli.options import collect as collect_options, parameters as option_parameters
from attnviz.cli.params import choice_parser, FromOpt, MAX_NEW_TOKENS, ModelOptions, TextArg, whole_number
from attnviz.data.languages import LANGUAGES, TASKS

# Imports inside the functions (the API, numpy) keep `attnviz --help` and each command's --help light.

__all__ = ["Source", "Offer", "takes", "read_text", "read_texts", "two_prompts", "CliReporter", "MAX_TEXT_BYTES"]

MAX_TEXT_BYTES = 1_000_000  # text from a file or stdin


def read_text(source: Path | None) -> str:
    """The text of a file (or of stdin for None), as UTF-8, at most MAX_TEXT_BYTES."""
    from attnviz.errors import InputError

    name = "standard input" if source is None else str(source)
    try:
        if source is None:
            data = sys.stdin.buffer.read(MAX_TEXT_BYTES + 1)
        else:
            from attnviz.base.files import read_regular

            data = read_regular(source, MAX_TEXT_BYTES, "text")
    except OSError as exc:
        raise InputError(f"cannot read the text from {name}: {exc.strerror or exc}") from None
    if len(data) > MAX_TEXT_BYTES:
        raise InputError(f"the text in {name} is over {MAX_TEXT_BYTES:,} bytes; give a shorter one")
    try:
        return data.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise InputError(f"the text in {name} is not UTF-8 (byte {exc.start}); save it as UTF-8") from None


MAX_CORPUS_BYTES = 64 << 20  # a file of texts is read to at most this much (an endless input stops here)


def read_texts(path: str | Path, limit: int, what: str, *, text_on_stdin: bool = False) -> list[str]:
    """The texts of a file of texts (--corpus, --mean-over, --reference), as `attnviz corpus` reads them: one per
    line, or JSON lines with a text field (.jsonl/.json, or — standard input and any other name but .txt — when
    the first line that holds text is a JSON object); - reads standard input (refused when TEXT is read from
    it too). Blank and unreadable lines are skipped and counted on stderr; at most `limit` texts and
    MAX_CORPUS_BYTES bytes."""
    from attnviz.base.files import open_regular
    from attnviz.base.text import visible
    from attnviz.cli.output import err, say
    from attnviz.corpora import corpus_format, read_lines
    from attnviz.errors import InputError

    path = str(path)
    if path == "-" and text_on_stdin:
        raise typer.BadParameter("standard input is read once: give TEXT or the texts of "
                                 f"{what} as a file", param_hint=what)
    name = "standard input" if path == "-" else visible(path)
    raw = sys.stdin.buffer if path == "-" else open_regular(Path(path), what)
    stream = _Counted(raw)
    texts: list[str] = []
    bad = 0
    try:
        for line in read_lines(stream, name, corpus_format(path, None, None),  # type: ignore[arg-type]
                               stop=lambda: stream.read_so_far > MAX_CORPUS_BYTES):
            if line.text is None or not line.text.strip():
                bad += 1
                continue
            texts.append(line.text)
            if len(texts) > limit:
                raise InputError(f"{name} holds more than {limit:,} texts; {what} takes at most {limit:,} (split "
                                 f"the file)")
    finally:
        if path != "-":
            raw.close()
    if stream.read_so_far > MAX_CORPUS_BYTES:
        raise InputError(f"{name} is more than {MAX_CORPUS_BYTES >> 20} MiB; {what} reads at most that (split the "
                         f"file)")
    if not texts:
        raise InputError(f"{name} holds no text (one per line, or JSON lines with a text field)")
    if bad:
        say(f"{bad:,} line{'s' if bad != 1 else ''} of {name} skipped (empty or not a text)", console=err)
    return texts


class _Counted:
    """A binary stream that counts the bytes read from it."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.read_so_far = 0

    def readline(self, size: int = -1) -> bytes:
        line = self.stream.readline(size)
        self.read_so_far += len(line)
        return line


# --- the one input type ------------------------------------------------------------------------------------

# What a command can look at, as groups of options: each command offers some of them (Source.taking).
KINDS = {"text": ("text", "text_file"), "image": ("image", "image_size"), "audio": ("audio", "language", "task"),
         "seq2seq": ("target", "max_new_tokens"), "long": ("stream", "pool", "words"), "saved": ("source",)}


@dataclass(frozen=True)
class Offer:
    """An option group offered in part: the fields of `cls` named in `names` (the others keep their defaults),
    with the help of some said in the command's own words (`help`: (name, text) pairs)."""

    cls: type
    names: tuple[str, ...]
    help: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Source:
    """What a command looks at, as typed: TEXT (or - for standard input, or --text-file), --image, --audio, a
    saved capture (--from), and how to read it (--target, --max-new-tokens for encoder-decoder models;
    --stream, --pool, --words for long text). resolve() checks that one input is given and reads it, once;
    options() are the reading options for the API. A command offers the kinds it takes (Source.taking)."""

    text: TextArg = None
    text_file: Annotated[Optional[Path], typer.Option(
        "--text-file", help="Read the text from this file (UTF-8) instead of TEXT.", dir_okay=False,
        show_default=False, metavar="FILE")] = None
    image: Annotated[Optional[str], typer.Option(
        "--image", metavar="FILE", show_default=False,
        help="A picture instead of TEXT (PNG, JPEG or WebP; - reads standard input), for a vision model (the "
             "model defaults to dinov2): attention over its patches, tokens [CLS] and p(row,col).")] = None
    image_size: Annotated[Optional[int], typer.Option(
        "--image-size", parser=whole_number(28, 1024), metavar="PIXELS", show_default=False,
        help="--image: the longer side fed to the model, 28 to 1,024 pixels (default: the model's own, 224 for "
             "dinov2); both sides are rounded to whole patches.")] = None
    audio: Annotated[Optional[str], typer.Option(
        "--audio", metavar="FILE", show_default=False,
        help="A sound instead of TEXT (WAV or FLAC, at most 120 s, read 30 s at a time; - reads standard input), "
             "for a speech model (the model defaults to whisper, English; -m whisper-base hears 99 languages): the "
             "transcript it writes, and its attention over time.")] = None
    language: Annotated[Optional[str], typer.Option(
        "--language", parser=choice_parser(tuple(LANGUAGES), {}), metavar="CODE", show_default=False,
        help="--audio: the language spoken, a Whisper code (en, ko, ja, zh, de, …); default: a multilingual model "
             "(-m whisper-base) detects it and says how sure it is; -m whisper (tiny.en) hears English.")] = None
    task: Annotated[str, typer.Option(
        "--task", parser=choice_parser(TASKS, {}), metavar="TASK",
        help="--audio: transcribe (the words spoken) or translate (an English translation, whose cross-attention "
             "then lines English words up with the speech; a multilingual model).")] = "transcribe"
    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="TEXT", show_default=False,
        help="Encoder-decoder models: the decoder reads this target text (teacher forcing); without it the "
             "decoder writes its own (greedy, --max-new-tokens).")] = None
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", parser=whole_number(1, MAX_NEW_TOKENS), metavar="N", show_default=False,
        help="Tokens to write, at most, 1 to 4,096 (attnviz generate, and encoder-decoder models without "
             "--target; for a sound, --audio, 1 to 448: Whisper's decoder positions): default 20; the "
             "end-of-sequence token stops earlier.")] = None
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
    source: FromOpt = None

    @classmethod
    def taking(cls, *kinds: str, **help: str) -> Offer:
        """The options of the kinds of input a command takes (text, image, audio, seq2seq, long, saved), an
        option's help in the command's own words where given (audio="…")."""
        return Offer(cls, tuple(name for kind in kinds for name in KINDS[kind]), tuple(help.items()))

    @property
    def offered(self) -> tuple[str, ...]:
        return getattr(self, "_offered", tuple(f.name for f in dataclasses.fields(self)))

    def takes(self, kind: str) -> bool:
        return KINDS[kind][0] in self.offered

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

    def resolve(self):
        """The one input, read and checked once: the text (str), a picture (attnviz.Picture), a sound
        (attnviz.Sound), or a saved capture (a Capture, or an encoder-decoder model's Parts)."""
        return self._resolved

    @functools.cached_property
    def _resolved(self):
        texts = self.text is not None or self.text_file is not None
        if self.audio is None and (self.language is not None or self.task != "transcribe"):
            flag = "--language" if self.language is not None else "--task"
            kind = "a saved capture" if self.source is not None else "a picture" if self.image is not None else "text"
            raise typer.BadParameter(f"{flag} is for --audio (what a speech model hears); this input is {kind}",
                                     param_hint=flag)
        if self.source is not None:
            if texts or self.image is not None or self.audio is not None:
                raise typer.BadParameter("give either TEXT (or --image, --audio) or --from, not both")
            if self.target is not None or self.max_new_tokens is not None:
                raise typer.BadParameter("--target and --max-new-tokens choose what the model reads; with --from "
                                         "nothing is run")
            from attnviz.api import load_capture

            return load_capture(self.source)
        if self.audio is not None:
            if texts or self.image is not None:
                raise typer.BadParameter("give either TEXT (or --image) or --audio, not both", param_hint="--audio")
            if self.words or self.stream:
                raise typer.BadParameter("--words and --stream are for text; a sound's attention is held whole",
                                         param_hint="--audio")
            if self.target is not None and self.max_new_tokens is not None:
                raise typer.BadParameter("give either --target (the decoder reads it) or --max-new-tokens (the "
                                         "decoder writes), not both", param_hint="--target")
            from attnviz.api import sound

            return sound(self.audio, language=self.language, task=self.task)
        if self.image is not None:
            if texts:
                raise typer.BadParameter("give either TEXT or --image, not both", param_hint="--image")
            if self.words or self.stream:
                raise typer.BadParameter("--words and --stream are for text; a picture's attention is held whole",
                                         param_hint="--image")
            from attnviz.api import picture

            return picture(self.image, size=self.image_size)
        if self.image_size is not None:
            raise typer.BadParameter("--image-size is for --image", param_hint="--image-size")
        text = self.given_text()
        if text is None:
            raise typer.BadParameter(self._missing())
        from attnviz.base.text import check_text

        return check_text(text)

    def _missing(self) -> str:
        """What to give, in the words of what this command takes."""
        if self.takes("saved"):
            others = [o for kind, o in (("image", "--image FILE"), ("audio", "--audio FILE")) if self.takes(kind)]
            return f"give the TEXT to look at (in quotes), {', '.join(others + ['or --from CAPTURE.npz'])}"
        return ("give the TEXT to look at, in quotes (or - to read it from standard input, or --text-file FILE)")

    def options(self, **keep: Any) -> dict:
        """How the API reads the input (attnviz.capture's options): words, streaming, what a streamed run keeps,
        an encoder-decoder model's target and tokens to write. `keep`: attnviz.Keep's fields a command sets
        (rows, cols, layers, rollout_token, pictures)."""
        from attnviz.api import Keep

        options: dict[str, Any] = {"words": self.words, "target": self.target, "max_new_tokens": self.max_new_tokens,
                                   "reporter": CliReporter()}
        if self.takes("long"):
            options["stream"] = True if self.stream else None
            options["keep"] = Keep(pool=self.pool, **keep)
        else:
            options["stream"] = False  # a command that does not stream holds the whole α (or says why it cannot)
        return options


@functools.cache
def _group_parameters(cls: type, names: tuple[str, ...] | None = None,
                      help: tuple[tuple[str, str], ...] = ()) -> tuple[list[inspect.Parameter],
                                                                       list[inspect.Parameter]]:
    """An option group's fields (those named in `names`, or all) as keyword parameters: (arguments, options),
    with the help texts `help` gives. Once per group: evaluating the annotations is most of what defining the
    commands costs at start-up."""
    hints = get_type_hints(cls, include_extras=True)
    own = dict(help)
    arguments: list[inspect.Parameter] = []
    options: list[inspect.Parameter] = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or (names is not None and f.name not in names):
            continue
        metadata = getattr(hints[f.name], "__metadata__", ())
        is_argument = any(type(m).__name__ == "ArgumentInfo" for m in metadata)
        annotation = hints[f.name]
        if f.name in own:  # the same option, its help in this command's words
            import copy
            from typing import Annotated as Marked

            infos = [copy.copy(m) for m in metadata]
            for info in infos:
                info.help = own[f.name]
            annotation = Marked[tuple([annotation.__origin__, *infos])]
        (arguments if is_argument else options).append(
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=annotation))
    return arguments, options


def takes(**groups: type | Offer) -> Callable:
    """Decorator: add the fields of each option-group dataclass (or those an Offer names) to the command's
    options, and pass each group to the command as one object (the way simonw/llm shares option groups through
    decorators)."""

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        keyword = inspect.Parameter.KEYWORD_ONLY
        own = [p.replace(kind=keyword) for p in signature.parameters.values() if p.name not in groups]
        arguments: list[inspect.Parameter] = []
        options: list[inspect.Parameter] = []
        analysis: list[inspect.Parameter] = []  # an analysis's options dataclass: its options first
        for group in groups.values():
            cls, names, help = (group.cls, group.names, group.help) if isinstance(group, Offer) else (group, None, ())
            if is_options(cls):
                analysis += option_parameters(cls)
                continue
            group_arguments, group_options = _group_parameters(cls, names, help)
            arguments += group_arguments
            options += group_options
        params = arguments + analysis + own + options  # TEXT first, the analysis's options, the shared ones last

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for arg, group in groups.items():
                cls, names = (group.cls, group.names) if isinstance(group, Offer) else (group, None)
                if is_options(cls):
                    kwargs[arg] = collect_options(cls, kwargs)
                    continue
                made = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls)
                              if not f.name.startswith("_") and (names is None or f.name in names)})
                if names is not None:
                    object.__setattr__(made, "_offered", names)
                kwargs[arg] = made
            given = [*kwargs.values(), *(found for value in kwargs.values() if is_options(type(value))
                                         for found in getattr(value, "_selections", ()))]
            selections = tuple(value for value in given
                               if isinstance(value, Selection) and value.what in ("layer", "head"))
            for group in kwargs.values():
                if isinstance(group, ModelOptions) and selections:  # checked before the weights load
                    object.__setattr__(group, "_checked_first", selections)
            return func(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # Typer must see the new signature, not the function's own
        return wrapper

    return decorate


def two_prompts(inp: Source, corrupt: str | None, usage: str) -> tuple[str, str]:
    """CLEAN and CORRUPT of a command that compares two prompts (patch, discover): CLEAN as TEXT, - or
    --text-file (then the one argument given is CORRUPT), CORRUPT the prompt itself. `usage` the command line
    said when CORRUPT is missing."""
    if inp.text_file is not None and corrupt is None:  # --text-file CLEAN: the one argument is CORRUPT
        inp, corrupt = dataclasses.replace(inp, text=None), inp.text
    if corrupt is None:
        raise typer.BadParameter(f"give the clean prompt and the corrupted one: {usage}")
    if corrupt == "-":
        raise typer.BadParameter("CORRUPT is the prompt itself (standard input is for CLEAN, as -)")
    return inp.resolve(), corrupt
