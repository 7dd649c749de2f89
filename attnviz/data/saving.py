"""Captures on disk: format 1 (one self-attention, a Capture) and format 2 (an encoder-decoder model's parts,
one file), written atomically and read as untrusted: each member's .npy header is read before its data, and
anything of the wrong dtype, shape or size is refused before it is allocated. Plain arrays and one JSON meta;
loading never unpickles. The classes hand themselves in (Capture.load, load_capture), so that this module
imports neither."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.base.files import atomic_output, check_suffix
from attnviz.base.npzfile import Member, read_npz
from attnviz.base.text import is_valid_unicode
from attnviz.data.npzformat import (FORMAT_VERSION, MAX_ATTENTION_BYTES, PARTS_FORMAT_VERSION, capture_members,
                                    checked_flags, checked_long, checked_meta, checked_offsets, format_version, limit,
                                    long_members, sound_members)
from attnviz.data.sides import PART_AXES, PART_META, PART_NAMES, SIDE_KEYS, Side, part_meta
from attnviz.errors import AttentionCheckError, CaptureFormatError, OutputError, arg


def write_capture(capture: Any, path: str | os.PathLike) -> Path:
    """Write the capture as .npz (plain arrays + JSON meta), atomically: format 1, or for one part of an
    encoder-decoder model format 2 with that part."""
    if capture.part is not None:  # one part of an encoder-decoder model: format 2
        return write_parts({capture.part: capture}, path)
    path = check_suffix(path, (".npz",))
    most = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
    if capture.attentions.nbytes > most:
        raise OutputError(f"α takes {capture.attentions.nbytes:,} bytes, over the {most:,} a capture may hold "
                          f"(so it could not be read back); set ATTNVIZ_MAX_CAPTURE_BYTES to raise the limit")
    arrays: dict[str, Any] = {
        "attentions": capture.attentions,
        "tokens": np.array(capture.tokens, dtype=np.str_),
        "token_ids": capture.token_ids,
        "special": capture.special,
        "special_kind": np.array(capture.special_kind, dtype=np.str_),
        "subword": capture.subword,
        "meta": np.array(json.dumps({**capture.meta, "format_version": FORMAT_VERSION}, sort_keys=True)),
    }
    if capture.offsets is not None:
        arrays["offsets"] = capture.offsets
    if capture.generated is not None:
        arrays["generated"] = capture.generated
    if capture.image is not None:
        arrays["image"] = capture.image
    if capture.long is not None:
        rollout_tokens = sorted(capture.long.rollout)
        arrays.update({
            "long_tokens": np.array(capture.long.tokens, dtype=np.str_), "long_special": capture.long.special,
            "long_kinds": np.array(capture.long.special_kind, dtype=np.str_),
            "long_edges": np.asarray(capture.long.edges, np.int64),
            "rollout_tokens": np.array(rollout_tokens, np.int64),
            "rollout": np.array([capture.long.rollout[t] for t in rollout_tokens], np.float32).reshape(
                len(rollout_tokens), capture.long.n_tokens)})
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)
    return path


def read_capture(path: str | os.PathLike, cls: type) -> Any:
    """Read a capture written by save(), treating the file as untrusted: each member's .npy header is
    read before its data, and a member whose dtype, shape or size is wrong is refused before anything
    is allocated. Raises CaptureFormatError (one line) for anything but a valid capture within
    LIMITS; memory stays within the α limit plus one float32 copy of α. A format-2 file (an
    encoder-decoder model) must hold one part; `load_capture` reads any."""
    path = Path(path)
    raw = read_npz(path, {"meta": capture_members()["meta"]})["meta"]
    if format_version(raw) == PARTS_FORMAT_VERSION:  # format 2: one part reads as a Capture
        parts = read_parts(path, raw, cls)
        if len(parts) != 1:
            raise CaptureFormatError(f"{path} holds the {', '.join(parts)} attention of an encoder-decoder "
                                     f"model: choose one with {arg('part')}", "part")
        return next(iter(parts.values()))
    return read_v1(path, cls)


def read_v1(path: Path, cls: type) -> Any:
    data = read_npz(path, capture_members(), optional=long_members())
    meta = checked_meta(data["meta"], path)
    long = checked_long(data, path)
    T = data["attentions"].shape[2] if data["attentions"].ndim == 4 else -1
    for key in ("tokens", "token_ids", "special", "special_kind", "subword"):
        if data[key].shape != (T,) or data["attentions"].shape[3] != T:
            raise CaptureFormatError(f"{path}: {key} has shape {data[key].shape} but α is "
                                     f"{data['attentions'].shape}: they must line up on T")
    for key in ("tokens", "special_kind"):
        bad = next((i for i, t in enumerate(data[key].tolist()) if not is_valid_unicode(t)), None)
        if bad is not None:
            raise CaptureFormatError(f"{path}: {key}[{bad}] is not valid Unicode (a lone surrogate)")
    capture = cls(
        attentions=data["attentions"],
        tokens=tuple(data["tokens"].tolist()),
        token_ids=data["token_ids"],
        special=data["special"],
        special_kind=tuple(data["special_kind"].tolist()),
        subword=data["subword"],
        meta=meta,
        long=long,
        offsets=checked_offsets(data.get("offsets"), T, meta, path),
        generated=checked_flags(data.get("generated"), T, "generated", path),
        image=data.get("image"),
    )
    if long is not None and len(long.edges) - 1 != capture.n_tokens:
        raise CaptureFormatError(f"{path}: {len(long.edges) - 1} pooled blocks, but α has {capture.n_tokens}")
    try:
        return capture.validate()
    except AttentionCheckError as exc:
        raise CaptureFormatError(f"{path}: {exc}") from None


# --- format 2: an encoder-decoder model's parts (attnviz.data.parts.Parts holds them) -------------------------


def _source_side(captures: dict[str, Any]) -> Side | None:
    for name in ("encoder", "cross"):
        if name in captures:
            return captures[name].key_side
    return None


def _target_side(captures: dict[str, Any]) -> tuple[Side, np.ndarray | None] | None:
    for name in ("decoder", "cross"):
        if name in captures:
            c = captures[name]
            return Side(c.tokens, c.token_ids, c.special, c.special_kind, c.subword, c.offsets), c.generated
    return None


def write_parts(captures: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write format 2 atomically (an encoder-decoder model's parts, or one of them): each part's α, the source
    and target tokens once, one meta (the first part's, less what is each part's own)."""
    path = check_suffix(path, (".npz",))
    most = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
    arrays: dict[str, Any] = {}
    for name, capture in captures.items():
        if capture.attentions.nbytes > most:
            raise OutputError(f"the {name} α takes {capture.attentions.nbytes:,} bytes, over the {most:,} a "
                              f"capture may hold; set ATTNVIZ_MAX_CAPTURE_BYTES to raise the limit")
        arrays[f"{name}_attentions"] = capture.attentions
    target = _target_side(captures)
    for prefix, side in (("source", _source_side(captures)), ("target", None if target is None else target[0])):
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
    heard = next((c for c in captures.values() if c.sound is not None), None)
    if heard is not None:
        arrays["sound"] = heard.sound  # float32 as the model heard it: verify recomputes the spectrogram from it
        arrays["mel"] = heard.mel
    shared = {k: v for k, v in next(iter(captures.values())).meta.items() if k not in PART_META}
    meta = {**shared, "format_version": PARTS_FORMAT_VERSION, "parts": list(captures)}
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)
    return path


def read_parts(path: Path, raw_meta: np.ndarray, cls: type) -> dict[str, Any]:
    """The parts of a format-2 file, each checked as a capture file is (the parts' agreement is Parts' to
    check)."""
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
    optional |= sound_members()
    data = read_npz(path, members, optional=optional)
    if ("sound" in data) != ("mel" in data):
        raise CaptureFormatError(f"{path}: a capture of sound holds both its samples and its spectrogram")
    heard = data["sound"].astype(np.float32) if "sound" in data else None
    mel = data["mel"].astype(np.float32) if "mel" in data else None
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
        capture = cls(attentions=a, tokens=rows.tokens, token_ids=rows.token_ids, special=rows.special,
                          special_kind=rows.special_kind, subword=rows.subword, meta=part_meta(meta, name),
                          offsets=rows.offsets, generated=generated if PART_AXES[name][0] == "target" else None,
                          keys=cols if name == "cross" else None,
                          sound=heard if name != "decoder" else None, mel=mel if name != "decoder" else None)
        try:
            captures[name] = capture.validate()
        except AttentionCheckError as exc:
            raise CaptureFormatError(f"{path}: the {name} part: {exc}") from None
    return captures
