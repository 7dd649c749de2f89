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

from attnviz.panels import Panel
from attnviz.render.colors import DEFAULT_CMAP, rgb, text_on
from attnviz.text import cells, fit, glyphs, pad

SHADES = " ░▒▓█"  # 0 .. vmax in five steps
MAX_HEADER_LINES = 5  # vertical key labels are cut to this many characters
MAX_ROW_LABEL = 12  # cells


@dataclass(frozen=True)
class TermLayout:
    cell: int  # terminal cells per matrix cell
    columns: range  # key positions shown
    label_width: int  # cells for "index label " before the first matrix cell

    @classmethod
    def fit(cls, T: int, labels: Sequence[str], width: int, start: int = 0, n_rows: int | None = None) -> TermLayout:
        n_rows = T if n_rows is None else n_rows
        label_width = min(max((cells(s) for s in labels), default=1), MAX_ROW_LABEL) + len(str(max(n_rows - 1, 0))) + 2
        avail = max(width - label_width, 4)
        for cell in (3, 2):
            if T * cell <= avail:
                return cls(cell, range(T), label_width)
        cell = 2
        n = max(avail // cell, 1)
        start = min(max(start, 0), max(T - n, 0))
        return cls(cell, range(start, min(start + n, T)), label_width)


def _shade(x: float) -> str:
    return SHADES[min(int(x * len(SHADES)), len(SHADES) - 1)]


def panel_renderable(panel: Panel, *, width: int = 80, color: bool = True, cmap: str = DEFAULT_CMAP,
                     start: int = 0, title: bool | str = True, legend: bool = True) -> Group:
    """A panel as rows of cells with row labels and vertical column labels, a legend, and a note when
    only a window of the columns fits in `width`."""
    matrix = np.asarray(panel.matrix, dtype=np.float32)
    n_rows, T = matrix.shape
    vmin, vmax = panel.scale.vmin, panel.scale.vmax
    scaled = np.clip((matrix - vmin) / max(vmax - vmin, 1e-12), 0.0, 1.0)  # (R, C) in [0, 1]
    lay = TermLayout.fit(T, panel.rows, width, start, n_rows)
    cols = list(lay.columns)
    colours = rgb(cmap, scaled)  # (R, C, 3)
    dark = text_on(colours) if color and panel.values else None
    lines: list[Text] = []
    if title:
        lines.append(Text(panel.title_text if title is True else str(title), style="bold"))
    # vertical column labels: line k holds glyph k of each shown label, each padded to the cell width
    headers = [glyphs(panel.cols[j])[:MAX_HEADER_LINES] for j in cols]
    depth = max((len(h) for h in headers), default=0)
    for k in range(depth):
        line = Text(" " * lay.label_width)
        for header in headers:
            piece = header[k] if k < len(header) else ""
            line.append(pad(piece if cells(piece) <= lay.cell else "…", lay.cell, "center"), style="dim" if k else "")
        lines.append(line)
    index_width = len(str(max(n_rows - 1, 0)))
    hidden = panel.hidden
    for i in range(n_rows):
        label = f"{i:>{index_width}} {fit(panel.rows[i], lay.label_width - index_width - 2)}"
        line = Text(pad(label, lay.label_width))
        for j in cols:
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
        lines.append(_legend(vmin, vmax, color, cmap, panel.scale.label))
    if len(cols) < T:
        lines.append(Text(f"showing keys {cols[0]}–{cols[-1]} of 0–{T - 1}: the terminal is {width} columns "
                          f"wide; widen it or pass --start to move the window", style="yellow"))
    if panel.footer:
        lines.append(Text(panel.footer, style="cyan"))
    return Group(*lines)


def _value_text(value: float, width: int) -> str:
    """A weight in `width` cells: "25" for 0.25 (hundredths), "**" for 1.00."""
    hundredths = int(round(float(value) * 100))
    text = "**" if hundredths >= 100 else f"{hundredths:02d}"
    return pad(text, width, "right" if width > 2 else "left")


def _legend(vmin: float, vmax: float, color: bool, cmap: str, label: str) -> Text:
    legend = Text(f"{'α' if label.startswith('attention weight') else label} {vmin:.2f} ")
    if color:
        for r, g, b in rgb(cmap, np.linspace(0, 1, 16)):
            legend.append(" ", style=Style(bgcolor=f"rgb({int(r)},{int(g)},{int(b)})"))
        legend.append(f" {vmax:.2f}")
    else:  # five equal steps: " " below vmax/5, "█" from 4·vmax/5
        legend.append(f"[{SHADES}] {vmax:.2f}")
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
                        key: str | None = None, start: int = 0) -> Group:
    """Panels (on one colour scale) side by side when they fit in `width`, else stacked, each windowed
    as a single heatmap is; each titled with its short title and followed by its footer."""
    from rich.table import Table

    R, T = panels[0].matrix.shape
    label_width = TermLayout.fit(T, panels[0].rows, 10**6, 0, R).label_width
    side_by_side = len(panels) * (label_width + 2 * T + 2) <= width
    panel_width = width // len(panels) - 2 if side_by_side else width
    rendered = [panel_renderable(p, width=panel_width, color=color, cmap=cmap, start=start,
                                 title=p.short or p.title_text, legend=False) for p in panels]
    legend = _legend(panels[0].scale.vmin, panels[0].scale.vmax, color, cmap, panels[0].scale.label)
    tail = [legend] + ([Text(key, style="dim")] if key else [])
    if not side_by_side:
        return Group(*rendered, *tail)
    grid = Table.grid(padding=(0, 2))
    for _ in rendered:
        grid.add_column()
    grid.add_row(*rendered)
    return Group(grid, *tail)
