"""The Capture: attention weights of one input, as plain numpy, plus what is needed to read them.

    attentions  float32 (L, H, T, T)   [layer, head, query_pos, key_pos]; row i = where query i looks
    tokens      str     (T,)           readable tokens, sub-word continuations prefixed with "##"
    token_ids   int64   (T,)           ids from the tokenizer
    special     bool    (T,)           token is a special token ([CLS], [SEP], <s>, <|endoftext|> ...)
    special_kind str    (T,)           "" | "start" ([CLS]/BOS) | "end" ([SEP]/EOS) | "other"
    subword     bool    (T,)           token continues the word of the token before it
    meta        dict                   model, revision, device, dtype, causal, text, source, ...
    image       uint8   (h, w, 3)      a vision model's capture: the picture as the model saw it, its patch
                                       grid in meta (image_grid [rows, cols], image_patch pixels), tokens
                                       [CLS] (and any register tokens) then p(row,col) row by row
    sound       float32 (n,)           a speech model's capture (its encoder and cross parts): the sound at
    mel         float32 (80, 2N)       16 kHz, and the log-mel spectrogram of its N encoder frames (meta
                                       audio_frames, frame_seconds); the keys are those frames, then (silence)

Saved as .npz with exactly these keys (meta as one JSON string); loading never unpickles.
Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from attnviz.base import registry
from attnviz.base.blocks import row_shares
from attnviz.data.npzformat import (MAX_SOUND_FRAMES)
from attnviz.data.sides import (SPECIAL_KINDS, HeadSpec, LongInput, Side,
                                causal_mask, normalise_tokens, window_mask)
from attnviz.errors import AttentionCheckError, SelectionError

ROW_SUM_ATOL = 1e-4


@dataclass(frozen=True, eq=False)
class Capture:
    """Attention of one input. Index it like TransformerLens's cache: cap[layer] -> (H, T, T),
    cap[layer, head] -> (T, T). Metrics and renderers read it and never change it."""

    command: ClassVar[str] = "capture"  # the command whose result it is
    attentions: np.ndarray  # (L, H, T, T) float32
    tokens: tuple[str, ...]  # (T,)
    token_ids: np.ndarray  # (T,) int64
    special: np.ndarray  # (T,) bool
    special_kind: tuple[str, ...]  # (T,)
    subword: np.ndarray  # (T,) bool
    meta: dict = field(default_factory=dict)
    long: LongInput | None = None  # a long input streamed and pooled: T counts blocks, long.tokens the input
    offsets: np.ndarray | None = None  # (T, 2) int64: each token's span of meta["text"]; (-1, -1) for none
    generated: np.ndarray | None = None  # (T,) bool: written by the model (attnviz generate), not the prompt
    keys: Side | None = None  # cross-attention: the key tokens (S of them; α is (L, H, T, S)); None: the queries
    image: np.ndarray | None = None  # (h, w, 3) uint8: a vision model's input picture
    sound: np.ndarray | None = None  # (n,) float32 at 16 kHz: a speech model's input
    mel: np.ndarray | None = None  # (bins, 2N) float32: the log-mel spectrogram of the N frames with sound

    def __post_init__(self) -> None:
        object.__setattr__(self, "attentions", np.asarray(self.attentions, dtype=np.float32))
        normalise_tokens(self)
        if self.generated is not None:
            object.__setattr__(self, "generated", np.asarray(self.generated, dtype=bool))
        self.attentions.setflags(write=False)

    # --- shape -------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.attentions.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attentions.shape[1]

    @property
    def n_tokens(self) -> int:
        return self.attentions.shape[2]

    @property
    def n_keys(self) -> int:
        """Key positions: T for self-attention, S (the source) for cross-attention."""
        return self.attentions.shape[3]

    @property
    def input_tokens(self) -> int:
        """Tokens of the input: T, or for a pooled long input the N tokens its blocks stand for (what every
        T = … and ln T says, not the number of blocks)."""
        return self.long.n_tokens if self.long is not None else self.n_tokens

    @property
    def input_keys(self) -> int:
        """Key tokens of the input: S for cross-attention, else input_tokens."""
        return self.input_tokens if self.square else self.n_keys

    @property
    def square(self) -> bool:
        """Queries and keys are the same tokens (self-attention)."""
        return self.keys is None

    @property
    def key_side(self) -> Side:
        """The key tokens: the queries themselves, or the source of cross-attention."""
        if self.keys is not None:
            return self.keys
        return Side(self.tokens, self.token_ids, self.special, self.special_kind, self.subword, self.offsets)

    @property
    def key_tokens(self) -> tuple[str, ...]:
        return self.tokens if self.keys is None else self.keys.tokens

    @property
    def key_special(self) -> np.ndarray:
        return self.special if self.keys is None else self.keys.special

    @property
    def part(self) -> str | None:
        """Which attention of an encoder-decoder model: "encoder", "decoder" or "cross"; None otherwise."""
        part = self.meta.get("part")
        return str(part) if part else None

    @property
    def grid(self) -> tuple[int, int] | None:
        """A vision capture's patch grid (rows, cols), or None for text."""
        grid = self.meta.get("image_grid")
        return (int(grid[0]), int(grid[1])) if self.image is not None and grid else None

    @property
    def frames(self) -> int:
        """A speech capture's encoder frames with sound (N; the keys are those frames, then any silence), or 0."""
        return int(self.meta.get("audio_frames", 0)) if self.mel is not None else 0

    @property
    def frame_seconds(self) -> float:
        return float(self.meta.get("frame_seconds", 0.02))

    @property
    def grid_start(self) -> int:
        """Where a vision capture's grid cells begin ([CLS] and register tokens come first)."""
        grid = self.grid
        return self.n_tokens - grid[0] * grid[1] if grid else 0

    @property
    def causal(self) -> bool:
        return bool(self.meta.get("causal", False))

    @property
    def model(self) -> str:
        return str(self.meta.get("model", "?"))

    @property
    def quantity(self) -> str:
        """What the matrices hold: "alpha" (attention weights, rows sum to 1) or "norm" (value-weighted norms
        ‖α_ij f_h(x_j)‖, Kobayashi et al. 2020)."""
        return str(self.meta.get("quantity", "alpha"))

    @property
    def sinks(self) -> bool:
        """The family has per-head sink logits (gpt-oss): each row's weights over the real keys sum to 1 − s,
        s the share the sink logit took."""
        return bool(self.meta.get("sinks", False))

    def as_distribution(self) -> Capture:
        """The capture with every row a distribution over keys: α itself; for norms each row divided by its
        sum (the share of the query's update that comes from each key); with sink logits each row divided by
        what the real keys kept (the shares among them)."""
        if self.quantity != "norm" and not self.sinks:
            return self

        shares = row_shares(self.attentions).astype(np.float32)
        quantity = "norm share" if self.quantity == "norm" else "alpha share"
        return replace(self, attentions=shares, meta={**self.meta, "quantity": quantity, "sinks": False})

    @property
    def pooled(self) -> bool:
        """α holds block means of a long input (see `long`), not one row per token."""
        return self.long is not None

    def __getitem__(self, index):
        return self.attentions[index]

    def __repr__(self) -> str:
        L, H, T, _ = self.attentions.shape
        preview = " ".join(self.tokens[:8]) + (" …" if T > 8 else "")
        return (f"Capture(model={self.model!r}, layers={L}, heads={H}, tokens={T}, "
                f"causal={self.causal}, source={self.meta.get('source', 'model')!r}: {preview})")

    # --- selection ---------------------------------------------------------------------------
    def layer_index(self, layer: int) -> int:
        """Normalise a layer index (negative counts from the end); raise SelectionError if out of range."""
        L = self.n_layers
        if not -L <= layer < L:
            raise SelectionError(f"layer {layer} is out of range: this model has {L} layers (0..{L - 1}, "
                                 f"or -{L}..-1 from the end)")
        return layer % L

    def head_index(self, head: int) -> int:
        H = self.n_heads
        if not -H <= head < H:
            raise SelectionError(f"head {head} is out of range: this model has {H} heads per layer "
                                 f"(0..{H - 1}), or use 'mean' or 'max'")
        return head % H

    def head_matrix(self, layer: int, head: HeadSpec = "mean") -> np.ndarray:
        """α of one head, or the mean / elementwise max over the heads of a layer. (T, T)"""
        per_head = self.attentions[self.layer_index(layer)]  # (H, T, T)
        if head == "mean":
            return per_head.mean(axis=0)
        if head == "max":
            return per_head.max(axis=0)
        if isinstance(head, str):
            raise SelectionError(f"head must be an index, 'mean' or 'max', not {head!r}")
        return per_head[self.head_index(head)]

    @property
    def future_mask(self) -> np.ndarray | None:
        """Cells a causal model cannot attend to (key after query), or None for encoders. (T, T) bool"""
        return causal_mask(self.n_tokens) if self.causal else None

    @property
    def windows(self) -> list[int] | None:
        """Per layer, the sliding window of a layer that has one, 0 for full attention (meta "windows"): for a
        causal model keys w or more tokens back are masked, for an encoder keys more than w away either way.
        None when the family has none, and for word-level or pooled captures (the windows are in tokens)."""
        windows = self.meta.get("windows")
        if not windows or self.meta.get("level") == "word" or self.pooled or self.keys is not None:
            return None
        return [int(w) for w in windows]

    def masked(self, layer: int) -> np.ndarray | None:
        """Cells layer `layer` cannot attend to: the future (causal models) and what its sliding window
        leaves out; in a pooled capture, the blocks of keys the window leaves out wholly. None when nothing is
        masked. (T, T) bool"""
        future = self.future_mask
        windows = self.windows
        window = windows[layer] if windows else 0
        if not window:
            pooled = self._pooled_window(layer)
            if not pooled or self.long is None:
                return future
            edges = np.asarray(self.long.edges)
            first, last = edges[:-1], edges[1:] - 1  # each block's first and last token
            if self.causal:  # every query of block I at least `pooled` after every key of block J
                beyond = first[:, None] - last[None, :] >= pooled
            else:
                beyond = np.maximum(first[:, None] - last[None, :], first[None, :] - last[:, None]) > pooled
            return beyond | (future if future is not None else False)
        return window_mask(self.n_tokens, window, self.causal) | (future if future is not None else False)

    def _pooled_window(self, layer: int) -> int:
        """A pooled capture's sliding window of `layer`, in tokens (0: none, or not pooled)."""
        windows = self.meta.get("windows")
        if not self.pooled or not windows or self.long is None or not 0 <= layer < len(windows):
            return 0
        return int(windows[layer])

    def window_note(self, layer: int) -> str:
        """The legend of a layer's sliding window, "" for a full layer."""
        windows = self.windows
        window = windows[layer] if windows else 0
        if not window:
            pooled = self._pooled_window(layer)
            if pooled:
                return (f"sliding window {pooled}: blocks of keys wholly {pooled}+ back masked" if self.causal else
                        f"local attention ±{pooled}: blocks of keys wholly further away masked")
            return ""
        return (f"sliding window {window}: keys {window}+ back masked" if self.causal else
                f"local attention ±{window}: keys further away masked")

    def keep_mask(self, hide_special: bool = False) -> np.ndarray:
        """Which token positions to show. (T,) bool"""
        return ~self.special if hide_special else np.ones(self.n_tokens, dtype=bool)

    def key_keep_mask(self, hide_special: bool = False) -> np.ndarray:
        """Which key positions to show. (S,) bool"""
        return ~self.key_special if hide_special else np.ones(self.n_keys, dtype=bool)

    @property
    def prompt_length(self) -> int:
        """Tokens before the first generated one (all of them when nothing was generated)."""
        if self.generated is None or not self.generated.any():
            return self.n_tokens
        return int(np.argmax(self.generated))

    def named_positions(self) -> dict[str, list[int]]:
        """Token positions by name, for --rows/--cols: "prompt" and "generated" (empty when none)."""
        P = self.prompt_length
        return {"prompt": list(range(P)), "generated": list(range(P, self.n_tokens))}

    def named_key_positions(self) -> dict[str, list[int]]:
        """The same for key columns (--cols): the source of cross-attention has no generated tokens."""
        if self.keys is None:
            return self.named_positions()
        return {"prompt": list(range(self.n_keys)), "generated": []}

    # --- checks ------------------------------------------------------------------------------
    def validate(self, atol: float = ROW_SUM_ATOL) -> Capture:
        """Raise AttentionCheckError unless α is (L, H, T, T), finite, in [0, 1], rows sum to 1,
        and the per-token arrays line up with T. Causal captures must be lower-triangular."""
        a = self.attentions
        if a.ndim != 4 or (self.keys is None and a.shape[2] != a.shape[3]) or 0 in a.shape:
            raise AttentionCheckError(f"attention must be (layers, heads, T, T), got shape {a.shape}")
        T = a.shape[2]
        for name in ("tokens", "token_ids", "special", "special_kind", "subword"):
            if len(getattr(self, name)) != T:
                raise AttentionCheckError(f"{name} has {len(getattr(self, name))} entries but α has {T} tokens")
        if self.keys is not None:
            S = a.shape[3]
            for name in ("tokens", "token_ids", "special", "special_kind", "subword"):
                if len(getattr(self.keys, name)) != S:
                    raise AttentionCheckError(f"the keys' {name} has {len(getattr(self.keys, name))} entries but α "
                                              f"has {S} key positions")
            if self.causal:
                raise AttentionCheckError("cross-attention is never causal")
            if set(self.keys.special_kind) - set(SPECIAL_KINDS):
                raise AttentionCheckError("the keys' special_kind holds an unknown kind")
        if self.generated is not None:
            if len(self.generated) != T:
                raise AttentionCheckError(f"generated has {len(self.generated)} entries but α has {T} tokens")
            if self.generated[self.prompt_length:].size and not self.generated[self.prompt_length:].all():
                raise AttentionCheckError("generated tokens must all follow the prompt")
            if self.generated.any() and not (self.causal or self.part == "cross"):
                raise AttentionCheckError("only a causal model's capture can hold generated tokens")
        if self.image is not None:
            self._validate_image(T)
        if self.sound is not None or self.mel is not None:
            self._validate_sound()
        kinds = set(self.special_kind) - set(SPECIAL_KINDS)
        if kinds:
            allowed = ", ".join(map(repr, SPECIAL_KINDS))
            raise AttentionCheckError(f"special_kind holds {sorted(kinds)[0]!r}; allowed: {allowed}")
        upper = causal_mask(T) if self.causal else None
        norms = self.quantity == "norm"  # value-weighted norms: ≥ 0, rows need not sum to 1
        windows = self.meta.get("windows")
        if windows is not None and (not isinstance(windows, list) or len(windows) != a.shape[0] or not all(
                isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= 1 << 30 for w in windows)):
            raise AttentionCheckError(f"meta windows must be one whole number ≥ 0 per layer ({a.shape[0]})")
        sliding = self.windows
        for n, layer in enumerate(a):  # (H, T, T): one layer at a time keeps temporaries small for large captures
            if sliding and sliding[n]:
                leak = float(np.abs(np.where(window_mask(T, sliding[n], self.causal), layer, 0.0)).max())
                if leak > atol:
                    raise AttentionCheckError(f"layer {n} attends outside its sliding window of {sliding[n]} "
                                              f"(max weight {leak:.3g})")
            if not np.isfinite(layer).all():
                raise AttentionCheckError("attention weights contain NaN or infinity")
            low, high = float(layer.min()), float(layer.max())
            if low < -atol or (high > 1 + atol and not norms):
                raise AttentionCheckError(f"attention weights outside [0, 1]: min {low:.3g}, max {high:.3g}")
            sums = layer.sum(axis=-1, dtype=np.float64)  # (H, T)
            if self.sinks and not norms:  # the sink logit takes a share: rows sum to at most 1
                worst = float(max(sums.max() - 1.0, 0.0))
                if worst > atol:
                    raise AttentionCheckError(f"attention rows sum to more than 1 (by {worst:.3g} > {atol:g})")
            worst = 0.0 if norms or self.sinks else float(np.abs(sums - 1.0).max())
            if worst > atol:
                raise AttentionCheckError(f"attention rows do not sum to 1 (worst deviation {worst:.3g} > {atol:g})")
            if upper is not None and upper.any():
                leak = float(np.abs(np.where(upper, layer, 0.0)).max())
                if leak > atol:
                    raise AttentionCheckError(f"causal model attends to future tokens (max weight {leak:.3g})")
        return self

    def _validate_image(self, T: int) -> None:
        image, grid, patch = self.image, self.meta.get("image_grid"), self.meta.get("image_patch")
        if image is None or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise AttentionCheckError("the picture must be (height, width, 3) uint8")
        if not (isinstance(grid, list) and len(grid) == 2 and all(isinstance(g, int) and not isinstance(g, bool)
                                                                  and g > 0 for g in grid)):
            raise AttentionCheckError("a capture with a picture needs meta image_grid: [rows, cols]")
        if not (isinstance(patch, int) and not isinstance(patch, bool) and patch > 0):
            raise AttentionCheckError("a capture with a picture needs meta image_patch: pixels per patch")
        rows, cols = grid
        if image.shape[:2] != (rows * patch, cols * patch):
            raise AttentionCheckError(f"the picture is {image.shape[1]} × {image.shape[0]} pixels, not the "
                                      f"{cols} × {rows} patches of {patch} pixels its grid says")
        if not 0 <= T - rows * cols <= 16 or self.special[T - rows * cols:].any():
            raise AttentionCheckError(f"{T} tokens do not hold a grid of {rows} × {cols} patches after [CLS]")

    def _validate_sound(self) -> None:
        sound, mel, N = self.sound, self.mel, self.meta.get("audio_frames")
        if sound is None or mel is None:
            raise AttentionCheckError("a capture of sound needs both its samples and its spectrogram")
        if not (isinstance(N, int) and not isinstance(N, bool) and 0 < N <= MAX_SOUND_FRAMES):
            raise AttentionCheckError(f"a capture of sound needs meta audio_frames: 1 to {MAX_SOUND_FRAMES}")
        step = self.meta.get("frame_seconds", 0.02)
        if not (isinstance(step, (int, float)) and not isinstance(step, bool) and 0 < step <= 1):
            raise AttentionCheckError("a capture of sound needs meta frame_seconds: the seconds of one frame")
        if sound.dtype != np.float32 or sound.ndim != 1 or not N * 320 <= len(sound) < (N + 1) * 320:
            raise AttentionCheckError(f"the sound is {len(sound) if sound.ndim == 1 else sound.shape} samples, not "
                                      f"the {N} frames of 320 its metadata says")
        if mel.dtype != np.float32 or mel.ndim != 2 or mel.shape[1] != 2 * N or not 1 <= mel.shape[0] <= 256:
            raise AttentionCheckError(f"the spectrogram is {mel.shape}, not (bins, {2 * N}) for {N} frames")
        if not (np.isfinite(sound).all() and np.isfinite(mel).all()) or np.abs(sound).max() > 1:
            raise AttentionCheckError("the sound's samples must be finite and within [-1, 1]")
        frames = self.key_side
        if len(frames) not in (N, N + 1) or frames.special[:N].any() or (len(frames) == N + 1
                                                                          and not frames.special[N]):
            raise AttentionCheckError(f"the {len(frames)} keys are not the {N} frames of the sound and its silence")

    # --- persistence (attnviz.data.saving) -------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the capture as .npz (plain arrays + JSON meta), atomically: format 1, or for one part of an
        encoder-decoder model format 2 with that part."""
        from attnviz.data.saving import write_capture

        return write_capture(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Capture:
        """Read a capture written by save(), treating the file as untrusted: each member's .npy header is
        read before its data, and a member whose dtype, shape or size is wrong is refused before anything
        is allocated. Raises CaptureFormatError (one line) for anything but a valid capture within
        LIMITS; memory stays within the α limit plus one float32 copy of α. A format-2 file (an
        encoder-decoder model) must hold one part; `load_capture` reads any."""
        from attnviz.data.saving import read_capture

        return read_capture(path, cls)

    # --- as a command's result (attnviz capture) -------------------------------------------------------------
    def to_dict(self) -> dict:
        """What `attnviz capture --json` prints: the tokens, α (layers × heads × rows × columns) and the
        metadata."""
        return {"model": self.model, "tokens": list(self.tokens), "token_ids": self.token_ids,
                "key_tokens": list(self.key_tokens), "special_kind": list(self.special_kind),
                "shape": list(self.attentions.shape), "attentions": self.attentions, "meta": self.meta}

    def report(self, **style: Any) -> list:
        return []

    @property
    def exit_code(self) -> int:
        return 0

    def saved(self, path: str | os.PathLike) -> str:
        """The line that says where the capture went, and its size."""
        return f"{path}  ({self.n_layers} layers × {self.n_heads} heads × {self.n_tokens} tokens)"

    def layer_slice(self, start: int, stop: int) -> Capture:
        """The same capture with only layers start..stop-1 (a view of α, nothing copied, not re-validated)."""
        return replace(self, attentions=self.attentions[start:stop])

    # --- views for notebooks ----------------------------------------------------------------------------------

    def _repr_html_(self) -> str:
        """In a notebook: the interactive viewer, inline and offline (one sandboxed frame per view)."""
        return registry.view("html")(self)

    def heatmap(self, layer: int = -1, head: int | str = "mean", **options):
        """α of one layer and head (or "mean", "max") as a matplotlib Figure; with ax=, drawn on those axes
        (returned). Options: hide_special, cmap, vmax, ax."""
        return registry.view("heatmap")(self, layer, head, **options)

    def figure(self, layer: int = -1, head: int | str = "mean", **options):
        """The capture's figure, as every result has one: heatmap(layer, head, **options) (the mean over the heads of
        the last layer by default); with ax=, drawn on those axes (returned)."""
        return self.heatmap(layer, head, **options)

    def heads(self):
        """The head statistics table (a HeadTable: shown as HTML in a notebook; .to_records() for data)."""
        return registry.view("heads")(self)

    def view(self, path: str | os.PathLike) -> Path:
        """Write the interactive page (one offline HTML file) to `path`."""
        return registry.view("view")(self, path)

    @classmethod
    def from_outputs(cls, outputs: Any, inputs: Any, tokenizer: Any, **options: Any) -> Capture:
        """Deprecated: attnviz.from_outputs(outputs, inputs, tokenizer) (the same Capture)."""
        return registry.view("from_outputs")(outputs, inputs, tokenizer, **options)

    def with_meta(self, **updates) -> Capture:
        return replace(self, meta={**self.meta, **updates})
