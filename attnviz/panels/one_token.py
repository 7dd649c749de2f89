"""One token in every layer and head (attnviz token): what it attends to, who attends to it, and the
steps of a generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.data.capture import Capture

from attnviz.panels.page import HeadChoice, Page, Panel, Scale, ScaleChoice
from attnviz.panels.names import generated_split, short_model, text_subtitle, token_labels
from attnviz.panels.attention import apply_scale


# --- one token in every layer and head (attnviz token) ----------------------------------------------------


STRIPE_SHARE = 0.5  # a head is a stripe for key j when the other queries give j at least half this weight


def token_links(capture: Capture, i: int, top: int = 5) -> list[dict]:
    """The heads in which query `i` singles out one other, non-special token j: ranked by how much more
    weight i puts on j than the other queries of that head do on average ("lift" = α_ij − mean_q α_qj, over
    the other non-special queries that can see j). A head where every query looks at j (a vertical stripe)
    has a small lift however large α_ij is; `typical` gives that mean and `stripe` says so. (The key with the
    largest α_ij alone would name such stripes first.)"""
    alpha = capture.attentions.astype(np.float64)  # (L, H, T, T)
    T = capture.n_tokens
    keys = ~capture.special.copy()
    keys[i] = False
    queries = ~capture.special.copy()
    queries[i] = False
    if not keys.any():
        return []
    sees = np.ones((T, T), bool) if not capture.causal else np.tril(np.ones((T, T), bool))  # (query, key)
    others = queries[:, None] & sees  # which other queries count for each key (T, T)
    counts = others.sum(axis=0)  # (T,)
    column = np.einsum("lhqk,qk->lhk", alpha, others.astype(np.float64))
    typical = np.where(counts > 0, column / np.maximum(counts, 1), 0.0)  # (L, H, T)
    weight = alpha[:, :, i, :]  # (L, H, T)
    lift = np.where(keys, weight - typical, -np.inf)
    links: list[dict] = []
    for index in np.argsort(-lift.reshape(-1), kind="stable"):
        layer, head, key = (int(v) for v in np.unravel_index(index, lift.shape))
        if not np.isfinite(lift[layer, head, key]) or lift[layer, head, key] <= 0:
            break
        if any((link["layer"], link["head"]) == (layer, head) for link in links):
            continue
        w, t = float(weight[layer, head, key]), float(typical[layer, head, key])
        links.append({"layer": layer, "head": head, "key": key, "token": capture.tokens[key], "weight": w,
                      "typical": t, "lift": w - t, "stripe": bool(t >= STRIPE_SHARE * w)})
        if len(links) == top:
            break
    return links


def generation_steps(capture: Capture, layer: int, head: HeadChoice = "mean", top: int = 3) -> list[dict]:
    """For each generated token, the earlier tokens its row of α (in `layer`, the head mean or one head)
    weighs most, largest first, and the weight on itself: what it attends to as it is read back in to
    choose the next token."""
    matrix = capture.head_matrix(capture.layer_index(layer), head).astype(np.float64)  # (T, T) or (T, S)
    keys = capture.key_tokens
    steps = []
    for t in capture.named_positions()["generated"]:
        earlier = matrix[t, :t] if capture.square else matrix[t]  # cross-attention: every source token
        order = np.argsort(-earlier, kind="stable")[:top]
        steps.append({"position": t, "token": capture.tokens[t],
                      "self": float(matrix[t, t]) if capture.square else None,
                      "top": [{"position": int(j), "token": keys[j], "weight": float(earlier[j])} for j in order]})
    return steps


def group_name(labels: Sequence[str], group: Sequence[int]) -> str:
    """How a group of tokens is named: 'cat' for one, 'cat' + 'sat' for several (the first few, then how many)."""
    if len(group) == 1:
        return labels[group[0]]
    return " + ".join(repr(labels[j]) for j in group[:4]) + (f" + {len(group) - 4} more" if len(group) > 4 else "")


def group_rows(capture: Capture, layers: Sequence[int], group: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(the group's rows of α summed (layers, H, T): what they attend to, its columns summed (layers, H, T): who
    attends to them); one token's own row and column."""
    at = list(group)
    alpha = capture.attentions[list(layers)]
    return alpha[:, :, at, :].sum(axis=2), alpha[:, :, :, at].sum(axis=3)


def group_hidden(capture: Capture, group: Sequence[int]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Where the group's summed row and column are masked: keys none of them may see, queries that see none."""
    future = capture.future_mask
    if future is None:
        return None, None
    at = list(group)
    return np.asarray(future[at].all(axis=0)), np.asarray(future[:, at].all(axis=1))


def token_page(capture: Capture, i: int | Sequence[int], layers: Sequence[int],
               scale: ScaleChoice | None = None) -> Page:
    """For each chosen layer, two panels of heads × tokens: the token's own row of α (what it attends to)
    and its column (who attends to it); of several tokens, their rows and their columns summed."""
    group = [i] if isinstance(i, int) else list(i)
    labels = token_labels(capture)
    name = group_name(labels, group)
    quoted = repr(name) if len(group) == 1 else name  # several: each quoted already
    heads = tuple(f"head {h}" for h in range(capture.n_heads))
    rows, columns = group_rows(capture, layers, group)
    hidden_row_of, hidden_column_of = group_hidden(capture, group)
    summed = "" if len(group) == 1 else " (summed)"
    panels = []
    for k, layer in enumerate(layers):
        row, column = rows[k], columns[k]  # (H, T)
        hidden_row = None if hidden_row_of is None else np.broadcast_to(hidden_row_of, row.shape)
        hidden_column = None if hidden_column_of is None else np.broadcast_to(hidden_column_of, column.shape)
        common: dict[str, Any] = dict(rows=heads, cols=labels, scale=Scale(), layer=layer, row_axis="head",
                                      name="token", col_split=generated_split(capture))
        panels.append(Panel(matrix=row, hidden=hidden_row, title=(f"layer {layer}",),
                            short=f"layer {layer}: what {quoted} attend{'s' if len(group) == 1 else ''} to{summed}",
                            col_axis="key (attended to)", **common))
        panels.append(Panel(matrix=column, hidden=hidden_column, title=(f"layer {layer}",),
                            short=f"layer {layer}: who attends to {quoted}{summed}", col_axis="query (attending)",
                            **common))
    panels = apply_scale(panels, scale)
    i = group[0]
    what = f"token {i} {name!r}" if len(group) == 1 else f"tokens {', '.join(map(str, group[:8]))}" + \
        (" …" if len(group) > 8 else "") + f" ({name})"
    title = f"{short_model(capture.model)} · {what} in every layer and head"
    stem = f"attnviz_token{i}" if len(group) == 1 else f"attnviz_tokens{group[0]}-{group[-1]}"
    return Page(panels=tuple(panels), title=title, name=stem, subtitle=text_subtitle(capture),
                notes=(panels[0].scale.describe(),))


