"""Pages of panels as matplotlib figures (PNG, SVG, PDF). No pyplot: every figure is an explicit
`matplotlib.figure.Figure`, laid out in inches so that labels stay legible from T=8 to T=128+.

`heatmap(...)` draws one matrix on an Axes you give it and returns that Axes (seaborn-style);
`page_figure(page)` lays out a Page and returns a `HeatmapFigure` handle (figure, axes, colorbar axes,
images, title), so callers never reach into matplotlib's internals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from attnviz._version import __version__
from attnviz.data.capture import Capture
from attnviz.base.files import atomic_output, check_suffix
from attnviz.render import FORMATS
from attnviz.panels import HeadChoice, Page, Panel, Scale, heatmap_page, short_model
from attnviz.render.colors import DEFAULT_CMAP, colormap, rgb, text_on
from attnviz.render.fonts import families_for
from attnviz.base.text import cells, fit, glyphs, wrap_cells

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.

MAX_MATRIX_IN = 16.0  # a single heatmap's matrix is never wider than this (inches)
MIN_FONT_PT = 5.0  # below this, labels are thinned (every k-th token) instead of shrunk
MIN_VALUE_PT = 6.5  # below this (about 9 pixels at 100 dpi) cell values are not written, and a note says so


@dataclass(frozen=True)
class LabelLayout:
    """Cell size and label font for a matrix of n × n cells (n the longer side)."""

    cell_in: float  # inches per cell
    fontsize: float  # points
    step: int  # label every step-th token

    @classmethod
    def for_tokens(cls, T: int, *, target_in: float = 7.0, min_cell: float = 0.13, max_cell: float = 0.5,
                   max_side: float = MAX_MATRIX_IN) -> LabelLayout:
        cell = min(max(target_in / T, min_cell), max_cell)
        cell = min(cell, max_side / T)
        fit = cell * 72 * 0.8  # the font size whose line height fills a cell
        if fit >= MIN_FONT_PT:
            return cls(cell, min(fit, 11.0), 1)
        return cls(cell, MIN_FONT_PT, math.ceil(MIN_FONT_PT / fit))

    def label_extent_in(self, labels: Sequence[str]) -> float:
        """Inches needed beside the matrix for the longest label (wide characters count twice)."""
        longest = max((cells(s) for s in labels), default=1)
        return min(longest, 14) * self.fontsize * 0.62 / 72 + 0.12

    @property
    def value_fontsize(self) -> float:
        """The size at which a value like "0.25" fits in a cell."""
        return min(9.0, self.cell_in * 72 / 2.7)


@dataclass
class HeatmapFigure:
    """A laid-out figure and the artists a caller may change."""

    figure: Any  # matplotlib.figure.Figure
    axes: list  # one Axes per panel, in page order
    colorbar_axes: Any
    images: list  # one AxesImage per panel
    title: Any  # the figure title (a matplotlib Text)

    def _repr_png_(self) -> bytes:
        """In a notebook: the figure, as an image (no %matplotlib magic needed)."""
        return self.figure._repr_png_()

    def __getattr__(self, name: str):
        """Everything else is the matplotlib Figure's: `savefig`, `set_size_inches`, `suptitle`, `dpi`, …"""
        return _figure_attribute(self, name)


def _figure_attribute(handle, name: str):
    """A figure handle behaves as its matplotlib Figure: what the handle lacks, the Figure answers."""
    if name.startswith("__") or name == "figure":  # copying and pickling look these up before fields exist
        raise AttributeError(name)
    return getattr(handle.figure, name)


