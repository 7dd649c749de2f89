"""A page over a sound drawn as one figure: the log-mel spectrogram on top, time in seconds along the bottom,
and under it each panel with the same time axis (cross-attention: a row per token written; the encoder: time
against time; word timings: the alignment matrix, its path, each word's span). Imports matplotlib."""

from __future__ import annotations

import numpy as np

from attnviz.panels import Page
from attnviz.render.colors import DEFAULT_CMAP
from attnviz.render.fonts import families_for
from attnviz.render.png import fit_title, HeatmapFigure, NOTE_PT, panel_on, wrap_text

MEL_CMAP = "magma"
MAX_ROW_LABELS = 60  # more rows than this: every k-th label


def sound_figure(page: Page, *, cmap: str = DEFAULT_CMAP, ax=None) -> HeatmapFigure:
    """The figure of a page whose panels' columns are the frames of `page.spectrogram` (with `ax`: the first
    panel drawn on it, panel_on)."""
    if ax is not None:
        return panel_on(page.panels[0], ax, cmap=cmap, title=page.title, text=page.text)
    from attnviz.render.figure import NotebookFigure as Figure

    assert page.spectrogram is not None
    mel = page.spectrogram
    seconds = mel.shape[1] / 2 * page.frame_seconds
    families = families_for(page.text)
    width = min(max(7.0, 3.0 * seconds + 2.5), 16.0)
    spec_h = 1.4
    heights = []
    for panel in page.panels:
        R = panel.matrix.shape[0]
        heights.append(min(max(1.6, 0.18 * min(R, MAX_ROW_LABELS) + 0.6), 6.0) if panel.row_axis != "query frame (s)"
                       else min(width - 2.5, 5.0))
    title, title_pt = fit_title(page.title, width - 0.3)
    notes = wrap_text(" · ".join(page.notes), width - 0.3)
    header = 0.2 + (title.count("\n") + 1) * title_pt * 1.3 / 72 + (0.22 if page.subtitle else 0) + \
        (notes.count("\n") + 1) * 0.16 + (0.3 if page.words else 0.1)
    gap = 0.55
    fig_h = header + spec_h + sum(h + gap for h in heights) + 0.35
    fig = Figure(figsize=(width, fig_h), dpi=100)
    left, plot_w = 1.6, width - 2.6
    y = fig_h - header - spec_h
    spec_ax = fig.add_axes((left / width, y / fig_h, plot_w / width, spec_h / fig_h))
    spec_ax.imshow(mel, origin="lower", aspect="auto", cmap=MEL_CMAP, extent=(0, seconds, 0, mel.shape[0]),
                   interpolation="nearest")
    spec_ax.set_ylabel("mel bin", fontsize=8)
    spec_ax.tick_params(labelsize=7, labelbottom=False)
    for word, start, end in page.words:  # each word's span, named above the spectrogram
        spec_ax.axvline(start, color="white", linewidth=0.8, alpha=0.9)
        spec_ax.text((start + end) / 2, mel.shape[0] * 1.02, word, ha="center", va="bottom", fontsize=8,
                     fontfamily=families, clip_on=False)
    axes, images = [], []
    bar_axes = []
    for panel, h in zip(page.panels, heights):
        y -= h + gap
        ax = fig.add_axes((left / width, y / fig_h, plot_w / width, h / fig_h), sharex=spec_ax)
        R, C = panel.matrix.shape
        span = C * page.frame_seconds
        square = panel.row_axis == "query frame (s)"
        extent = (0, span, span, 0) if square else (0, span, R, 0)
        image = ax.imshow(panel.matrix, aspect="auto", cmap=cmap, extent=extent, interpolation="nearest",
                          norm=panel.scale.mpl_norm())
        if not square:
            step = max(1, -(-R // MAX_ROW_LABELS))
            ax.set_yticks(np.arange(0, R, step) + 0.5)
            ax.set_yticklabels(panel.rows[::step], fontsize=7, fontfamily=families)
        else:
            ax.tick_params(axis="y", labelsize=7)
        if panel.path is not None:
            rows, cols = panel.path
            ax.plot((cols + 0.5) * page.frame_seconds, rows + 0.5, color="#00e5ff", linewidth=1.2)
        ax.set_ylabel(panel.row_axis, fontsize=8)
        ax.set_xlim(0, seconds)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(panel.short if len(page.panels) > 1 else "", fontsize=9, fontfamily=families)
        cax = fig.add_axes(((left + plot_w + 0.15) / width, y / fig_h, 0.12 / width, h / fig_h))
        bar = fig.colorbar(image, cax=cax)
        bar.ax.tick_params(labelsize=7)
        bar.set_label(panel.scale.label, fontsize=7)
        bar_axes.append(cax)
        axes.append(ax)
        images.append(image)
    if axes:
        axes[-1].set_xlabel("time (s)", fontsize=8)
    top = 1 - 0.12 / fig_h
    title_artist = fig.suptitle(title, x=0.02, y=top, ha="left", va="top", fontsize=title_pt, fontfamily=families)
    top -= (title.count("\n") + 1) * title_pt * 1.3 / 72 / fig_h
    if page.subtitle:
        fig.text(0.02, top, page.subtitle, ha="left", va="top", fontsize=9, color="0.3", fontfamily=families)
        top -= 0.22 / fig_h
    fig.text(0.02, top, notes, ha="left", va="top", fontsize=NOTE_PT, color="0.4", fontfamily=families)
    return HeatmapFigure(fig, axes, bar_axes[0] if bar_axes else None, images, title_artist)
