"""The grid overview: every selected layer x head as a small panel, composed as one image and pasted into the
PNG pixel for pixel (the static counterpart of bertviz's model view)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Sequence

import numpy as np

from attnviz.base.files import atomic_output, check_suffix
from attnviz.data.capture import Capture
from attnviz.panels import Panel, grid_title
from attnviz.render import FORMATS
from attnviz.render.colors import DEFAULT_CMAP, colormap
from attnviz.render.encode import encode_png, figure_rgb
from attnviz.render.fonts import families_for
from attnviz.render.png import _figure_attribute, fit_title, save_figure, shorten_cells

# matplotlib is imported inside the functions that draw, so that reading a capture never loads it.


@dataclass
class GridFigure:
    """The grid overview: the figure, its one Axes and image, and the composed mosaic (H_px, W_px, 3)."""

    figure: Any
    axes: Any
    image: Any
    mosaic: np.ndarray
    tiles: np.ndarray | None = None  # (H_px, W_px) bool: the heads' pixels (the gaps hold their labels)

    def _repr_png_(self) -> bytes:
        return self.figure._repr_png_()

    def __getattr__(self, name: str):
        """Everything else is the matplotlib Figure's (`savefig`, …)."""
        return _figure_attribute(self, name)


def grid_figure(capture: Capture, panels: Sequence[Panel], layers: Sequence[int], heads: Sequence[int], *,
                cmap: str = DEFAULT_CMAP, panel_px: int = 64, dpi: int = 100,
                labels: dict[tuple[int, int], str] | None = None) -> GridFigure:
    """Every selected layer × head as a small panel on the panels' one colour scale: the static
    counterpart of bertviz's model view. Composed as one image (fast for 144+ heads), shown pixel for
    pixel at `dpi`. `labels`: a word under each head (its pattern label)."""
    from matplotlib import cm, colors
    from attnviz.render.figure import NotebookFigure as Figure

    by_key = {(p.layer, p.head): p for p in panels}
    R, C = panels[0].matrix.shape
    scale = max(1, math.ceil(panel_px / max(R, C)))  # whole pixels per token
    side_h, side_w, gap = R * scale, C * scale, 4
    gap_v = 13 if labels else gap  # room under each row for the heads' labels
    nL, nH = len(layers), len(heads)
    mapping = colormap(cmap)
    chosen = [by_key[layer, head] for layer in layers for head in heads]
    units = np.stack([p.scale.unit(p.matrix) for p in chosen])  # (nL nH, R, C) in [0, 1], each on its scale
    hidden = chosen[0].hidden
    if hidden is not None:
        units = np.ma.masked_where(np.broadcast_to(hidden, units.shape), units)
    tiles = mapping(units, bytes=True)[..., :3]  # (nL nH, R, C, 3)
    tiles = tiles.reshape(nL, nH, R, C, 3).repeat(scale, axis=2).repeat(scale, axis=3)
    if chosen[0].row_split is not None:  # where the prompt ends: a white line in every tile
        tiles[:, :, chosen[0].row_split * scale] = 255
    if chosen[0].col_split is not None:
        tiles[:, :, :, chosen[0].col_split * scale] = 255
    mosaic = np.full((nL, side_h + gap_v, nH, side_w + gap, 3), 255, np.uint8)
    mosaic[:, :side_h, :, :side_w] = tiles.transpose(0, 2, 1, 3, 4)
    inside = np.zeros((nL, side_h + gap_v, nH, side_w + gap), bool)
    inside[:, :side_h, :, :side_w] = True
    keep_rows = nL * (side_h + gap_v) - (0 if labels else gap_v)  # the last row's labels need their gap
    mosaic = mosaic.reshape(nL * (side_h + gap_v), nH * (side_w + gap), 3)[:keep_rows, :-gap]
    inside = inside.reshape(nL * (side_h + gap_v), nH * (side_w + gap))[:keep_rows, :-gap]
    height_px, width_px = mosaic.shape[:2]
    left, bottom, top, right = 0.7, 0.55, 0.6, 1.0  # inches
    fig_w = width_px / dpi + left + right
    title, title_pt = fit_title(grid_title(capture, panels), fig_w - 0.3)  # shrunk, then wrapped: never cut off
    top += math.ceil(title.count("\n") * title_pt * 1.3 / 72 * dpi) / dpi  # whole pixels
    fig_h = height_px / dpi + bottom + top
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    ax = fig.add_axes((left / fig_w, bottom / fig_h, width_px / dpi / fig_w, height_px / dpi / fig_h))
    image = ax.imshow(mosaic, interpolation="nearest", aspect="auto")
    ax.set_xticks([i * (side_w + gap) + side_w / 2 - 0.5 for i in range(nH)], [str(h) for h in heads], fontsize=8)
    ax.set_yticks([i * (side_h + gap_v) + side_h / 2 - 0.5 for i in range(nL)], [str(x) for x in layers], fontsize=8)
    for (r, layer), (c, head) in ((rc, hc) for rc in enumerate(layers) for hc in enumerate(heads)):
        text = (labels or {}).get((layer, head))
        if text:
            ax.text(c * (side_w + gap) + side_w / 2 - 0.5, r * (side_h + gap_v) + side_h + gap_v / 2 - 0.5,
                    shorten_cells(text, max(side_w // 4, 4)), ha="center", va="center", fontsize=6, color="0.25")
    ax.set_xlabel("head", fontsize=9)
    ax.set_ylabel("layer", fontsize=9)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    cax = fig.add_axes(((fig_w - right + 0.15) / fig_w, bottom / fig_h, 0.15 / fig_w, min(height_px / dpi, 4) / fig_h))
    shared = chosen[0].scale if all(p.scale == chosen[0].scale for p in chosen) else None
    bar = fig.colorbar(cm.ScalarMappable(norm=shared.mpl_norm() if shared else colors.Normalize(0, 1), cmap=mapping),
                       cax=cax)
    bar.ax.tick_params(labelsize=7)
    if shared is None:
        bar.set_label("each head from 0 to its own largest weight", fontsize=7)
    fig.suptitle(title, x=0.02, ha="left", y=1 - 0.12 / fig_h, va="top", fontsize=title_pt,
                 fontfamily=families_for(title))
    return GridFigure(fig, ax, image, mosaic, inside)


def save_grid(grid: GridFigure, path: str | Path, *, dpi: int = 100) -> Path:
    """Write the grid. As PNG the labels are drawn by matplotlib and the mosaic pasted in pixel for pixel
    (resampling a large image is most of the time savefig would take); SVG and PDF go through savefig."""

    path = check_suffix(path, FORMATS)
    if path.suffix.lower() != ".png":
        return save_figure(grid.figure, path, dpi=dpi)
    grid.image.set_visible(False)
    try:
        rgb = figure_rgb(grid.figure, dpi).copy()  # (H_px, W_px, 3)
    finally:
        grid.image.set_visible(True)
    box = grid.axes.get_window_extent()
    top, left = int(round(rgb.shape[0] - box.y1)), int(round(box.x0))
    height, width = grid.mosaic.shape[:2]
    if grid.tiles is None:
        rgb[top:top + height, left:left + width] = grid.mosaic
    else:  # only the heads' own pixels: the labels matplotlib drew in the gaps stay
        region = rgb[top:top + height, left:left + width]
        region[grid.tiles] = grid.mosaic[grid.tiles]
    with atomic_output(path) as tmp:
        tmp.write_bytes(encode_png(rgb))
    return path


__all__ = ["GridFigure", "grid_figure", "save_grid"]