def heatmap(matrix: np.ndarray, row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
            *, ax, cmap: str = DEFAULT_CMAP, scale: Scale | None = None, vmin: float = 0.0,
            vmax: float | None = None, hidden: np.ndarray | None = None,
            fontsize: float | tuple[float, float] | None = None, step: int | tuple[int, int] = 1,
            families: Sequence[str] | None = None, values: bool = False, value_fontsize: float = 7.0):
    """Draw a matrix (R, C) on `ax`: rows down, columns across, tick labels. Returns `ax`.

    fontsize, step: of the tick labels (every step-th labelled), or (rows', columns') where they differ (a
    panel of 6 tokens × 64 dimensions labels every token and every 8th dimension).
    scale: how values map to colours (default: linear from vmin to vmax, or to the largest value).
    hidden: (R, C) bool, cells not drawn (a causal model's future keys, shown in the masked colour).
    values: write each value in its cell, in black or white by the cell colour's luminance."""
    matrix = np.asarray(matrix, dtype=np.float32)
    shown = np.ma.masked_where(hidden, matrix) if hidden is not None else matrix
    if scale is None:
        top = float(matrix.max()) if vmax is None and matrix.size else (vmax if vmax is not None else 1.0)
        scale = Scale(vmin, max(top, vmin + 1e-9))
    ax.imshow(shown, cmap=colormap(cmap), norm=scale.mpl_norm(), interpolation="nearest", aspect="auto")
    rotate = any(cells(s) > 2 for s in (col_labels or ()))
    _set_tick_labels(ax, row_labels, col_labels, fontsize=fontsize or 9.0, step=step, families=families,
                     rotate=rotate)
    if values:
        _write_values(ax, matrix, hidden, cmap, scale, value_fontsize)
    return ax


SPLIT_COLOR, SPLIT_EDGE = "white", "black"  # the line where the prompt ends: white, outlined for any colormap


def draw_splits(ax, panel: Panel) -> None:
    """The line between prompt and generated tokens: before the panel's row_split and col_split."""
    from matplotlib import patheffects

    outline = [patheffects.withStroke(linewidth=2.6, foreground=SPLIT_EDGE)]
    if panel.row_split is not None:
        ax.axhline(panel.row_split - 0.5, color=SPLIT_COLOR, linewidth=1.4, path_effects=outline)
    if panel.col_split is not None:
        ax.axvline(panel.col_split - 0.5, color=SPLIT_COLOR, linewidth=1.4, path_effects=outline)
    if panel.summary:  # the selection's row and column, set apart from α's
        rows, cols = panel.matrix.shape
        ax.axhline(rows - 1.5, color=SPLIT_COLOR, linewidth=2.4, path_effects=outline)
        ax.axvline(cols - 1.5, color=SPLIT_COLOR, linewidth=2.4, path_effects=outline)


def _write_values(ax, matrix: np.ndarray, hidden, cmap: str, scale: Scale, fontsize: float) -> None:
    dark = text_on(rgb(cmap, scale.unit(matrix)))  # (R, C) bool: dark text on light cells
    shown = matrix if hidden is None else np.where(hidden, 0.0, matrix)
    write = value_format(shown)
    for (i, j), value in np.ndenumerate(matrix):
        if hidden is not None and hidden[i, j]:
            continue
        ax.text(j, i, write(value), ha="center", va="center", fontsize=fontsize,
                color=".15" if dark[i, j] else "w")


def value_format(values: np.ndarray):
    """One way to write every cell of a picture, so its numbers line up: weights below 1 as ".25" (hundredths,
    the leading zero left out), anything up to 10 with two decimals ("2.31", "0.05"), up to 100 with one,
    beyond as whole numbers. Returns value -> text."""
    finite = np.abs(np.asarray(values, np.float64)[np.isfinite(values)])
    largest = float(finite.max()) if finite.size else 0.0
    if largest < 0.995:
        return lambda v: f"{v:.2f}".replace("0.", ".", 1)
    decimals = 2 if largest < 9.995 else 1 if largest < 99.95 else 0
    return lambda v: f"{v:.{decimals}f}"


