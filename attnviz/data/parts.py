"""An encoder-decoder model's attention: three Captures (encoder, decoder, cross) over two token sides, saved
as one file (format 2); and load_capture, which reads either format."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnviz import registry
from attnviz.data.capture import Capture
from attnviz.data.npzformat import (MAX_ATTENTION_BYTES, PARTS_FORMAT_VERSION, capture_members, checked_flags,
                                    checked_meta, checked_offsets, format_version, limit,
                                    long_members)
from attnviz.data.sides import Side
from attnviz.errors import AttentionCheckError, CaptureFormatError, OutputError, SelectionError
from attnviz.files import atomic_output, check_suffix
from attnviz.npzfile import Member, read_npz
from attnviz.text import is_valid_unicode

PART_NAMES = ("encoder", "decoder", "cross")
PART_AXES = {"encoder": ("source", "source"), "decoder": ("target", "target"), "cross": ("target", "source")}
SIDE_KEYS = ("tokens", "token_ids", "special", "special_kind", "subword")
PART_META = ("part", "causal", "text")  # what each part's meta has of its own; the rest is shared


def part_meta(shared: dict, name: str) -> dict:
    """A part's meta from the shared meta of an encoder-decoder capture: its name, causality, and as "text"
    the text of its queries (the source for the encoder, the target for decoder and cross)."""
    text = shared.get("source_text", "") if name == "encoder" else shared.get("target_text", "")
    return {**shared, "part": name, "causal": name == "decoder", "text": text}


@dataclass(frozen=True, eq=False)
class Parts:
    """The attention of an encoder-decoder model (T5, BART, Marian): encoder self-attention over the source
    (L, H, S, S), decoder self-attention over the target (L, H, T, T, causal) and cross-attention from target
    queries to source keys (L, H, T, S). Each part is a Capture; they share one meta (model, source_text,
    target_text, …). Saved as capture format 2."""

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

    def _repr_html_(self) -> str:
        """In a notebook: the interactive viewer with a list of the parts, inline and offline."""
        return registry.view("html")(self)

    def part(self, name: str) -> Capture:
        if name not in self.captures:
            have = ", ".join(self.names)
            raise SelectionError(f"--part: this capture holds {have}, not {name}", "--part")
        return self.captures[name]

    def _source(self) -> Side | None:
        for name in ("encoder", "cross"):
            if name in self.captures:
                return self.captures[name].key_side
        return None

    def _target(self) -> tuple[Side, np.ndarray | None] | None:
        for name in ("decoder", "cross"):
            if name in self.captures:
                c = self.captures[name]
                return Side(c.tokens, c.token_ids, c.special, c.special_kind, c.subword, c.offsets), c.generated
        return None

    def save(self, path: str | os.PathLike) -> Path:
        """Write format 2 atomically: each part's α, the source and target tokens once, one meta."""
        path = check_suffix(path, (".npz",))
        most = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
        arrays: dict[str, Any] = {}
        for name, capture in self.captures.items():
            if capture.attentions.nbytes > most:
                raise OutputError(f"the {name} α takes {capture.attentions.nbytes:,} bytes, over the {most:,} a "
                                  f"capture may hold; set ATTNVIZ_MAX_CAPTURE_BYTES to raise the limit")
            arrays[f"{name}_attentions"] = capture.attentions
        target = self._target()
        for prefix, side in (("source", self._source()), ("target", None if target is None else target[0])):
            if side is None:
                continue
            for key in SIDE_KEYS:
                value = getattr(side, key)
                arrays[f"{prefix}_{key}"] = np.array(value, dtype=np.str_) if key in ("tokens", "special_kind") \
                    else value
            if side.offsets is not None:
                arrays[f"{prefix}_offsets"] = side.offsets
        if target is not None and target[1] is not None:
            arrays["target_generated"] = target[1]
        meta = {**self.meta, "format_version": PARTS_FORMAT_VERSION, "parts": self.names}
        arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
        with atomic_output(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez_compressed(fh, **arrays)
        return path

    @classmethod
    def _load(cls, path: Path, raw_meta: np.ndarray) -> Parts:
        meta = checked_meta(raw_meta, path, version=PARTS_FORMAT_VERSION)
        names = meta.pop("parts", None)
        if not (isinstance(names, list) and names and all(n in PART_NAMES for n in names)
                and len(set(names)) == len(names)):
            raise CaptureFormatError(f"{path}: metadata 'parts' must list some of {', '.join(PART_NAMES)}")
        sides = {side for n in names for side in PART_AXES[n]}
        alpha = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
        side_members = {f"{side}_{key}": spec for side in sides for key, spec in capture_members().items()
                        if key in SIDE_KEYS}
        members = {**{f"{n}_attentions": Member("f", 4, alpha) for n in names}, **side_members}
        optional = {f"{side}_offsets": long_members()["offsets"] for side in sides}
        optional["target_generated"] = long_members()["generated"]
        data = read_npz(path, members, optional=optional)
        built: dict[str, Side] = {}
        for side in sides:
            n = data[f"{side}_tokens"].shape[0] if data[f"{side}_tokens"].ndim == 1 else -1
            for key in SIDE_KEYS:
                if data[f"{side}_{key}"].shape != (n,):
                    raise CaptureFormatError(f"{path}: {side}_{key} does not line up with {side}_tokens")
            for key in ("tokens", "special_kind"):
                if not all(is_valid_unicode(t) for t in data[f"{side}_{key}"].tolist()):
                    raise CaptureFormatError(f"{path}: {side}_{key} is not valid Unicode (a lone surrogate)")
            text = meta.get(f"{side}_text", "")
            built[side] = Side(tuple(data[f"{side}_tokens"].tolist()), data[f"{side}_token_ids"],
                               data[f"{side}_special"], tuple(data[f"{side}_special_kind"].tolist()),
                               data[f"{side}_subword"],
                               checked_offsets(data.get(f"{side}_offsets"), n, {"text": text}, path))
        generated = checked_flags(data.get("target_generated"), len(built["target"]) if "target" in built else 0,
                                   "target_generated", path)
        captures = {}
        for name in names:
            rows, cols = (built[side] for side in PART_AXES[name])
            a = data[f"{name}_attentions"]
            if a.ndim != 4 or a.shape[2:] != (len(rows), len(cols)):
                raise CaptureFormatError(f"{path}: {name}_attentions is {a.shape}, expected (L, H, {len(rows)}, "
                                         f"{len(cols)}) for its {PART_AXES[name][0]} × {PART_AXES[name][1]} tokens")
            capture = Capture(attentions=a, tokens=rows.tokens, token_ids=rows.token_ids, special=rows.special,
                              special_kind=rows.special_kind, subword=rows.subword, meta=part_meta(meta, name),
                              offsets=rows.offsets, generated=generated if PART_AXES[name][0] == "target" else None,
                              keys=cols if name == "cross" else None)
            try:
                captures[name] = capture.validate()
            except AttentionCheckError as exc:
                raise CaptureFormatError(f"{path}: the {name} part: {exc}") from None
        try:
            return cls(captures)
        except AttentionCheckError as exc:
            raise CaptureFormatError(f"{path}: {exc}") from None




def load_capture(path: str | os.PathLike) -> Capture | Parts:
    """Any capture file: format 1 (one self-attention) as a Capture, format 2 (an encoder-decoder model's
    parts) as Parts. The metadata is read first to tell which."""
    path = Path(path)
    raw = read_npz(path, {"meta": capture_members()["meta"]})["meta"]
    if format_version(raw) == PARTS_FORMAT_VERSION:
        return Parts._load(path, raw)
    return Capture._load_v1(path)


