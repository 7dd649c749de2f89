"""One text's statistics, many texts at a time: each text's head-table metrics from its own unpadded α
(packed rows, computed together within ROWS_BYTES), by text and by token.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.base.blocks import row_shares
from attnviz.base.parallel import run_all
from attnviz.metrics import BLOCK, LABELS, Metric, Rows, Tokens, all_metrics, label_heads


# --- one text's statistics -----------------------------------------------------------------------------


def corpus_metrics() -> list[Metric]:
    """The numeric metrics of the head table, and the label inputs (block)."""
    return [m for m in all_metrics() if m.kind == "number"]


@dataclass
class TextStats:
    """One text's contribution: per-text head values, per-text row moments, its labels. Shapes (L, H)."""

    values: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # metric -> (count, mean, m2) over query rows
    labels: np.ndarray  # (L, H) index into LABELS
    tokens: int


@dataclass
class BatchStats:
    """Several texts' contributions at once: TextStats stacked along a first axis of texts, (B, L, H) each."""

    values: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    labels: np.ndarray
    tokens: np.ndarray  # (B,) int

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, b: int) -> TextStats:
        return TextStats({name: v[b] for name, v in self.values.items()},
                         {name: (c[b], m[b], m2[b]) for name, (c, m, m2) in self.rows.items()},
                         self.labels[b], int(self.tokens[b]))

    def __iter__(self) -> Iterator[TextStats]:
        return (self[b] for b in range(len(self)))

    @classmethod
    def stack(cls, stats: Sequence[TextStats]) -> BatchStats:
        names = list(stats[0].values)
        return cls({name: np.stack([s.values[name] for s in stats]) for name in names},
                   {name: tuple(np.stack([s.rows[name][i] for s in stats]) for i in range(3))  # type: ignore[misc]
                    for name in names},
                   np.stack([s.labels for s in stats]), np.array([s.tokens for s in stats], np.int64))


ROWS_BYTES = 4 << 20  # α of the texts whose statistics are computed together, as float64: kept in cache
# (at least one layer of one text)


def pack(alphas: Sequence[np.ndarray]) -> np.ndarray:
    """Texts' α (L, H, n, n) each, as one array of all their query rows, keys first: (W, R, L·H) float32 with W
    the longest n and R = Σ n (text k's rows after text k − 1's; keys beyond a text's own hold 0)."""
    L, H = alphas[0].shape[:2]
    W, R = max(a.shape[-1] for a in alphas), sum(a.shape[-1] for a in alphas)
    out = np.zeros((W, R, L * H), np.float32)
    r = 0
    for a in alphas:
        n = a.shape[-1]
        out[:n, r:r + n] = np.asarray(a).reshape(L * H, n, n).transpose(2, 1, 0)
        r += n
    return out


def unpack(packed: np.ndarray, start: int, n: int, heads: int) -> np.ndarray:
    """One text's α (L, H, n, n) back from pack()'s layout: its n rows from row `start`."""
    block = packed[:n, start:start + n]  # (keys, queries, L·H)
    return np.ascontiguousarray(block.reshape(n, n, -1, heads).transpose(2, 3, 1, 0))


def text_stats(alpha: np.ndarray, tokens: Tokens, metrics: Sequence[Metric], sinks: bool = False,
               windows: Sequence[int] | None = None) -> TextStats:
    """The statistics of one text from its own α (L, H, n, n), padding already cut away (texts_stats)."""
    return texts_stats(pack([alpha]), [alpha.shape[-1]], [tokens], alpha.shape[1], metrics, sinks, windows)[0]


