"""Panels as Rich renderables for the terminal. Nothing here prints: the CLI does.

Colour terminals get coloured cells; with NO_COLOR (or output that is not a terminal) cells are shaded
glyphs from SHADES, so the picture survives copy-paste and pipes. Every width is measured in terminal
cells (a Hangul syllable takes two), so rows stay aligned for any script. Labels arrive display-safe
from the Panels and are written as plain Text, never parsed as markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np
from rich.console import Group
from rich.style import Style
from rich.text import Text

from attnviz.panels import generated_split, Panel, Scale, short_model, token_labels, with_shared_scale
from attnviz.render.colors import DEFAULT_CMAP, rgb, text_on
from attnviz.base.text import cells, fit, glyphs, pad, visible

SHADES = " ░▒▓█"  # 0 .. vmax in five steps
MAX_HEADER_LINES = 12  # vertical key labels longer than this many characters end in "…"
MAX_ROW_LABEL = 12  # cells


def _header(letters: list) -> list:
    """A vertical key label: every character up to MAX_HEADER_LINES, the last one "…" when it is cut."""
    return letters if len(letters) <= MAX_HEADER_LINES else [*letters[:MAX_HEADER_LINES - 1], "…"]


@dataclass(frozen=True)
class TermLayout:
    cell: int  # terminal cells per matrix cell
    columns: range  # key positions shown
    label_width: int  # cells for "index label " before the first matrix cell

    @classmethod
    def fit(cls, T: int, labels: Sequence[str], width: int, start: int = 0, n_rows: int | None = None,
            cell_widths: tuple[int, ...] = (3, 2)) -> TermLayout:
        n_rows = T if n_rows is None else n_rows
        label_width = min(max((cells(s) for s in labels), default=1), MAX_ROW_LABEL) + len(str(max(n_rows - 1, 0))) + 2
        avail = max(width - label_width, 4)
        for cell in cell_widths:
            if T * cell <= avail:
                return cls(cell, range(T), label_width)
        cell = 2
        n = max(avail // cell, 1)
        start = min(max(start, 0), max(T - n, 0))
        return cls(cell, range(start, min(start + n, T)), label_width)


SPLIT_BAR, SPLIT_STYLE = "│", "bold red"  # where the prompt ends and generated tokens begin


def _shade(x: float) -> str:
    return SHADES[min(int(x * len(SHADES)), len(SHADES) - 1)]


def panel_renderable(panel: Panel, *, width: int = 80, color: bool = True, cmap: str = DEFAULT_CMAP,
                     start: int = 0, title: bool | str = True, legend: bool = True, rows: Sequence[int] | None = None,
                     cell_widths: tuple[int, ...] = (3, 2)) -> Group:
    """A panel as rows of cells with row labels and vertical column labels, a legend, and a note when
    only a window of the columns fits in `width`; `rows` shows only those query rows (a window of a long
    input)."""
    matrix = np.asarray(panel.matrix, dtype=np.float32)
    n_rows, T = matrix.shape
    scaled = panel.scale.unit(matrix)  # (R, C) in [0, 1], as the colours show it
    # a "│" before the first generated key column, and before the selection's column: one cell more each
    bar = int(panel.col_split is not None) + int(panel.summary)
    lay = TermLayout.fit(T, panel.rows, width - bar, start, n_rows, cell_widths)
    cols = list(lay.columns)
    colours = rgb(cmap, scaled)  # (R, C, 3)
    dark = text_on(colours) if color and panel.values else None
    lines: list[Text] = []
    if title:
        lines.append(Text(panel.title_text if title is True else str(title), style="bold"))
    # vertical column labels: line k holds glyph k of each shown label, each padded to the cell width
    headers = [_header(glyphs(panel.cols[j])) for j in cols]
    depth = max((len(h) for h in headers), default=0)
    for k in range(depth):
        line = Text(" " * lay.label_width)
        for j, header in zip(cols, headers):
            if j == panel.col_split or (panel.summary and j == T - 1):
                line.append(SPLIT_BAR, style=SPLIT_STYLE)
            piece = header[k] if k < len(header) else ""
            line.append(pad(piece if cells(piece) <= lay.cell else "…", lay.cell, "center"), style="dim" if k else "")
        lines.append(line)
    index_width = len(str(max(n_rows - 1, 0)))
    hidden = panel.hidden
    for i in (range(n_rows) if rows is None else rows):
        if i == panel.row_split:  # where the prompt ends: a rule across, labelled
            across = lay.cell * len(cols) + int(panel.col_split in cols) + int(panel.summary and T - 1 in cols)
            named = fit("─ generated below ", across)
            rule = Text("─" * lay.label_width + named + "─" * (across - cells(named)), style=SPLIT_STYLE)
            lines.append(rule)
        summary = panel.summary and i == n_rows - 1
        if summary:  # the selection's row: a rule above it, no index
            bars = int(panel.col_split in cols) + int(T - 1 in cols)
            lines.append(Text("─" * (lay.label_width + lay.cell * len(cols) + bars), style=SPLIT_STYLE))
        index = " " * index_width if summary else f"{i:>{index_width}}"
        label = f"{index} {fit(panel.rows[i], lay.label_width - index_width - 2)}"
        line = Text(pad(label, lay.label_width))
        for j in cols:
            if j == panel.col_split or (panel.summary and j == T - 1):
                line.append(SPLIT_BAR, style=SPLIT_STYLE)
            if hidden is not None and hidden[i, j]:
                line.append(pad("·", lay.cell, "center"), style="dim")
            elif color:
                r, g, b = (int(v) for v in colours[i, j])
                text = _value_text(matrix[i, j], lay.cell) if panel.values else " " * lay.cell
                fg = None if dark is None else ("black" if dark[i, j] else "white")
                line.append(text, style=Style(color=fg, bgcolor=f"rgb({r},{g},{b})"))
            elif panel.values:
                line.append(_value_text(matrix[i, j], lay.cell))
            else:
                line.append(_shade(scaled[i, j]) * lay.cell)
        lines.append(line)
    if legend:
        lines.append(_legend(panel.scale, color, cmap, panel.values))
    if len(cols) < T:
        lines.append(Text(f"showing keys {cols[0]}–{cols[-1]} of 0–{T - 1}: the terminal is {width} columns "
                          f"wide; widen it or pass --start to move the window", style="yellow"))
    if rows is not None and len(rows) < n_rows:
        lines.append(Text(f"showing queries {rows[0]}–{rows[-1]} of 0–{n_rows - 1} (--rows)", style="yellow"))
    if panel.footer:
        lines.append(Text(panel.footer, style="cyan"))
    return Group(*lines)


def _value_text(value: float, width: int) -> str:
    """A weight in `width` cells: "25" for 0.25 (hundredths), "**" for 1.00."""
    hundredths = int(round(float(value) * 100))
    text = "**" if hundredths >= 100 else f"{hundredths:02d}"
    return pad(text, width, "right" if width > 2 else "left")


def _legend(scale: Scale, color: bool, cmap: str, values: bool = False) -> Text:
    """The colour key: the scale's ends, its kind, and how to read numbers in cells."""
    label = "α" if scale.label.startswith("attention weight") else scale.label
    legend = Text(f"{label} {scale.vmin:.2f} ")
    if color:
        for r, g, b in rgb(cmap, np.linspace(0, 1, 16)):
            legend.append(" ", style=Style(bgcolor=f"rgb({int(r)},{int(g)},{int(b)})"))
        legend.append(f" {scale.vmax:.2f}")
    else:  # five equal steps of the scale: " " for the lowest fifth, "█" for the highest
        legend.append(f"[{SHADES}] {scale.vmax:.2f}")
    legend.append(f" · {scale.describe()}", style="dim")
    if values:
        legend.append(" · numbers are α in hundredths (25 = 0.25, ** = 1.00)", style="dim")
    return legend


