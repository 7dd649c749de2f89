"""Pooling attention into blocks of consecutive tokens: the one definition behind word-level attention, the
pictures of a streamed long input, the rollout row drawn over blocks and a picture pooled again to fit a
terminal. Rows (queries) are averaged over a block, key columns summed, so a pooled row of attention still
sums to 1. Pure numpy."""

from __future__ import annotations

import math

import numpy as np


def row_shares(rows: np.ndarray) -> np.ndarray:
    """Rows made distributions: each divided by its sum (a row summing to 0 stays 0), in float64. Value-weighted
    norms become each key's share of the update; sink-logit rows the shares of what the real keys kept."""
    rows = np.asarray(rows, np.float64)
    totals = rows.sum(axis=-1, keepdims=True)
    return np.divide(rows, totals, out=np.zeros_like(rows), where=totals > 0)


def equal_edges(n: int, pool: int) -> tuple[np.ndarray, int]:
    """Block edges for n positions in at most `pool` equal blocks (the last may be shorter), and the block
    size: edges[b] is the first position of block b, edges[-1] = n. (B + 1,)"""
    block = max(1, math.ceil(n / max(pool, 1)))
    return np.append(np.arange(0, n, block), n), block


def every(n: int, k: int) -> np.ndarray:
    """Edges of blocks of k positions each (the last may be shorter). (B + 1,)"""
    return np.append(np.arange(0, n, max(k, 1)), n)


def sum_blocks(x: np.ndarray, edges: np.ndarray, axis: int = -1) -> np.ndarray:
    """x summed over each block of `edges` along `axis`, in x's own dtype."""
    return np.add.reduceat(x, np.asarray(edges)[:-1], axis=axis)


def sum_row_blocks(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(..., R, C) summed over each block of rows of `edges`, (..., B, C), in x's own dtype: one product with a
    one-hot (B, R) matrix, several times faster than reduceat along a middle axis. x must be finite (a NaN
    would reach every block of its column)."""
    edges = np.asarray(edges)
    one_hot = np.zeros((len(edges) - 1, x.shape[-2]), x.dtype)
    one_hot[np.repeat(np.arange(len(edges) - 1), np.diff(edges)), np.arange(edges[0], edges[-1])] = 1
    return np.matmul(one_hot, x)


def pool_blocks(matrix: np.ndarray, row_edges: np.ndarray, col_edges: np.ndarray | None = None) -> np.ndarray:
    """(..., R, C) pooled to (..., B, B'): rows averaged over each block of `row_edges`, columns summed over
    each block of `col_edges` (default the same), in float64, returned as float32."""
    row_edges = np.asarray(row_edges)
    col_edges = row_edges if col_edges is None else np.asarray(col_edges)
    summed = sum_blocks(sum_blocks(np.asarray(matrix, np.float64), col_edges, -1), row_edges, -2)
    return (summed / np.diff(row_edges)[:, None]).astype(np.float32)
