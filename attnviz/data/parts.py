"""An encoder-decoder model's attention: three Captures (encoder, decoder, cross) over two token sides, saved
as one file (format 2); and load_capture, which reads either format."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from attnviz.base import registry
from attnviz.data.capture import Capture
from attnviz.data.saving import read_parts, read_v1, write_parts
from attnviz.data.npzformat import PARTS_FORMAT_VERSION, capture_members, format_version
from attnviz.data.sides import PART_AXES, PART_META, PART_NAMES, SIDE_KEYS, part_meta  # noqa: F401 (re-exported)
from attnviz.errors import AttentionCheckError, CaptureFormatError, SelectionError, arg
from attnviz.base.npzfile import read_npz


def heard(meta: dict) -> dict:
    """What a speech model heard: {"language": "ko", "language_probability": 0.93 (None: as asked), "task":
    "transcribe"}; {} where the capture is of no sound (every speech result's to_dict carries it)."""
    if "language" not in meta:
        return {}
    return {"language": meta["language"], "language_probability": meta.get("language_probability"),
            "task": meta.get("task", "transcribe")}


def heard_text(meta: dict) -> str:
    """The same in words: "language ko (detected, 93%)", "language ko (as given)", ", translated to English"."""
    found = heard(meta)
    if not found:
        return ""
    how = (f"detected, {found['language_probability']:.0%}" if found["language_probability"] is not None
           else "as given" if meta.get("multilingual", True) else "an English-only model")
    return f"language {found['language']} ({how})" + (", translated to English" if found["task"] == "translate"
                                                        else "")


@dataclass(frozen=True, eq=False)
class Parts:
    """The attention of an encoder-decoder model (T5, BART, Marian): encoder self-attention over the source
    (L, H, S, S), decoder self-attention over the target (L, H, T, T, causal) and cross-attention from target
    queries to source keys (L, H, T, S). Each part is a Capture; they share one meta (model, source_text,
    target_text, …). Saved as capture format 2."""

    command: ClassVar[str] = "capture"  # the command whose result it is
    captures: dict[str, Capture]

    def __post_init__(self) -> None:
        unknown = set(self.captures) - set(PART_NAMES)
        if unknown or not self.captures:
            raise AttentionCheckError(f"parts must be some of {', '.join(PART_NAMES)}, not {sorted(unknown)}")
        object.__setattr__(self, "captures", {n: self.captures[n] for n in PART_NAMES if n in self.captures})
        source = [self.captures[n].key_side.tokens for n in ("encoder", "cross") if n in self.captures]
        target = [self.captures[n].tokens for n in ("decoder", "cross") if n in self.captures]
        if len(set(source)) > 1 or len(set(target)) > 1:
            raise AttentionCheckError("the parts do not share the same source and target tokens")

    @property
    def names(self) -> list[str]:
        return list(self.captures)

    @property
    def meta(self) -> dict:
        """The shared meta: a part's own, less what is the part's alone."""
        first = next(iter(self.captures.values()))
        return {k: v for k, v in first.meta.items() if k not in PART_META}

    @property
    def model(self) -> str:
        return str(self.meta.get("model", "?"))

    @property
    def source_text(self) -> str:
        """What the encoder read: the source text (a speech model: the sound's name)."""
        return str(self.meta.get("source_text", ""))

    @property
    def target_text(self) -> str:
        """What the decoder read or wrote: the target text given, or the one it generated."""
        return str(self.meta.get("target_text", ""))

    @property
    def transcript(self) -> str | None:
        """A speech model's transcript: the text it wrote (or was given) for the sound; None for a text model."""
        return self.target_text if self.sound is not None else None

    def _heard(self) -> Capture | None:
        return next((c for c in self.captures.values() if c.sound is not None), None)

    @property
    def sound(self) -> np.ndarray | None:
        """A speech model's input: the samples at 16 kHz (n,) float32, kept by the parts that hear it; else None."""
        heard = self._heard()
        return None if heard is None else heard.sound

    @property
    def mel(self) -> np.ndarray | None:
        """A speech model's log-mel spectrogram (bins, 2N) of the N frames with sound; else None."""
        heard = self._heard()
        return None if heard is None else heard.mel

    def _repr_html_(self) -> str:
        """In a notebook: the interactive viewer with a list of the parts, inline and offline."""
        return registry.view("html")(self)

    def part(self, name: str) -> Capture:
        if name not in self.captures:
            have = ", ".join(self.names)
            raise SelectionError(f"{arg('part')}: this capture holds {have}, not {name}", "part")
        return self.captures[name]

    def save(self, path: str | os.PathLike) -> Path:
        """Write format 2 atomically: each part's α, the source and target tokens once, one meta."""
        return write_parts(self.captures, path)

    # --- as a command's result (attnviz capture) -------------------------------------------------------------
    def to_dict(self) -> dict:
        """What `attnviz capture --json` prints: each part as a Capture's to_dict, and the shared metadata."""
        return {"model": self.model, **heard(self.meta), "meta": self.meta,
                "parts": {name: capture.to_dict() for name, capture in self.captures.items()}}

    def report(self, **style: Any) -> list:
        return []

    @property
    def exit_code(self) -> int:
        return 0

    def saved(self, path: str | os.PathLike) -> str:
        """The line that says where the parts went, and their sizes."""
        sizes = ", ".join(f"{name} {c.n_layers}×{c.n_heads}×{c.n_tokens}×{c.n_keys}"
                          for name, c in self.captures.items())
        said = heard_text(self.meta)
        return f"{path}  ({sizes}: layers × heads × rows × columns{'; ' + said if said else ''})"

    @classmethod
    def _load(cls, path: Path, raw_meta: np.ndarray) -> Parts:
        try:
            return cls(read_parts(path, raw_meta, Capture))
        except AttentionCheckError as exc:
            raise CaptureFormatError(f"{path}: {exc}") from None



def load_capture(path: str | os.PathLike) -> Capture | Parts:
    """Any capture file: format 1 (one self-attention) as a Capture, format 2 (an encoder-decoder model's
    parts) as Parts. The metadata is read first to tell which."""
    path = Path(path)
    raw = read_npz(path, {"meta": capture_members()["meta"]})["meta"]
    if format_version(raw) == PARTS_FORMAT_VERSION:
        return Parts._load(path, raw)
    return read_v1(path, Capture)


