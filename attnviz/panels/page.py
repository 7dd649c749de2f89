"""What a picture is made of: a Scale (how values map to colours), a Panel (one matrix with its labels,
hidden cells, scale, title and file name) and a Page (the panels of one figure or screen); coarsen pools a
panel further to fit a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from attnviz.base.blocks import every, pool_blocks, sum_blocks

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.



HeadChoice = int | str  # a head index, "mean" or "max"


NORMS = ("linear", "sqrt", "log")
AUTO_LINEAR_MAX_T = 64  # --norm auto: linear up to this many tokens, log beyond (long inputs are mostly tiny
# weights, about 1/T each, beside a few near 1: only a log scale shows both; a linear one is flat purple)
LOG_RANGE = 1e-3  # a log scale spans three decades below vmax


@dataclass(frozen=True)
class Scale:
    """How values map to colours: from vmin to vmax, linearly, by square root, or logarithmically (three
    decades below vmax); `shared` says whether the panels of a picture share it."""

    vmin: float = 0.0
    vmax: float = 1.0
    label: str = "attention weight α"
    norm: str = "linear"
    shared: bool = True

    @property
    def low(self) -> float:
        """The value drawn in the lowest colour (for a log scale, vmax / 1000)."""
        return max(self.vmin, self.vmax * LOG_RANGE) if self.norm == "log" else self.vmin

    def unit(self, values) -> np.ndarray:
        """Values mapped to [0, 1] as the colours show them (the same mapping matplotlib's norm makes)."""
        x = np.asarray(values, dtype=np.float64)
        if self.norm == "log":
            low, high = np.log(self.low), np.log(max(self.vmax, self.low * (1 + 1e-9)))
            with np.errstate(divide="ignore", invalid="ignore"):
                out = (np.log(np.maximum(x, self.low)) - low) / max(high - low, 1e-12)
        else:
            out = (x - self.vmin) / max(self.vmax - self.vmin, 1e-12)
            if self.norm == "sqrt":
                out = np.sqrt(np.clip(out, 0.0, None))
        return np.clip(out, 0.0, 1.0)

    def mpl_norm(self):
        """The matplotlib Normalize equal to `unit` (for images and colorbars)."""
        from matplotlib import colors

        if self.norm == "log":
            return colors.LogNorm(self.low, max(self.vmax, self.low * (1 + 1e-9)), clip=True)
        if self.norm == "sqrt":
            return colors.PowerNorm(0.5, self.vmin, self.vmax, clip=True)
        return colors.Normalize(self.vmin, self.vmax, clip=True)

    def describe(self) -> str:
        """What the legend says: "√ scale, per head" and the like."""
        kind = {"linear": "linear scale", "sqrt": "√ scale", "log": "log scale"}[self.norm]
        return f"{kind}, {'one for every panel' if self.shared else 'each panel its own'}"


@dataclass(frozen=True)
class ScaleChoice:
    """What the user asked for: --scale shared|per-head, --norm linear|sqrt|log|auto, --vmax."""

    kind: str = "shared"
    norm: str = "auto"
    vmax: float | None = None

    def norm_for(self, n_tokens: int) -> str:
        if self.norm != "auto":
            return self.norm
        return "linear" if n_tokens <= AUTO_LINEAR_MAX_T else "log"


@dataclass(frozen=True)
class Panel:
    """One matrix as it will be drawn.

    matrix   (R, C) float32    what is drawn; rows are queries (attending), columns keys (attended to)
    rows     (R,) str          row labels;  cols (C,) str: column labels (display-safe)
    hidden   (R, C) bool|None  cells not drawn (a causal model's future keys)"""

    matrix: np.ndarray
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    hidden: np.ndarray | None
    scale: Scale
    title: tuple[str, ...]  # pieces joined into the title; the export draws the first piece once per layer
    name: str  # file stem: layer00_head02, layer05_mean
    short: str = ""  # the title inside a page of several panels: "layer 3"
    layer: int | None = None
    head: HeadChoice | None = None
    row_axis: str = "query (attending)"
    col_axis: str = "key (attended to)"
    footer: str = ""  # a line under the picture (the stats line of `compare`)
    values: bool = False  # write each cell's value in it
    cmap: str | None = None  # this panel's own colormap (e.g. diverging for Q·Kᵀ), else the page's
    row_split: int | None = None  # the first row (and column) of generated tokens: a line is drawn before it
    col_split: int | None = None
    picture: np.ndarray | None = None  # (h, w, 3) uint8 drawn under the matrix (a vision capture's patch grid)
    mark: tuple[int, int] | None = None  # a cell outlined (the patch whose row is drawn)
    path: tuple[np.ndarray, np.ndarray] | None = None  # (rows, columns) of a path drawn over the matrix (DTW)
    summary: bool = False  # the last row and column summarise selected tokens (heatmap --tokens), set apart

    @property
    def title_text(self) -> str:
        return "".join(self.title)

    @property
    def shown(self) -> np.ndarray:
        """The matrix with hidden cells masked, as matplotlib draws it. (R, C) masked array"""
        return np.ma.masked_where(self.hidden, self.matrix) if self.hidden is not None else self.matrix


@dataclass(frozen=True)
class Page:
    """Panels shown together (one figure, one screen), on one colour scale, under one title."""

    panels: tuple[Panel, ...]
    title: str
    name: str = "attnviz"  # default file stem
    notes: tuple[str, ...] = field(default_factory=tuple)
    subtitle: str = ""  # the input text, display-safe (shortened to fit by the renderer)
    spectrogram: np.ndarray | None = None  # (bins, 2N): a sound's log-mel, drawn above panels whose columns are time
    frame_seconds: float = 0.02  # seconds a column of those panels stands for
    words: tuple[tuple[str, float, float], ...] = ()  # (word, start, end): spans marked over the spectrogram

    @property
    def scale(self) -> Scale:
        return self.panels[0].scale

    @property
    def text(self) -> str:
        """Every string the page draws (labels, titles, the input text, notes, words): what its fonts must cover."""
        pieces = [self.title, self.subtitle, *self.notes, *(w for w, _, _ in self.words)]
        for panel in self.panels:
            pieces += [*panel.rows, *panel.cols, *panel.title, panel.short, panel.footer]
        return "".join(pieces)


def coarsen(panel: Panel, k: int) -> Panel:
    """A panel pooled further by k × k cells (rows averaged, columns summed, so a row of attention still
    sums to 1), labelled by each group's first cell: for a terminal narrower than a pooled picture."""
    if k <= 1:
        return panel
    R, C = panel.matrix.shape
    row_edges, col_edges = every(R, k), every(C, k)
    row_groups, col_groups = row_edges[:-1], col_edges[:-1]
    hidden = None
    if panel.hidden is not None:
        visible_cells = sum_blocks(sum_blocks((~panel.hidden).astype(np.int64), col_edges, 1), row_edges, 0)
        hidden = visible_cells == 0
    title = (*panel.title, f" · pooled again ×{k} to fit")
    def split(at: int | None) -> int | None:  # kept where it falls between two groups
        return at // k if at is not None and at % k == 0 else None

    return replace(panel, matrix=pool_blocks(panel.matrix, row_edges, col_edges),
                   rows=tuple(panel.rows[i] for i in row_groups), cols=tuple(panel.cols[j] for j in col_groups),
                   hidden=hidden, title=title,
                   row_split=split(panel.row_split), col_split=split(panel.col_split))


def pool_columns(panel: Panel, k: int) -> Panel:
    """A panel's columns summed k at a time (rows kept: each still sums to what it did), labelled by each
    group's first column: a sound's frames narrowed to a terminal."""
    if k <= 1:
        return panel
    R, C = panel.matrix.shape
    col_edges = every(C, k)
    matrix = pool_blocks(panel.matrix, every(R, 1), col_edges)  # columns summed, rows as they were
    top = max(float(matrix.max()), 1e-9)
    return replace(panel, matrix=matrix.astype(np.float32), cols=tuple(panel.cols[i] for i in col_edges[:-1]),
                   hidden=None, scale=replace(panel.scale, vmin=0.0, vmax=top),
                   title=(*panel.title, f" · {k} frames a column"), path=None)
