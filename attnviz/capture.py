"""The Capture: attention weights of one input, as plain numpy, plus what is needed to read them.

    attentions  float32 (L, H, T, T)   [layer, head, query_pos, key_pos]; row i = where query i looks
    tokens      str     (T,)           readable tokens, sub-word continuations prefixed with "##"
    token_ids   int64   (T,)           ids from the tokenizer
    special     bool    (T,)           token is a special token ([CLS], [SEP], <s>, <|endoftext|> ...)
    special_kind str    (T,)           "" | "start" ([CLS]/BOS) | "end" ([SEP]/EOS) | "other"
    subword     bool    (T,)           token continues the word of the token before it
    meta        dict                   model, revision, device, dtype, causal, text, source, ...

Saved as .npz with exactly these keys (meta as one JSON string); loading never unpickles.
Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

import numpy as np

from attnviz.errors import AttentionCheckError, CaptureFormatError, OutputError, SelectionError
from attnviz.files import atomic_output, current_umask  # noqa: F401 (re-exported)
from attnviz.npzfile import Member, read_npz
from attnviz.text import is_valid_unicode

FORMAT_VERSION = 1
ARRAY_KEYS = ("attentions", "tokens", "token_ids", "special", "special_kind", "subword")
SPECIAL_KINDS = ("", "start", "end", "other")
ROW_SUM_ATOL = 1e-4

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


def _normalise_tokens(obj) -> None:
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
        _normalise_tokens(self)

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True, eq=False)
class Capture:
    """Attention of one input. Index it like TransformerLens's cache: cap[layer] -> (H, T, T),
    cap[layer, head] -> (T, T). Metrics and renderers read it and never change it."""

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "attentions", np.asarray(self.attentions, dtype=np.float32))
        _normalise_tokens(self)
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
        from attnviz.blocks import row_shares

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
        leaves out. None when nothing is masked. (T, T) bool"""
        future = self.future_mask
        windows = self.windows
        window = windows[layer] if windows else 0
        if not window:
            return future
        return window_mask(self.n_tokens, window, self.causal) | (future if future is not None else False)

    def window_note(self, layer: int) -> str:
        """The legend of a layer's sliding window, "" for a full layer."""
        windows = self.windows
        window = windows[layer] if windows else 0
        if not window:
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
            if self.sinks:  # the sink logit takes a share: rows sum to at most 1
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

    # --- persistence -------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the capture as .npz (plain arrays + JSON meta), atomically: format 1, or for one part of an
        encoder-decoder model format 2 with that part."""
        if self.part is not None:
            return Parts({self.part: self}).save(path)
        path = check_suffix(path, (".npz",))
        limit = _limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
        if self.attentions.nbytes > limit:
            raise OutputError(f"α takes {self.attentions.nbytes:,} bytes, over the {limit:,} a capture may hold "
                              f"(so it could not be read back); set ATTNVIZ_MAX_CAPTURE_BYTES to raise the limit")
        arrays: dict[str, Any] = {
            "attentions": self.attentions,
            "tokens": np.array(self.tokens, dtype=np.str_),
            "token_ids": self.token_ids,
            "special": self.special,
            "special_kind": np.array(self.special_kind, dtype=np.str_),
            "subword": self.subword,
            "meta": np.array(json.dumps({**self.meta, "format_version": FORMAT_VERSION}, sort_keys=True)),
        }
        if self.offsets is not None:
            arrays["offsets"] = self.offsets
        if self.generated is not None:
            arrays["generated"] = self.generated
        if self.long is not None:
            rollout_tokens = sorted(self.long.rollout)
            arrays.update({
                "long_tokens": np.array(self.long.tokens, dtype=np.str_), "long_special": self.long.special,
                "long_kinds": np.array(self.long.special_kind, dtype=np.str_),
                "long_edges": np.asarray(self.long.edges, np.int64),
                "rollout_tokens": np.array(rollout_tokens, np.int64),
                "rollout": np.array([self.long.rollout[t] for t in rollout_tokens], np.float32).reshape(
                    len(rollout_tokens), self.long.n_tokens)})
        with atomic_output(path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez_compressed(fh, **arrays)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> Capture:
        """Read a capture written by save(), treating the file as untrusted: each member's .npy header is
        read before its data, and a member whose dtype, shape or size is wrong is refused before anything
        is allocated. Raises CaptureFormatError (one line) for anything but a valid capture within
        LIMITS; memory stays within the α limit plus one float32 copy of α. A format-2 file (an
        encoder-decoder model) must hold one part; `load_capture` reads any."""
        loaded = load_capture(path)
        if isinstance(loaded, Parts):
            if len(loaded.names) != 1:
                raise CaptureFormatError(f"{path} holds the {', '.join(loaded.names)} attention of an encoder-decoder "
                                         f"model: choose one with --part")
            return loaded.part(loaded.names[0])
        return loaded

    @classmethod
    def _load_v1(cls, path: Path) -> Capture:
        data = read_npz(path, capture_members(), optional=long_members())
        meta = _checked_meta(data["meta"], path)
        long = _checked_long(data, path)
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
            offsets=_checked_offsets(data.get("offsets"), T, meta, path),
            generated=_checked_flags(data.get("generated"), T, "generated", path),
        )
        if long is not None and len(long.edges) - 1 != capture.n_tokens:
            raise CaptureFormatError(f"{path}: {len(long.edges) - 1} pooled blocks, but α has {capture.n_tokens}")
        try:
            return capture.validate()
        except AttentionCheckError as exc:
            raise CaptureFormatError(f"{path}: {exc}") from None

    def layer_slice(self, start: int, stop: int) -> Capture:
        """The same capture with only layers start..stop-1 (a view of α, nothing copied, not re-validated)."""
        return replace(self, attentions=self.attentions[start:stop])

    # --- from a forward pass the user ran, and views for notebooks ------------------------------------------

    @classmethod
    def from_outputs(cls, outputs, inputs, tokenizer, *, text: str | None = None, model: str | None = None) -> Capture:
        """The Capture of the essays' own code: `out = model(**inputs, output_attentions=True)`, then
        `Capture.from_outputs(out, inputs, tokenizer)`. `outputs` holds `.attentions` (one (1, H, T, T) tensor
        or array per layer), `inputs` the tokenizer's `input_ids` of one unpadded text; each is checked like
        a capture file (shapes, the α limit, rows sum to 1). Needs neither torch nor transformers itself."""
        from attnviz.tokens import describe_tokens

        attentions = getattr(outputs, "attentions", None)
        if attentions is None and isinstance(outputs, dict):
            attentions = outputs.get("attentions")
        if not attentions or any(a is None for a in attentions):
            raise CaptureFormatError("these outputs hold no attention weights: run the model with "
                                     "output_attentions=True, loaded with attn_implementation='eager'")
        ids = _plain(inputs["input_ids"] if "input_ids" in inputs else None)
        if ids is None or ids.ndim != 2 or ids.shape[0] != 1:
            raise CaptureFormatError("from_outputs takes the inputs of one text (input_ids of shape (1, T))")
        mask = _plain(inputs["attention_mask"]) if "attention_mask" in inputs else None
        if mask is not None and not np.all(mask == 1):
            raise CaptureFormatError("the inputs are padded; give one unpadded text")
        T = ids.shape[1]
        limit = _limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
        layers: list[np.ndarray] = []
        for n, layer in enumerate(attentions):
            shape = tuple(getattr(layer, "shape", ()))
            if len(shape) != 4 or shape[0] != 1 or shape[2:] != (T, T) or (layers and shape[1] != layers[0].shape[0]):
                raise CaptureFormatError(f"layer {n} attention has shape {shape}, expected (1, H, {T}, {T})")
            if 4 * shape[1] * T * T * (len(attentions)) > limit:
                raise CaptureFormatError(f"these attentions would take more than {limit:,} bytes (the capture "
                                         f"limit, ATTNVIZ_MAX_CAPTURE_BYTES)")
            layers.append(np.asarray(_plain(layer), np.float32)[0])
        token_ids = [int(i) for i in ids[0]]
        shown_text = text if text is not None else str(tokenizer.decode(token_ids, skip_special_tokens=True))
        added = tokenizer.get_special_tokens_mask(token_ids, already_has_special_tokens=True)
        described = describe_tokens(tokenizer, shown_text, token_ids, added, [None] * T, None)
        alpha = np.stack(layers)  # (L, H, T, T)
        causal = bool(T > 1 and np.abs(np.triu(alpha, k=1)).max() < 1e-6)
        meta = {"model": model or "a model's own outputs", "causal": causal, "text": shown_text,
                "source": "outputs"}
        half = any("16" in str(getattr(a, "dtype", "")) for a in attentions)  # float16 / bfloat16 runs
        return cls(attentions=alpha, tokens=tuple(described.tokens), token_ids=np.asarray(token_ids),
                   special=np.asarray(described.special, bool), special_kind=tuple(described.kinds),
                   subword=np.asarray(described.subword, bool), meta=meta).validate(atol=2e-2 if half else 1e-4)

    def _repr_html_(self) -> str:
        """In a notebook: the interactive viewer, inline and offline (one sandboxed frame per view)."""
        return _view("html")(self)

    def heatmap(self, layer: int = -1, head: int | str = "mean", **options):
        """α of one layer and head (or "mean", "max") as a matplotlib Figure."""
        return _view("heatmap")(self, layer, head, **options)

    def heads(self):
        """The head statistics table (a HeadTable: shown as HTML in a notebook; .to_records() for data)."""
        return _view("heads")(self)

    def view(self, path: str | os.PathLike) -> Path:
        """Write the interactive page (one offline HTML file) to `path`."""
        return _view("view")(self, path)

    def with_meta(self, **updates) -> Capture:
        return replace(self, meta={**self.meta, **updates})


# --- encoder-decoder models: three parts (format 2) -------------------------------------------------

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
        return _view("html")(self)

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
        limit = _limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
        arrays: dict[str, Any] = {}
        for name, capture in self.captures.items():
            if capture.attentions.nbytes > limit:
                raise OutputError(f"the {name} α takes {capture.attentions.nbytes:,} bytes, over the {limit:,} a "
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
        meta = _checked_meta(raw_meta, path, version=PARTS_FORMAT_VERSION)
        names = meta.pop("parts", None)
        if not (isinstance(names, list) and names and all(n in PART_NAMES for n in names)
                and len(set(names)) == len(names)):
            raise CaptureFormatError(f"{path}: metadata 'parts' must list some of {', '.join(PART_NAMES)}")
        sides = {side for n in names for side in PART_AXES[n]}
        alpha = _limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
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
                               _checked_offsets(data.get(f"{side}_offsets"), n, {"text": text}, path))
        generated = _checked_flags(data.get("target_generated"), len(built["target"]) if "target" in built else 0,
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


PARTS_FORMAT_VERSION = 2


def load_capture(path: str | os.PathLike) -> Capture | Parts:
    """Any capture file: format 1 (one self-attention) as a Capture, format 2 (an encoder-decoder model's
    parts) as Parts. The metadata is read first to tell which."""
    path = Path(path)
    raw = read_npz(path, {"meta": capture_members()["meta"]})["meta"]
    try:
        version = json.loads(str(raw)).get("format_version")
    except (json.JSONDecodeError, RecursionError, ValueError, AttributeError):
        version = None  # the full check below says what is wrong
    if version == PARTS_FORMAT_VERSION:
        return Parts._load(path, raw)
    return Capture._load_v1(path)


# --- views that need the renderers: registered by the public API (attnviz.api), which sits above them -----

VIEWS: dict[str, Any] = {}  # "html", "heatmap", "heads", "view" -> function(capture, ...)


VIEWS_HOME = "attnviz.api"  # the module that registers them, imported on the first view asked for


def _view(name: str):
    if not VIEWS:  # loaded by name, not imported from up here: nothing below the renderers imports them
        import importlib

        importlib.import_module(VIEWS_HOME)
    return VIEWS[name]


def _plain(value):
    """A tensor or array as a numpy array (torch tensors through .detach().cpu(), without importing torch)."""
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy() if getattr(value, "is_floating_point", lambda: False)() \
            else value.detach().cpu().numpy()
    return np.asarray(value)


# --- limits on what a capture file may hold (see "Errors" in the README) --------------------------------


def _limit(name: str, default: int) -> int:
    from attnviz.sizes import size_from_env

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
}


def capture_members() -> dict[str, Member]:
    """What each array of a capture file may be, with the current limits. T can be at most √(α limit / 4)
    (one layer, one head of float32), which bounds every per-token array too."""
    alpha = _limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
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
    alpha = _limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
    N = MAX_LONG_TOKENS
    word = MAX_TOKEN_CHARS * 4
    return {"offsets": Member("iu", 2, 16 * N), "generated": Member("b", 1, N),
            "long_tokens": Member("U", 1, N * word, word), "long_special": Member("b", 1, N),
            "long_kinds": Member("U", 1, N * 32, 32), "long_edges": Member("iu", 1, 8 * (N + 1)),
            "rollout_tokens": Member("iu", 1, 8 * 64), "rollout": Member("f", 2, min(alpha, 64 * N * 8))}


MAX_LONG_TOKENS = 1 << 17  # the longest input a pooled capture describes
MAX_HEAD_STATS = 100_000  # head records a pooled capture may carry


def _checked_flags(flags: np.ndarray | None, T: int, name: str, path: Path) -> np.ndarray | None:
    if flags is None:
        return None
    if flags.shape != (T,):
        raise CaptureFormatError(f"{path}: {name} has shape {flags.shape}, expected ({T},)")
    return flags.astype(bool)


def _checked_offsets(offsets: np.ndarray | None, T: int, meta: dict, path: Path) -> np.ndarray | None:
    """Token spans of the text: (T, 2), each -1 or within the text."""
    if offsets is None:
        return None
    n = len(str(meta.get("text", "")))
    if offsets.shape != (T, 2) or (offsets < -1).any() or (offsets > n).any():
        raise CaptureFormatError(f"{path}: offsets must be (T, 2) spans of the text")
    return offsets.astype(np.int64)


def _checked_long(data: dict, path: Path) -> LongInput | None:
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


def _checked_meta(raw: np.ndarray, path: Path, version: int = FORMAT_VERSION) -> dict:
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
            _check_structured(key, meta[key], path)
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


def _check_structured(key: str, value, path: Path) -> None:
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


def window_mask(T: int, window: int, causal: bool) -> np.ndarray:
    """True where a sliding window hides key j from query i: i − j ≥ window (causal), |i − j| > window (an
    encoder's local attention). (T, T) bool"""
    offset = np.arange(T)[:, None] - np.arange(T)[None, :]  # i − j
    return offset >= window if causal else np.abs(offset) > window


def causal_mask(T: int) -> np.ndarray:
    """True where key j comes after query i (j > i): the cells a causal model never attends to. (T, T) bool"""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def check_suffix(path: str | os.PathLike, allowed: tuple[str, ...]) -> Path:
    """Raise OutputError unless `path` ends in one of `allowed` (".png", ...). Returns it as a Path."""
    path = Path(path)
    if path.suffix.lower() not in allowed:
        raise OutputError(f"unknown output format {path.suffix or '(no suffix)'!r} for {path}: use "
                          f"{', '.join(allowed)}")
    return path


