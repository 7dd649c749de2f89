"""Attention heatmaps as matplotlib figures (PNG, SVG, PDF). No pyplot: every figure is an explicit
`matplotlib.figure.Figure`, laid out in inches so that labels stay legible from T=8 to T=128+.

`heatmap(...)` draws one (T, T) matrix on an Axes you give it and returns that Axes (seaborn-style).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from attnviz.capture import Capture, HeadSpec, atomic_output, check_suffix
from attnviz.render.fonts import families_for

FORMATS = (".png", ".svg", ".pdf")
DEFAULT_CMAP = "viridis"
MAX_MATRIX_IN = 16.0  # a single heatmap's matrix is never wider than this (inches)
MIN_FONT_PT = 5.0  # below this, labels are thinned (every k-th token) instead of shrunk


@dataclass(frozen=True)
class LabelLayout:
    """Cell size and label font for a T x T matrix."""

    cell_in: float  # inches per cell
    fontsize: float  # points
    step: int  # label every step-th token

    @classmethod
    def for_tokens(cls, T: int, *, target_in: float = 7.0, min_cell: float = 0.13, max_cell: float = 0.5,
                   max_side: float = MAX_MATRIX_IN) -> "LabelLayout":
        cell = min(max(target_in / T, min_cell), max_cell)
        cell = min(cell, max_side / T)
        fit = cell * 72 * 0.8  # the font size whose line height fills a cell
        if fit >= MIN_FONT_PT:
            return cls(cell, min(fit, 11.0), 1)
        return cls(cell, MIN_FONT_PT, math.ceil(MIN_FONT_PT / fit))

    def label_extent_in(self, labels: Sequence[str]) -> float:
        """Inches needed beside the matrix for the longest label."""
        longest = max((len(s) for s in labels), default=1)
        return min(longest, 14) * self.fontsize * 0.62 / 72 + 0.12


def colormap(name: str):
    from matplotlib import colormaps

    try:
        return colormaps[name].with_extremes(bad="#f2f2f2")
    except KeyError:
        from attnviz.errors import SelectionError

        raise SelectionError(f"unknown colormap {name!r}; try viridis, magma, Blues or any matplotlib name") from None


def heatmap(alpha: np.ndarray, row_labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
            *, ax, cmap: str = DEFAULT_CMAP, vmin: float = 0.0, vmax: float | None = None,
            mask_upper: bool = False, fontsize: float | None = None, step: int = 1, cbar_ax=None,
            families: Sequence[str] | None = None):
    """Draw α (T_q, T_k) on `ax`: query rows, key columns, token tick labels. Returns `ax`.

    mask_upper hides j > i (causal models: those weights are 0 by construction).
    cbar_ax, if given, receives a colorbar for the image."""
    alpha = np.asarray(alpha, dtype=np.float32)
    shown = np.ma.masked_where(np.triu(np.ones(alpha.shape, bool), k=1), alpha) if mask_upper else alpha
    vmax = float(alpha.max()) if vmax is None else vmax
    image = ax.imshow(shown, cmap=colormap(cmap), vmin=vmin, vmax=max(vmax, vmin + 1e-9),
                      interpolation="nearest", aspect="auto")
    _set_tick_labels(ax, row_labels, col_labels, fontsize=fontsize or 9.0, step=step, families=families)
    if cbar_ax is not None:
        bar = ax.figure.colorbar(image, cax=cbar_ax)
        bar.ax.tick_params(labelsize=8)
        bar.set_label("attention weight α", fontsize=8)
    return ax


def _set_tick_labels(ax, row_labels, col_labels, *, fontsize: float, step: int, families) -> None:
    font = dict(fontsize=fontsize, fontfamily=list(families) if families else None)
    for labels, set_ticks, set_labels in ((col_labels, ax.set_xticks, ax.set_xticklabels),
                                          (row_labels, ax.set_yticks, ax.set_yticklabels)):
        if labels is None:
            set_ticks([])
            continue
        positions = list(range(0, len(labels), step))
        set_ticks(positions)
        set_labels([labels[i] for i in positions], **font)
    ax.tick_params(axis="x", labelrotation=90, length=2, pad=2)
    ax.tick_params(axis="y", length=2, pad=2)


def head_label(capture: Capture, head: HeadSpec) -> str:
    if head == "mean":
        return f"mean of {capture.n_heads} heads"
    if head == "max":
        return f"max over {capture.n_heads} heads"
    return f"head {capture.head_index(head)}"


def short_model(capture: Capture) -> str:
    return capture.model.rstrip("/").split("/")[-1]


def heatmap_figure(capture: Capture, layer: int = -1, head: HeadSpec = "mean", *, hide_special: bool = False,
                   cmap: str = DEFAULT_CMAP, vmax: float | None = None):
    """One labelled heatmap of one layer: a Figure with the matrix, token labels, colorbar, title."""
    return layers_figure(capture, [layer], head, hide_special=hide_special, cmap=cmap, vmax=vmax)


def layers_figure(capture: Capture, layers: Sequence[int], head: HeadSpec = "mean", *,
                  hide_special: bool = False, cmap: str = DEFAULT_CMAP, vmax: float | None = None):
    """A panel per layer (same head choice in each), one shared colour scale and colorbar."""
    from matplotlib.figure import Figure

    layers = [capture.layer_index(layer) for layer in layers]
    keep = capture.keep_mask(hide_special)
    tokens = [t for t, k in zip(capture.tokens, keep) if k]
    mats = [capture.head_matrix(layer, head)[np.ix_(keep, keep)] for layer in layers]  # n x (T', T')
    vmax = max(float(m.max()) for m in mats) if vmax is None else vmax
    T = len(tokens)
    many = len(layers) > 1
    lay = LabelLayout.for_tokens(T, target_in=4.0 if many else 7.0, max_side=7.0 if many else MAX_MATRIX_IN)
    families = families_for("".join(tokens) + capture.model)
    label_in = lay.label_extent_in(tokens)
    side = lay.cell_in * T
    ncols = 1 if not many else min(len(layers), 3 if len(layers) <= 9 else 4)
    nrows = math.ceil(len(layers) / ncols)
    pad_l, pad_b, top = label_in + 0.3, label_in + 0.3, (0.45 if many else 0.1)
    panel_w, panel_h = pad_l + side + 0.25, pad_b + side + top
    header, cbar_w = 0.45, 1.0
    fig_w, fig_h = ncols * panel_w + cbar_w, nrows * panel_h + header
    fig = Figure(figsize=(fig_w, fig_h), dpi=100)
    for n, (layer, mat) in enumerate(zip(layers, mats)):
        r, c = divmod(n, ncols)
        x0 = c * panel_w + pad_l
        y0 = fig_h - header - (r + 1) * panel_h + pad_b
        ax = fig.add_axes((x0 / fig_w, y0 / fig_h, side / fig_w, side / fig_h))
        heatmap(mat, tokens, tokens, ax=ax, cmap=cmap, vmax=vmax, mask_upper=capture.causal,
                fontsize=lay.fontsize, step=lay.step, families=families)
        if many:
            ax.set_title(f"layer {layer}", fontsize=10)
        if c == 0:
            ax.set_ylabel("query (attending)", fontsize=8)
        if r == nrows - 1 or n + ncols >= len(layers):
            ax.set_xlabel("key (attended to)", fontsize=8)
    cbar_h = min(fig_h - header - 0.6, max(side, 2.0))
    cax = fig.add_axes(((fig_w - cbar_w + 0.15) / fig_w, (fig_h - header - cbar_h - top) / fig_h,
                        0.18 / fig_w, cbar_h / fig_h))
    bar = fig.colorbar(fig.axes[0].images[0], cax=cax)
    bar.ax.tick_params(labelsize=8)
    bar.set_label("attention weight α", fontsize=8)
    title = f"{short_model(capture)} · " + (f"layer {layers[0]} · " if not many else "") + head_label(capture, head)
    if hide_special:
        title += " · special tokens hidden"
    fig.suptitle(title, x=0.02, y=1 - 0.12 / fig_h, ha="left", va="top", fontsize=11, fontfamily=families)
    return fig


def save_figure(fig, path: str | Path, *, dpi: int = 150) -> Path:
    """Write `fig` in the format its suffix names (.png, .svg, .pdf), atomically."""
    path = check_suffix(path, FORMATS)
    suffix = path.suffix.lower()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format=suffix[1:], dpi=dpi, metadata=_metadata(suffix))
    return path


def _metadata(suffix: str) -> dict:
    from attnviz import __version__

    software = f"attnviz {__version__}"
    return {"Software": software} if suffix == ".png" else {"Creator": software}


def scaling_figure(rows, T: int, d_k: int, model: str):
    """Mean softmax entropy per layer with raw logits Q·Kᵀ and with Q·Kᵀ/√d_k, beside ln T."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    layers = [r.layer for r in rows]
    ax.plot(layers, [r.entropy_scaled for r in rows], "o-", label="softmax(QKᵀ/√d_k)  (what the model does)")
    ax.plot(layers, [r.entropy_raw for r in rows], "s--", label="softmax(QKᵀ)  (no scaling)")
    ax.axhline(math.log(T), color="grey", linestyle=":", label=f"uniform: ln T = {math.log(T):.2f}")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention entropy (nats)")
    ax.set_xticks(layers)
    ax.set_ylim(0, math.log(T) * 1.08)
    ax.set_title(f"{model.split('/')[-1]}: why divide by √d_k (d_k = {d_k}, T = {T})", fontsize=10)
    fig.legend(fontsize=8, loc="outside lower center", ncols=2, frameon=False)
    return fig