def _set_tick_labels(ax, row_labels, col_labels, *, fontsize: float | tuple[float, float],
                     step: int | tuple[int, int], families, rotate: bool) -> None:
    row_pt, col_pt = fontsize if isinstance(fontsize, tuple) else (fontsize, fontsize)
    row_step, col_step = step if isinstance(step, tuple) else (step, step)
    for labels, set_ticks, set_labels, pt, every in ((col_labels, ax.set_xticks, ax.set_xticklabels, col_pt, col_step),
                                                     (row_labels, ax.set_yticks, ax.set_yticklabels, row_pt, row_step)):
        if labels is None:
            set_ticks([])
            continue
        positions = list(range(0, len(labels), every))
        shown = [labels[i] for i in positions]
        if rotate and labels is col_labels:  # Hangul, kana and Han upright, one character under another
            shown = [upright(label) if wide(label) else label for label in shown]
        set_ticks(positions)
        set_labels(shown, fontsize=pt, fontfamily=list(families) if families else None)
    ax.tick_params(axis="x", labelrotation=90 if rotate else 0, length=2, pad=2)
    ax.tick_params(axis="y", length=2, pad=2)
    if rotate and col_labels is not None:
        for text in ax.get_xticklabels():
            if wide(text.get_text()):
                text.set_rotation(0)
                text.set_verticalalignment("top")
                text.set_linespacing(1.0)


def wide(label: str) -> bool:
    """A label with a wide character (Hangul, kana, Han): written upright, not turned on its side."""
    return any(cells(char) == 2 for char in label)


def upright(label: str) -> str:
    """A column label written downwards, one character under another, each upright (as CJK is read vertically)."""
    return "\n".join(glyphs(label))


TITLE_PT, MIN_TITLE_PT = 11.0, 7.0
CHAR_EM = 0.6  # average width of a character cell of DejaVu Sans, in em (wide characters count twice)


def fit_title(title: str, width_in: float) -> tuple[str, float]:
    """A title that fits `width_in` inches: shrunk from 11 pt down to 7 pt, then wrapped; never cut off."""
    need = cells(title) * TITLE_PT * CHAR_EM / 72
    if need <= width_in:
        return title, TITLE_PT
    size = max(MIN_TITLE_PT, TITLE_PT * width_in / need)
    per_line = max(int(width_in * 72 / (size * CHAR_EM)), 10)
    if cells(title) <= per_line:
        return title, size
    return "\n".join(wrap_cells(title, per_line)), size


NOTE_PT = 8.0  # the small print under a figure's title


def wrap_text(text: str, width_in: float, size_pt: float = NOTE_PT) -> str:
    """`text` wrapped between words into lines that fit `width_in` inches at `size_pt` (never shrunk, never cut
    off: the small print is drawn at the size it was wrapped for)."""
    return "\n".join(wrap_cells(text, max(int(width_in * 72 / (size_pt * CHAR_EM)), 10)))


def page_notes(page: Page, lay: LabelLayout, values_dropped: bool) -> list[str]:
    """The small print under the title: the colour scale, thinned labels, values not written."""
    notes = list(page.notes)
    if lay.step > 1:
        notes.append(f"every {lay.step}{'nd' if lay.step == 2 else 'rd' if lay.step == 3 else 'th'} token labelled")
    if values_dropped:
        notes.append("cells too small to write values in (fewer tokens, or --layer with one layer)")
    notes.append(page.scale.describe())
    return notes


def decorate(ax, panel: Panel, image=None) -> None:
    """What a panel adds over its heatmap on `ax`: the splits between parts, a picture under a patch grid (the
    weights over it half-transparent), the marked cell."""
    draw_splits(ax, panel)
    R, C = panel.matrix.shape
    if panel.picture is not None:
        shown = image if image is not None else ax.images[0]
        shown.set_alpha(0.65)
        shown.set_zorder(1)
        ax.imshow(panel.picture, extent=(-0.5, C - 0.5, R - 0.5, -0.5), zorder=0, interpolation="bilinear")
        ax.set_xlim(-0.5, C - 0.5)
        ax.set_ylim(R - 0.5, -0.5)
    if panel.mark is not None:
        from matplotlib.patches import Rectangle

        ax.add_patch(Rectangle((panel.mark[1] - 0.5, panel.mark[0] - 0.5), 1, 1, fill=False, edgecolor="#00e5ff",
                               linewidth=2, zorder=3))


