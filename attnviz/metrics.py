"""Pure functions of a Capture: head statistics, pattern labels, rollout, model-vs-scratch differences.
Nothing here changes the capture; everything returns new numpy arrays or small records.

α is one head's (T, T) matrix; row i is query i; n_i is the number of keys row i may attend to: T for
encoders, i + 1 for causal models. Every per-head statistic is one function here plus one row of the
metric registry (METRICS, below), which holds its definition and feeds every table and caption.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import CaptureMismatchError, arg
from attnviz.tokens import is_punctuation

# Pattern thresholds, after Clark et al. 2019 ("What does BERT look at?") and Kovaleva et al. 2019
# ("Revealing the dark secrets of BERT"). A head gets the first label whose test it passes, in this order.
POSITIONAL_MIN = 0.5  # previous-token / next-token / self: mean weight on that offset
VERTICAL_MIN = 0.5  # vertical: mean over rows of the weight on one single key column
BLOCK_MIN = 0.8  # block: mean mass on keys of the query's own segment (needs ≥ 2 segments)
BROAD_MIN = 0.85  # broad: normalised entropy
# induction / duplicate-token (Olsson et al. 2022; TransformerLens's head detector): mean over the rows that have
# a target (an earlier occurrence of the query's token) of the weight on the targets
REPEAT_MIN = 0.4
LABELS = ("induction", "duplicate-token", "previous-token", "next-token", "self", "vertical", "block", "broad",
          "mixed")
SENTENCE_END = {".", "!", "?", "。", "！", "？"}


# --- what the metrics see: the tokens, and blocks of query rows -------------------------------------------


@dataclass(frozen=True, eq=False)
class Tokens:
    """What the metrics know of the input besides α: the tokens, which are special and how, causality."""

    tokens: tuple[str, ...]
    special: np.ndarray  # (T,) bool
    kinds: np.ndarray  # (T,) str: "" | "start" | "end" | "other"
    causal: bool
    square: bool = True  # the queries are these same tokens; False for cross-attention (these are the keys)
    window: int = 0  # this layer's sliding window (causal: the last w keys; encoder: ±w); 0 for none
    ids: tuple[int, ...] | None = None  # token ids, what "the same token" compares (else the token texts)

    def at_layer(self, windows: Sequence[int] | None, layer: int) -> Tokens:
        """These tokens as layer `layer` sees them: with its sliding window, if it has one."""
        window = int(windows[layer]) if windows else 0
        return self if window == self.window else replace(self, window=window)

    @classmethod
    def of(cls, capture: Capture) -> Tokens:
        """The keys' tokens: the input itself for self-attention, the source for cross-attention."""
        if capture.keys is not None:
            keys = capture.keys
            return cls(tuple(keys.tokens), np.asarray(keys.special, bool), np.array(keys.special_kind), False,
                       square=False)
        words = capture.meta.get("level") == "word"  # a word's id is its first piece's: compare the words
        return cls(tuple(capture.tokens), np.asarray(capture.special, bool), np.array(capture.special_kind),
                   capture.causal, ids=None if words else tuple(int(i) for i in capture.token_ids))

    @property
    def T(self) -> int:
        return len(self.tokens)

    @functools.cached_property
    def n_keys(self) -> np.ndarray:
        """Keys each query may attend to: T for encoders, i + 1 for causal models; within a sliding window
        at most w (causal) or the keys within ±w. (T,)"""
        i = np.arange(self.T)
        if not self.window:
            return i + 1 if self.causal else np.full(self.T, self.T)
        if self.causal:
            return np.minimum(i + 1, self.window)
        return np.minimum(i, self.window) + np.minimum(self.T - 1 - i, self.window) + 1

    @functools.cached_property
    def seen_by(self) -> np.ndarray:
        """Queries that can see each key: T for encoders, T − j for causal models; within a sliding window at
        most w (causal), or the queries within ±w. (T,)"""
        j = np.arange(self.T)
        if not self.window:
            return self.T - j if self.causal else np.full(self.T, self.T)
        if self.causal:
            return np.minimum(self.T - j, self.window)
        return np.minimum(j, self.window) + np.minimum(self.T - 1 - j, self.window) + 1

    @functools.cached_property
    def groups(self) -> dict[str, np.ndarray]:
        """Key groups for the mass metrics, each a float (T,) indicator. Special kinds come from the tokenizer."""
        first = np.zeros(self.T, dtype=bool)
        first[0] = True
        masks = {"start": self.special & (self.kinds == "start"), "end": self.special & (self.kinds == "end"),
                 "punct": ~self.special & np.array([is_punctuation(t) for t in self.tokens], dtype=bool),
                 "first": first}
        return {name: mask.astype(np.float64) for name, mask in masks.items()}

    @functools.cached_property
    def segments(self) -> np.ndarray:
        """Segment id per token: a new segment starts after an [SEP]/EOS or a sentence-final mark. (T,)"""
        ids, current = [], 0
        for token, kind in zip(self.tokens, self.kinds):
            ids.append(current)
            if kind == "end" or token.removeprefix("##") in SENTENCE_END:
                current += 1
        return np.array(ids, dtype=np.int64)

    @functools.cached_property
    def keys(self) -> np.ndarray:
        """What "the same token" compares: the ids, else the texts. (T,)"""
        return np.asarray(self.ids, dtype=np.int64) if self.ids is not None else np.array(self.tokens, dtype=object)

    @functools.cached_property
    def two_segments(self) -> bool:
        return len(set(self.segments[~self.special].tolist())) >= 2


def repeat_targets(keys: np.ndarray, queries: np.ndarray, shift: int) -> np.ndarray:
    """TransformerLens's head-detector patterns for the rows `queries`, (b, T) bool. shift 0 (duplicate token):
    key j < i holds the query's token; shift 1 (induction): key j ≤ i follows an earlier occurrence of it
    (keys[j − 1] = keys[i], j − 1 < i)."""
    j = np.arange(len(keys))
    if shift == 0:
        return (keys[None, :] == keys[queries][:, None]) & (j[None, :] < queries[:, None])
    before = np.concatenate([keys[:1], keys[:-1]])  # before[j] = keys[j − 1] (j = 0 is excluded below)
    return (before[None, :] == keys[queries][:, None]) & (j[None, :] >= 1) & (j[None, :] <= queries[:, None])


@dataclass(frozen=True)
class Weighting:
    """A row statistic that is a weighted sum Σ_j α_ij·w_ij of its row: `weights(tokens, queries)` gives the
    weights of the rows `queries` of one text, (T,) for every row alike or (b, T). square_only: defined only
    when queries and keys are the same tokens (0 for cross-attention, whose metrics are NaN). wide: weights
    beyond [0, 1] (distances), summed in float64 whatever α's precision; the others are weights in [0, 1] of a
    row that sums to at most 1, summed in α's own precision (float32: within about 1e-7)."""

    name: str
    weights: Callable[[Tokens, np.ndarray], np.ndarray]
    square_only: bool = False
    wide: bool = False
    shared: bool = False  # the same weights (T,) for every row, whatever `queries` are


def _same_segment(tokens: Tokens, queries: np.ndarray) -> np.ndarray:
    return tokens.segments[queries][:, None] == tokens.segments[None, :]


