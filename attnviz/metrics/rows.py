"""What the metrics see and their row kernels: the tokens (which are special, segments, repeats), blocks of
query rows with their weightings, and the per-row quantities every head metric averages.

α is one head's (T, T) matrix; row i is query i; n_i is the number of keys row i may attend to: T for
encoders, i + 1 for causal models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from attnviz.data.capture import Capture
from attnviz.base.tokens import is_punctuation



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
    reach: int = 0  # keys from `reach` on have zero weight in every row (a causal block's later keys): the
    # entropy and the weighted sums skip them; 0: none known

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
        return row_entropy(self.alpha[..., :self.reach] if self.reach else self.alpha)

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
                seen = slice(0, self.reach or None)
                out[..., list(_PER_ROW)] = _row_products(alpha[..., seen], self._per_row_weights[..., seen])
        if _WIDE:
            wide = self._weights(_WIDE, np.float64)
            if self.alpha.dtype == np.float64 or self.texts:  # a corpus batch's chunk: its float64 copy is made
                # for the column sums anyway, and holds at most corpus.ROWS_BYTES
                out[..., list(_WIDE)] = _row_products(self.alpha64, wide)
            else:  # float64 a few rows at a time: a copy that stays in the cache, not one of the whole block
                width = self.reach or T
                step = max(1, WIDE_BYTES // max(H * width * 8, 1))
                for r0 in range(0, b, step):
                    r1 = min(b, r0 + step)
                    out[:, r0:r1, list(_WIDE)] = _row_products(self.alpha[:, r0:r1, :width].astype(np.float64),
                                                               wide[:, r0:r1, :width])
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


def normalised_entropy_rows(rows: Rows) -> np.ndarray:
    if rows.tokens.square:
        n = rows.n_keys.astype(np.float64)  # (b,) keys each row may attend to
    else:  # cross-attention: every target row sees every source key
        n = np.full(len(rows.queries), float(rows.tokens.T))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 1, rows.entropy / np.log(np.maximum(n, 2)), np.nan)


def distance_rows(rows: Rows) -> np.ndarray:
    if not rows.tokens.square:  # positions in two different sentences
        return np.full(rows.alpha.shape[:2], np.nan)
    return rows.weighted_sum("distance")


def own_segment_rows(rows: Rows) -> np.ndarray:
    if not rows.tokens.square:
        return np.full(rows.alpha.shape[:2], np.nan)
    return np.where(rows.two_segments[None], rows.weighted_sum("segment"), np.nan)


def repeat_rows(rows: Rows, shift: int) -> np.ndarray:
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


