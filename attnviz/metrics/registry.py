"""The metric registry: one Metric row per head statistic (name, header, definition, row kernel), and
head_values, which computes them one layer and one block of query rows at a time. Every table, CSV/JSON,
gallery caption and the glossary are made from it: a new metric is one register() call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import UsageError

from attnviz.metrics.rows import Rows, Tokens, own_segment_rows, distance_rows, normalised_entropy_rows, repeat_rows


# --- the metric registry ---------------------------------------------------------------------------
# One row per head metric. The heads table, --json/--csv, the export's heads.csv/heads.json, the gallery
# captions and glossary, `attnviz explain` and the docs' definition table are all made from it, and so
# is every number of a long input's streamed path: a new metric is one register() call below.


@dataclass(frozen=True)
class Metric:
    """One per-head statistic, defined on blocks of query rows so that it can be computed from a capture or
    streamed over a long input a block at a time.

    name        key in JSON/CSV and the long --sort key ("norm_entropy")
    header      the column header in terminal tables, also accepted by --sort ("norm_ent")
    definition  one line, shown by `attnviz explain`, the docs and the gallery glossary
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
    min_rows: int = 1  # fewer rows with a value than this: not enough evidence, the value is when_empty

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
                out[m.name] = np.where(counts >= max(m.min_rows, 1), self.sums[m.name] / np.maximum(counts, 1),
                                       empty)
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
        raise UsageError(f"metric {metric.name!r} needs exactly one of rows= or columns=")
    taken = {key for m in METRICS for key in (m.name, m.header)} | set(FIXED_COLUMNS)
    if metric.name in taken or metric.header in taken:
        raise UsageError(f"a metric or column named {metric.name!r}/{metric.header!r} exists already")
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
                      normalised_entropy_rows)
PREV = Metric("prev", "prev", "mean of α_i,i−1 over i ≥ 1: weight on the previous token", lambda r: r.at(-1),
              square_only=True)
SELF = Metric("self", "self", "mean of α_ii: weight on the token itself", lambda r: r.at(0), square_only=True)
NEXT = Metric("next", "next", "mean of α_i,i+1 over i < T−1: weight on the next token", lambda r: r.at(1),
              square_only=True)
VERTICAL = Metric("vertical", "vert", "the largest mean weight one key column gets (a vertical stripe in the "
                  "heatmap)", columns=_vertical)
MAX_WEIGHT = Metric("max_weight", "max", "mean over rows of max_j α_ij", lambda r: r.alpha.max(axis=-1))
DISTANCE = Metric("mean_distance", "dist", "mean over rows of Σ_j α_ij·|i − j|, in tokens", distance_rows, "{:.1f}",
                  square_only=True)
KEPT = Metric("kept", "kept", "mean over rows of Σ_j α_ij: what a row keeps for the real keys when a per-head sink "
              "logit (gpt-oss) takes its share; the other statistics use each row's shares of what it kept. "
              "Shown for such models only",
              lambda r: r.kept if r.kept is not None else np.full(r.alpha.shape[:2], np.nan),
              when_empty=float("nan"), optional=True)
MIN_REPEATS = 4  # rows whose token occurred before that induct and dup need: fewer are not enough to test
INDUCTION = Metric("induction", "induct", "mean, over the rows whose token occurred before, of the weight on the keys "
                   "that followed its earlier occurrences (an induction head: … A B … A → B); the rows of "
                   f"TransformerLens's induction pattern. Shown when at least {MIN_REPEATS} tokens of the text "
                   "occurred before (fewer: not enough repeats to test)",
                   lambda r: repeat_rows(r, 1), when_empty=float("nan"), square_only=True, optional=True,
                   min_rows=MIN_REPEATS)
DUPLICATE = Metric("duplicate", "dup", "mean, over the rows whose token occurred before, of the weight on its earlier "
                   "occurrences (a duplicate-token head); the rows of TransformerLens's duplicate-token pattern. "
                   f"Shown when at least {MIN_REPEATS} tokens of the text occurred before",
                   lambda r: repeat_rows(r, 0), when_empty=float("nan"), square_only=True, optional=True,
                   min_rows=MIN_REPEATS)
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
BLOCK = Metric("block", "block", "mean over rows of the weight on keys of the query's own segment", own_segment_rows,
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


def by_layer(compute: Callable[[Capture], np.ndarray], capture: Capture) -> np.ndarray:
    """A per-head function of a capture computed one layer at a time, so its float64 temporaries stay the
    size of one layer (H·T²) even for the largest capture accepted. (L, H)"""
    return np.concatenate([np.asarray(compute(capture.layer_slice(n, n + 1))) for n in range(capture.n_layers)])