def panel_on(panel: Panel, ax, *, cmap: str = DEFAULT_CMAP, title: str | None = None, text: str = ""):
    """One panel drawn on the caller's matplotlib Axes, as seaborn draws: its heatmap (in the panel's own
    colormap, else `cmap`), what decorate() adds, the axis labels, a colorbar beside it and `title` (default the
    panel's own) above. Returns `ax`. What figure(ax=ax) of every result draws: its main panel."""
    families = families_for(text + (title or panel.title_text))
    before = len(ax.images)  # the caller may have drawn on it already
    heatmap(panel.matrix, panel.rows, panel.cols, ax=ax, cmap=panel.cmap or cmap, scale=panel.scale,
            hidden=panel.hidden, families=families, values=panel.values)
    image = ax.images[before]
    decorate(ax, panel, image)
    ax.set_title(panel.title_text if title is None else title, fontsize=9, fontfamily=families)
    ax.set_xlabel(panel.col_axis, fontsize=8)
    ax.set_ylabel(panel.row_axis, fontsize=8)
    ax.figure.colorbar(image, ax=ax, label=panel.scale.label)
    return ax


def page_figure(page: Page, *, cmap: str = DEFAULT_CMAP, ax=None) -> HeatmapFigure:
    """Lay out a page: a grid of panels (same shape), one colour scale and colorbar (or one per panel when
    each has its own), the title (never cut off), the input text and the small print. With `ax`: the first
    panel drawn on it (panel_on), `ax` returned."""
    if ax is not None:
        return panel_on(page.panels[0], ax, cmap=cmap, title=page.title, text=page.text)
    from attnviz.render.figure import NotebookFigure as Figure

    panels = page.panels
    many = len(panels) > 1
    own_bars = not all(p.scale == panels[0].scale and p.scale.shared for p in panels)
    R, C = panels[0].matrix.shape
    lay = LabelLayout.for_tokens(max(R, C), target_in=4.0 if many else 7.0, max_side=7.0 if many else MAX_MATRIX_IN)
    rows, cols = panels[0].rows, panels[0].cols
    families = families_for(page.text)
    rotate = any(cells(s) > 2 for s in cols)
    pad_l = lay.label_extent_in(rows) + 0.3
    pad_b = (lay.label_extent_in(cols) if rotate else lay.fontsize / 72 + 0.1) + 0.3
    width, height = lay.cell_in * C, lay.cell_in * R
    ncols = 1 if not many else min(len(panels), 3 if len(panels) <= 9 else 4)
    nrows = math.ceil(len(panels) / ncols)
    top = 0.45 if many else 0.1
    bar_room = 0.75 if own_bars and many else 0.0
    panel_w, panel_h = pad_l + width + 0.25 + bar_room, pad_b + height + top
    cbar_w = 0.0 if own_bars and many else 1.0
    fig_w = ncols * panel_w + cbar_w
    values = any(p.values for p in panels)
    write_values = values and lay.value_fontsize >= MIN_VALUE_PT
    notes = page_notes(page, lay, values and not write_values)
    title, title_pt = fit_title(page.title, fig_w - 0.3)
    title_lines = title.count("\n") + 1
    subtitle = page.subtitle
    if subtitle:
        limit = max(int((fig_w - 0.3) * 72 / (9 * CHAR_EM)), 12)
        subtitle = subtitle if cells(subtitle) <= limit else shorten_cells(subtitle, limit)
    note_text = wrap_text(" · ".join(notes), fig_w - 0.3)
    note_lines = note_text.count("\n") + 1
    header = 0.16 + title_lines * title_pt * 1.3 / 72 + (0.2 if subtitle else 0.0) + note_lines * 0.16 + 0.08
    fig_h = nrows * panel_h + header
    fig = Figure(figsize=(fig_w, fig_h), dpi=100)
    axes, images = [], []
    bar_axes = []
    for n, panel in enumerate(panels):
        r, c = divmod(n, ncols)
        x0 = c * panel_w + pad_l
        y0 = fig_h - header - (r + 1) * panel_h + pad_b
        ax = fig.add_axes((x0 / fig_w, y0 / fig_h, width / fig_w, height / fig_h))
        heatmap(panel.matrix, panel.rows, panel.cols, ax=ax, cmap=cmap, scale=panel.scale,
                hidden=panel.hidden, fontsize=lay.fontsize, step=lay.step, families=families,
                values=panel.values and write_values, value_fontsize=lay.value_fontsize)
        decorate(ax, panel)
        if many:
            ax.set_title(panel.short, fontsize=10, fontfamily=families)
        if c == 0:
            ax.set_ylabel(panel.row_axis, fontsize=8)
        if r == nrows - 1 or n + ncols >= len(panels):
            ax.set_xlabel(panel.col_axis, fontsize=8)
        if own_bars and many:  # each panel its own scale: a slim colorbar beside it
            cax = fig.add_axes(((x0 + width + 0.12) / fig_w, y0 / fig_h, 0.12 / fig_w, height / fig_h))
            fig.colorbar(ax.images[0], cax=cax).ax.tick_params(labelsize=7)
            bar_axes.append(cax)
        axes.append(ax)
        images.append(ax.images[0])
    if not (own_bars and many):
        cbar_h = min(fig_h - header - 0.6, max(height, 2.0))
        cax = fig.add_axes(((fig_w - cbar_w + 0.15) / fig_w, (fig_h - header - cbar_h - top) / fig_h,
                            0.18 / fig_w, cbar_h / fig_h))
        bar = fig.colorbar(images[0], cax=cax)
        bar.ax.tick_params(labelsize=8)
        bar.set_label(page.scale.label, fontsize=8)
        bar_axes.append(cax)
    y = 1 - 0.12 / fig_h
    title_artist = fig.suptitle(title, x=0.02, y=y, ha="left", va="top", fontsize=title_pt, fontfamily=families)
    y -= title_lines * title_pt * 1.3 / 72 / fig_h
    if subtitle:
        fig.text(0.02, y, subtitle, ha="left", va="top", fontsize=9, color="0.3", fontfamily=families)
        y -= 0.2 / fig_h
    fig.text(0.02, y, note_text, ha="left", va="top", fontsize=NOTE_PT, color="0.4", fontfamily=families)
    return HeatmapFigure(fig, axes, bar_axes[0], images, title_artist)


