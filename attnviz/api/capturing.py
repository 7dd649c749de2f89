"""The one way an input becomes attention: attnviz.capture(text, picture or sound, model=…), and a Capture from a
forward pass the user ran themselves (from_outputs) or from a file (load_capture). Every command that shows
attention gets it through attention_of: a saved capture as it is, or the input through the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.base.arguments import checked
from attnviz.api.models import borrows, for_input, resolve_model
from attnviz.data.capture import Capture
from attnviz.data.parts import PART_NAMES, Parts, load_capture
from attnviz.data.modality import PICTURE, of_input
from attnviz.errors import InputError, UsageError, arg
from attnviz.data.picture import Picture, picture  # re-exported: a vision model's input
from attnviz.progress import Reporter
from attnviz.data.sound import Sound, sound, WINDOW_SECONDS  # Sound, sound re-exported: a speech model's input
from attnviz.base.selection import Selection
from attnviz.base.text import check_text
from attnviz.data.words import to_words  # re-exported: a Capture or Parts at word level

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["Sound", "sound", "capture", "capture_audio", "capture_image", "Keep", "from_outputs", "load_capture",
           "picture", "Picture", "to_words", "attention_of", "one_attention", "default_model"]

WHISPER_TOKENS = 448  # Whisper's decoder positions: what it can write for one sound


MAX_POOL = 4096  # a pooled picture's side, at most (the command line's --pool takes the same)


@dataclass(frozen=True)
class Keep:
    """What a streamed capture keeps beside its statistics (a long input's α is never held whole).

    pool           the pooled pictures: at most pool × pool cells, each a block mean
    rows, cols     a window of α kept exactly (selections of query rows, key columns); layers: of these layers
    rollout_token  a token (index or text) whose rollout row is kept
    pictures       False: statistics only (no pooled matrices, no rollout rows)
    """

    pool: int = 512
    rows: Selection | None = None
    cols: Selection | None = None
    layers: Selection | None = None
    rollout_token: str | None = None
    pictures: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.pool, bool) or not isinstance(self.pool, int) or not 1 <= self.pool <= MAX_POOL:
            raise UsageError(f"{arg('pool')} takes a whole number from 1 to {MAX_POOL:,} cells a side; got "
                             f"{self.pool!r:.40}", "pool")

    def window(self) -> tuple | None:
        if self.rows is None and self.cols is None:
            return None
        return (self.rows, self.cols, self.layers or Selection.everything("layer", "layers"))


@borrows
@checked
def capture(text: str | Picture | Sound, *, model: Any = None, tokenizer: Any = None, words: bool = False,
            stream: bool | None = None, keep: Keep | None = None, part: str | None = None, target: str | None = None,
            max_new_tokens: int | None = None, decoding: Any = None, norms: bool = False, truncate: bool = True,
            device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Capture | Parts:
    """The attention of `text` (or of a picture, attnviz.picture(), or a sound, attnviz.sound(), each through its
    own door: capture_image, capture_audio): the one place that chooses how it is computed.

    model          a name or folder (loaded here), a Model from load_model(), or a Hugging Face model object
                   with its `tokenizer` (switched to eager attention in place if it was loaded with SDPA)
    words          attention between words instead of sub-word tokens
    stream         True: a block of query rows at a time (exact statistics, pooled pictures); None: only when
                   the full α would pass the memory budget; False: never. `keep`: what a streamed run keeps
    part           an encoder-decoder model's encoder, decoder or cross attention; None gives all three (Parts)
    target         an encoder-decoder model's decoder reads this text; without it the decoder writes
                   (`max_new_tokens`, default 20; `decoding`: an attnviz.Decoding, default greedy)
    norms          the value-weighted norms ‖α_ij·f_h(x_j)‖ (each query's shares of them) instead of α
    reporter       hears of long work (the command line shows it)
    """
    if max_new_tokens is not None:
        from attnviz.engine.generation import Decoding

        Decoding(max_new_tokens=max_new_tokens)  # a count no decoding takes is refused before any model loads
    if norms:
        from attnviz.api.values import norms as value_norms

        shares = value_norms(text, model=model, tokenizer=tokenizer, truncate=truncate,  # type: ignore[arg-type]
                             device=device, dtype=dtype, reporter=reporter).capture
        return to_words(shares) if words else shares
    modality = of_input(text)
    if modality.whole:  # a picture or a sound, each through its own door
        if words or stream:
            raise UsageError(f"{arg('words')} and {arg('stream')} are for text; a {modality.name}'s attention is "
                             f"held whole", "words" if words else "stream")
        if modality is PICTURE:
            return capture_image(text, model=for_input(model, text), device=device, dtype=dtype)
        whole = capture_audio(text, model=for_input(model, text), tokenizer=tokenizer, target=target,
                              max_new_tokens=max_new_tokens, device=device, dtype=dtype, reporter=reporter)
        return whole.part(part) if part is not None else whole
    assert isinstance(text, str)  # a picture and a sound went through their own doors above
    check_text(text)
    if part is not None and part not in PART_NAMES:
        raise InputError(f"part must be one of {', '.join(PART_NAMES)}, not {part!r}", "part")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    keep = keep or Keep()
    from attnviz.engine.capturing import run_capture

    return run_capture(loaded, text, words=words, stream=stream, part=part, target=target,
                       max_new_tokens=max_new_tokens, truncate=truncate, pool=keep.pool, window=keep.window(),
                       rollout_token=keep.rollout_token, pictures=keep.pictures, decoding=decoding,
                       reporter=reporter or Reporter())


@checked
def from_outputs(outputs: Any, inputs: Any, tokenizer: Any, *, text: str | None = None,
                 model: str | None = None) -> Capture:
    """The Capture of the essays' own code: `out = model(**inputs, output_attentions=True)`, then
    `attnviz.from_outputs(out, inputs, tokenizer)`. Checked like a capture file (shapes, the α limit, rows
    sum to 1)."""
    from attnviz.engine.outputs import capture_from_outputs

    return capture_from_outputs(outputs, inputs, tokenizer, text=text, model=model)


@borrows
@checked
def capture_image(image: Any, *, model: Any = "dinov2", size: int | None = None, device: str = "auto",
                  dtype: str = "float32") -> Capture:
    """The attention of a vision transformer over one picture: `image` a path (PNG, JPEG or WebP), "-" for
    standard input, the file's bytes, an (H, W, 3) uint8 RGB array, a PIL image or an attnviz.picture();
    `model` a vision model's name or folder (the offline "dinov2", a ViT, DeiT, DINOv2, CLIP or SigLIP vision
    folder) or object.

    The picture is fitted whole to the patch grid (its longer side `size` pixels, default the model's own, both
    sides whole patches). The Capture's tokens are [CLS] (and any register tokens) then p(row,col) row by row;
    `capture.image` is the picture as the model saw it and `capture.grid` its (rows, cols)."""
    chosen = picture(image, size=size)
    loaded = resolve_model(model, None, device=device, dtype=dtype)
    from attnviz.engine.vision import capture_image as run

    return run(loaded, chosen)


@borrows
@checked
def capture_audio(audio: Any, *, model: Any = "whisper", tokenizer: Any = None, target: str | None = None,
                  max_new_tokens: int | None = None, device: str = "auto", dtype: str = "float32",
                  reporter: Reporter | None = None) -> Parts:
    """The attention of a speech model (Whisper) over one sound: `audio` a path (WAV or FLAC), "-" for standard
    input, the file's bytes, a float array of samples at 16 kHz or an attnviz.sound() (which says the language
    and the task: attnviz.sound(path, language="ko", task="translate")); `model` the offline "whisper" (tiny.en),
    "whisper-base" (multilingual: the language detected where not given), a Whisper folder or a Whisper model
    object with its `tokenizer`. A sound over 30 s is read 30 s at a time (cross and decoder parts only).

    The decoder writes the transcript greedily (at most `max_new_tokens`, default 224), as faster-whisper does
    without timestamps, or reads `target`. The Parts: encoder (frames × frames), decoder (tokens × tokens) and
    cross (tokens × frames) attention; the keys of the sound are its 20-ms frames, 0.00s, 0.02s, …, then one
    "(silence)" for the padding to 30 s (the sum of the weights on it). Each part that hears the sound keeps it
    (`.sound`, 16 kHz) and its log-mel spectrogram (`.mel`)."""
    heard = sound(audio)
    if target is not None:
        check_text(target)
        if max_new_tokens is not None:
            raise InputError("give either target (the decoder reads it) or max_new_tokens (the decoder writes), "
                             "not both", "target")
    if max_new_tokens is not None and not 1 <= max_new_tokens <= WHISPER_TOKENS:
        raise UsageError(f"{arg('max_new_tokens')} takes 1 to {WHISPER_TOKENS} for a sound (Whisper's decoder reads "
                         f"{WHISPER_TOKENS} positions); got {max_new_tokens:,}", "max_new_tokens")
    if target is not None and heard.seconds > WINDOW_SECONDS:
        raise InputError(f"{arg('target')} is read against one window of {WINDOW_SECONDS:g} s; this sound lasts "
                         f"{heard.seconds:.1f} s: cut it, or let the model write", "target")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    if not loaded.speech:
        raise InputError(f"{loaded.name} reads {'images' if loaded.vision else 'text'}, not sound: give a speech "
                         f"model (model='whisper', offline)", "model")
    from attnviz.engine.speech import capture_sound, reading, windowed

    reporter = reporter or Reporter()
    if windowed(heard):  # over 30 s: 30 s at a time, each window written on its own
        from attnviz.engine.windows import capture_windows

        language, task = reading(loaded, heard)
        windows = -(-len(heard.samples) // int(WINDOW_SECONDS * 16_000))
        with reporter.progress(f"writing, {windows} windows of 30 s", windows * (max_new_tokens or 224),
                               "tokens") as advance:
            return capture_windows(loaded, heard, language, task, max_new_tokens, advance)
    if target is None:
        with reporter.progress("writing", max_new_tokens or 224, "tokens") as advance:
            return capture_sound(loaded, heard, max_new_tokens=max_new_tokens, on_step=advance)
    with reporter.status(f"reading the target over {heard.seconds:.1f} s of sound"):
        return capture_sound(loaded, heard, target=target)


def default_model(given: Any) -> str | None:
    """The offline model an input defaults to when none is named: dinov2 for a picture, whisper for a sound, None
    (the default text model) for text."""
    return of_input(given).default_model


def attention_of(given: Any, *, model: Any = None, tokenizer: Any = None, part: str | None = None,
                 default_part: str | None = "cross", words: bool = False, stream: bool | None = False,
                 keep: Keep | None = None, target: str | None = None, max_new_tokens: int | None = None,
                 truncate: bool = True, device: str = "auto", dtype: str = "float32",
                 reporter: Reporter | None = None) -> Capture | Parts:
    """What a command shows: a saved capture as it is (at word level with `words`), or the input (text, a
    picture, a sound) through the model. Of an encoder-decoder model's attention, the `part` asked for, else
    `default_part` (None: all three, as Parts)."""
    if isinstance(given, (Capture, Parts)):
        if target is not None or max_new_tokens is not None:
            raise UsageError(f"{arg('target')} and {arg('max_new_tokens')} choose what the model reads; a saved "
                             f"capture runs nothing", "target")
        chosen = _part_of(given, part, default_part)
        return to_words(chosen) if words else chosen
    if isinstance(given, str):
        loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
        loaded.check_inputs(part=part, target=target, max_new_tokens=max_new_tokens, stream=stream)
        return capture(given, model=loaded, words=words, stream=stream, keep=keep,
                       part=(part or default_part) if loaded.seq2seq else None, target=target,
                       max_new_tokens=max_new_tokens, truncate=truncate, reporter=reporter)
    whole = capture(given, model=model, tokenizer=tokenizer, words=words, stream=stream, target=target,
                    max_new_tokens=max_new_tokens, device=device, dtype=dtype, reporter=reporter)
    return _part_of(whole, part, default_part)


def one_attention(given: Any, *, default_part: str = "cross", **options: Any) -> Capture:
    """attention_of where one kind of attention is shown: a Capture (of an encoder-decoder model, `part` or
    `default_part`)."""
    whole = attention_of(given, default_part=default_part, **options)
    assert isinstance(whole, Capture)  # a part is always chosen
    return whole


def _part_of(whole: Capture | Parts, part: str | None, default_part: str | None) -> Capture | Parts:
    """A capture as it is (a part refused: it has one kind of attention), or one part of Parts (all of them for
    no part and no default)."""
    if isinstance(whole, Parts):
        chosen = part or default_part
        return whole.part(chosen) if chosen else whole
    if part is not None:
        raise UsageError(f"this capture has one kind of attention (self-attention); {arg('part')} is for captures "
                         f"of encoder-decoder models", "part")
    return whole
