"""What a command looks at, resolved once: TEXT, - (standard input) or --text-file, a saved capture
(--from), long inputs (--stream, --words), and the model; the option groups a command takes (@takes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, get_type_hints
from collections.abc import Callable

import typer
from rich.text import Text

from attnviz.progress import Reporter
from attnviz.errors import spell
from attnviz.cli.errors import usage_errors
from attnviz.cli.output import err, flag, say
from attnviz.cli.params import FromOpt, MAX_NEW_TOKENS, ModelOptions, TextArg, whole_number
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


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


def read_texts(path: Path, limit: int, what: str) -> list[str]:
    """The texts of a file, one per line, or JSON lines with a text field for .jsonl (blank and undecodable lines
    skipped), at most `limit`."""
    from attnviz.corpora import corpus_format, read_lines
    from attnviz.errors import InputError
    from attnviz.base.files import open_regular

    texts: list[str] = []
    with open_regular(path, what) as handle:
        for line in read_lines(handle, str(path), corpus_format(str(path), None, None)):
            if line.text is not None and line.text.strip():
                texts.append(line.text)
            if len(texts) > limit:
                raise InputError(f"{path} has more than {limit:,} texts; {what} takes at most {limit:,}")
    if not texts:
        raise InputError(f"{path} holds no texts (one per line)")
    return texts


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
        from attnviz.base.text import check_text

        return check_text(text)

    def load_single(self, what: str):
        """The model, for a command that shows one self-attention (steps, positions, norms, sinks)."""
        loaded = self.load()
        loaded.require_single(what)
        return loaded


@dataclass(frozen=True)
class PictureSource(TextSource):
    """TEXT, or --image for a vision model: the commands whose library function takes a picture too (what the
    capture shows, verify, norms, sinks). require_text() then gives an attnviz.Picture, and the model defaults
    to dinov2."""

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
        help="A sound instead of TEXT (WAV or FLAC, at most 30 s; - reads standard input), for a speech model (the "
             "model defaults to whisper): the transcript it writes, and its attention over time.")] = None

    def require_text(self):
        """The text, or with --image the picture, with --audio the sound (read and checked once)."""
        if self.audio is not None:
            if self.text is not None or self.text_file is not None or self.image is not None:
                raise typer.BadParameter("give either TEXT (or --image) or --audio, not both", param_hint="--audio")
            return self._sound
        if self.image is None:
            if self.image_size is not None:
                raise typer.BadParameter("--image-size is for --image", param_hint="--image-size")
            return super().require_text()
        if self.text is not None or self.text_file is not None:
            raise typer.BadParameter("give either TEXT or --image, not both", param_hint="--image")
        return self._picture

    @functools.cached_property
    def _picture(self):
        from attnviz.api import picture

        return picture(self.image, size=self.image_size)

    @functools.cached_property
    def _sound(self):
        from attnviz.api import sound

        return sound(self.audio)

    def load(self, *, lm_head: bool | str = False):
        if self.audio is not None and self.model is None:  # a sound: the offline speech model
            return dataclasses.replace(self, model="whisper").load(lm_head=lm_head)
        if self.image is not None and self.model is None:  # a picture: the offline vision model
            return dataclasses.replace(self, model="dinov2").load(lm_head=lm_head)
        return super().load(lm_head=lm_head)


@dataclass(frozen=True)
class TextInput(PictureSource):
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
        attnviz generate), --stream for the others: refused in one line where they do not apply (the model
        decides, through the library)."""
        with usage_errors():
            loaded.check_inputs(part=part, target=self.target, max_new_tokens=self.max_new_tokens,
                                stream=self.streaming(), writes=writes)

    # What a command offers beside TEXT: the commands with --stream, --pool and --words say so (LongTextInput).
    def streaming(self) -> bool | None:
        return None  # this command does not stream

    def word_level(self) -> bool:
        return False

    def pool_size(self) -> int:
        return 512

    def audio_parts(self):
        """All three parts of a speech model over --audio: the decoder writes its transcript (a progress bar
        counts the tokens) or reads --target."""
        from attnviz.api import capture_audio

        if getattr(self, "words", False) or getattr(self, "stream", False):
            raise typer.BadParameter("--words and --stream are for text; a sound's attention is held whole",
                                     param_hint="--audio")
        if self.target is not None and self.max_new_tokens is not None:
            raise typer.BadParameter("give either --target (the decoder reads it) or --max-new-tokens (the decoder "
                                     "writes), not both", param_hint="--target")
        heard = self.require_text()
        loaded = self.load()
        with usage_errors():
            return capture_audio(heard, model=loaded, target=self.target, max_new_tokens=self.max_new_tokens,
                                 reporter=CliReporter())

    def parts(self, loaded, text: str, decoding=None):
        """All three attention parts of an encoder-decoder model: the decoder reads --target, or writes (a
        progress bar counts its tokens)."""
        from attnviz.api import capture

        with usage_errors():
            return capture(text, model=loaded, target=self.target, max_new_tokens=self.max_new_tokens,
                           decoding=decoding, truncate=self.truncate, reporter=CliReporter())

    def capture(self, *, window: tuple | None = None, rollout_token: str | None = None, pictures: bool = True,
                part: str | None = None, default_part: str | None = "cross"):
        """The model's Capture of the text, as attnviz.capture chooses its path: the full α when it fits the
        memory budget; else (or with --stream, where the command offers it) a pooled capture streamed a block
        of rows at a time, with the exact window (rows, cols, layers selections) and rollout row asked for.
        `pictures=False` (a command that shows only statistics) skips the pooled matrices and rollout rows.
        For an encoder-decoder model: the `part` asked for, else the one this command shows (`default_part`;
        None: all three, as Parts)."""
        from attnviz.api import Keep, capture

        if getattr(self, "image", None) is not None:  # a picture, for a vision model
            return self.image_capture()  # type: ignore[attr-defined]
        if self.audio is not None:  # a sound, for a speech model
            whole = self.audio_parts()
            return whole if (part or default_part) is None else _chosen_part(whole, part, default_part)
        text = self.require_text()
        loaded = self.load()
        self.check_model_kind(loaded, part)
        rows, cols, layers = window if window is not None else (None, None, None)
        keep = Keep(pool=self.pool_size(), rows=rows, cols=cols, layers=layers, rollout_token=rollout_token,
                    pictures=pictures)
        streaming = self.streaming()
        with usage_errors():
            return capture(text, model=loaded, words=self.word_level(), truncate=self.truncate,
                           stream=False if streaming is None else (True if streaming else None), keep=keep,
                           part=(part or default_part) if loaded.seq2seq else None, target=self.target,
                           max_new_tokens=self.max_new_tokens, reporter=CliReporter())


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

    def streaming(self) -> bool | None:
        return self.stream

    def image_capture(self):
        """The vision model's Capture of --image (the model: -m, else dinov2)."""
        from attnviz.api import capture_image

        if self.words or self.stream:
            raise typer.BadParameter("--words and --stream are for text; a picture's attention is held whole",
                                     param_hint="--image")
        chosen = self.require_text()
        loaded = self.load()
        with usage_errors():
            return capture_image(chosen, model=loaded)

    def word_level(self) -> bool:
        return self.words

    def pool_size(self) -> int:
        return self.pool


