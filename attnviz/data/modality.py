"""What an input is made of: text (tokens), a picture (the cells of its grid, after [CLS]) or a sound (frames of
20 ms, then the silence that pads it to 30 s). A modality is a small object, so that the rest of attnviz asks it
rather than branching on the kind of input: the offline model an input of its kind defaults to, whether it can
be streamed or read word by word, what one position is called, and how a capture of it says its size.

Nothing here imports numpy or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Modality", "TEXT", "PICTURE", "SOUND", "of_input", "of_capture"]


@dataclass(frozen=True)
class Modality:
    """One kind of input.

    name            "text", "picture" or "sound"
    position        what one query or key position is: a token, a cell of the picture's grid, a frame of sound
    default_model   the offline model an input of this kind is read by when none is named (None: the default
                    text model)
    whole           its attention is held whole: no streaming, no word level
    """

    name: str
    position: str
    default_model: str | None
    whole: bool

    def size(self, capture: Any) -> str:
        """The size of a capture of this kind, as a table's title says it: "T = 8", "T = 132 over 131 frames of
        sound (20 ms each) and the silence after it", "2 target × 7 source tokens"."""
        if self is SOUND:
            silence = " and the silence after it" if capture.n_keys > capture.frames else ""
            queries = f"{capture.n_tokens} target tokens" if not capture.square else f"T = {capture.n_tokens}"
            return (f"{queries} over {capture.frames} frames of sound ({capture.frame_seconds * 1000:.0f} ms each)"
                    f"{silence}")
        if capture.square:
            blocks = capture.n_tokens if capture.long is not None else 0
            return f"T = {capture.input_tokens}" + (f" (pictures: {blocks} blocks)" if blocks > 1 else "")
        return f"{capture.n_tokens} target × {capture.n_keys} source tokens"


TEXT = Modality("text", "token", None, whole=False)
PICTURE = Modality("picture", "cell", "dinov2", whole=True)
SOUND = Modality("sound", "frame", "whisper", whole=True)


def of_input(given: Any) -> Modality:
    """The modality of an input: an attnviz.Picture, an attnviz.Sound, or text (a saved capture: its own)."""
    if getattr(given, "is_picture", False):
        return PICTURE
    if getattr(given, "is_sound", False):
        return SOUND
    if hasattr(given, "captures"):  # an encoder-decoder model's Parts
        return of_capture(next(iter(given.captures.values())))
    if hasattr(given, "attentions"):
        return of_capture(given)
    return TEXT


def of_capture(capture: Any) -> Modality:
    """The modality of a capture: a picture's holds its grid, a sound's its spectrogram (both parts that hear
    it; an encoder-decoder model's decoder reads text)."""
    if capture.grid is not None:
        return PICTURE
    if capture.mel is not None:
        return SOUND
    return TEXT
