"""The .npz capture format's limits and checks: what each stored array may be, the metadata's types, and the
checks that a file's arrays line up. The trust boundary for shared files: every check here runs before
anything from a file is used. Pure numpy; nothing here builds a Capture."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from attnviz.data.sides import SPECIAL_KINDS, LongInput
from attnviz.errors import CaptureFormatError
from attnviz.base.npzfile import Member
from attnviz.base.sizes import size_from_env
from attnviz.base.text import is_valid_unicode

FORMAT_VERSION = 1  # one self-attention (a Capture)
PARTS_FORMAT_VERSION = 2  # an encoder-decoder model's three parts (Parts)
ARRAY_KEYS = ("attentions", "tokens", "token_ids", "special", "special_kind", "subword")


def limit(name: str, default: int) -> int:
    return size_from_env(name, default)


MAX_ATTENTION_BYTES = 1 << 30  # α as stored: 1 GiB (268M float32 weights); $ATTNVIZ_MAX_CAPTURE_BYTES changes it
MAX_TOKEN_CHARS = 1000  # the longest token string
MAX_META_CHARS = 1 << 20  # the metadata JSON: 1M characters
META_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,), "revision": (str, type(None)), "device": (str,), "dtype": (str,), "model_type": (str,),
    "causal": (bool,), "text": (str,), "source": (str,), "attnviz_version": (str,), "dropped_tokens": (int,),
    "unk_token_id": (int,),
    "level": (str,), "pieces": (int,), "quantity": (str,), "norm_check": (float, int), "prompt": (str,),
    "generated_text": (str,), "decoding": (str,), "stopped": (str,), "part": (str,), "source_text": (str,),
    "target_text": (str,), "target_source": (str,), "sinks": (bool,), "windows": (list,),
    "image_grid": (list,), "image_patch": (int,), "image_name": (str,), "audio_name": (str,),
    "audio_seconds": (float, int), "audio_frames": (int,), "frame_seconds": (float,), "audio_file_rate": (int,),
    "audio_channels": (int,), "prompt_tokens": (int,), "alignment_heads": (str,), "language": (str,),
    "language_probability": (float, int), "task": (str,), "sound_windows": (int,), "multilingual": (bool,),
    "window_rows": (list,), "window_frames": (list,),
}


def capture_members() -> dict[str, Member]:
    """What each array of a capture file may be, with the current limits. T can be at most √(α limit / 4)
    (one layer, one head of float32), which bounds every per-token array too."""
    alpha = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
    T = math.isqrt(alpha // 4) + 1
    word = MAX_TOKEN_CHARS * 4
    return {
        "attentions": Member("f", 4, alpha),
        "tokens": Member("U", 1, T * word, word), "token_ids": Member("iu", 1, T * 8),
        "special": Member("b", 1, T), "special_kind": Member("U", 1, T * 4 * 8, 4 * 8),
        "subword": Member("b", 1, T), "meta": Member("U", 0, MAX_META_CHARS * 4),
    }


def long_members() -> dict[str, Member]:
    """The arrays a pooled capture of a long input adds, and the token offsets (optional in any capture)."""
    alpha = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
    N = MAX_LONG_TOKENS
    word = MAX_TOKEN_CHARS * 4
    return {"offsets": Member("iu", 2, 16 * N), "generated": Member("b", 1, N),
            "image": Member("u", 3, MAX_IMAGE_MEMBER_BYTES),
            "long_tokens": Member("U", 1, N * word, word), "long_special": Member("b", 1, N),
            "long_kinds": Member("U", 1, N * 32, 32), "long_edges": Member("iu", 1, 8 * (N + 1)),
            "rollout_tokens": Member("iu", 1, 8 * 64), "rollout": Member("f", 2, min(alpha, 64 * N * 8))}


def sound_members() -> dict[str, Member]:
    """What a capture of sound adds: its samples at 16 kHz (float32, at most 30 s) and its log-mel spectrogram."""
    return {"sound": Member("f", 1, 4 * (MAX_SOUND_FRAMES + 1) * 320),
            "mel": Member("f", 2, 4 * 256 * 2 * MAX_SOUND_FRAMES)}


MAX_SOUND_FRAMES = 6000  # 120 s (four windows of 30 s) of encoder frames of 20 ms: data/sound.py MAX_SECONDS
MAX_LONG_TOKENS = 1 << 17  # the longest input a pooled capture describes
MAX_IMAGE_MEMBER_BYTES = 3 * 2048 * 2048  # the picture a vision capture keeps, as the model saw it (uint8 RGB)
MAX_HEAD_STATS = 100_000  # head records a pooled capture may carry


def checked_flags(flags: np.ndarray | None, T: int, name: str, path: Path) -> np.ndarray | None:
    if flags is None:
        return None
    if flags.shape != (T,):
        raise CaptureFormatError(f"{path}: {name} has shape {flags.shape}, expected ({T},)")
    return flags.astype(bool)


def checked_offsets(offsets: np.ndarray | None, T: int, meta: dict, path: Path) -> np.ndarray | None:
    """Token spans of the text: (T, 2), each -1 or within the text."""
    if offsets is None:
        return None
    n = len(str(meta.get("text", "")))
    if offsets.shape != (T, 2) or (offsets < -1).any() or (offsets > n).any():
        raise CaptureFormatError(f"{path}: offsets must be (T, 2) spans of the text")
    return offsets.astype(np.int64)


def checked_long(data: dict, path: Path) -> LongInput | None:
    """The long input's arrays of a pooled capture, checked to line up; None for an ordinary capture."""
    keys = ("long_tokens", "long_special", "long_kinds", "long_edges")
    present = [k for k in keys if k in data]
    if not present:
        return None
    if len(present) != len(keys):
        raise CaptureFormatError(f"{path}: a pooled capture needs all of {', '.join(keys)}")
    N = data["long_tokens"].shape[0]
    edges = data["long_edges"].astype(np.int64)
    if data["long_special"].shape != (N,) or data["long_kinds"].shape != (N,) or len(edges) < 2 or edges[0] != 0 \
            or edges[-1] != N or (np.diff(edges) <= 0).any():
        raise CaptureFormatError(f"{path}: the long input's tokens and blocks do not line up")
    for key in ("long_tokens", "long_kinds"):
        if not all(is_valid_unicode(t) for t in data[key].tolist()):
            raise CaptureFormatError(f"{path}: {key} is not valid Unicode (a lone surrogate)")
    if set(data["long_kinds"].tolist()) - set(SPECIAL_KINDS):
        raise CaptureFormatError(f"{path}: long_kinds holds an unknown kind")
    rollout = {}
    if "rollout" in data or "rollout_tokens" in data:
        rows, tokens = data.get("rollout"), data.get("rollout_tokens")
        if rows is None or tokens is None or rows.shape != (len(tokens), N) or ((tokens < 0) | (tokens >= N)).any() \
                or not np.isfinite(rows).all():
            raise CaptureFormatError(f"{path}: the stored rollout rows do not line up with the input")
        rollout = {int(t): np.asarray(r, np.float64) for t, r in zip(tokens, rows)}
    return LongInput(tuple(data["long_tokens"].tolist()), data["long_special"].astype(bool),
                     tuple(data["long_kinds"].tolist()), edges, rollout)