@dataclass(frozen=True)
class CaptureInput(LongTextInput):
    """Where a command's Capture comes from: TEXT run through the model, or a saved --from capture."""

    source: FromOpt = None

    def capture(self, *, window: tuple | None = None, rollout_token: str | None = None, pictures: bool = True,
                part: str | None = None, default_part: str | None = "cross"):
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
        if self.text is None and self.text_file is None and self.source is None and self.image is None \
                and self.audio is None:
            raise typer.BadParameter("give the TEXT to look at (in quotes), --image FILE, --audio FILE, or --from "
                                     "CAPTURE.npz")

    def saved(self):
        """The --from file: a Capture, or an encoder-decoder model's Parts."""
        from attnviz.data.parts import load_capture

        if self.text is not None or self.text_file is not None or self.image is not None or self.audio is not None:
            raise typer.BadParameter("give either TEXT (or --image, --audio) or --from, not both")
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
            return _as_words(whole) if self.words else whole
        return super().capture(default_part=None)


def _chosen_part(loaded, part: str | None, default_part: str | None):
    """A saved Capture as it is (--part refused: it has one kind of attention), or one part of Parts (all of
    them for no part and no default)."""
    from attnviz.data.parts import Parts

    if isinstance(loaded, Parts):
        chosen = part or default_part
        return loaded.part(chosen) if chosen else loaded
    if part is not None:
        raise typer.BadParameter("this capture has one kind of attention (self-attention); --part is for captures "
                                 "of encoder-decoder models", param_hint="--part")
    return loaded


