"""The pieces a Capture is made of besides α: the tokens along an axis (Side), what a pooled capture keeps of
a long input (LongInput), and the masks a causal or sliding-window model applies. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np

SPECIAL_KINDS = ("", "start", "end", "other")
HeadSpec = Union[int, str]  # an index, "mean" or "max"

@dataclass(frozen=True, eq=False)
class LongInput:
    """What a pooled capture keeps of a long input besides its pooled α: the input's own tokens, where the
    pooled blocks start, and the rollout rows its streamed pass computed.

    tokens, special, special_kind (N,) for the N tokens of the input; edges (P + 1,): block starts and N;
    rollout: token position -> (N,) rolled-out attention of that token."""

    tokens: tuple[str, ...]
    special: np.ndarray
    special_kind: tuple[str, ...]
    edges: np.ndarray
    rollout: dict = field(default_factory=dict)
    # an exact window of α computed while streaming (not saved): (layers, H, rows, cols) and its positions
    window: np.ndarray | None = None
    window_rows: np.ndarray | None = None
    window_cols: np.ndarray | None = None
    window_layers: tuple[int, ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def block(self) -> int:
        return int(self.edges[1] - self.edges[0]) if len(self.edges) > 1 else 1


def normalise_tokens(obj) -> None:
    """The per-token fields of a Capture or Side as plain tuples and numpy arrays of fixed dtypes."""
    # numpy's str arrays drop trailing NUL characters, so a NUL is kept as the visible ␀ from the start
    object.__setattr__(obj, "tokens", tuple(str(t).replace("\x00", "␀") for t in obj.tokens))
    object.__setattr__(obj, "token_ids", np.asarray(obj.token_ids, dtype=np.int64))
    object.__setattr__(obj, "special", np.asarray(obj.special, dtype=bool))
    object.__setattr__(obj, "special_kind", tuple(str(k) for k in obj.special_kind))
    object.__setattr__(obj, "subword", np.asarray(obj.subword, dtype=bool))
    if obj.offsets is not None:
        object.__setattr__(obj, "offsets", np.asarray(obj.offsets, dtype=np.int64).reshape(-1, 2))


@dataclass(frozen=True, eq=False)
class Side:
    """The tokens along one axis of α, with what is known of each: for cross-attention the keys (the source
    sentence) differ from the queries (the target), and a Capture keeps them here."""

    tokens: tuple[str, ...]
    token_ids: np.ndarray
    special: np.ndarray
    special_kind: tuple[str, ...]
    subword: np.ndarray
    offsets: np.ndarray | None = None  # (S, 2) spans of the source text, (-1, -1) for none

    def __post_init__(self) -> None:
        normalise_tokens(self)

    def __len__(self) -> int:
        return len(self.tokens)




def window_mask(T: int, window: int, causal: bool) -> np.ndarray:
    """True where a sliding window hides key j from query i: i − j ≥ window (causal), |i − j| > window (an
    encoder's local attention). (T, T) bool"""
    offset = np.arange(T)[:, None] - np.arange(T)[None, :]  # i − j
    return offset >= window if causal else np.abs(offset) > window


def causal_mask(T: int) -> np.ndarray:
    """True where key j comes after query i (j > i): the cells a causal model never attends to. (T, T) bool"""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


# --- an encoder-decoder model's parts: which token side runs along each axis of α -----------------------

PART_NAMES = ("encoder", "decoder", "cross")
PART_AXES = {"encoder": ("source", "source"), "decoder": ("target", "target"), "cross": ("target", "source")}
SIDE_KEYS = ("tokens", "token_ids", "special", "special_kind", "subword")
PART_META = ("part", "causal", "text")  # what each part's meta has of its own; the rest is shared


def part_meta(shared: dict, name: str) -> dict:
    """A part's meta from the shared meta of an encoder-decoder capture: its name, causality, and as "text"
    the text of its queries (the source for the encoder, the target for decoder and cross)."""
    text = shared.get("source_text", "") if name == "encoder" else shared.get("target_text", "")
    return {**shared, "part": name, "causal": name == "decoder", "text": text}