def _group(name: str) -> Callable[[Tokens, np.ndarray], np.ndarray]:
    return lambda tokens, queries: tokens.groups[name]


# Every weighting of a block of rows is summed in a few products with α, one per kind (Rows.weighted); a
# metric reads its own.
WEIGHTINGS: tuple[Weighting, ...] = (
    *(Weighting(group, _group(group), shared=True) for group in ("start", "end", "punct", "first")),
    Weighting("distance", lambda t, q: np.abs(q[:, None] - np.arange(t.T)[None, :]), square_only=True, wide=True),
    Weighting("segment", _same_segment, square_only=True),
    Weighting("duplicate", lambda t, q: repeat_targets(t.keys, q, 0), square_only=True),
    Weighting("induction", lambda t, q: repeat_targets(t.keys, q, 1), square_only=True),
)
_NARROW = tuple(k for k, w in enumerate(WEIGHTINGS) if not w.wide)
_SHARED = tuple(k for k in _NARROW if WEIGHTINGS[k].shared)
_PER_ROW = tuple(k for k in _NARROW if not WEIGHTINGS[k].shared)
_WIDE = tuple(k for k, w in enumerate(WEIGHTINGS) if w.wide)
_WEIGHTING_INDEX = {w.name: k for k, w in enumerate(WEIGHTINGS)}