def with_progress(what: str, total: int, run: Callable):
    """Run `run(step)` with a progress bar of tokens on stderr that `step(n)` advances."""
    with CliReporter().progress(what, total, "tokens") as step:
        return run(step)


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
            annotation = Marked[(annotation.__origin__, *infos)]  # type: ignore[valid-type]
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
        for group in groups.values():
            cls, names, help = (group.cls, group.names, group.help) if isinstance(group, Offer) else (group, None, ())
            group_arguments, group_options = _group_parameters(cls, names, help)
            arguments += group_arguments
            options += group_options
        params = arguments + own + options  # TEXT comes first on the command line, the shared options last

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for arg, group in groups.items():
                cls, names = (group.cls, group.names) if isinstance(group, Offer) else (group, None)
                made = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls)
                              if not f.name.startswith("_") and (names is None or f.name in names)})
                if names is not None:
                    object.__setattr__(made, "_offered", names)
                kwargs[arg] = made
            selections = tuple(value for value in kwargs.values()
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


@dataclass(frozen=True)
class SoundInput(ModelOptions):
    """A sound and the speech model to run it through (--audio, --target, -m), or a saved capture of one
    (--from): the commands that read only sound (align)."""

    audio: Annotated[Optional[str], typer.Option(
        "--audio", metavar="FILE", show_default=False,
        help="The sound (WAV or FLAC, at most 30 s; - reads standard input); the model defaults to whisper.")] = None
    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="TEXT", show_default=False,
        help="The transcript to time (forced alignment); without it, the one the model writes.")] = None
    source: FromOpt = None

    def parts(self):
        """The capture of sound: from --from (nothing is run), or the model over --audio."""
        from attnviz.api import capture_audio, sound

        if (self.audio is None) == (self.source is None):
            raise typer.BadParameter("give the sound to look at (--audio FILE) or a capture of one (--from "
                                     "CAPTURE.npz), one of them")
        if self.source is not None:
            if self.target is not None:
                raise typer.BadParameter("--target chooses what the model reads; with --from nothing is run",
                                         param_hint="--target")
            from attnviz.data.parts import load_capture

            return load_capture(self.source)
        heard = sound(self.audio)
        loaded = (self if self.model is not None else dataclasses.replace(self, model="whisper")).load()
        with usage_errors():
            return capture_audio(heard, model=loaded, target=self.target, reporter=CliReporter())


# --- the one input type ------------------------------------------------------------------------------------

# What a command can look at, as groups of options: each command offers some of them (Source.taking).
KINDS = {"text": ("text", "text_file"), "image": ("image", "image_size"), "audio": ("audio",),
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
        help="A sound instead of TEXT (WAV or FLAC, at most 30 s; - reads standard input), for a speech model (the "
             "model defaults to whisper): the transcript it writes, and its attention over time.")] = None
    target: Annotated[Optional[str], typer.Option(
        "--target", metavar="TEXT", show_default=False,
        help="Encoder-decoder models: the decoder reads this target text (teacher forcing); without it the "
             "decoder writes its own (greedy, --max-new-tokens).")] = None
    max_new_tokens: Annotated[Optional[int], typer.Option(
        "--max-new-tokens", "-n", parser=whole_number(1, MAX_NEW_TOKENS), metavar="N", show_default=False,
        help="Tokens to write, at most, 1 to 4,096 (attnviz generate, and encoder-decoder models without "
             "--target): default 20; the end-of-sequence token stops earlier.")] = None
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

            return sound(self.audio)
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
