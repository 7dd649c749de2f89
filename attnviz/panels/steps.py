"""One head step by step (attnviz steps) and words shuffled with and without positions (attnviz positions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.base.text import shorten, visible

from attnviz.panels.page import Page, Panel, Scale
from attnviz.panels.names import short_model


# --- one head step by step (attnviz steps) ------------------------------------------------------------


def _signed(matrix: np.ndarray, label: str) -> Scale:
    """A colour scale centred on 0, for values of either sign (Q, K, V, Q·Kᵀ)."""
    m = float(np.abs(matrix[np.isfinite(matrix)]).max()) if np.isfinite(matrix).any() else 1.0
    return Scale(-max(m, 1e-9), max(m, 1e-9), label, shared=False)


def steps_page(steps, capture_tokens: Sequence[str], model: str, text: str = "") -> Page:
    """The computation of one head as six panels: Q, K, Q·Kᵀ, Q·Kᵀ/√d_k (masked keys blank), α, α·V.
    `steps` is a scratch.Steps (numpy arrays)."""
    labels = tuple(visible(t) for t in capture_tokens)
    T = len(labels)
    dims = lambda n: tuple(str(i) if i % 8 == 0 else "" for i in range(n))
    hidden = ~steps.allowed if not steps.allowed.all() else None
    small = T <= 12
    base: dict[str, Any] = dict(rows=labels, layer=steps.layer, head=steps.head, name="steps")
    panels = [
        Panel(matrix=steps.q.astype(np.float32), cols=dims(steps.q.shape[1]), hidden=None,
              scale=_signed(steps.q, "value"), title=("Q = X·W_Q (+ b)",), short=f"Q  ({T} × d_k = {steps.d_k})",
              cmap="RdBu_r", row_axis="token", col_axis="dimension", **base),
        Panel(matrix=steps.k.astype(np.float32), cols=dims(steps.k.shape[1]), hidden=None,
              scale=_signed(steps.k, "value"), title=("K = X·W_K (+ b)",), short=f"K  ({T} × d_k = {steps.d_k})",
              cmap="RdBu_r", row_axis="token", col_axis="dimension", **base),
        Panel(matrix=steps.scores.astype(np.float32), cols=labels, hidden=None, scale=_signed(steps.scores, "score"),
              title=("Q·Kᵀ",), short="scores Q·Kᵀ", cmap="RdBu_r", values=small, **base),
        Panel(matrix=steps.scaled.astype(np.float32), cols=labels, hidden=hidden,
              scale=_signed(np.where(steps.allowed, steps.scaled, 0.0), "score"), title=("Q·Kᵀ / √d_k",),
              short=steps.scaling_text + ("  (masked keys: −∞)" if hidden is not None else ""),
              cmap="RdBu_r", values=small, **base),
        Panel(matrix=steps.alpha.astype(np.float32), cols=labels, hidden=hidden,
              scale=Scale(0.0, 1.0, "attention weight α", shared=False), title=("softmax → α",),
              short="softmax of each row → α", values=small, **base),
        Panel(matrix=steps.out.astype(np.float32), cols=dims(steps.out.shape[1]), hidden=None,
              scale=_signed(steps.out, "value"), title=("α·V",), short=f"α·V  ({T} × d_v = {steps.out.shape[1]})",
              cmap="RdBu_r", row_axis="token", col_axis="dimension", **base),
    ]
    title = (f"{short_model(model)} · layer {steps.layer} · head {steps.head}: "
             f"α = softmax(Q·Kᵀ/√d_k), out = α·V")
    note = (f"d_k = {steps.d_k}, scores {steps.scaling_text}"
            + ("" if steps.sink is None else
               f", sink logit {steps.sink:.2f} (rows keep {steps.alpha.sum(-1).mean():.2f} of their weight)")
            + f" · this α equals the model's own: max |Δ| = {steps.max_diff:.1e}")
    return Page(panels=tuple(panels), title=title, name=f"attnviz_steps_layer{steps.layer}_head{steps.head}",
                notes=(note,), subtitle=("“" + visible(shorten(text, 400)) + "”") if text else "")


def positions_page(result, model: str, layer: int, text: str = "") -> Page:
    """Both experiments for one layer (mean over heads): α of the text, α of the shuffled text put back in
    the original order, and their difference; without position embeddings, then with them.
    `result` is a scratch.PositionsResult."""
    labels = tuple(visible(t) for t in result.tokens)
    panels = []
    for name, alpha, back in (("without positions", result.alpha_without, result.back_without),
                              ("with positions", result.alpha_with, result.back_with)):
        a, b = alpha[layer].mean(axis=0), back[layer].mean(axis=0)  # (T, T)
        top = max(float(a.max()), float(b.max()), 1e-9)
        diff = np.abs(a - b)
        common: dict[str, Any] = dict(rows=labels, cols=labels, hidden=None, name="positions", layer=layer)
        panels += [
            Panel(matrix=a, scale=Scale(0.0, top), title=(name,), short=f"{name}: α of the text", **common),
            Panel(matrix=b, scale=Scale(0.0, top), title=(name,), short=f"{name}: α of the shuffled text, "
                                                                        f"re-ordered", **common),
            Panel(matrix=diff.astype(np.float32), scale=Scale(0.0, max(top, 1e-9), "|difference|", shared=False),
                  title=(name,), short=f"|difference|: max {diff.max():.1e}", cmap="magma", **common),
        ]
    if result.similarity is not None:
        n = len(result.similarity)
        positions = tuple(str(i) for i in range(n))
        panels.append(Panel(matrix=result.similarity.astype(np.float32), rows=positions, cols=positions, hidden=None,
                            scale=Scale(-1.0, 1.0, "cosine similarity", shared=False),
                            title=("position embeddings",), short=f"the position embeddings themselves: cosine "
                                                                 f"similarity of positions 0–{n - 1}",
                            name="positions", cmap="RdBu_r", row_axis="position i", col_axis="position j"))
    title = (f"{short_model(model)} · layer {layer} (mean of heads): without positions, self-attention sees a set")
    note = (f"shuffled: {' '.join(visible(w) for w in result.shuffled)} · max |Δα| over all layers: "
            f"{result.diff_without.max():.1e} without positions, {result.diff_with.max():.2f} with them")
    return Page(panels=tuple(panels), title=title, name=f"attnviz_positions_layer{layer}", notes=(note,),
                subtitle=("“" + visible(shorten(text, 400)) + "”") if text else "")