def mixed_figure(page: Page, *, cmap: str = DEFAULT_CMAP, ncols: int = 3, extra=None, ax=None) -> HeatmapFigure:
    """Panels of different shapes and scales (the steps of one head), each with its own colorbar and
    colormap, laid out by matplotlib's constrained layout under the page's title, text and small print (each
    wrapped at its own size, in a header of its own: never pressed on the panels). `extra(ax)`: draws one more
    plot in the slot after the last panel (no slot is left empty when there is one). With `ax`: the first panel
    drawn on it (panel_on), `ax` returned."""
    if ax is not None:
        return panel_on(page.panels[0], ax, cmap=cmap, title=page.title, text=page.text)
    from attnviz.render.figure import NotebookFigure as Figure

    panels = page.panels
    slots = len(panels) + (1 if extra is not None else 0)
    ncols = max(1, min(ncols, slots))
    if slots % ncols and slots <= 4:  # three panels in a 2 × 2 grid: one row instead of an empty quadrant
        ncols = slots
    nrows = math.ceil(slots / ncols)
    T = max(max(p.matrix.shape) for p in panels)
    lay = LabelLayout.for_tokens(T, target_in=3.2, max_side=4.5)
    families = families_for(page.text)
    panel_in = max(2.6, lay.cell_in * T + lay.label_extent_in(panels[0].rows) + 1.2)
    fig_w = ncols * panel_in
    matrix_in = panel_in - lay.label_extent_in(panels[0].rows) - 1.2  # what each panel's matrix gets, about
    value_pts = [min(matrix_in / max(p.matrix.shape) * 72 / 2.7, 8.0) for p in panels]  # "0.25" fits a cell
    dropped = [p.short for p, pt in zip(panels, value_pts) if p.values and pt < MIN_VALUE_PT]
    title, title_pt = fit_title(page.title, fig_w - 0.3)
    subtitle = wrap_text(page.subtitle, fig_w - 0.3, 9.0) if page.subtitle else ""
    notes = list(page.notes) + ([f"numbers left out where cells are too small to read ({', '.join(dropped)}): "
                                 f"--json has every value"] if dropped else [])
    note_text = wrap_text(" · ".join(notes), fig_w - 0.3) if notes else ""
    lines = [(title, title_pt), (subtitle, 9.0), (note_text, NOTE_PT)]
    header = 0.14 + sum((text.count("\n") + 1) * pt * 1.3 / 72 for text, pt in lines if text) + 0.06
    fig_h = nrows * (panel_in + 0.3) + 0.3 + header
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    fig = Figure(figsize=(fig_w, fig_h), dpi=100,
                 layout=ConstrainedLayoutEngine(rect=(0, 0, 1, 1 - header / fig_h)))  # the panels below the header
    axes, images = [], []
    grid = fig.subplots(nrows, ncols, squeeze=False)
    for n, ax in enumerate(grid.flat):
        if n >= len(panels):
            if n == len(panels) and extra is not None:
                extra(ax)
            else:
                ax.set_visible(False)
            continue
        panel = panels[n]
        legible = value_pts[n] >= MIN_VALUE_PT
        # rows and columns labelled each by their own count: the matrix fills the panel (aspect "auto"), so 6
        # token rows of a 6 × 64 panel get a sixth of its height each
        by_row, by_col = (LabelLayout.for_tokens(n, target_in=matrix_in, max_side=matrix_in)
                          for n in panel.matrix.shape)
        heatmap(panel.matrix, panel.rows, panel.cols, ax=ax, cmap=panel.cmap or cmap, scale=panel.scale,
                hidden=panel.hidden, fontsize=(min(by_row.fontsize, 9.0), min(by_col.fontsize, 9.0)),
                step=(by_row.step, by_col.step), families=families, values=panel.values and legible,
                value_fontsize=value_pts[n])
        draw_splits(ax, panel)
        ax.set_title(panel.short, fontsize=9, fontfamily=families)
        ax.set_xlabel(panel.col_axis, fontsize=8)
        ax.set_ylabel(panel.row_axis, fontsize=8)
        fig.colorbar(ax.images[0], ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
        axes.append(ax)
        images.append(ax.images[0])
    y = 1 - 0.12 / fig_h
    title_artist = fig.suptitle(title, x=0.01, y=y, ha="left", va="top", fontsize=title_pt, fontfamily=families)
    y -= (title.count("\n") + 1) * title_pt * 1.3 / 72 / fig_h
    for text, pt, shade in ((subtitle, 9.0, "0.3"), (note_text, NOTE_PT, "0.4")):
        if text:
            fig.text(0.01, y, text, ha="left", va="top", fontsize=pt, color=shade, fontfamily=families)
            y -= (text.count("\n") + 1) * pt * 1.3 / 72 / fig_h
    return HeatmapFigure(fig, axes, None, images, title_artist)


def bars(ax, labels: Sequence[str], values: Sequence[float], *, title: str = "", xlabel: str = "") -> None:
    """Horizontal bars, one per label (top to bottom), each with its value written beside it: red above 0, blue
    below (the diverging colours of the heatmaps beside it)."""
    values = [float(v) for v in values]
    positions = list(range(len(values)))
    ax.barh(positions, values, color=["#b2182b" if v >= 0 else "#2166ac" for v in values], height=0.6)
    ax.set_yticks(positions, list(labels), fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="0.3", linewidth=0.8)
    reach = max((abs(v) for v in values), default=1.0) or 1.0
    ax.set_xlim(min(min(values, default=0.0), 0.0) - 0.3 * reach, max(max(values, default=0.0), 0.0) + 0.3 * reach)
    for y, v in zip(positions, values):
        ax.text(v, y, f" {v:+.3f} " if v else " 0 ", ha="left" if v >= 0 else "right", va="center", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def shorten_cells(text: str, limit: int) -> str:
    """One line of at most `limit` cells, ending in … when cut."""

    return fit(" ".join(text.split()), limit)


def panel_figure(panel: Panel, *, cmap: str = DEFAULT_CMAP, subtitle: str = "", ax=None) -> HeatmapFigure:
    """One panel alone, titled with its own title (with `ax`: drawn on it, panel_on)."""
    if ax is not None:
        return panel_on(panel, ax, cmap=cmap, text=subtitle)
    return page_figure(Page(panels=(panel,), title=panel.title_text, name=panel.name, subtitle=subtitle), cmap=cmap)


def heatmap_figure(capture: Capture, layer: int = -1, head: HeadChoice = "mean", *, hide_special: bool = False,
                   cmap: str = DEFAULT_CMAP, vmax: float | None = None, ax=None):
    """One labelled heatmap of one layer and head (an index, "mean" or "max"): a figure of its own, or drawn on
    the matplotlib axes `ax` (with its title and a colorbar beside it) and `ax` returned, as seaborn does."""
    page = heatmap_page(capture, [layer], [head], hide_special=hide_special, vmax=vmax)
    return page_figure(page, cmap=cmap, ax=ax)


def save_figure(fig, path: str | Path, *, dpi: int = 150) -> Path:
    """Write a figure (or a HeatmapFigure) in the format its suffix names (.png, .svg, .pdf), atomically."""
    fig = getattr(fig, "figure", fig)
    path = check_suffix(path, FORMATS)
    suffix = path.suffix.lower()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=suffix[1:], dpi=dpi, metadata=_metadata(suffix))
    return path


def _metadata(suffix: str) -> dict:
    software = f"attnviz {__version__}"
    return {"Software": software} if suffix == ".png" else {"Creator": software}


def scaling_figure(rows, T: int, d_k: int, model: str, ax=None):
    """Mean softmax entropy per layer with raw logits Q·Kᵀ and with Q·Kᵀ/√d_k, beside ln T (on the caller's `ax`,
    returned, where one is given)."""
    from attnviz.render.figure import canvas

    main = ax
    fig, (ax,) = canvas(main, (6.4, 4.6))
    layers = [r.layer for r in rows]
    ax.plot(layers, [r.entropy_scaled for r in rows], "o-", label="softmax(QKᵀ/√d_k)  (what the model does)")
    ax.plot(layers, [r.entropy_raw for r in rows], "s--", label="softmax(QKᵀ)  (no scaling)")
    ax.axhline(math.log(T), color="grey", linestyle=":", label=f"uniform: ln T = {math.log(T):.2f}")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention entropy (nats)")
    ax.set_xticks(layers)
    ax.set_ylim(0, math.log(T) * 1.08 if T > 1 else 1.0)
    ax.set_title(f"{short_model(model)}: why divide by √d_k (d_k = {d_k}, T = {T})", fontsize=10)
    if main is not None:
        ax.legend(fontsize=8)
        return ax
    fig.legend(fontsize=8, loc="outside lower center", ncols=2, frameon=False)
    return fig


__all__ = ["FORMATS", "HeatmapFigure", "LabelLayout", "Scale", "heatmap", "heatmap_figure", "page_figure",
           "panel_figure", "panel_on", "save_figure", "scaling_figure"]
