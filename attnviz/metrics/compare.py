"""Comparisons of shown matrices: the summary under one picture, and the model vs. the from-scratch path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import CaptureMismatchError

from attnviz.metrics.rows import row_entropy, token_distance


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
