"""One input as the model reads it (a tokenised text, or a picture cut into patches), and what the Capture needs
to know of each token. Its own module, so that the text side (forward.py) and the picture side (pictures.py)
both build it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Encoded:
    """One tokenised input, ready for the model, plus what the Capture needs to know of each token."""

    inputs: dict  # tensors for model(**inputs), batch of 1, on the model's device
    tokens: list[str]  # readable (T,)
    token_ids: list[int]
    special: list[bool]
    special_kind: list[str]
    subword: list[bool]
    dropped: int  # tokens cut by truncation
    offsets: list | None = None  # each token's (start, end) in the text, (-1, -1) when it has none
    image: Any = None  # a picture's input: (h, w, 3) uint8 as the model sees it (engine/vision.py)
    grid: tuple[int, int] | None = None  # its patch grid (rows, cols)
    patch: int = 0  # pixels per patch side
    image_name: str = ""