def bar_chart(labels: Sequence[str], values: Sequence[float], *, width: int = 80, title: str | None = None) -> Group:
    """Horizontal bars, one per label, scaled to the largest value, with the value printed."""
    label_width = min(max((cells(s) for s in labels), default=1), MAX_ROW_LABEL) + len(str(len(labels) - 1)) + 2
    bar_width = max(width - label_width - 8, 5)
    top = max(max(values, default=0.0), 1e-12)
    eighths = " ▏▎▍▌▋▊▉█"
    lines = [Text(title, style="bold")] if title else []
    index_width = len(str(len(labels) - 1))
    for i, (label, value) in enumerate(zip(labels, values)):
        length = max(value, 0.0) / top * bar_width
        full, part = int(length), int((length - int(length)) * 8)
        bar = "█" * full + (eighths[part] if part else "")
        row = Text(pad(f"{i:>{index_width}} {fit(label, label_width - index_width - 2)}", label_width))
        row.append(bar.ljust(bar_width), style="cyan")
        row.append(f" {value:.3f}")
        lines.append(row)
    return Group(*lines)


def panels_side_by_side(panels: Sequence[Panel], *, width: int = 80, color: bool = True, cmap: str = DEFAULT_CMAP,
                        key: str | None = None, start: int = 0, rows: Sequence[int] | None = None) -> Group:
    """Panels (on one colour scale) side by side: all in one row if they fit, else with narrower cells, else
    as many per row as fit (at least two when two fit with one-character cells), else stacked, each windowed
    as a single heatmap is; each titled with its short title and followed by its footer."""
    from rich.table import Table

    R, T = panels[0].matrix.shape
    label_width = TermLayout.fit(T, panels[0].rows, 10**6, 0, R).label_width
    per_row = 1
    cell_widths: tuple[int, ...] = (3, 2)
    bar = int(any(p.col_split is not None for p in panels))  # the prompt/generated separator takes a cell
    fits = {cell: max(width // (label_width + cell * T + 2 + bar), 1) for cell in (2, 1)}
    for cell, wanted in ((2, len(panels)), (1, len(panels)), (2, 2), (1, 2)):  # all in a row, then rows of ≥ 2
        if len(panels) > 1 and fits[cell] >= wanted:
            per_row, cell_widths = min(fits[cell], len(panels)), (cell,)
            break
    panel_width = width // per_row - 2 if per_row > 1 else width
    rendered = [panel_renderable(p, width=panel_width, color=color, cmap=cmap, start=start, rows=rows,
                                 title=p.short or p.title_text, legend=False, cell_widths=cell_widths)
                for p in panels]
    legend = _legend(panels[0].scale, color, cmap)
    tail = [legend] + ([Text(key, style="dim")] if key else [])
    if per_row == 1:
        return Group(*rendered, *tail)
    grids = []
    for first in range(0, len(rendered), per_row):
        grid = Table.grid(padding=(0, 2))
        for _ in range(per_row):
            grid.add_column()
        grid.add_row(*rendered[first:first + per_row])
        grids.append(grid)
    return Group(*grids, *tail)


# --- one head step by step -------------------------------------------------------------------------------


def _vector_table(name: str, matrix: np.ndarray, labels: Sequence[str], width: int):
    """Rows of vectors: each token's norm and its first few components (as many as fit)."""
    from rich import box
    from rich.table import Table

    label_w = max(min(max(cells(s) for s in labels), MAX_ROW_LABEL), len("token"))
    number_w = max(len(f"{v:.2f}") for v in matrix.ravel()) if matrix.size else 4
    column_w = max(number_w, len(f"{name}[{matrix.shape[1] - 1}]"))
    norm_w = max(max(len(f"{np.linalg.norm(row):.2f}") for row in matrix), len(name) + 2)
    shown = max(0, min(matrix.shape[1], (width - label_w - norm_w - 4) // (column_w + 1)))
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("token", no_wrap=True, min_width=label_w, max_width=label_w)
    table.add_column(f"‖{name}‖", justify="right", no_wrap=True, min_width=norm_w)
    for d in range(shown):
        table.add_column(f"{name}[{d}]", justify="right", no_wrap=True, min_width=column_w)
    if shown < matrix.shape[1]:
        table.add_column("…", no_wrap=True, width=1)
    for label, row in zip(labels, matrix):
        cells_ = [Text(fit(label, label_w)), Text(f"{np.linalg.norm(row):.2f}")]
        cells_ += [Text(f"{v:.2f}") for v in row[:shown]]
        if shown < matrix.shape[1]:
            cells_.append(Text(""))
        table.add_row(*cells_)
    return table


def _number_grid(matrix: np.ndarray, labels: Sequence[str], fmt: str, hidden: np.ndarray | None, width: int):
    """A T × T matrix as numbers, or None when it does not fit the width."""
    from rich import box
    from rich.table import Table

    label_w = min(max(cells(s) for s in labels), MAX_ROW_LABEL)
    number_w = max(len(fmt.format(v)) for v in matrix.ravel()) + 1
    if label_w + 2 + number_w * matrix.shape[1] > width:
        return None
    room = (width - label_w - 2) // matrix.shape[1]  # wider cells, for longer key labels, when there is room
    cell_w = max(number_w, min(room, min(max(cells(s) for s in labels), 8) + 1))
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False)
    table.add_column("", no_wrap=True)
    for label in labels:
        table.add_column(fit(label, cell_w - 1), justify="right", no_wrap=True, min_width=cell_w)
    for i, label in enumerate(labels):
        row = [Text(fit(label, label_w) + " ")]
        for j, value in enumerate(matrix[i]):
            hid = hidden is not None and hidden[i, j]
            row.append(Text("−∞" if hid else fmt.format(value), style="dim" if hid else ""))
        table.add_row(*row)
    return table


def steps_renderable(page, steps, *, width: int = 80, color: bool = True, token: int | None = None) -> Group:
    """One head's computation, in order: Q and K, Q·Kᵀ, ÷√d_k and the mask, softmax → α, α·V; numbers in
    the cells when they fit, heatmaps otherwise. With `token`, only that query's row, step by step."""

    labels = page.panels[0].rows
    hidden = page.panels[3].hidden
    causal = bool(hidden is not None and hidden[np.triu_indices(len(hidden), 1)].all())  # keys after the query hidden
    parts: list = [Text(page.title, style="bold")]
    if page.subtitle:
        parts.append(Text(page.subtitle, style="dim"))
    d_k = steps.d_k
    parts.append(Text(f"1. Q and K: each token's hidden state times the layer's W_Q and W_K (d_k = {d_k})",
                      style="cyan"))
    if token is None:
        parts += [_vector_table("q", steps.q, labels, width), _vector_table("k", steps.k, labels, width)]
    else:
        parts.append(_vector_table("q", steps.q[token:token + 1], labels[token:token + 1], width))
        parts.append(_vector_table("k", steps.k, labels, width))
    if token is not None:
        return Group(*parts, *_token_steps(steps, labels, token, hidden, width))
    for number, panel, fmt, what in ((2, page.panels[2], "{:.1f}", "scores Q·Kᵀ: how well each query matches each key"),
                                     (3, page.panels[3], "{:.2f}", f"scaled: {steps.scaling_text}"
                                      + (" ; keys after the query masked to −∞ (causal)" if causal else
                                         "" if hidden is not None else " ; no mask: every token sees every key")
                                      + (f" ; {steps.window}" if steps.window else "")),
                                     (4, page.panels[4], "{:.2f}", "softmax of each row → α " + (
                                         "(each row sums to 1)" if steps.sink is None else
                                         f"(with the sink logit {steps.sink:.2f} as one more key, dropped after: "
                                         f"rows keep {steps.alpha.sum(-1).mean():.2f} of their weight on average)"))):
        parts.append(Text(f"{number}. {what}", style="cyan"))
        grid = _number_grid(panel.matrix, labels, fmt, panel.hidden, width)
        parts.append(grid if grid is not None else panel_renderable(panel, width=width, color=color, title=False))
    parts.append(Text(f"5. α·V: each row is a weighted sum of the value vectors (d_v = {steps.v.shape[1]})",
                      style="cyan"))
    parts.append(_vector_table("out", steps.out, labels, width))
    parts.append(Text(f"This α equals the model's own for layer {steps.layer}, head {steps.head}: "
                      f"max |Δ| = {steps.max_diff:.1e}", style="green" if steps.max_diff < 1e-4 else "red"))
    return Group(*parts)


def _token_steps(steps, labels, i: int, hidden, width: int) -> list:
    """One query row: its scores with every key, scaled, masked, softmaxed; then the weighted sum."""

    from rich import box
    from rich.table import Table

    label_w = min(max(cells(s) for s in labels), MAX_ROW_LABEL)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for name in ("key", "q·k", f"÷√{steps.d_k}" if not steps.scaling else "scaled", "α (softmax)", "model α"):
        table.add_column(name, justify="left" if name == "key" else "right", no_wrap=True)
    for j, label in enumerate(labels):
        masked = hidden is not None and hidden[i, j]
        table.add_row(Text(fit(label, label_w)), Text(f"{steps.scores[i, j]:.2f}"),
                      Text("−∞" if masked else f"{steps.scaled[i, j]:.2f}", style="dim" if masked else ""),
                      Text(f"{steps.alpha[i, j]:.3f}"), Text(f"{steps.model_alpha[i, j]:.3f}"))
    order = np.argsort(-steps.alpha[i])[:4]
    row_diff = float(np.abs(steps.alpha[i] - steps.model_alpha[i]).max())
    terms = " + ".join(f"{steps.alpha[i, j]:.2f}·v({labels[j]})" for j in order if steps.alpha[i, j] > 0.005)
    sink = ("" if steps.sink is None else
            f" (with the head's sink logit {steps.sink:.2f} as one more key, dropped after)")
    return [Text(f"2–4. the query {labels[i]!r} (token {i}): its scores, {steps.scaling_text}, softmax{sink}",
                 style="cyan"), table,
            Text("5. its output is the α-weighted sum of the value vectors:", style="cyan"),
            Text(f"   out({labels[i]}) = {terms}{' + …' if len(order) and steps.alpha[i, order[-1]] > 0.005 else ''}"
                 f"   (‖out‖ = {np.linalg.norm(steps.out[i]):.2f})"),
            Text(f"This row equals the model's own α: max |Δ| = {row_diff:.1e}", style="green")]


def positions_renderable(result, model: str) -> Group:
    """The positions experiment as a few lines and a table: max |Δα| per layer, without and with positions."""
    from rich import box
    from rich.table import Table


    words = " ".join(visible(w) for w in result.words)
    shuffled = " ".join(visible(w) for w in result.shuffled)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1))
    for name in ("layer", "without positions", "with positions"):
        table.add_column(name, justify="right")
    for layer, (a, b) in enumerate(zip(result.diff_without, result.diff_with)):
        table.add_row(Text(str(layer)), Text(f"{a:.1e}"), Text(f"{b:.3f}"))
    without, with_ = float(result.diff_without.max()), float(result.diff_with.max())
    return Group(
        Text(f"{visible(model)}: the text and its words shuffled", style="bold"),
        Text(f"  text:     {words}"), Text(f"  shuffled: {shuffled}"),
        Text("max |Δα| between α of the text and α of the shuffled text put back in the original order, over "
             "every head:", style="cyan"),
        table,
        Text(f"Without position embeddings the difference is {without:.1e} (float rounding): self-attention alone "
             f"sees the words as a set, and moving a word only moves its row and column of α. With them it is up "
             f"to {with_:.2f}: position embeddings are how the model knows the order.", style="green"),
    )


def token_renderable(capture, i: int | Sequence[int], layers: Sequence[int], links: Sequence[dict], *,
                     width: int = 80, color: bool = True, cmap: str = DEFAULT_CMAP) -> Group:
    """One token (or several, summed): per layer the mean over heads of its row and of its column, and its
    strongest links."""
    from attnviz.panels.one_token import group_hidden, group_name, group_rows

    group = [i] if isinstance(i, int) else list(i)
    labels = token_labels(capture)
    rows = tuple(f"layer {n}" for n in layers)
    summed_rows, summed_columns = group_rows(capture, layers, group)
    attends, attended = summed_rows.mean(axis=1), summed_columns.mean(axis=1)  # (layers, T)
    hidden_row, hidden_column = group_hidden(capture, group)
    name = group_name(labels, group)
    quoted = repr(name) if len(group) == 1 else name  # several: each quoted already
    summed = "" if len(group) == 1 else ", summed over the tokens"
    panels = with_shared_scale([
        Panel(attends, rows, labels, None if hidden_row is None else np.broadcast_to(hidden_row, attends.shape),
              Scale(), (f"what {quoted} attend{'s' if len(group) == 1 else ''} to (mean of {capture.n_heads} heads "
                        f"per layer{summed})",), "token", col_split=generated_split(capture)),
        Panel(attended, rows, labels, None if hidden_column is None else np.broadcast_to(hidden_column,
                                                                                           attended.shape),
              Scale(), (f"who attends to {quoted} (mean of {capture.n_heads} heads per layer{summed})",), "token",
              col_split=generated_split(capture)),
    ])
    head = f"token {group[0]} {name!r}" if len(group) == 1 else f"tokens {', '.join(map(str, group[:8]))}" + \
        (" …" if len(group) > 8 else "")
    parts: list = [Text(f"{short_model(capture.model)} · {head}", style="bold")]
    for panel in panels:
        parts.append(panel_renderable(panel, width=width, color=color, cmap=cmap))
    if links:
        parts.append(Text(f"heads in which {name!r} singles out another token (its weight on it, against what "
                          f"the other tokens put there on average):", style="cyan"))
        for link in links:
            stripe = " — a stripe: every token looks there" if link["stripe"] else ""
            parts.append(Text(f"  layer {link['layer']} head {link['head']} → {labels[link['key']]} "
                              f"{link['weight']:.2f} (others {link['typical']:.2f}){stripe}"))
    parts.append(Text("every head: attnviz token … --json, or -o token.png", style="dim"))
    return Group(*parts)