def entropy_figure(values, uniform: float, model: str):
    """Layers × heads of mean entropy (nats) as an annotated heatmap on [0, ln T]."""
    from matplotlib.figure import Figure

    L, H = values.shape
    fig = Figure(figsize=(1.2 + 0.55 * H, 1.2 + 0.45 * L), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    heatmap(values, [str(n) for n in range(L)], [str(n) for n in range(H)], ax=ax, vmax=uniform, fontsize=8)
    ax.tick_params(axis="x", labelrotation=0)
    for (layer, head), v in np.ndenumerate(values):
        ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=6.5,
                color="white" if v < 0.6 * uniform else "black")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    bar = fig.colorbar(ax.images[0], ax=ax, shrink=0.9)
    bar.set_label(f"entropy, nats (ln T = {uniform:.2f} is uniform)", fontsize=8)
    ax.set_title(f"{model.split('/')[-1]}: mean attention entropy per head", fontsize=10)
    return fig


def rollout_figure(matrix, tokens: Sequence[str], model: str):
    """Attention rollout (T, T) with token labels."""
    from matplotlib.figure import Figure

    T = len(tokens)
    lay = LabelLayout.for_tokens(T)
    families = families_for("".join(tokens))
    label_in = lay.label_extent_in(tokens)
    side = lay.cell_in * T
    fig = Figure(figsize=(label_in + side + 1.6, label_in + side + 0.9), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    heatmap(matrix, tokens, tokens, ax=ax, fontsize=lay.fontsize, step=lay.step, families=families)
    ax.set_xlabel("input token")
    ax.set_ylabel("position at the top layer")
    fig.colorbar(ax.images[0], ax=ax, shrink=0.8).set_label("rolled-out attention", fontsize=8)
    ax.set_title(f"{model.split('/')[-1]}: attention rollout (Abnar & Zuidema 2020)", fontsize=10)
    return fig


def grid_figure(capture: Capture, layers: Sequence[int], heads: Sequence[int], *, cmap: str = DEFAULT_CMAP,
                panel_px: int = 64, dpi: int = 100):
    """Every selected layer × head as a small panel, one shared colour scale: the static counterpart of
    bertviz's model view. The panels are composed as one image (fast for 144+ heads)."""
    from matplotlib import cm, colors
    from matplotlib.figure import Figure

    T = capture.n_tokens
    scale = max(1, math.ceil(panel_px / T))  # whole pixels per token
    side, gap = T * scale, 4
    vmax = max(float(capture.attentions[np.ix_(layers, heads)].max()), 1e-9)
    norm, mapping = colors.Normalize(0.0, vmax), colormap(cmap)
    mask = np.triu(np.ones((T, T), bool), k=1) if capture.causal else np.zeros((T, T), bool)
    nL, nH = len(layers), len(heads)
    mosaic = np.full((nL * (side + gap) - gap, nH * (side + gap) - gap, 3), 255, np.uint8)
    for r, layer in enumerate(layers):
        shown = np.ma.masked_where(np.broadcast_to(mask, capture.attentions[layer].shape), capture.attentions[layer])
        rgb = mapping(norm(shown), bytes=True)[..., :3]  # (H, T, T, 3)
        for c, head in enumerate(heads):
            panel = rgb[head].repeat(scale, axis=0).repeat(scale, axis=1)  # (side, side, 3)
            y, x = r * (side + gap), c * (side + gap)
            mosaic[y:y + side, x:x + side] = panel
    height_px, width_px = mosaic.shape[:2]
    left, bottom, top, right = 0.7, 0.55, 0.6, 1.0  # inches
    fig_w, fig_h = width_px / dpi + left + right, height_px / dpi + bottom + top
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    ax = fig.add_axes((left / fig_w, bottom / fig_h, width_px / dpi / fig_w, height_px / dpi / fig_h))
    ax.imshow(mosaic, interpolation="nearest", aspect="auto")
    centres = lambda n: [i * (side + gap) + side / 2 - 0.5 for i in range(n)]  # noqa: E731
    ax.set_xticks(centres(nH), [str(h) for h in heads], fontsize=8)
    ax.set_yticks(centres(nL), [str(layer) for layer in layers], fontsize=8)
    ax.set_xlabel("head", fontsize=9)
    ax.set_ylabel("layer", fontsize=9)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    cax = fig.add_axes(((fig_w - right + 0.15) / fig_w, bottom / fig_h, 0.15 / fig_w, min(height_px / dpi, 4) / fig_h))
    bar = fig.colorbar(cm.ScalarMappable(norm=norm, cmap=mapping), cax=cax)
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(f"{short_model(capture)} · every head · T = {T} · one colour scale (0–{vmax:.2f})",
                 x=0.02, ha="left", y=1 - 0.12 / fig_h, va="top", fontsize=10)
    return fig
