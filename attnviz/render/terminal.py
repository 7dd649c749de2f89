"""Attention heatmaps as Rich renderables for the terminal. Nothing here prints: the CLI does.

Colour terminals get coloured cells; with NO_COLOR (or output that is not a terminal) cells are
shaded glyphs from SHADES, so the picture survives copy-paste and pipes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from rich.console import Group
from rich.style import Style
from rich.text import Text

from attnviz.capture import Capture, HeadSpec

SHADES = " ░▒▓█"  # 0 .. vmax in five steps
MAX_HEADER_LINES = 5  # vertical key labels are cut to this many characters
MAX_ROW_LABEL = 12


@dataclass(frozen=True)
class TermLayout:
    cell: int  # characters per cell
    columns: range  # key positions shown
    label_width: int

    @classmethod
    def fit(cls, T: int, labels: Sequence[str], width: int, start: int = 0) -> "TermLayout":
        label_width = min(max(len(s) for s in labels), MAX_ROW_LABEL) + len(str(T - 1)) + 2
        avail = max(width - label_width, 4)
        for cell in (3, 2):
            if T * cell <= avail:
                return cls(cell, range(T), label_width)
        cell = 2
        n = max(avail // cell, 1)
        start = min(max(start, 0), max(T - n, 0))
        return cls(cell, range(start, min(start + n, T)), label_width)


def _rgb(cmap_name: str, x: np.ndarray) -> np.ndarray:
    from attnviz.render.png import colormap

    return np.asarray(colormap(cmap_name)(x, bytes=True))[..., :3].astype(int)  # (..., 3)


def _shade(x: float) -> str:
    return SHADES[min(int(x * len(SHADES)), len(SHADES) - 1)]


def _fit(label: str, n: int) -> str:
    return label if len(label) <= n else label[: n - 1] + "…"


def matrix_renderable(alpha: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], *,
                      width: int = 80, color: bool = True, cmap: str = "viridis", vmax: float | None = None,
                      mask_upper: bool = False, start: int = 0, title: str | None = None) -> Group:
    """α (T, T) as rows of cells with row labels and vertical key labels, a legend, and a note when
    only a window of the key columns fits in `width`."""
    alpha = np.asarray(alpha, dtype=np.float32)
    T = alpha.shape[0]
    vmax = float(alpha.max()) if vmax is None else vmax
    scaled = np.clip(alpha / max(vmax, 1e-12), 0.0, 1.0)  # (T, T) in [0, 1]
    lay = TermLayout.fit(T, row_labels, width, start)
    cols = list(lay.columns)
    rgb = _rgb(cmap, scaled) if color else None
    lines: list[Text] = []
    if title:
        lines.append(Text(title, style="bold"))
    # vertical key labels: line k holds character k of each shown key's label
    depth = min(max(len(col_labels[j]) for j in cols), MAX_HEADER_LINES)
    for k in range(depth):
        line = Text(" " * lay.label_width)
        for j in cols:
            label = _fit(col_labels[j], MAX_HEADER_LINES)
            line.append((label[k] if k < len(label) else " ").center(lay.cell), style="dim" if k else "")
        lines.append(line)
    index_width = len(str(T - 1))
    for i in range(T):
        label = f"{i:>{index_width}} {_fit(row_labels[i], lay.label_width - index_width - 2)}"
        line = Text(label.ljust(lay.label_width))
        for j in cols:
            if mask_upper and j > i:
                line.append("·".center(lay.cell), style="dim")
            elif color:
                r, g, b = rgb[i, j]
                line.append(" " * lay.cell, style=Style(bgcolor=f"rgb({r},{g},{b})"))
            else:
                line.append(_shade(scaled[i, j]) * lay.cell)
        lines.append(line)
    lines.append(_legend(vmax, color, cmap))
    if len(cols) < T:
        lines.append(Text(f"showing keys {cols[0]}–{cols[-1]} of 0–{T - 1}: the terminal is {width} columns "
                          f"wide; widen it or pass --start to move the window", style="yellow"))
    return Group(*lines)


def _legend(vmax: float, color: bool, cmap: str) -> Text:
    legend = Text("α 0 ")
    if color:
        for r, g, b in _rgb(cmap, np.linspace(0, 1, 16)):
            legend.append(" ", style=Style(bgcolor=f"rgb({r},{g},{b})"))
        legend.append(f" {vmax:.2f}")
    else:  # five equal steps: " " below vmax/5, "█" from 4·vmax/5
        legend.append(f"[{SHADES}] {vmax:.2f}")
    return legend


def heatmap_renderable(capture: Capture, layer: int = -1, head: HeadSpec = "mean", *, hide_special: bool = False,
                       width: int = 80, color: bool = True, cmap: str = "viridis", start: int = 0) -> Group:
    """One layer of a capture (a head, or the head mean/max) as a terminal heatmap."""
    keep = capture.keep_mask(hide_special)
    tokens = [t for t, k in zip(capture.tokens, keep) if k]
    alpha = capture.head_matrix(layer, head)[np.ix_(keep, keep)]
    which = head if isinstance(head, str) else f"head {capture.head_index(head)}"
    title = f"{capture.model} · layer {capture.layer_index(layer)} · {which}"
    return matrix_renderable(alpha, tokens, tokens, width=width, color=color, cmap=cmap,
                             mask_upper=capture.causal, start=start, title=title)


def bar_chart(labels: Sequence[str], values: Sequence[float], *, width: int = 80, title: str | None = None) -> Group:
    """Horizontal bars, one per label, scaled to the largest value, with the value printed."""
    label_width = min(max(len(s) for s in labels), MAX_ROW_LABEL) + len(str(len(labels) - 1)) + 2
    bar_width = max(width - label_width - 8, 5)
    top = max(max(values), 1e-12)
    eighths = " ▏▎▍▌▋▊▉█"
    lines = [Text(title, style="bold")] if title else []
    index_width = len(str(len(labels) - 1))
    for i, (label, value) in enumerate(zip(labels, values)):
        length = value / top * bar_width
        full, part = int(length), int((length - int(length)) * 8)
        bar = "█" * full + (eighths[part] if part else "")
        row = Text(f"{i:>{index_width}} {_fit(label, label_width - index_width - 2)}".ljust(label_width))
        row.append(bar.ljust(bar_width), style="cyan")
        row.append(f" {value:.3f}")
        lines.append(row)
    return Group(*lines)


def compare_renderable(captures: Sequence[Capture], layers: Sequence[int], head: HeadSpec = "mean", *,
                       width: int = 80, color: bool = True, cmap: str = "viridis") -> Group:
    """The chosen layers (of one capture, or of two captures of the same text) side by side, each with a
    stats line. Panels that do not fit side by side in `width` are stacked instead."""
    from rich.table import Table

    from attnviz.errors import InputError
    from attnviz.metrics import matrix_summary

    if len(captures) == 2 and captures[0].tokens != captures[1].tokens:
        a, b = captures
        raise InputError(f"the two models tokenise the text differently ({a.n_tokens} tokens: {' '.join(a.tokens)} "
                         f"| {b.n_tokens} tokens: {' '.join(b.tokens)}), so their attention cannot be compared "
                         f"cell by cell")
    panels = [(cap, cap.layer_index(layer)) for layer in layers for cap in captures]
    T = captures[0].n_tokens
    mats = [cap.head_matrix(layer, head) for cap, layer in panels]
    vmax = max(float(m.max()) for m in mats)  # one colour scale for every panel
    label_width = TermLayout.fit(T, captures[0].tokens, 10**6).label_width
    side_by_side = len(panels) * (label_width + 2 * T + 2) <= width
    panel_width = width // len(panels) - 2 if side_by_side else width
    which = head if isinstance(head, str) else f"head {head}"
    rendered = []
    for (cap, layer), alpha in zip(panels, mats):
        name = f"{cap.model.split('/')[-1]} " if len(captures) == 2 else ""
        entropy, special_mass, distance = matrix_summary(alpha, cap.special)
        body = matrix_renderable(alpha, cap.tokens, cap.tokens, width=panel_width, color=color, cmap=cmap,
                                 vmax=vmax, mask_upper=cap.causal, title=f"{name}layer {layer} · {which}")
        stats = Text(f"H={entropy:.2f} sp={special_mass:.2f} d={distance:.1f}", style="cyan")
        rendered.append(Group(body, stats))
    key = Text("H: mean entropy (nats) · sp: mass on special tokens · d: mean distance (tokens)", style="dim")
    if not side_by_side:
        return Group(*rendered, key)
    grid = Table.grid(padding=(0, 2))
    for _ in rendered:
        grid.add_column()
    grid.add_row(*rendered)
    return Group(grid, key)