def checked_meta(raw: np.ndarray, path: Path, version: int = FORMAT_VERSION) -> dict:
    """The metadata JSON as a dict of plain values, with the known keys of the right types."""
    try:
        meta = json.loads(str(raw))
    except (json.JSONDecodeError, RecursionError, ValueError):
        raise CaptureFormatError(f"{path}: metadata is not valid JSON (or nested too deeply)") from None
    if not isinstance(meta, dict):
        raise CaptureFormatError(f"{path}: metadata is not a JSON object")
    found = meta.pop("format_version", None)
    if found != version:
        raise CaptureFormatError(f"{path}: capture format version {found!r} is not supported "
                                 f"(this attnviz reads versions {FORMAT_VERSION} and {PARTS_FORMAT_VERSION})")
    for key in ("pooled", "head_stats"):
        if key in meta:
            check_structured(key, meta[key], path)
    for key, value in meta.items():
        if key in ("pooled", "head_stats") or (key == "parts" and version == PARTS_FORMAT_VERSION):
            continue
        allowed = META_TYPES.get(key, (str, int, float, bool, type(None)))
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise CaptureFormatError(f"{path}: metadata {key!r} is a {type(value).__name__}, expected "
                                     f"{' or '.join(t.__name__ for t in allowed)}")
        if isinstance(value, str) and not is_valid_unicode(value):
            raise CaptureFormatError(f"{path}: metadata {key!r} is not valid Unicode (a lone surrogate)")
    return meta


def check_structured(key: str, value, path: Path) -> None:
    """`pooled` is {"tokens": int, "block": int}; `head_stats` a list of flat records of plain values."""
    scalar = (str, int, float, type(None))
    if key == "pooled":
        if not (isinstance(value, dict) and set(value) <= {"tokens", "block"}
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value.values())):
            raise CaptureFormatError(f"{path}: metadata 'pooled' must hold positive whole numbers tokens, block")
        return
    if not (isinstance(value, list) and len(value) <= MAX_HEAD_STATS and all(
            isinstance(r, dict) and len(r) <= 64 and all(isinstance(k, str) and isinstance(v, scalar)
                                                        and not isinstance(v, bool) for k, v in r.items())
            for r in value)):
        raise CaptureFormatError(f"{path}: metadata 'head_stats' must be a list of flat records")
    for record in value:
        for v in record.values():
            if isinstance(v, str) and not is_valid_unicode(v):
                raise CaptureFormatError(f"{path}: metadata 'head_stats' is not valid Unicode")



def format_version(raw_meta: np.ndarray):
    """The format version a file's metadata declares (None where it cannot be read: the full check says why)."""
    try:
        return json.loads(str(raw_meta)).get("format_version")
    except (json.JSONDecodeError, RecursionError, ValueError, AttributeError):
        return None
