"""What removing heads changed (attnviz ablate): Δα of the most changed later layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz.base.text import visible

from attnviz.panels.page import Page, Panel, Scale


# --- what removing heads changed (attnviz ablate) ------------------------------------------------------


DELTA_PANELS = 12  # later layers drawn at most (the most changed, shown in layer order)


def delta_layers(delta: np.ndarray, after: int) -> list[dict]:
    """Per layer above `after`: the largest and the mean |Δα| and the head that changed most. delta (L, H, T, T)"""
    rows = []
    for layer in range(after + 1, delta.shape[0]):
        per_head = np.abs(delta[layer]).max(axis=(-2, -1))  # (H,)
        rows.append({"layer": layer, "max_abs_delta": float(per_head.max()),
                     "mean_abs_delta": float(np.abs(delta[layer]).mean()), "most_changed_head": int(per_head.argmax())})
    return rows


def delta_page(delta: np.ndarray, tokens: Sequence[str], causal: bool, *, after: int, title: str,
               subtitle: str = "") -> Page | None:
    """Δα = α with the heads removed − α of the clean model, for the most changed head of each later layer (at
    most DELTA_PANELS layers, the most changed), on one colour scale centred on 0. None when no layer follows."""
    layers = delta_layers(delta, after)
    if not layers:
        return None
    chosen = sorted(sorted(layers, key=lambda r: -r["max_abs_delta"])[:DELTA_PANELS], key=lambda r: r["layer"])
    top = max(max(r["max_abs_delta"] for r in chosen), 1e-9)
    scale = Scale(-top, top, "Δα (heads removed − clean)")
    labels = tuple(visible(t) for t in tokens)
    T = len(labels)
    hidden = np.triu(np.ones((T, T), bool), 1) if causal else None
    panels = tuple(Panel(matrix=delta[r["layer"], r["most_changed_head"]].astype(np.float32), rows=labels, cols=labels,
                         hidden=hidden, scale=scale, title=(title,), name="ablation",
                         short=f"layer {r['layer']} · head {r['most_changed_head']}: max |Δα| {r['max_abs_delta']:.2f}",
                         layer=r["layer"], head=r["most_changed_head"], cmap="RdBu_r", values=T <= 12)
                   for r in chosen)
    notes = (f"each later layer's most changed head; one colour scale, centred on 0 (±{top:.2f})"
             + ("" if len(chosen) == len(layers) else
                f"; the {len(chosen)} most changed of {len(layers)} later layers"),)
    return Page(panels=panels, title=title, name="attnviz_ablation", notes=notes, subtitle=subtitle)


