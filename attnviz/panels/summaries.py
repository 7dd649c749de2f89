"""Pictures of numbers per head or per token: rollout, entropy, a grid of heads, the share of each label.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz.data.capture import Capture

from attnviz.panels.page import Page, Panel, Scale
from attnviz.panels.names import generated_split, short_model, token_labels


# --- other pictures ------------------------------------------------------------------------------


def rollout_panel(capture: Capture, matrix: np.ndarray) -> Panel:
    """Attention rollout (T, T) over the input tokens."""
    labels = token_labels(capture)
    vmax = float(matrix.max()) if matrix.size else 1.0
    return Panel(matrix=np.asarray(matrix, np.float32), rows=labels, cols=labels, hidden=capture.future_mask,
                 scale=Scale(0.0, max(vmax, 1e-9), "rolled-out attention"),
                 title=(f"{short_model(capture.model)} · attention rollout (Abnar & Zuidema 2020)",),
                 name="attnviz_rollout", row_axis="position at the top layer", col_axis="input token",
                 row_split=generated_split(capture), col_split=generated_split(capture))


def entropy_panel(values: np.ndarray, uniform: float, model: str, *, normalised: bool = False,
                  title: str = "mean attention entropy per head", layers: Sequence[int] | None = None) -> Panel:
    """Layers × heads of mean entropy, each value written in its cell, on [0, uniform]."""
    unit = "normalised entropy (1 is uniform)" if normalised else f"entropy, nats (ln T = {uniform:.2f} is uniform)"
    return head_grid_panel(values, Scale(0.0, uniform, unit), f"{short_model(model)} · {title}", "attnviz_entropy",
                           layers=layers)


def head_grid_panel(values: np.ndarray, scale: Scale, title: str, name: str, short: str = "",
                    layers: Sequence[int] | None = None) -> Panel:
    """One number per layer and head as a layers × heads heatmap with the value in each cell; `values` holds
    the rows of `layers` (default 0..L-1)."""
    L, H = values.shape
    names = range(L) if layers is None else layers
    return Panel(matrix=np.asarray(values, np.float32), rows=tuple(str(n) for n in names),
                 cols=tuple(str(n) for n in range(H)), hidden=None, scale=scale, title=(title,), name=name,
                 short=short, row_axis="layer", col_axis="head", values=True)


def label_share_page(counts: np.ndarray, labels: Sequence[str], title: str, subtitle: str = "") -> Page:
    """For each pattern label, the share of texts in which each head got it: one layers × heads panel per
    label, on one scale from 0 to 1. counts (L, H, len(labels))"""
    total = np.maximum(counts.sum(axis=-1, keepdims=True), 1)
    share = counts / total
    scale = Scale(0.0, 1.0, "share of texts")
    panels = tuple(head_grid_panel(share[..., n], scale, title, f"labels_{label}", short=label)
                   for n, label in enumerate(labels))
    return Page(panels=panels, title=title, name="labels", subtitle=subtitle)


