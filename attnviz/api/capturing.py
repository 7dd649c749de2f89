"""The one way a text becomes attention: attnviz.capture(text, model=…), and a Capture from a forward pass the
user ran themselves (from_outputs) or from a file (load_capture)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.base.arguments import checked
from attnviz.api.models import borrows, resolve_model
from attnviz.data.capture import Capture
from attnviz.data.parts import PART_NAMES, Parts, load_capture
from attnviz.errors import InputError
from attnviz.data.picture import Picture, picture  # re-exported: a vision model's input
from attnviz.progress import Reporter
from attnviz.data.sound import Sound, sound  # re-exported: a speech model's input
from attnviz.base.selection import Selection
from attnviz.base.text import check_text
from attnviz.data.words import to_words  # re-exported: a Capture or Parts at word level

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["Sound", "sound", "capture", "capture_audio", "capture_image", "Keep", "from_outputs", "load_capture",
           "picture", "Picture", "to_words"]


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

    def window(self) -> tuple | None:
        if self.rows is None and self.cols is None:
            return None
        return (self.rows, self.cols, self.layers or Selection.everything("layer", "layers"))


@borrows
@checked
def capture(text: str, *, model: Any = None, tokenizer: Any = None, words: bool = False, stream: bool | None = None,
            keep: Keep | None = None, part: str | None = None, target: str | None = None,
            max_new_tokens: int | None = None, decoding: Any = None, truncate: bool = True, device: str = "auto",
            dtype: str = "float32", reporter: Reporter | None = None) -> Capture | Parts:
    """The attention of `text`: the one place that chooses how it is computed.

    model          a name or folder (loaded here), a Model from load_model(), or a Hugging Face model object
                   with its `tokenizer` (switched to eager attention in place if it was loaded with SDPA)
    words          attention between words instead of sub-word tokens
    stream         True: a block of query rows at a time (exact statistics, pooled pictures); None: only when
                   the full α would pass the memory budget; False: never. `keep`: what a streamed run keeps
    part           an encoder-decoder model's encoder, decoder or cross attention; None gives all three (Parts)
    target         an encoder-decoder model's decoder reads this text; without it the decoder writes
                   (`max_new_tokens`, default 20; `decoding`: an attnviz.Decoding, default greedy)
    reporter       hears of long work (the command line shows it)
    """
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
    input, the file's bytes, a float array of samples at 16 kHz or an attnviz.sound(); `model` the offline
    "whisper" (tiny.en), a Whisper folder or a Whisper model object with its `tokenizer`.

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
    if max_new_tokens is not None and not 1 <= max_new_tokens <= 448:
        raise InputError(f"max_new_tokens takes 1 to 448 (Whisper's decoder reads 448 positions); got "
                         f"{max_new_tokens}", "max_new_tokens")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    if not loaded.speech:
        raise InputError(f"{loaded.name} reads {'images' if loaded.vision else 'text'}, not sound: give a speech "
                         f"model (model='whisper', offline)", "model")
    from attnviz.engine.speech import capture_sound

    reporter = reporter or Reporter()
    if target is None:
        with reporter.progress("writing", max_new_tokens or 224, "tokens") as advance:
            return capture_sound(loaded, heard, max_new_tokens=max_new_tokens, on_step=advance)
    with reporter.status(f"reading the target over {heard.seconds:.1f} s of sound"):
        return capture_sound(loaded, heard, target=target)
