"""Every head as an image, fast: one labelled image per (layer, head) and a head-mean image per layer, for the
export (attnviz.api.gallery writes the folder around them).

Why it is fast: the naive way builds a new figure per head, and laying out ~2T tick labels is most of the
cost. Here one figure is laid out and drawn once, with the image and title hidden (the static layer:
axes, tick labels, colorbar; one colorbar per colour scale); for each head only the colour-mapped α is
written into the axes' pixel rectangle with numpy, the title is pasted from cached pieces, and the frame
is PNG-encoded. Heads are spread over worker processes, which inherit the drawn layout when they are
forked. Vector formats (SVG, PDF) reuse one figure and swap the data, then savefig.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import fields, replace
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np

from attnviz.data.capture import Capture
from attnviz.panels import Panel, Scale, ScaleChoice, attention_panels
from attnviz.render.encode import encode_scanlines, rgb_view, scanlines
from attnviz.render.png import FORMATS as FIGURE_FORMATS, panel_figure

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.

FORMATS = tuple(suffix.lstrip(".") for suffix in FIGURE_FORMATS)  # png, svg, pdf
DEFAULT_DPI = 100
MIN_DPI, MAX_DPI = 20, 600  # a raster image's resolution (the command line's --dpi says the same)
MAX_WORKERS = 1024


def export_panels(capture: Capture, layers: Sequence[int], heads: Sequence[int],
                  scale: ScaleChoice | None = None) -> list[Panel]:
    """What the export draws: per layer its selected heads, then its head mean. With a shared scale the
    per-head panels share one colour scale (the largest weight among them), head means another."""
    per_head = attention_panels(capture, layers, heads, scale=scale)
    means = attention_panels(capture, layers, ["mean"], scale=scale)
    order: dict = {(p.layer, p.head): p for p in per_head + means}
    return [order[layer, head] for layer in dict.fromkeys(p.layer for p in means) for head in [*heads, "mean"]]


class HeadImageWriter:
    """One labelled heatmap layout, drawn once; writes one image per panel by swapping only the matrix and
    the title. Every image matches `render.png.panel_figure(panel)` in size, labels, colorbar and title;
    the matrix is drawn with the same colormap and normalisation. Panels must share shape and labels."""

    def __init__(self, panels: Sequence[Panel], *, cmap: str = "viridis", dpi: int = DEFAULT_DPI, fmt: str = "png",
                 subtitle: str = ""):
        from matplotlib.backends.backend_agg import FigureCanvasAgg


        self.fmt, self.dpi = fmt, dpi
        self._norms: dict = {}
        self.handle = panel_figure(panels[0], cmap=cmap, subtitle=subtitle)
        self.fig = self.handle.figure
        self.fig.set_dpi(dpi)
        self.canvas = FigureCanvasAgg(self.fig)
        self.ax, self.cax = self.handle.axes[0], self.handle.colorbar_axes
        self.image, self.title = self.handle.images[0], self.handle.title
        if fmt == "png":
            self._draw_static_layers(panels[0])

    def _draw_static_layers(self, reference: Panel) -> None:
        """Draw tick labels, frame, axis titles and the small print once, into one frame buffer; the
        colorbar is drawn once per colour scale (its columns cached), the matrix and title per frame."""
        for artist in (self.image, self.title, self.cax):
            artist.set_visible(False)
        self.canvas.draw()  # the costly part: ~2T tick labels
        self.common = self.canvas.copy_from_bbox(self.fig.bbox)
        rgb = np.asarray(self.canvas.buffer_rgba())[..., :3]  # (H_px, W_px, 3)
        self.lines = scanlines(rgb)  # (H_px, 1 + 3 W_px): the frame, ready for the PNG encoder
        self.cax.set_visible(True)
        bar = self.cax.get_window_extent()
        self.bar_cols = slice(max(int(bar.x0) - 2, 0), rgb.shape[1])  # the colorbar, its ticks and label
        self._bars: dict = {}  # Scale -> the colorbar columns' pixels, drawn once per scale (a few kB each)
        self.current_scale: Scale | None = None
        height, width = rgb.shape[:2]
        box = self.ax.get_window_extent()
        # the matrix goes inside the frame: from one pixel in from each spine (the spines stay as drawn)
        self.rows = slice(int(round(height - box.y1)) + 1, int(round(height - box.y0)) - 1)
        self.cols = slice(int(round(box.x0)) + 1, int(round(box.x1)) - 1)
        n_rows, n_cols = self.rows.stop - self.rows.start, self.cols.stop - self.cols.start
        R, C = reference.matrix.shape
        # nearest cell for each pixel (what imshow's "nearest" does), computed once: pixel rows per cell
        # row, and for each byte of a pixel row the byte of the (R, 3C) colour-mapped matrix it copies
        self.row_repeats = np.bincount(np.minimum((np.arange(n_rows) + 0.5) * R / n_rows, R - 1).astype(np.intp),
                                       minlength=R)
        col_cell = np.minimum((np.arange(n_cols) + 0.5) * C / n_cols, C - 1).astype(np.intp)  # (n_cols,)
        self.row_starts = np.concatenate([[0], np.cumsum(self.row_repeats)])  # first pixel row of each cell row
        self.col_starts = np.searchsorted(col_cell, np.arange(C + 1))  # first pixel column of each cell column
        self.col_bytes = (col_cell[:, None] * 3 + np.arange(3)[None, :]).ravel()  # (3 n_cols,)
        # the title strip: from the top of the figure down to just above the axes (display coordinates)
        self.title_rows = slice(0, self.rows.start - 2)
        from matplotlib.transforms import Bbox

        self.title_background = self.canvas.copy_from_bbox(
            Bbox.from_extents(0, height - self.title_rows.stop, width, height))
        self.title.set_visible(True)
        # the title is drawn in two cached pieces, "<model> · layer L · " and "head H", placed where the
        # second would fall in the whole string: L + 2H text draws instead of L × H
        self.suffix = self.fig.text(0, self.title.get_position()[1], "", fontproperties=self.title.get_fontproperties(),
                                    ha="left", va=self.title.get_va(), transform=self.title.get_transform())
        self._strips: dict = {}

    def _strip(self, artist, text: str, x: float | None = None) -> np.ndarray:
        """The title strip with only `text` drawn by `artist` (at figure-fraction x, if given)."""
        self.canvas.restore_region(self.title_background)
        artist.set_text(text)
        if x is not None:
            artist.set_x(x)
        self.fig.draw_artist(artist)
        return np.asarray(self.canvas.buffer_rgba())[self.title_rows, :, :3].copy()

    def title_strip(self, panel: Panel) -> np.ndarray:
        prefix, suffix = panel.title[0], "".join(panel.title[1:])
        if prefix not in self._strips:
            self.title.set_text(prefix)
            width_px = self.title.get_window_extent(self.canvas.get_renderer()).width
            self._strips[prefix] = (self._strip(self.title, prefix), width_px)
        strip, width_px = self._strips[prefix]
        key = (width_px, suffix)
        if key not in self._strips:
            x = self.title.get_position()[0] + width_px / self.fig.bbox.width
            self._strips[key] = self._strip(self.suffix, suffix, x)
        return np.minimum(strip, self._strips[key])  # dark text on white: the two pieces combine exactly

    def _bar(self, scale: Scale) -> np.ndarray:
        """The colorbar columns for `scale`, drawn onto the static layer. (H_px, w, 3)"""
        if scale not in self._bars:
            if len(self._bars) >= 64:  # per-head scales: keep memory small
                self._bars.clear()
            self.canvas.restore_region(self.common)
            self.image.set_norm(self.norm(scale))  # the colorbar follows its mappable
            self.fig.draw_artist(self.cax)
            self._bars[scale] = np.asarray(self.canvas.buffer_rgba())[:, self.bar_cols, :3].copy()
        return self._bars[scale]

    def norm(self, scale: Scale):
        if scale not in self._norms:
            self._norms[scale] = scale.mpl_norm()
        return self._norms[scale]

    def render_scanlines(self, panel: Panel) -> np.ndarray:
        """The finished image of one panel as PNG scanlines: uint8 (H_px, 1 + 3 W_px), filter byte first.
        The buffer is reused by the next call (only the matrix, the colorbar when the scale changes and
        the title change between frames), so encode it before rendering the next panel."""
        lines = self.lines
        frame = rgb_view(lines)  # (H_px, W_px, 3) view
        if panel.scale != self.current_scale:
            frame[:, self.bar_cols] = self._bar(panel.scale)
            self.current_scale = panel.scale
        cells = self.image.cmap(self.norm(panel.scale)(panel.shown), bytes=True)[..., :3]  # (R, C, 3)
        wide = cells.reshape(len(cells), -1)[:, self.col_bytes]  # (R, 3 n_cols): columns widened
        inside = frame[self.rows, self.cols]
        inside[...] = np.repeat(wide, self.row_repeats, axis=0).reshape(inside.shape)
        self._paint_splits(inside, panel)
        frame[self.title_rows] = self.title_strip(panel)
        return lines

    def _paint_splits(self, inside: np.ndarray, panel: Panel) -> None:
        """The prompt/generated line as render.png.draw_splits draws it: 2 white pixels outlined in black."""
        for split, starts, axis in ((panel.row_split, self.row_starts, 0), (panel.col_split, self.col_starts, 1)):
            if split is None:
                continue
            at, size = int(starts[split]), inside.shape[axis]
            for offset, value in ((-2, 0), (1, 0), (-1, 255), (0, 255)):
                if 0 <= at + offset < size:
                    (inside[at + offset] if axis == 0 else inside[:, at + offset])[...] = value

    def render(self, panel: Panel) -> np.ndarray:
        """The finished image of one panel as RGB uint8 (H_px, W_px, 3), a copy of its own."""
        return rgb_view(self.render_scanlines(panel)).copy()

    def write(self, panel: Panel, path: Path) -> None:
        if self.fmt == "png":
            Path(path).write_bytes(encode_scanlines(self.render_scanlines(panel)))
            return
        self.image.set_data(panel.shown)
        self.image.set_norm(self.norm(panel.scale))
        self.title.set_text(panel.title_text)
        self.fig.savefig(path, format=self.fmt, dpi=self.dpi)


# --- worker processes ---------------------------------------------------------------------------------

_writer: HeadImageWriter | None = None  # set in the parent before forking, or by _init_worker when spawning
_panels: list[Panel] = []


def _init_worker(spawned: tuple | None, cmap: str, dpi: int, fmt: str, subtitle: str) -> None:
    """In each worker: Ctrl-C is the parent's to handle; on Linux, die with the parent. A spawned worker
    (no fork on this platform) lays out its own writer from the capture."""
    global _writer, _panels
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it forked
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    _die_with_parent()
    if spawned is not None:
        arrays, layers, heads, scale, prefix = spawned
        _panels = [replace(p, name=prefix + p.name) for p in export_panels(Capture(**arrays), layers, heads, scale)]
        _writer = HeadImageWriter(_panels, cmap=cmap, dpi=dpi, fmt=fmt, subtitle=subtitle)


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the parent exits
    except (OSError, AttributeError):  # not Linux: the parent's terminate() is the only guard
        pass


def _write_chunk(task: tuple[list[int], str, str]) -> int:
    indices, folder, fmt = task
    assert _writer is not None
    for index in indices:
        panel = _panels[index]
        _writer.write(panel, Path(folder) / f"{panel.name}.{fmt}")
    return len(indices)


def worker_count(requested: int, chunks: int) -> int:
    """Never more workers than chunks of work or cores."""
    return max(1, min(requested, chunks, os.cpu_count() or 1))


def render_panels(panels: Sequence[Panel], folder: Path, *, fmt: str = "png", dpi: int = DEFAULT_DPI,
                  cmap: str = "viridis", workers: int = 1, on_done: Callable[[int], None] | None = None,
                  spawn_args: tuple | None = None, subtitle: str = "") -> None:
    """Write one image per panel into `folder` as `<panel.name>.<fmt>`. With several workers the layout is
    drawn once here and inherited by forked workers; where fork is missing, `spawn_args` (capture arrays,
    layers, heads) let each worker rebuild the panels."""
    global _writer, _panels
    # about six chunks per worker, so no worker is left with a long tail; at most 8 panels a chunk
    chunk = max(1, min(8, -(-len(panels) // (6 * max(workers, 1)))))
    chunks = [list(range(i, min(i + chunk, len(panels)))) for i in range(0, len(panels), chunk)]
    workers = worker_count(workers, len(chunks))
    fork = "fork" in multiprocessing.get_all_start_methods()
    _panels = list(panels)
    if workers <= 1 or fork:
        _writer = HeadImageWriter(_panels, cmap=cmap, dpi=dpi, fmt=fmt, subtitle=subtitle)  # laid out once, here
    if workers <= 1:
        for part in chunks:
            done = _write_chunk((part, str(folder), fmt))
            if on_done:
                on_done(done)
        return
    context = multiprocessing.get_context("fork" if fork else "spawn")
    # Ctrl-C or SIGTERM in the middle of fork() would be swallowed by an at-fork hook: hold them until the
    # workers exist (they arrive right after, and the workers unblock them for themselves)
    blocked = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if hasattr(signal, "pthread_sigmask") else None
    try:
        pool = context.Pool(workers, initializer=_init_worker,
                            initargs=(None if fork else spawn_args, cmap, dpi, fmt, subtitle))
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        for done in pool.imap_unordered(_write_chunk, [(part, str(folder), fmt) for part in chunks]):
            if on_done:
                on_done(done)
        pool.close()
    except BaseException:
        pool.terminate()  # Ctrl-C, SIGTERM or an error: no worker outlives the export
        raise
    finally:
        pool.join()


def capture_arrays(capture: Capture) -> dict:
    return {field.name: getattr(capture, field.name) for field in fields(capture)}