def texts_stats(packed: np.ndarray, lengths: Sequence[int], tokens: Sequence[Tokens], heads: int,
                metrics: Sequence[Metric], sinks: bool = False, windows: Sequence[int] | None = None) -> BatchStats:
    """The statistics of several texts at once from their query rows as pack() lays them out (W, R, L·H): for
    each text the values the head table shows for it (head_values) and moments over its query rows. The
    metrics run on the rows of many texts together (metrics.Rows with texts), each row with its own text's
    tokens; a text's values are then reduced over its own rows. `sinks`: the family's sink logits take part
    of each row; the statistics then use each row's shares, and 'kept' what it kept. `windows`: each layer's
    sliding window (then one layer at a time, each counting keys within its own)."""
    G = packed.shape[-1]
    L, H, B = G // heads, heads, len(lengths)
    sizes = np.asarray(lengths, np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    queries = np.concatenate([np.arange(n) for n in sizes])
    row_metrics = [m for m in metrics if m.rows is not None]
    row_functions = [m.rows for m in row_metrics if m.rows is not None]
    column_metrics = [m for m in metrics if m.rows is None]
    M = len(row_metrics)
    moments = np.zeros((3, M, G, B))  # count, mean, m2 of each row metric, head (layer-major) and text
    columns = np.zeros((len(column_metrics), G, B))

    def chunk(t0: int, t1: int) -> None:  # the texts t0..t1; writes only their columns of the results
        r0, r1 = int(starts[t0]), int(starts[t1])
        width, counts = int(sizes[t0:t1].max()), sizes[t0:t1]
        text_of = np.zeros((r1 - r0, t1 - t0))  # each row's text, one-hot: sums over a text's rows as matmuls
        text_of[np.arange(r1 - r0), np.repeat(np.arange(t1 - t0), counts)] = 1.0
        per = 1 if windows else max(1, ROWS_BYTES // max(width * (r1 - r0) * H * 8, 1))  # layers at a time
        for l0 in range(0, L, per):
            l1 = min(L, l0 + per)
            g0, g1 = l0 * H, l1 * H
            alpha = packed[:width, r0:r1, g0:g1].transpose(2, 1, 0)  # (kH, rows, width), a view
            kept = None
            if sinks:  # as head_values does: each row's shares, and what it kept
                kept = alpha.sum(axis=-1, dtype=np.float64)
                alpha = row_shares(alpha)
            texts = tuple(t.at_layer(windows, l0) for t in tokens[t0:t1])
            rows = Rows(alpha, queries[r0:r1], texts[0], kept, texts=texts, counts=tuple(int(c) for c in counts))
            if row_metrics:  # every row metric's moments at once, each text's over its own rows
                v = np.stack([np.asarray(of(rows), np.float64) for of in row_functions])  # (M, kH, rows)
                finite = np.isfinite(v)
                x = np.where(finite, v, 0.0)
                # count, Σx and Σx² over each text's rows in one product; M2 = Σx² − (Σx)²/count
                sums = np.stack([finite.astype(np.float64), x, x * x]) @ text_of  # (3, M, kH, texts)
                count = sums[0]
                mean = np.divide(sums[1], count, out=np.zeros_like(count), where=count > 0)
                m2 = np.maximum(sums[2] - mean * sums[1], 0.0)
                moments[:, :, g0:g1, t0:t1] = count, mean, m2
            if column_metrics:  # each text's mean over its rows of α, (kH, n), and its column statistics
                column_sums = np.matmul(text_of.T, rows.alpha64.transpose(2, 1, 0))  # (width, texts, kH)
                for k, (n, text) in enumerate(zip(counts, texts)):
                    column_mean = column_sums[:n, k].T / n
                    for c, m in enumerate(column_metrics):
                        assert m.columns is not None
                        columns[c, g0:g1, t0 + k] = np.asarray(m.columns(column_mean, text), np.float64)

    run_all([functools.partial(chunk, t0, t1) for t0, t1 in _text_chunks(sizes, G)])
    values, out_moments = {}, {}
    for i, m in enumerate(row_metrics):
        count, mean, m2 = (_by_text(part, H) for part in moments[:, i])
        values[m.name] = np.where(count >= max(m.min_rows, 1), mean, m.when_empty)
        out_moments[m.name] = (count, mean, m2)
    for c, m in enumerate(column_metrics):  # a column statistic counts once per row of its text
        value = _by_text(columns[c], H)
        values[m.name] = value
        out_moments[m.name] = (np.broadcast_to(sizes[:, None, None], value.shape).astype(np.float64), value,
                               np.zeros_like(value))
    block = values.get(BLOCK.name, np.full((B, L, H), np.nan))
    named = label_heads(values, block)
    labels = np.zeros((B, L, H), np.int64)
    for i, label in enumerate(LABELS):
        labels[named == label] = i
    return BatchStats({m.name: values[m.name] for m in metrics}, {m.name: out_moments[m.name] for m in metrics},
                      labels, sizes)


def _by_text(part: np.ndarray, H: int) -> np.ndarray:
    """(L·H, texts) -> (texts, L, H)."""
    return np.ascontiguousarray(part.T).reshape(part.shape[1], -1, H)


def _text_chunks(lengths: np.ndarray, G: int) -> Iterator[tuple[int, int]]:
    """Runs of consecutive texts whose rows, over every layer and head, fit ROWS_BYTES in float64 (at least
    one text each)."""
    t0 = 0
    while t0 < len(lengths):
        t1, rows, width = t0 + 1, int(lengths[t0]), int(lengths[t0])
        while t1 < len(lengths):
            wider, more = max(width, int(lengths[t1])), rows + int(lengths[t1])
            if wider * more * G * 8 > ROWS_BYTES:
                break
            t1, rows, width = t1 + 1, more, wider
        yield t0, t1
        t0 = t1


