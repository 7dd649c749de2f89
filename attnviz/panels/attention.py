"""Attention panels: α of chosen layers and heads (a window of rows and columns of a long input), on one
scale or each its own, and the heatmap page.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import SelectionError, arg
from attnviz.base.text import visible

from attnviz.panels.page import HeadChoice, Page, Panel, Scale, ScaleChoice
from attnviz.panels.names import (PART_TITLES, head_filename, head_label, key_labels, kept_tokens, short_model, splits,
                                  text_subtitle, token_labels)


# --- attention panels ------------------------------------------------------------------------------


def attention_panels(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], *,
                     hide_special: bool = False, vmax: float | None = None,
                     scale: ScaleChoice | None = None) -> list[Panel]:
    """One panel per (layer, head), layer-major, on the chosen scale (default: one shared linear-or-√ scale
    from 0 to the largest weight shown, or to vmax). Heads may be indices, "mean" or "max"."""
    keep = kept_tokens(capture, hide_special)
    key_keep = capture.key_keep_mask(hide_special)
    labels, cols = token_labels(capture, keep), key_labels(capture, key_keep)
    everything = bool(keep.all() and key_keep.all())
    future = capture.future_mask
    hidden = None if future is None else (future if everything else future[np.ix_(keep, keep)])
    model = short_model(capture.model)
    extra: tuple[str, ...] = (f" · {PART_TITLES[capture.part]}",) if capture.part else ()
    extra += (" · special tokens hidden",) if hide_special else ()
    shown = None if everything else np.flatnonzero(keep)
    axes: dict[str, Any] = dict(splits(capture, shown, None if everything else np.flatnonzero(key_keep)))
    if capture.part == "cross":
        axes |= {"row_axis": "target token (query)", "col_axis": "source token (key)"}
    if capture.quantity == "norm":
        extra += (" · ‖α·f(x)‖",)
    if capture.long is not None and capture.long.block > 1:
        extra += (f" · mean over {capture.long.block}×{capture.long.block}-token blocks",)
        axes = {"row_axis": "query block (token positions)", "col_axis": "key block (token positions)"}
    if capture.generated is not None and capture.generated.any():
        axes |= {"row_axis": "query (attending) · generated below the line",
                 "col_axis": "key (attended to) · generated right of the line"}
    panels = []
    for layer in layers:
        layer = capture.layer_index(layer)
        for head in heads:
            alpha = capture.head_matrix(layer, head)  # (T, S)
            if not everything:
                alpha = alpha[np.ix_(keep, key_keep)]  # (T', S')
            if not isinstance(head, str):
                head = capture.head_index(head)
            label = head_label(head, capture.n_heads)
            layer_hidden, note = hidden, capture.window_note(layer)
            if note:  # this layer's sliding window, drawn like the causal mask
                masked = capture.masked(layer)
                layer_hidden = masked if everything or masked is None else masked[np.ix_(keep, keep)]
            panels.append(Panel(matrix=alpha, rows=labels, cols=cols, hidden=layer_hidden,
                                scale=quantity_scale(capture),
                                title=(f"{model} · layer {layer} · ", label, *extra,
                                       *((f" · {note}",) if note else ())),
                                name=head_filename(layer, head), short=f"layer {layer}", layer=layer, head=head,
                                **axes))
    choice = scale or ScaleChoice()
    return apply_scale(panels, replace(choice, vmax=vmax) if vmax is not None else choice)


def window_panels(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], rows: Sequence[int] | None,
                  cols: Sequence[int] | None, *, scale: ScaleChoice | None = None) -> list[Panel]:
    """Exact α for query rows × key columns (a window into a long input): sliced from a full capture, or the
    window a streamed run computed. One panel per layer and head."""

    long = capture.long
    if long is None:
        rows = list(range(capture.n_tokens)) if rows is None else list(rows)
        cols = list(range(capture.n_keys)) if cols is None else list(cols)
        tokens, keys, future = capture.tokens, capture.key_tokens, capture.future_mask
        source = {layer: capture.attentions[layer][:, rows][:, :, cols] for layer in layers}  # (H, r, c)
    else:
        if long.window is None or long.window_rows is None or long.window_cols is None:
            raise SelectionError("this capture is pooled (a long input): an exact window needs the text run again, "
                                 f"e.g. with {arg('rows', '4000:4100')}", "rows")
        rows, cols = [int(i) for i in long.window_rows], [int(j) for j in long.window_cols]
        tokens = keys = long.tokens
        future = np.triu(np.ones((long.n_tokens, long.n_tokens), bool), 1) if capture.causal else None
        missing = [layer for layer in layers if layer not in long.window_layers]
        if missing:
            raise SelectionError(f"layer {missing[0]} was not streamed into the window", "layer")
        source = {layer: long.window[long.window_layers.index(layer)] for layer in layers}
    hidden = None if future is None else future[np.ix_(rows, cols)]
    row_labels = tuple(f"{i} {visible(tokens[i])}" for i in rows)
    col_labels = tuple(f"{j} {visible(keys[j])}" for j in cols)
    model = short_model(capture.model)
    where = f" · queries {_span(rows)}, keys {_span(cols)}"
    marks = splits(capture, rows, cols) if long is None else {"row_split": None, "col_split": None}
    row_split, col_split = marks["row_split"], marks["col_split"]
    panels = []
    for layer in layers:
        per_head = np.asarray(source[layer], np.float32)  # (H, r, c)
        for head in heads:
            matrix = (per_head.mean(0) if head == "mean" else per_head.max(0) if head == "max"
                      else per_head[int(head)])
            label = head_label(head, per_head.shape[0])
            panels.append(Panel(matrix=matrix, rows=row_labels, cols=col_labels, hidden=hidden, scale=Scale(),
                                title=(f"{model} · layer {layer} · ", label, where),
                                name=f"{head_filename(layer, head)}_{window_name(rows, cols)}",
                                short=f"layer {layer}", layer=layer,
                                head=head, row_split=row_split, col_split=col_split))
    return apply_scale(panels, scale)


def window_page(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], rows: Sequence[int] | None,
                cols: Sequence[int] | None, *, scale: ScaleChoice | None = None) -> Page:
    """What `attnviz heatmap --rows/--cols` draws: the exact window of every selected layer and head, named by
    its layers, heads, rows and columns (another window never takes its file name)."""
    panels = window_panels(capture, layers, heads, rows, cols, scale=scale)
    title = (panels[0].title_text if len(panels) == 1 else
             f"{panels[0].title[0].split(' · ')[0]} · exact window")
    layer_part = "-".join(str(p) for p in dict.fromkeys(p.layer for p in panels))
    head_part = "-".join(str(h) if isinstance(h, str) else f"head{h}" for h in dict.fromkeys(p.head for p in panels))
    where = panels[0].name.split("_", 2)[2]  # the panels' rows and columns, as their names spell them
    return Page(panels=tuple(panels), title=title, name=f"attnviz_layer{layer_part}_{head_part}_{where}",
                subtitle=text_subtitle(capture))


def span_name(positions: Sequence[int]) -> str:
    """Positions as a file name spells them: "12-17" for a run, "0-3+7+9-11" for a few runs; more than four
    runs: the first and last with how many ("0-40n12"), so that no two windows drawn in a row share a name
    but by the most unusual choice."""
    ordered = sorted(set(int(i) for i in positions))
    runs: list[list[int]] = []
    for i in ordered:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    if len(runs) > 4:
        return f"{ordered[0]}-{ordered[-1]}n{len(ordered)}"
    return "+".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def window_name(rows: Sequence[int], cols: Sequence[int]) -> str:
    """rows12-17_cols0-17: the part of a file name that says which window it holds."""
    return f"rows{span_name(rows)}_cols{span_name(cols)}"


def _span(positions: Sequence[int]) -> str:
    """"4–9" for a run of positions, "4–9 (3 of them)" when some are left out."""
    first, last = min(positions), max(positions)
    whole = len(positions) == last - first + 1
    return f"{first}–{last}" if whole else f"{first}–{last} ({len(positions)} of them)"


def quantity_scale(capture: Capture) -> Scale:
    """The scale's label for what a capture holds: α, or value-weighted norms."""
    if capture.quantity == "norm":
        return Scale(label="‖α·f(x)‖, value-weighted norm")
    return Scale()