@dataclass(frozen=True)
class Rows:
    """A block of query rows of every head of one layer: the unit every metric is computed from, whether α
    comes from a capture, is computed a block at a time for a long input, or holds the rows of several texts
    of a corpus batch at once.

    alpha (H, b, T): rows `queries` (b,) of α, float64 from a capture, float32 as a model gives it on the
    streamed and corpus paths (then the entropy and the weights in [0, 1] are summed in float32, within
    about 1e-6 of float64, and the distances in float64; see Weighting). kept (H, b): for a family with sink
    logits, what each row kept over the real keys before it was made its shares (alpha then holds the shares);
    None otherwise.
    texts, counts: rows of several texts, each text's rows in a run (`counts[k]` rows, keys padded with zero
    weight to the longest text); `queries` are positions within each row's own text and `tokens` is texts[0].
    Every per-row quantity below is computed for each text from its own tokens."""

    alpha: np.ndarray
    queries: np.ndarray
    tokens: Tokens
    kept: np.ndarray | None = None
    texts: tuple[Tokens, ...] = ()
    counts: tuple[int, ...] = ()

    def parts(self) -> list[tuple[Tokens, int, int]]:
        """(tokens, first row, end row) of each text these rows belong to."""
        if not self.texts:
            return [(self.tokens, 0, len(self.queries))]
        edges = np.cumsum((0, *self.counts))
        return [(t, int(a), int(b)) for t, a, b in zip(self.texts, edges[:-1], edges[1:])]

    def per_row(self, of: Callable[[Tokens, np.ndarray], np.ndarray]) -> np.ndarray:
        """A per-row quantity (b,) made by `of(tokens, queries)` for each text's rows."""
        if not self.texts:
            return np.asarray(of(self.tokens, self.queries))
        return np.concatenate([np.asarray(of(t, self.queries[a:b])) for t, a, b in self.parts()])

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """The number of keys of each row's text. (b,)"""
        return self.per_row(lambda t, q: np.full(len(q), t.T))

    @functools.cached_property
    def n_keys(self) -> np.ndarray:
        """Keys each row may attend to (Tokens.n_keys of its text). (b,)"""
        return self.per_row(lambda t, q: t.n_keys[q])

    @functools.cached_property
    def two_segments(self) -> np.ndarray:
        """Whether each row's text has two segments or more. (b,) bool"""
        return self.per_row(lambda t, q: np.full(len(q), t.two_segments))

    def at(self, offset: int) -> np.ndarray:
        """α_i,i+offset for each row, NaN where that key does not exist (and always for cross-attention,
        where query i and key i are different sentences). (H, b)"""
        out = np.full(self.alpha.shape[:2], np.nan)
        if not self.tokens.square:
            return out
        keys = self.queries + offset
        inside = (keys >= 0) & (keys < self.lengths)
        rows = np.nonzero(inside)[0]
        out[:, rows] = self.alpha[:, rows, keys[inside]]
        return out

    @functools.cached_property
    def entropy(self) -> np.ndarray:
        """-Σ_j α_ij ln α_ij for each row, nats, computed once for every metric that needs it. (H, b)"""
        return row_entropy(self.alpha)

    def _weights(self, chosen: Sequence[int], dtype) -> np.ndarray:
        """The weights of the weightings `chosen` (indices into WEIGHTINGS) for these rows, keys beyond a row's
        text 0. (len(chosen), b, T)"""
        out = np.zeros((len(chosen), len(self.queries), self.alpha.shape[-1]), dtype)
        for tokens, a, b in self.parts():
            for n, k in enumerate(chosen):
                weighting = WEIGHTINGS[k]
                if tokens.square or not weighting.square_only:
                    out[n, a:b, :tokens.T] = weighting.weights(tokens, self.queries[a:b])
        return out

    @functools.cached_property
    def narrow_weights(self) -> np.ndarray:
        """The weights in [0, 1] (every weighting but the wide ones), in α's precision. (narrow, b, T)"""
        return self._weights(_NARROW, self._narrow_dtype)

    @functools.cached_property
    def _per_row_weights(self) -> np.ndarray:
        """The weights in [0, 1] that differ from row to row, in α's precision. (per-row, b, T)"""
        if self.texts:
            return self.narrow_weights[[_NARROW.index(k) for k in _PER_ROW]]
        return self._weights(_PER_ROW, self._narrow_dtype)

    @property
    def _narrow_dtype(self):
        return np.float32 if self.alpha.dtype == np.float32 else np.float64

    @functools.cached_property
    def weighted(self) -> np.ndarray:
        """Σ_j α_ij·w_ij of every weighting, (H, b, weightings) float64: the weights in [0, 1] in α's own
        precision (the weights every row shares, of one text, in one product with their few nonzero keys; the
        others in one batched product), the wide ones in float64, a cache-sized run of rows at a time."""
        H, b, T = self.alpha.shape
        out = np.empty((H, b, len(WEIGHTINGS)))
        alpha = self.alpha if self.alpha.dtype == np.float32 else self.alpha64
        if self.texts:  # rows of several texts: each row has its own text's weights
            out[..., list(_NARROW)] = _row_products(alpha, self.narrow_weights)
        else:
            if _SHARED:
                shared = np.zeros((T, len(_SHARED)), self._narrow_dtype)
                for n, k in enumerate(_SHARED):
                    if self.tokens.square or not WEIGHTINGS[k].square_only:
                        shared[:, n] = WEIGHTINGS[k].weights(self.tokens, self.queries)
                keys = np.flatnonzero(shared.any(axis=1))  # [CLS], [SEP], punctuation, token 0: a few keys
                few = alpha[..., keys] if 4 * len(keys) < T else alpha
                sums = few.reshape(-1, few.shape[-1]) @ (shared[keys] if few is not alpha else shared)
                out[..., list(_SHARED)] = sums.reshape(H, b, -1)
            if _PER_ROW:
                out[..., list(_PER_ROW)] = _row_products(alpha, self._per_row_weights)
        if _WIDE:
            wide = self._weights(_WIDE, np.float64)
            if self.alpha.dtype == np.float64 or self.texts:  # a corpus batch's chunk: its float64 copy is made
                # for the column sums anyway, and holds at most corpus.ROWS_BYTES
                out[..., list(_WIDE)] = _row_products(self.alpha64, wide)
            else:  # float64 a few rows at a time: a copy that stays in the cache, not one of the whole block
                step = max(1, WIDE_BYTES // max(H * T * 8, 1))
                for r0 in range(0, b, step):
                    r1 = min(b, r0 + step)
                    out[:, r0:r1, list(_WIDE)] = _row_products(self.alpha[:, r0:r1].astype(np.float64),
                                                               wide[:, r0:r1])
        return out

    @functools.cached_property
    def alpha64(self) -> np.ndarray:
        """alpha in float64, in alpha's own memory layout: the wide weightings of a corpus chunk and its column
        sums are summed in it."""
        return self.alpha if self.alpha.dtype == np.float64 else self.alpha.astype(np.float64)

    def weighted_sum(self, name: str) -> np.ndarray:
        """Σ_j α_ij·w_ij of the weighting `name` for each row. (H, b)"""
        return self.weighted[..., _WEIGHTING_INDEX[name]]

    def has_weight(self, name: str) -> np.ndarray:
        """Whether each row has a nonzero weight of `name` (a repeat target, say). (b,)"""
        k = _WEIGHTING_INDEX[name]
        if WEIGHTINGS[k].wide or WEIGHTINGS[k].shared:
            return np.asarray(self._weights((k,), np.float64)[0].any(axis=-1))
        return np.asarray(self._per_row_weights[_PER_ROW.index(k)].any(axis=-1))

    def mass(self, group: str) -> np.ndarray:
        """Σ_{j in group} α_ij for each row. (H, b)"""
        return self.weighted_sum(group)


WIDE_BYTES = 256 << 10  # float32 rows made float64 at a time for the wide weightings: a copy the cache holds


def _row_products(alpha: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Σ_j alpha[h, i, j]·weights[k, i, j] for every head, row and weighting, as one batched product (BLAS) in
    the arrays' precision: (H, b, T), (k, b, T) -> (H, b, k) float64."""
    products = np.matmul(weights.transpose(1, 0, 2), alpha.transpose(1, 2, 0))  # (b, k, H)
    return products.transpose(2, 0, 1).astype(np.float64)


def row_entropy(alpha: np.ndarray) -> np.ndarray:
    """-Σ_j α_ij ln α_ij for every row, nats, in α's own precision (float32 or float64; float32 terms summed
    blockwise, within about 1e-6 nats of float64), returned as float64. (..., T) -> (...)"""
    alpha = np.asarray(alpha)
    if alpha.dtype not in (np.float32, np.float64):
        alpha = alpha.astype(np.float64)
    logs = np.maximum(alpha, np.finfo(alpha.dtype).tiny)  # 0·ln 0 = 0: a zero weight meets a finite log
    np.log(logs, out=logs)
    if alpha.flags.c_contiguous:  # one dot product per row (BLAS)
        T = alpha.shape[-1]
        dots = np.matmul(alpha.reshape(-1, 1, T), logs.reshape(-1, T, 1)).reshape(alpha.shape[:-1])
        return -dots.astype(np.float64)
    np.multiply(logs, alpha, out=logs)
    return -logs.sum(axis=-1).astype(np.float64)


def _normalised_entropy_rows(rows: Rows) -> np.ndarray:
    if rows.tokens.square:
        n = rows.n_keys.astype(np.float64)  # (b,) keys each row may attend to
    else:  # cross-attention: every target row sees every source key
        n = np.full(len(rows.queries), float(rows.tokens.T))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 1, rows.entropy / np.log(np.maximum(n, 2)), np.nan)


def _distance_rows(rows: Rows) -> np.ndarray:
    if not rows.tokens.square:  # positions in two different sentences
        return np.full(rows.alpha.shape[:2], np.nan)
    return rows.weighted_sum("distance")


def _block_rows(rows: Rows) -> np.ndarray:
    if not rows.tokens.square:
        return np.full(rows.alpha.shape[:2], np.nan)
    return np.where(rows.two_segments[None], rows.weighted_sum("segment"), np.nan)


def _repeat_rows(rows: Rows, shift: int) -> np.ndarray:
    """Per row, the weight on its repeat targets; NaN for a row without any (and for cross-attention)."""
    if not rows.tokens.square:
        return np.full(rows.alpha.shape[:2], np.nan)
    name = "induction" if shift else "duplicate"
    return np.where(rows.has_weight(name)[None], rows.weighted_sum(name), np.nan)


DETECTORS = ("previous-token", "duplicate-token", "induction")


def detector_scores(alpha: np.ndarray, keys: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per detector, (TransformerLens's score, the share), (L, H) each, from α (L, H, T, T) and the token ids:
    TransformerLens's head detector (error measure "mul", nothing excluded) scores Σ α⊙P / Σ α with P its
    pattern (previous token; earlier occurrences of the query's token; the tokens after them); the share is
    the same weight averaged over the rows that have a target only."""
    T = alpha.shape[-1]
    queries = np.arange(T)
    patterns = {"previous-token": np.eye(T, k=-1, dtype=bool),
                "duplicate-token": repeat_targets(keys, queries, 0), "induction": repeat_targets(keys, queries, 1)}
    total = alpha.sum(axis=(-2, -1))  # (L, H)
    out = {}
    for name in DETECTORS:
        pattern = patterns[name]
        on = (alpha * pattern).sum(axis=-1)  # (L, H, T) weight on the targets, per row
        rows = pattern.any(axis=-1)
        share = on[..., rows].mean(axis=-1) if rows.any() else np.full(total.shape, np.nan)
        out[name] = (on.sum(axis=-1) / np.maximum(total, 1e-30), share)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two arrays (ties share their mean rank); NaN when either is constant."""
    def ranks(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64).ravel()
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        for value in np.unique(x):  # ties: their mean rank
            tied = x == value
            if tied.sum() > 1:
                r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def uniform_entropy(T: int) -> float:
    """The entropy of uniform attention over T keys: ln T nats (the encoder baseline)."""
    return float(np.log(T))


def token_distance(T: int) -> np.ndarray:
    """|i - j| for every query i and key j. (T, T)"""
    return np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])


# --- the metric registry ---------------------------------------------------------------------------
# One row per head metric. The heads table, --json/--csv, the export's heads.csv/heads.json, the gallery
# captions and glossary, `attnviz explain` and the README's definition table are all made from it, and so
# is every number of a long input's streamed path: a new metric is one register() call below.


@dataclass(frozen=True)
class Metric:
    """One per-head statistic, defined on blocks of query rows so that it can be computed from a capture or
    streamed over a long input a block at a time.

    name        key in JSON/CSV and the long --sort key ("norm_entropy")
    header      the column header in terminal tables, also accepted by --sort ("norm_ent")
    definition  one line, shown by `attnviz explain`, the README and the gallery glossary
    rows        Rows -> (H, b): a value per head and query row; the metric is their mean over rows (NaN
                rows are left out; none left gives 0)
    columns     instead of rows: (mean over rows of α, (H, T); Tokens) -> (H,), for column statistics
    fmt         how a value is written in tables and captions"""

    name: str
    header: str
    definition: str
    rows: Callable[[Rows], np.ndarray] | None = None
    fmt: str = "{:.2f}"
    kind: str = "number"  # "number" | "text"
    columns: Callable[[np.ndarray, Tokens], np.ndarray] | None = None
    when_empty: float = 0.0  # the value when no row counts (every row NaN)
    square_only: bool = False  # compares query and key positions: undefined (NaN, shown "–") for cross-attention
    optional: bool = False  # left out of tables and records where it does not apply (every value NaN)

    def format(self, value) -> str:
        if self.kind == "text":
            return str(value)
        return "–" if value is None or not np.isfinite(value) else self.fmt.format(value)


class Accumulator:
    """Metric values of the heads of one layer, folded in one block of query rows at a time."""

    def __init__(self, metrics: Sequence[Metric], H: int, tokens: Tokens):
        self.metrics, self.tokens = list(metrics), tokens
        self.sums = {m.name: np.zeros(H) for m in self.metrics if m.rows is not None}
        self.counts = {m.name: np.zeros(H) for m in self.metrics if m.rows is not None}
        self.column_sum = np.zeros((H, tokens.T))
        self.rows_seen = 0

    def add(self, rows: Rows) -> None:
        for m in self.metrics:
            if m.rows is not None:
                values = np.asarray(m.rows(rows), dtype=np.float64)  # (H, b)
                finite = np.isfinite(values)
                self.sums[m.name] += np.where(finite, values, 0.0).sum(axis=-1)
                self.counts[m.name] += finite.sum(axis=-1)
        self.column_sum += rows.alpha.sum(axis=1)  # a block's rows in α's precision, blocks in float64
        self.rows_seen += rows.alpha.shape[1]

    def absorb(self, other: Accumulator) -> None:
        """Fold in what another accumulator of the same heads and tokens saw (other rows)."""
        for name in self.sums:
            self.sums[name] += other.sums[name]
            self.counts[name] += other.counts[name]
        self.column_sum += other.column_sum
        self.rows_seen += other.rows_seen

    def result(self) -> dict[str, np.ndarray]:
        """Each metric's value per head. (H,) each"""
        out = {}
        column_mean = self.column_sum / max(self.rows_seen, 1)  # (H, T)
        for m in self.metrics:
            if m.rows is not None:
                counts = self.counts[m.name]
                empty = float("nan") if m.square_only and not self.tokens.square else m.when_empty
                out[m.name] = np.where(counts > 0, self.sums[m.name] / np.maximum(counts, 1), empty)
            elif m.columns is not None:
                out[m.name] = np.asarray(m.columns(column_mean, self.tokens))
        return out


BLOCK_ROWS_BYTES = 64 << 20  # α rows held in float64 at a time when computing metrics from a capture


def row_blocks(alpha_layer: np.ndarray, tokens: Tokens, budget: int = BLOCK_ROWS_BYTES,
               queries: Sequence[int] | None = None):
    """Rows blocks of one layer's α (H, T, T), each small enough to hold in float64; only the rows
    `queries` (in order) when given."""
    H, T, _ = alpha_layer.shape
    step = max(1, budget // max(H * T * 8, 1))
    if queries is None:
        for start in range(0, T, step):
            chosen = np.arange(start, min(start + step, T))
            yield Rows(np.asarray(alpha_layer[:, start:start + step], dtype=np.float64), chosen, tokens)
        return
    wanted = np.asarray(queries, dtype=np.intp)
    for start in range(0, len(wanted), step):
        chosen = wanted[start:start + step]
        yield Rows(np.asarray(alpha_layer[:, chosen], dtype=np.float64), chosen, tokens)


def head_values(capture: Capture, metrics: Sequence[Metric] | None = None,
                queries: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Every metric (default: the registered ones and what the labels need) of every head, one layer and
    one block of rows at a time; over the query rows `queries` only, when given (e.g. the generated
    tokens'). (L, H) each"""
    metrics = list(metrics) if metrics is not None else all_metrics()
    sinks = capture.sinks
    raw, capture = capture, capture.as_distribution()  # norms and sink logits: each row's shares
    tokens = Tokens.of(capture)
    per_layer = []
    for layer in range(capture.n_layers):
        layer_tokens = tokens.at_layer(raw.windows, layer)  # with this layer's sliding window
        acc = Accumulator(metrics, capture.n_heads, layer_tokens)
        kept = raw.attentions[layer].sum(axis=-1, dtype=np.float64) if sinks else None  # (H, T)
        for rows in row_blocks(capture.attentions[layer], layer_tokens, queries=queries):
            acc.add(rows if kept is None else replace(rows, kept=kept[:, rows.queries]))
        per_layer.append(acc.result())
    return {m.name: np.stack([values[m.name] for values in per_layer]) for m in metrics}


def _one(metric: Metric) -> Callable[[Capture], np.ndarray]:
    return lambda capture: head_values(capture, [metric])[metric.name]


def _vertical(column_mean: np.ndarray, tokens: Tokens) -> np.ndarray:
    return column_mean.max(axis=-1)


def _top_key(column_mean: np.ndarray, tokens: Tokens) -> np.ndarray:
    return np.array(tokens.tokens, dtype=object)[column_mean.argmax(axis=-1)]


SINK_MIN = 0.3  # Gu et al. 2024: a key is an attention sink when its sink score exceeds this


def sink_scores(column_mean: np.ndarray, tokens: Tokens) -> np.ndarray:
    """Per key, the mean attention it receives from the queries that can see it (Gu et al. 2024): every
    query for encoders, the queries at or after it for causal models. (H, T)"""
    return column_mean * tokens.T / tokens.seen_by  # the mean over all rows, made one over the rows that see j


def _sink(column_mean: np.ndarray, tokens: Tokens) -> np.ndarray:
    return sink_scores(column_mean, tokens).max(axis=-1)


METRICS: list[Metric] = []
FIXED_COLUMNS = ("layer", "head", "label")


def register(metric: Metric) -> Metric:
    """Add a metric to every head table. Names and headers must be new."""
    if (metric.rows is None) == (metric.columns is None):
        raise ValueError(f"metric {metric.name!r} needs exactly one of rows= or columns=")
    taken = {key for m in METRICS for key in (m.name, m.header)} | set(FIXED_COLUMNS)
    if metric.name in taken or metric.header in taken:
        raise ValueError(f"a metric or column named {metric.name!r}/{metric.header!r} exists already")
    METRICS.append(metric)
    return metric


def unregister(name: str) -> None:
    METRICS[:] = [m for m in METRICS if m.name != name]


register_metric = register  # the public name (attnviz.register_metric)


def list_metrics() -> tuple[Metric, ...]:
    """Every metric the head tables show, in column order: name, header, format and definition."""
    return tuple(METRICS)


def find_metric(key: str) -> Metric | None:
    """The metric whose name or header is `key`."""
    return next((m for m in METRICS if key in (m.name, m.header)), None)


def columns(present: dict | None = None) -> list[str]:
    """Record keys in order: layer, head, every registered metric, label; an optional metric only where the
    record `present` has it."""
    return ["layer", "head", *(m.name for m in METRICS if not (m.optional and present is not None
                                                               and m.name not in present)), "label"]


ENTROPY = Metric("entropy", "entropy", "mean over rows of −Σ_j α_ij ln α_ij, in nats (0·ln 0 = 0); uniform over T "
                 "keys = ln T", lambda r: r.entropy)
NORM_ENTROPY = Metric("norm_entropy", "norm_ent", "mean over rows with n_i > 1 of H_i / ln n_i: 0 one-hot, 1 uniform",
                      _normalised_entropy_rows)
PREV = Metric("prev", "prev", "mean of α_i,i−1 over i ≥ 1: weight on the previous token", lambda r: r.at(-1),
              square_only=True)
SELF = Metric("self", "self", "mean of α_ii: weight on the token itself", lambda r: r.at(0), square_only=True)
NEXT = Metric("next", "next", "mean of α_i,i+1 over i < T−1: weight on the next token", lambda r: r.at(1),
              square_only=True)
VERTICAL = Metric("vertical", "vert", "the largest mean weight one key column gets (a vertical stripe in the "
                  "heatmap)", columns=_vertical)
MAX_WEIGHT = Metric("max_weight", "max", "mean over rows of max_j α_ij", lambda r: r.alpha.max(axis=-1))
DISTANCE = Metric("mean_distance", "dist", "mean over rows of Σ_j α_ij·|i − j|, in tokens", _distance_rows, "{:.1f}",
                  square_only=True)
KEPT = Metric("kept", "kept", "mean over rows of Σ_j α_ij: what a row keeps for the real keys when a per-head sink "
              "logit (gpt-oss) takes its share; the other statistics use each row's shares of what it kept. "
              "Shown for such models only",
              lambda r: r.kept if r.kept is not None else np.full(r.alpha.shape[:2], np.nan),
              when_empty=float("nan"), optional=True)
INDUCTION = Metric("induction", "induct", "mean, over the rows whose token occurred before, of the weight on the keys "
                   "that followed its earlier occurrences (an induction head: … A B … A → B); the rows of "
                   "TransformerLens's induction pattern. Shown when the text repeats a token",
                   lambda r: _repeat_rows(r, 1), when_empty=float("nan"), square_only=True, optional=True)
DUPLICATE = Metric("duplicate", "dup", "mean, over the rows whose token occurred before, of the weight on its earlier "
                   "occurrences (a duplicate-token head); the rows of TransformerLens's duplicate-token pattern. "
                   "Shown when the text repeats a token",
                   lambda r: _repeat_rows(r, 0), when_empty=float("nan"), square_only=True, optional=True)
for _metric in (
    ENTROPY, NORM_ENTROPY, MAX_WEIGHT, DISTANCE, PREV, SELF, NEXT, KEPT,
    Metric("start_mass", "start", "mean over rows of the weight on [CLS]/BOS keys", lambda r: r.mass("start")),
    Metric("end_mass", "end", "mean over rows of the weight on [SEP]/EOS keys", lambda r: r.mass("end")),
    VERTICAL,
    Metric("top_key", "top_key", "the key that column belongs to", kind="text", columns=_top_key),
    Metric("punct_mass", "punct", "mean over rows of the weight on punctuation tokens", lambda r: r.mass("punct")),
    Metric("first_mass", "first", "mean over rows of the weight on token 0", lambda r: r.mass("first")),
    Metric("sink", "sink", "the largest sink score of a key: the mean weight it receives from the queries that can "
           f"see it (Gu et al. 2024; a sink above {SINK_MIN})", columns=_sink),
    INDUCTION, DUPLICATE,
):
    register(_metric)

# what the pattern labels are computed from (also when a caller has unregistered the metric); block is not a
# column (it is undefined for a single segment) but decides the block label
BLOCK = Metric("block", "block", "mean over rows of the weight on keys of the query's own segment", _block_rows,
               when_empty=float("nan"), square_only=True)
LABEL_INPUTS = (INDUCTION, DUPLICATE, PREV, NEXT, SELF, VERTICAL, NORM_ENTROPY, BLOCK)


def all_metrics() -> list[Metric]:
    """The registered metrics and the label inputs, each once."""
    names = {m.name for m in METRICS}
    return [*METRICS, *(m for m in LABEL_INPUTS if m.name not in names)]


# the same numbers as plain functions of a capture, (L, H) each
entropy = _one(ENTROPY)
normalised_entropy = _one(NORM_ENTROPY)
block_score = _one(BLOCK)


max_weight = _one(MAX_WEIGHT)
mean_distance = _one(DISTANCE)


def vertical_score(capture: Capture) -> tuple[np.ndarray, np.ndarray]:
    """For each head, the key column with the most mean weight, and that weight. (L, H) each"""
    column_mass = capture.attentions.mean(axis=-2)  # (L, H, T)
    return column_mass.argmax(axis=-1), column_mass.max(axis=-1)


def segments(capture: Capture) -> np.ndarray:
    return Tokens.of(capture).segments


def label_heads(values: dict[str, np.ndarray], block: np.ndarray) -> np.ndarray:
    """The pattern label of each head from its scores, first match in LABELS order. (L, H) str"""
    def at_least(name: str, minimum: float) -> np.ndarray:
        value = values.get(name)
        return np.zeros(values["prev"].shape, bool) if value is None else np.nan_to_num(value, nan=0.0) >= minimum

    tests = [at_least("induction", REPEAT_MIN), at_least("duplicate", REPEAT_MIN),
             values["prev"] >= POSITIONAL_MIN, values["next"] >= POSITIONAL_MIN, values["self"] >= POSITIONAL_MIN,
             values["vertical"] >= VERTICAL_MIN, np.nan_to_num(block, nan=0.0) >= BLOCK_MIN,
             values["norm_entropy"] >= BROAD_MIN]
    labels = np.full(values["prev"].shape, "mixed", dtype=object)
    for label, passed in reversed(list(zip(LABELS, tests))):
        labels[passed] = label
    return labels


def by_layer(compute: Callable[[Capture], np.ndarray], capture: Capture) -> np.ndarray:
    """A per-head function of a capture computed one layer at a time, so its float64 temporaries stay the
    size of one layer (H·T²) even for the largest capture accepted. (L, H)"""
    return np.concatenate([np.asarray(compute(capture.layer_slice(n, n + 1))) for n in range(capture.n_layers)])


def records_from_values(values: dict[str, np.ndarray]) -> list[dict]:
    """Head records (one dict per layer and head, keys in the order of columns()) from metric values
    (L, H) each, however they were computed."""
    block = values.get("block")
    labels = label_heads(values, block if block is not None else np.full(values["prev"].shape, np.nan))
    L, H = values["prev"].shape
    records = []
    for layer in range(L):
        for head in range(H):
            record: dict = {"layer": layer, "head": head}
            for m in METRICS:
                if m.optional and not np.isfinite(values[m.name]).any():
                    continue  # does not apply to this model
                value = values[m.name][layer, head]
                record[m.name] = str(value) if m.kind == "text" else float(value)
            record["label"] = str(labels[layer, head])
            records.append(record)
    return records


def _stored_stats(capture: Capture, queries: Sequence[int] | None) -> list | None:
    """The head records a pooled capture carries (statistics of every row: they cannot be narrowed), checked
    against the capture's shape and the metric registry."""
    stored = capture.meta.get("head_stats")
    if isinstance(stored, list) and queries is not None:
        from attnviz.errors import SelectionError

        raise SelectionError(f"this capture is pooled (a long input) and holds statistics of all rows; "
                             f"{arg('rows')} needs the text run again", "rows")
    if not isinstance(stored, list):
        return None
    check_head_stats(stored, capture.n_layers, capture.n_heads)
    return stored


def check_head_stats(records: list, layers: int, heads: int) -> None:
    """A pooled capture's head records come from a file: exactly one per (layer, head) in range, every
    registered metric present as a number (a finite one or NaN; text metrics as text), a known label.
    CaptureFormatError names the first record that is not."""
    from attnviz.errors import CaptureFormatError

    def bad(n: int, what: str) -> CaptureFormatError:
        return CaptureFormatError(f"this capture's head statistics are damaged: record {n} {what}")

    if len(records) != layers * heads:
        raise CaptureFormatError(f"this capture's head statistics hold {len(records)} records, not one for each of "
                                 f"its {layers} × {heads} heads")
    seen = set()
    for n, record in enumerate(records):
        if not isinstance(record, dict):
            raise bad(n, "is not a record")
        layer, head = record.get("layer"), record.get("head")
        if not (isinstance(layer, int) and isinstance(head, int) and not isinstance(layer, bool)
                and not isinstance(head, bool) and 0 <= layer < layers and 0 <= head < heads):
            raise bad(n, f"names layer {layer!r}, head {head!r}: the capture has layers 0..{layers - 1}, heads "
                         f"0..{heads - 1}")
        if (layer, head) in seen:
            raise bad(n, f"repeats layer {layer}, head {head}")
        seen.add((layer, head))
        for m in METRICS:
            if m.optional and (m.name in record) != (m.name in records[0]):
                raise bad(n, f"has {m.name!r} where record 0 has not, or the other way round")
            if m.optional and m.name not in record:
                continue  # a metric that does not apply to this model
            value = record.get(m.name)
            if m.kind == "text":
                if not isinstance(value, str):
                    raise bad(n, f"has no text {m.name!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value):
                raise bad(n, f"has no number {m.name!r} (it holds {str(value)[:40]!r})")
        if record.get("label") not in LABELS:
            raise bad(n, f"has the unknown label {str(record.get('label'))[:40]!r}")


def value_grid(capture: Capture, name: str, queries: Sequence[int] | None = None) -> np.ndarray:
    """One metric of every head (the stored value for a pooled long input), over the query rows `queries`
    when given. (L, H)"""
    if _stored_stats(capture, queries) is not None:
        grid = np.zeros((capture.n_layers, capture.n_heads))
        for record in capture.meta["head_stats"]:
            grid[record["layer"], record["head"]] = float(record.get(name) or 0.0)
        return grid
    metric = next(m for m in all_metrics() if m.name == name)
    return by_layer(lambda layer: head_values(layer, [metric], queries)[metric.name], capture)


def head_records(capture: Capture, queries: Sequence[int] | None = None) -> list[dict]:
    """Every registered metric and the pattern label of every head, one dict per (layer, head), in
    layer-major order, over the query rows `queries` when given. A pooled capture of a long input carries
    the records its streamed pass computed."""
    stored = _stored_stats(capture, queries)
    if stored is not None:
        return [dict(r) for r in stored]
    return records_from_values(head_values(capture, queries=queries))


def label_definitions() -> dict[str, str]:
    """Each pattern label and the test that gives it (the first that applies wins)."""
    return {
        "induction": f"induct ≥ {REPEAT_MIN}: where a token occurred before, the query looks at the token that "
                     f"followed it (… A B … A → B; Olsson et al. 2022); needs a text that repeats tokens",
        "duplicate-token": f"dup ≥ {REPEAT_MIN}: where a token occurred before, the query looks at its earlier "
                           f"occurrences; needs a text that repeats tokens",
        "previous-token": f"prev ≥ {POSITIONAL_MIN}: most queries look at the token before them",
        "next-token": f"next ≥ {POSITIONAL_MIN}: most queries look at the token after them",
        "self": f"self ≥ {POSITIONAL_MIN}: most queries look at themselves",
        "vertical": f"vert ≥ {VERTICAL_MIN}: one key column (often [CLS] or [SEP]) holds half the weight",
        "block": f"≥ {BLOCK_MIN} of the weight stays in the query's own segment (segments end at [SEP]/EOS or "
                 f". ! ?; the text needs two)",
        "broad": f"norm_ent ≥ {BROAD_MIN}: attention spread nearly evenly",
        "mixed": "none of the above",
    }


TERMS: dict[str, str] = {
    "alpha": "α, the attention weights: softmax(Q·Kᵀ/√d_k) with masked keys at −∞. Row i (a query) says how "
             "much token i looks at each key j; every row sums to 1.",
    "label": "the pattern label of a head, after Clark et al. 2019 and Kovaleva et al. 2019: the first of "
             + ", ".join(LABELS) + " whose test passes (see `attnviz explain <label>`).",
    "rollout": "attention rollout (Abnar & Zuidema 2020): per layer Â = rownorm(mean over heads of α + I), the "
               "identity standing for the residual stream, multiplied through the layers. Row i says how much "
               "of each input token reaches position i at the top.",
    "scale": "the colour scale: 0 to the largest weight shown, one scale for every panel of a picture; the "
             "legend and the colorbar give its end.",
    "entropy baseline": "ln T nats: the entropy of uniform attention over T keys. 0 is one-hot.",
    "causal": "decoder models (GPT-2, Llama) attend only to earlier tokens: α is lower-triangular and the "
              "future cells are drawn blank.",
    "special tokens": "[CLS], [SEP], <s>, </s>, … as the tokenizer's own special-token ids say; "
                      "--hide-special leaves them out of pictures (rows are not renormalised).",
    "part": "which attention of an encoder-decoder model (T5, BART, Marian) is shown (--part): encoder (source × "
            "source), decoder (target × target, causal) or cross (target rows × source columns).",
    "cross-attention": "in an encoder-decoder model, each target token's query against the encoder's output for "
                       "every source token: which source words a target word looks at. Rows sum to 1 over the "
                       "source; prev, self, next and dist compare positions of one sentence and are shown as –.",
    "generated": "tokens a causal model wrote (attnviz generate), after the prompt. Row t is what token t "
                 "attends to as it is read back in to choose the next token; pictures draw a line where the "
                 "prompt ends, and --rows generated keeps only those rows.",
    "layer": "one transformer block; layers are numbered from 0 at the input (-1 is the last).",
    "head": "one attention head of a layer: its own Q, K, V projections and its own α.",
    "H": "in compare's panel summaries: the mean row entropy of that matrix, in nats (see entropy). Elsewhere "
         "H is the number of heads per layer, as in L × H.",
    "sp": "in compare's panel summaries: the mean mass on special tokens (see special tokens).",
    "d": "in compare's panel summaries: the mean distance |i − j| in tokens between a query and what it "
         "attends to (see dist).",
    "T": "the number of tokens of the input (a long input streamed into blocks still counts its tokens).",
    "d_k": "the size of one head's query and key vectors (hidden size ÷ heads): 32 for MiniLM and the "
           "multilingual model, 64 for SmolLM2 and BERT-base. The scores are divided by √d_k.",
    "√d_k": "the square root of d_k, the divisor of Q·Kᵀ: it keeps the scores' spread near 1 however large "
            "d_k is (attnviz scaling shows why).",
    "Q·Kᵀ": "the scores: each query vector dotted with each key vector, before scaling and the softmax.",
    "softmax": "softmax(x)_j = exp(x_j) / Σ_k exp(x_k): turns a row of scores into weights that are positive and "
               "sum to 1; masked keys (at −∞) get exactly 0.",
    "Q": "the queries: each token's hidden state times W_Q (plus its bias), one d_k vector per head. q is "
         "one row of Q.",
    "K": "the keys: each token's hidden state times W_K (plus its bias). k is one row of K.",
    "V": "the values: each token's hidden state times W_V (plus its bias); α·V is what the head outputs.",
    "α·V": "the head's output for each query: the weighted sum of the value vectors, weights α (out in steps).",
    "mask": "keys a query may not see get −∞ before the softmax, so weight 0: padding, for causal models "
            "every later token, and in a sliding-window layer every key beyond the window.",
    "sliding window": "a layer that lets query i see only the last w keys (i − j < w; Mistral, Gemma 2/3, "
                      "gpt-oss, Cohere 2 alternate such layers with full ones); ModernBERT's local layers see the "
                      "keys within ±w. The keys beyond are masked: blank in every picture, like a causal "
                      "model's future, and the legend names the window.",
    "soft-capping": "Gemma 2 squashes each scaled score s to c·tanh(s/c) before the mask and softmax (c = "
                    "attn_logit_softcapping, e.g. 50): no score beyond ±c, so no head can put all its weight on "
                    "one key by a huge score. attnviz steps shows the capped scores; verify writes it out.",
    "sink logit": "gpt-oss gives each head one learned logit that joins every row's softmax as an extra key and "
                  "is dropped after: a row's weights over the real keys then sum to less than 1 (the 'kept' "
                  "column). Head statistics use each row's shares of what it kept; pictures show α as it is "
                  "(rows fainter where the sink took more). Not the same as a sink token (see 'sink').",
    "query_pre_attn_scalar": "Gemma scales the scores by 1/√query_pre_attn_scalar instead of 1/√d_k.",
    "QK-norm": "Qwen3, Gemma 3 and OLMo 2 normalise Q and K (RMSNorm) before the scores: per head (Qwen3, Gemma 3) "
               "or over the whole projection (OLMo 2).",
    "entropy_tokens": "in corpus output: the token-weighted mean entropy, over every query row of every text "
                      "(long texts count more), beside entropy, the mean over texts.",
    "tok-w": "in corpus tables: token-weighted, a mean over every query row of every text rather than over texts.",
    "label_share": "in corpus output: the share of texts in which the head got its majority label.",
    "ablation": "removing a head (attnviz ablate): its output α·V, where the output projection W_O receives it, "
                "replaced by 0 (zero ablation) or by its mean over positions (mean ablation); checked against the "
                "same removal made by editing W_O's weights.",
    "KL": "in ablate and importance: KL(p_clean ‖ p_removed) = Σ_v p_clean(v) ln(p_clean(v) / p_removed(v)), in "
          "nats, between the next-token distributions without and with the heads removed; 0 means no change.",
    "effect": "in importance: what removing one head alone changes — a causal LM's mean KL over positions, or "
              "‖ê_removed − ê_clean‖ of an encoder's unit sentence embedding (√(2(1 − cos))).",
    "gradient": "in importance: Michel et al. 2019's estimate, |∂loss/∂ξ_h| at ξ = 1 for a gate ξ_h on head h's "
                "output (an encoder: ‖∂ê/∂ξ_h‖), the first-order size of removing the head (ξ_h = 0).",
    "detector share": "in detect: the weight on a detector's targets averaged over the rows that have one (what the "
             "induction and duplicate-token labels test).",
    "TL score": "in detect: TransformerLens's head-detector score Σ α⊙P / Σ α over the whole matrix (error measure "
                "'mul', nothing excluded), P the detector's 0/1 pattern.",
    "by norm": "value-weighted norms (Kobayashi et al. 2020): ‖α_ij·f(x_j)‖ instead of α_ij, how much key j "
               "actually moves query i (attnviz norms, sinks).",
    "by α": "measured with the attention weights α themselves (beside 'by norm').",
    "stream": "--stream: a long input's attention computed a block of query rows at a time, so memory grows "
              "with T, not T²; the statistics are exact, pictures show block means.",
    "sink": "a key that takes a large share of many queries' attention whatever they are (often the first "
            "token, [CLS] or [SEP]): attnviz sinks lists them (Xiao et al. 2023, Gu et al. 2024).",
    "sink score": "a key's mean weight over the queries that can see it; above --threshold (0.3) it is a sink.",
    "|Δ|": "the absolute difference between two computations of the same number (the model's α and the "
           "from-scratch α, or a sum and its parts); max and mean over every cell.",
    "lift": "in attnviz token: how much more weight this token puts on a key than the other tokens do on "
            "average in that head. A large weight with a small lift is a vertical stripe, not a link.",
    "stripe": "a head where every token looks at the same key (a vertical stripe in its heatmap); attnviz token "
              "says so rather than calling it a link.",
    "piece": "a token that holds part of a character: byte-level tokenizers split a character of several UTF-8 "
             "bytes, and 나(2/3) is the second of the three tokens 나 is spread over.",
    "[CLS]/BOS": "in corpus layer tables: attention mass on the first special token ([CLS] for BERT, BOS for "
                 "causal models).",
    "[SEP]/EOS": "in corpus layer tables: attention mass on the closing special token ([SEP], EOS).",
    "norm": "the colour scale's mapping (--norm linear, sqrt, log or auto), not value-weighted norms (--norms, "
            "attnviz norms).",
    "mean": "in tables of heads: the mean over the layer's heads; `--head mean` draws that mean matrix.",
    "raw": "in attnviz scaling: the same trained weights and the same Q and K, without the division by √d_k.",
    "scaled": "in attnviz scaling: with the division by √d_k, as the model computes it.",
    "std": "standard deviation: over texts in corpus output; in attnviz scaling, of every score in a layer.",
    "largest |output|": "in attnviz verify --norms: the attention block output's largest |value| in that layer.",
    "relative |Δ|": "in attnviz verify --norms: max |Δ| ÷ max(1, largest |output|), the measure the verdict uses "
                    "(float32 rounding grows with the values; some models' outputs reach the hundreds).",
    "max |Δ| of the output": "in attnviz verify --norms: the largest difference between the attention block's "
                             "output and the sum of its parts α_ij·f(x_j) + b_O.",
    "worst head": "in attnviz verify: the head with the largest |Δ| in that layer.",
    "with positions": "in attnviz positions: the largest |Δ| between α of the shuffled text and α permuted back, "
                      "with the position embeddings as trained (large: the model knows the order).",
    "without positions": "in attnviz positions: the same with the position embeddings zeroed (float rounding: "
                         "self-attention alone sees a set).",
    "check |Δ|": "in attnviz norms: the largest difference between the attention block's output and the sum of "
                 "its parts α_ij·f(x_j) (plus the output bias): the exact check of the decomposition.",
    "sink heads": "in attnviz sinks: how many heads of the layer have a sink (a key whose sink score passes "
                  "--threshold).",
    "sinks (token: heads)": "in attnviz sinks: each sink token and in how many of the layer's heads it is one.",
    "score by α": "in attnviz sinks: the largest sink score in the layer, measured with α (beside 'by norm').",
    "pos": "in attnviz generate --terminal: the position of the new token in prompt + generated text.",
    "attends most to": "in attnviz generate --terminal: the earlier tokens the new token's row of α weighs most, "
                       "with their weights.",
    "itself": "in attnviz generate --terminal: the new token's weight on itself (the diagonal of α).",
}
TERM_ALIASES = {"entropy tokens": "entropy_tokens", "token-weighted": "tok-w", "q": "Q", "k": "K", "v": "V",
                "out": "α·V", "qk": "Q·Kᵀ", "sqrt(d_k)": "√d_k", "dk": "d_k", "streamed": "stream",
                "sinks": "sink", "sink_score": "sink score", "alpha·v": "α·V", "pieces": "piece",
                "share": "label_share", "α": "alpha", "qkᵀ": "Q·Kᵀ", "QKᵀ": "Q·Kᵀ", "QKᵀ/√d_k": "scaled",
                "mean |Δ|": "|Δ|", "max |Δ|": "|Δ|", "attends most to (weight)": "attends most to",
                "by α": "by α", "score": "sink score", "window": "sliding window", "sliding": "sliding window",
                "local attention": "sliding window", "softcap": "soft-capping", "softcapping": "soft-capping",
                "soft-cap": "soft-capping", "sink logits": "sink logit", "s_aux": "sink logit",
                "qk-norm": "QK-norm", "qk norm": "QK-norm"}


def glossary() -> list[tuple[str, str, str]]:
    """(term, other name, definition) for every metric, label and term, for `attnviz explain`."""
    rows = [(m.header, m.name if m.name != m.header else "", m.definition) for m in METRICS]
    rows += [(label, "label", text) for label, text in label_definitions().items()]
    rows += [(term, "", text) for term, text in TERMS.items()]
    return rows


def lookup(term: str) -> list[tuple[str, str, str]]:
    """The glossary rows for a term as a user types it: a column, label or term by name (exact case first,
    then any case), its other name, an alias, or a word in a term's name."""
    rows = glossary()
    wanted = term.strip()
    key = TERM_ALIASES.get(wanted, TERM_ALIASES.get(wanted.lower(), wanted))
    exact = [r for r in rows if key in (r[0], r[1])]
    if exact:
        return exact
    low = key.lower()
    return [r for r in rows if low in (r[0].lower(), r[1].lower())] or \
        [r for r in rows if r[1] == "" and len(low) > 2 and low in r[0].lower()]


def definitions_markdown() -> str:
    """The README's metric table, from the registry."""
    rows = ["| metric | column | definition |", "|---|---|---|"]
    rows += [f"| `{m.name}` | `{m.header}` | {m.definition.replace('|', chr(92) + '|')} |" for m in METRICS]
    return "\n".join(rows) + "\n"


def matrix_summary(alpha: np.ndarray, special: np.ndarray, queries: Sequence[int] | None = None, *,
                   square: bool = True) -> tuple[float, float, float]:
    """For one shown matrix (T, T): mean row entropy (nats), mean mass on special keys (`special` flags the
    keys), mean distance (NaN for a rectangular cross-attention matrix), over the rows `queries` (default
    all). Rows that do not sum to 1 (norms) are taken as their shares."""
    alpha = np.asarray(alpha, np.float64)
    totals = alpha.sum(-1, keepdims=True)
    alpha = np.divide(alpha, totals, out=np.zeros_like(alpha), where=totals > 0)
    R, C = alpha.shape
    distance = token_distance(C) if square else np.full((R, C), np.nan)
    if queries is not None:
        rows = np.asarray(queries, dtype=np.intp)
        alpha, distance = alpha[rows], distance[rows]
    return (float(row_entropy(alpha).mean()), float(alpha[:, special].sum(-1).mean()),
            float((alpha * distance).sum(-1).mean()))


# --- attention rollout (Abnar & Zuidema 2020) -----------------------------------------------------


def rollout(capture: Capture) -> np.ndarray:
    """Attention rollout: Â_l = rownorm(mean_h α_l + I) (the identity stands for the residual stream),
    R = Â_{L-1} ··· Â_1 Â_0. R[i, j] = how much of input token j reaches position i at the top. (T, T)
    For value-weighted norms each row is first made a distribution (its shares)."""
    if not capture.square:
        from attnviz.errors import SelectionError

        raise SelectionError("rollout follows self-attention through the layers; cross-attention has none to follow: "
                             f"use {arg('part')} encoder or {arg('part')} decoder", "part")
    capture = capture.as_distribution()
    T = capture.n_tokens
    result = np.eye(T)
    for layer in range(capture.n_layers):
        result = rollout_rows(capture.attentions[layer], np.arange(T)) @ result
    return result


def rollout_rows(alpha_rows: np.ndarray, at: np.ndarray) -> np.ndarray:
    """One layer's step of rollout for the query rows at positions `at`: Â = rownorm(mean_h α + I), the
    identity standing for the residual stream. The full rollout multiplies all of Â; the streamed path
    multiplies these rows a block at a time. α rows (H, b, T) -> Â rows (b, T), float64."""
    a = np.asarray(alpha_rows, np.float64).mean(axis=0)  # (b, T)
    a[np.arange(len(at)), at] += 1.0
    return a / a.sum(axis=-1, keepdims=True)


# --- model vs. from-scratch -----------------------------------------------------------------------


@dataclass(frozen=True)
class LayerDifference:
    layer: int
    max_abs: float
    mean_abs: float
    worst_head: int


def differences(reported: Capture, recomputed: Capture) -> list[LayerDifference]:
    """Per layer: max and mean |Δα| between two captures of the same input, and the head with the largest."""
    if reported.attentions.shape != recomputed.attentions.shape:
        raise CaptureMismatchError(f"the captures cannot be compared: shapes {reported.attentions.shape} and "
                                   f"{recomputed.attentions.shape} differ")
    delta = np.abs(reported.attentions.astype(np.float64) - recomputed.attentions)  # (L, H, T, T)
    per_head = delta.max(axis=(-2, -1))  # (L, H)
    return [LayerDifference(n, float(per_head[n].max()), float(delta[n].mean()), int(per_head[n].argmax()))
            for n in range(delta.shape[0])]