def with_shared_scale(panels: Sequence[Panel], vmax: float | None = None, vmin: float = 0.0,
                      norm: str | None = None) -> list[Panel]:
    """The panels on one colour scale: vmin to vmax (default: the largest value drawn)."""
    if vmax is None:
        vmax = max((float(p.matrix.max()) for p in panels if p.matrix.size), default=1.0)
    vmax = max(vmax, vmin + 1e-9)
    return [replace(p, scale=replace(p.scale, vmin=vmin, vmax=vmax, norm=norm or p.scale.norm, shared=True))
            for p in panels]


def apply_scale(panels: Sequence[Panel], choice: ScaleChoice | None) -> list[Panel]:
    """Panels on the scale the user chose: one shared scale (to --vmax, or the largest weight shown), or
    each panel its own (0 to its largest weight); the norm, for --norm auto, from the number of tokens."""
    if not panels:
        return []
    choice = choice or ScaleChoice()
    norm = choice.norm_for(max(panels[0].matrix.shape))
    if choice.kind == "per-head":
        return [replace(p, scale=replace(p.scale, vmin=0.0, norm=norm, shared=False,
                                         vmax=max(choice.vmax or float(p.matrix.max()) if p.matrix.size else 1.0,
                                                  1e-9)))
                for p in panels]
    return with_shared_scale(panels, choice.vmax, norm=norm)


def heatmap_page(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], *,
                 hide_special: bool = False, vmax: float | None = None, all_layers: bool = False,
                 scale: ScaleChoice | None = None) -> Page:
    """What `attnviz heatmap` draws: a panel per selected layer and head, on the chosen colour scale."""
    panels = attention_panels(capture, layers, heads, hide_special=hide_special, vmax=vmax, scale=scale)
    model = short_model(capture.model)
    if len(panels) == 1:
        title = panels[0].title_text
    else:
        same_head = len({p.head for p in panels}) == 1
        if not same_head:
            panels = [replace(p, short=f"layer {p.layer} · {p.title[1]}") for p in panels]
        title = f"{model} · " + (panels[0].title[1] if same_head else "heads side by side")
        title += " · special tokens hidden" if hide_special else ""
    layer_part = "all" if all_layers else "-".join(str(p) for p in dict.fromkeys(p.layer for p in panels))
    head_part = "-".join(str(h) if isinstance(h, str) else f"head{h}" for h in dict.fromkeys(p.head for p in panels))
    name = f"attnviz_{'all' if all_layers else 'layer' + layer_part}_{head_part}"
    return Page(panels=tuple(panels), title=title, name=name, subtitle=text_subtitle(capture))




SELECTED = "▸"  # marks a selected token's row and column label


def with_selection(page: Page, local: Sequence[int], name: str) -> Page:
    """The page with tokens selected (heatmap --tokens): their labels marked, and each panel one row and one
    column more, set apart — the mean of their rows (what they attend to, on α's scale) and the sum of their
    columns (the share of each query's attention that goes to them). `local`: their rows' indices in the
    panels (the panels are square: self-attention); `name` how the new row and column are labelled."""
    chosen = np.asarray(local, dtype=np.intp)
    panels = []
    for p in page.panels:
        rows_mean = p.matrix[chosen].mean(axis=0)  # (C,)
        cols_sum = p.matrix[:, chosen].sum(axis=1)  # (R,)
        corner = cols_sum[chosen].mean()
        matrix = np.block([[p.matrix, cols_sum[:, None]], [rows_mean[None, :], np.array([[corner]])]])
        hidden = None
        if p.hidden is not None:  # a key is hidden in the mean row where every selected row hides it
            hidden = np.zeros(matrix.shape, dtype=bool)
            hidden[:-1, :-1] = p.hidden
            hidden[-1, :-1] = p.hidden[chosen].all(axis=0)
        mark = set(chosen.tolist())
        rows = tuple(SELECTED + r if i in mark else r for i, r in enumerate(p.rows)) + (f"mean {name}",)
        cols = tuple(SELECTED + c if j in mark else c for j, c in enumerate(p.cols)) + (f"Σ {name}",)
        panels.append(replace(p, matrix=matrix.astype(np.float32), rows=rows, cols=cols, hidden=hidden,
                              summary=True))
    return replace(page, panels=tuple(panels))
