"""Export every head: one labelled image per (layer, head), a head-mean image per layer, a grid overview,
the capture, head statistics (CSV, JSON) and an offline index.html — fast.

Why it is fast: the naive way builds a new figure per head, and laying out ~2T tick labels is most of the
cost. Here one figure is laid out and drawn once, with the image and title hidden (the static layer:
axes, tick labels, colorbar; one colorbar per colour scale); for each head only the colour-mapped α is
written into the axes' pixel rectangle with numpy, the title is pasted from cached pieces, and the frame
is PNG-encoded. Heads are spread over worker processes, which inherit the drawn layout when they are
forked. Vector formats (SVG, PDF) reuse one figure and swap the data, then savefig.
"""

from __future__ import annotations

import csv
import io
import json
import multiprocessing
import os
import shutil
import struct
import tempfile
import zlib
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from attnviz.capture import Capture, current_umask
from attnviz.errors import OutputError
from attnviz.render.png import FORMATS as FIGURE_FORMATS

FORMATS = tuple(suffix.lstrip(".") for suffix in FIGURE_FORMATS)  # png, svg, pdf
# PNG encoding: filter "none" + zlib level 3. Heatmaps are large flat blocks, so filtering buys little; on a
# 1031x961 frame this takes 11 ms and 102 kB, against 34 ms and 75 kB for Pillow's default (level 6).
PNG_COMPRESS_LEVEL = 3
DEFAULT_DPI = 100


def head_filename(layer: int, head: int | str, fmt: str) -> str:
    """layer03_head07.png, or layer03_mean.png for the head mean."""
    return f"layer{layer:02d}_{'mean' if head == 'mean' else f'head{head:02d}'}.{fmt}"


@dataclass(frozen=True)
class Job:
    layer: int
    head: int | str  # an index, or "mean"


class HeadImageWriter:
    """One labelled heatmap layout, drawn once; writes one image per head by swapping only α and title.

    `vmaxes` names the colour scales in use ("head": per-head images, "mean": head means). Every image
    matches `render.png.heatmap_figure(capture, layer, head, vmax=vmaxes[kind])` in size, labels, colorbar
    and title; α is drawn with the same colormap and normalisation."""

    def __init__(self, capture: Capture, *, vmaxes: dict[str, float], cmap: str = "viridis",
                 dpi: int = DEFAULT_DPI, fmt: str = "png"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        from attnviz.render.png import heatmap_figure

        self.capture, self.fmt, self.dpi, self.vmaxes = capture, fmt, dpi, vmaxes
        self.fig = heatmap_figure(capture, 0, 0, cmap=cmap, vmax=max(vmaxes.values()))
        self.fig.set_dpi(dpi)
        self.canvas = FigureCanvasAgg(self.fig)
        self.ax, self.cax = self.fig.axes[0], self.fig.axes[1]
        self.image = self.ax.images[0]
        self.title = self.fig._suptitle
        T = capture.n_tokens
        self.mask = np.triu(np.ones((T, T), bool), k=1) if capture.causal else None
        if fmt == "png":
            self._draw_static_layers()

    def _draw_static_layers(self) -> None:
        """Draw tick labels, frame and axis titles once; then the colorbar once per colour scale."""
        from matplotlib.transforms import Bbox

        for artist in (self.image, self.title, self.cax):
            artist.set_visible(False)
        self.canvas.draw()  # the costly part: ~2T tick labels
        common = self.canvas.copy_from_bbox(self.fig.bbox)
        self.cax.set_visible(True)
        self.backgrounds = {}
        for kind, vmax in self.vmaxes.items():
            self.canvas.restore_region(common)
            self.image.set_clim(0.0, vmax)  # the colorbar follows its mappable
            self.fig.draw_artist(self.cax)
            rgb = np.asarray(self.canvas.buffer_rgba())[..., :3]  # (H_px, W_px, 3)
            self.backgrounds[kind] = scanlines(rgb)  # (H_px, 1 + 3 W_px), ready for the PNG encoder
        height, width = rgb.shape[:2]
        box = self.ax.get_window_extent()
        # α goes inside the frame: from one pixel in from each spine (the spines stay as drawn)
        self.rows = slice(int(round(height - box.y1)) + 1, int(round(height - box.y0)) - 1)
        self.cols = slice(int(round(box.x0)) + 1, int(round(box.x1)) - 1)
        n_rows, n_cols = self.rows.stop - self.rows.start, self.cols.stop - self.cols.start
        T = self.capture.n_tokens
        # nearest cell for each pixel (what imshow's "nearest" does), computed once: pixel rows per cell
        # row, and for each byte of a pixel row the byte of the (T, 3T) colour-mapped matrix it copies
        self.row_repeats = np.bincount(np.minimum((np.arange(n_rows) + 0.5) * T / n_rows, T - 1).astype(np.intp),
                                       minlength=T)
        col_cell = np.minimum((np.arange(n_cols) + 0.5) * T / n_cols, T - 1).astype(np.intp)  # (n_cols,)
        self.col_bytes = (col_cell[:, None] * 3 + np.arange(3)[None, :]).ravel()  # (3 n_cols,)
        # the title strip: from the top of the figure down to just above the axes (display coordinates)
        self.title_rows = slice(0, self.rows.start - 2)
        self.title_background = self.canvas.copy_from_bbox(
            Bbox.from_extents(0, height - self.title_rows.stop, width, height))
        self.title.set_visible(True)
        # the title is drawn in two cached pieces, "<model> · layer L · " and "head H", placed where the
        # second would fall in the whole string: L + 2H text draws instead of L × H
        self.suffix = self.fig.text(0, self.title.get_position()[1], "", fontproperties=self.title.get_fontproperties(),
                                    ha="left", va=self.title.get_va(), transform=self.title.get_transform())
        self._strips: dict = {}

    def title_text(self, job: Job) -> str:
        return self.title_prefix(job.layer) + self.title_suffix(job.head)

    def title_prefix(self, layer: int) -> str:
        from attnviz.render.png import short_model

        return f"{short_model(self.capture)} · layer {layer} · "

    def title_suffix(self, head: int | str) -> str:
        from attnviz.render.png import head_label

        return head_label(self.capture, head)

    def _strip(self, artist, text: str, x: float | None = None) -> np.ndarray:
        """The title strip with only `text` drawn by `artist` (at figure-fraction x, if given)."""
        self.canvas.restore_region(self.title_background)
        artist.set_text(text)
        if x is not None:
            artist.set_x(x)
        self.fig.draw_artist(artist)
        return np.asarray(self.canvas.buffer_rgba())[self.title_rows, :, :3].copy()

    def title_strip(self, job: Job) -> np.ndarray:
        prefix = self.title_prefix(job.layer)
        if prefix not in self._strips:
            self.title.set_text(prefix)
            width_px = self.title.get_window_extent(self.canvas.get_renderer()).width
            self._strips[prefix] = (self._strip(self.title, prefix), width_px)
        strip, width_px = self._strips[prefix]
        key = (width_px, job.head)
        if key not in self._strips:
            x = self.title.get_position()[0] + width_px / self.fig.bbox.width
            self._strips[key] = self._strip(self.suffix, self.title_suffix(job.head), x)
        return np.minimum(strip, self._strips[key])  # dark text on white: the two pieces combine exactly

    def scale(self, job: Job) -> str:
        return "mean" if job.head == "mean" and "mean" in self.vmaxes else "head"

    def render_scanlines(self, job: Job) -> np.ndarray:
        """The finished image of one head as PNG scanlines: uint8 (H_px, 1 + 3 W_px), filter byte first."""
        from matplotlib import colors

        alpha = self.capture.head_matrix(job.layer, job.head)  # (T, T)
        shown = np.ma.masked_where(self.mask, alpha) if self.mask is not None else alpha
        norm = colors.Normalize(0.0, self.vmaxes[self.scale(job)])
        cells = self.image.cmap(norm(shown), bytes=True)[..., :3]  # (T, T, 3), matplotlib's own mapping
        lines = self.backgrounds[self.scale(job)].copy()
        frame = rgb_view(lines)  # (H_px, W_px, 3) view
        wide = cells.reshape(len(cells), -1)[:, self.col_bytes]  # (T, 3 n_cols): columns widened
        frame[self.rows, self.cols] = np.repeat(wide, self.row_repeats, axis=0).reshape(frame[self.rows, self.cols].shape)
        frame[self.title_rows] = self.title_strip(job)
        return lines

    def render(self, job: Job) -> np.ndarray:
        """The finished image of one head as RGB uint8 (H_px, W_px, 3)."""
        return rgb_view(self.render_scanlines(job))

    def write(self, job: Job, path: Path) -> None:
        if self.fmt == "png":
            Path(path).write_bytes(encode_scanlines(self.render_scanlines(job)))
            return
        alpha = self.capture.head_matrix(job.layer, job.head)
        self.image.set_data(np.ma.masked_where(self.mask, alpha) if self.mask is not None else alpha)
        self.image.set_clim(0.0, self.vmaxes[self.scale(job)])
        self.title.set_text(self.title_text(job))
        self.fig.savefig(path, format=self.fmt, dpi=self.dpi)


def scanlines(rgb: np.ndarray) -> np.ndarray:
    """RGB uint8 (H, W, 3) -> PNG scanlines (H, 1 + 3W): each row is filter byte 0 ("none"), then its pixels."""
    height, width, _ = rgb.shape
    lines = np.zeros((height, 1 + 3 * width), np.uint8)
    lines[:, 1:] = rgb.reshape(height, 3 * width)
    return lines


def rgb_view(lines: np.ndarray) -> np.ndarray:
    """The (H, W, 3) pixels of PNG scanlines, as a view: writing to it writes the scanlines."""
    return lines[:, 1:].reshape(len(lines), -1, 3)


def encode_scanlines(lines: np.ndarray, level: int = PNG_COMPRESS_LEVEL) -> bytes:
    """A PNG file (8-bit truecolour, no interlace) from scanlines made by `scanlines`."""
    height, width = len(lines), (lines.shape[1] - 1) // 3

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(lines, level))
            + chunk(b"IEND", b""))


def encode_png(rgb: np.ndarray, level: int = PNG_COMPRESS_LEVEL) -> bytes:
    """A PNG file of an RGB uint8 image (H, W, 3)."""
    return encode_scanlines(scanlines(rgb), level)


# --- worker processes ---------------------------------------------------------------------------------

_writer: HeadImageWriter | None = None  # set in the parent before forking, or by _init_worker when spawning


def _init_worker(capture_arrays: dict | None, vmaxes: dict, cmap: str, dpi: int, fmt: str) -> None:
    global _writer
    if capture_arrays is not None:
        _writer = HeadImageWriter(Capture(**capture_arrays), vmaxes=vmaxes, cmap=cmap, dpi=dpi, fmt=fmt)


def _write_chunk(jobs: Sequence[Job], folder: str, fmt: str) -> int:
    for job in jobs:
        _writer.write(job, Path(folder) / head_filename(job.layer, job.head, fmt))
    return len(jobs)


def render_heads(capture: Capture, jobs: Sequence[Job], folder: Path, *, fmt: str = "png", dpi: int = DEFAULT_DPI,
                 cmap: str = "viridis", workers: int = 1, on_done: Callable[[int], None] | None = None) -> None:
    """Write one image per job into `folder`. Per-head images share one colour scale (the largest weight
    among them); head-mean images share another."""
    global _writer
    vmaxes = {}
    for kind, selected in (("head", [j for j in jobs if j.head != "mean"]), ("mean", [j for j in jobs if j.head == "mean"])):
        if selected:
            vmaxes[kind] = max(float(capture.head_matrix(j.layer, j.head).max()) for j in selected)
    chunk = max(1, min(16, len(jobs) // (4 * max(workers, 1))))
    chunks = [jobs[i:i + chunk] for i in range(0, len(jobs), chunk)]
    fork = "fork" in multiprocessing.get_all_start_methods()
    if workers <= 1 or len(chunks) == 1 or fork:
        _writer = HeadImageWriter(capture, vmaxes=vmaxes, cmap=cmap, dpi=dpi, fmt=fmt)  # laid out once, here
    if workers <= 1 or len(chunks) == 1:
        for part in chunks:
            done = _write_chunk(part, str(folder), fmt)
            if on_done:
                on_done(done)
        return
    # forked workers inherit the laid-out writer; spawned ones lay out their own
    initargs = (None if fork else _capture_arrays(capture), vmaxes, cmap, dpi, fmt)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork" if fork else "spawn"),
                             initializer=_init_worker, initargs=initargs) as pool:
        futures = [pool.submit(_write_chunk, part, str(folder), fmt) for part in chunks]
        try:
            for future in as_completed(futures):
                done = future.result()
                if on_done:
                    on_done(done)
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _capture_arrays(capture: Capture) -> dict:
    return {field.name: getattr(capture, field.name) for field in fields(capture)}


# --- the whole export -----------------------------------------------------------------------------------


def plan(layers: Sequence[int], heads: Sequence[int]) -> list[Job]:
    """Per layer: its selected heads, then its head mean."""
    return [Job(layer, head) for layer in layers for head in [*heads, "mean"]]


def export(capture: Capture, target: str | os.PathLike, *, layers: Sequence[int], heads: Sequence[int],
           fmt: str = "png", dpi: int = DEFAULT_DPI, cmap: str = "viridis", workers: int = 1, force: bool = False,
           on_total: Callable[[int], None] | None = None, on_done: Callable[[int], None] | None = None) -> Path:
    """Write the export folder atomically: everything goes into a temporary folder beside `target`,
    which replaces `target` only when complete. A non-empty `target` is refused unless `force`."""
    from attnviz.metrics import head_stats
    from attnviz.render.html import gallery_html
    from attnviz.render.png import grid_figure, save_figure

    if fmt not in FORMATS:
        raise OutputError(f"unknown format {fmt!r}: use {', '.join(FORMATS)}")
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise OutputError(f"{target} exists and is not a folder")
    check_target(target, force)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent))
    except OSError as exc:
        raise OutputError(f"cannot write to {target.parent}: {exc.strerror or exc}") from None
    try:
        jobs = plan(layers, heads)
        if on_total:
            on_total(len(jobs) + 1)
        render_heads(capture, jobs, staging, fmt=fmt, dpi=dpi, cmap=cmap, workers=workers, on_done=on_done)
        grid_name = f"grid.{fmt}"
        save_figure(grid_figure(capture, layers, heads, cmap=cmap), staging / grid_name, dpi=dpi)
        capture.save(staging / "attention.npz")
        stats = [s.as_dict() for s in head_stats(capture) if s.layer in set(layers) and s.head in set(heads)]
        write_stats(stats, staging)
        (staging / "index.html").write_text(gallery_html(capture, layers, heads, stats, fmt, grid_name),
                                            encoding="utf-8")
        if on_done:
            on_done(1)
        _replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def check_target(target: Path, force: bool) -> None:
    """A non-empty target is refused; with force, only one that an earlier export made is replaced
    (so --force never deletes a folder of the user's own)."""
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not force:
        raise OutputError(f"{target} is not empty; pass --force to replace it")
    if not ((target / "index.html").is_file() and (target / "attention.npz").is_file()):
        raise OutputError(f"{target} is not an attnviz export (no index.html and attention.npz); "
                          f"refusing to replace it even with --force")


def write_stats(stats: list[dict], folder: Path) -> None:
    with open(folder / "heads.json", "w", encoding="utf-8") as fh:
        json.dump(stats, fh, indent=1, ensure_ascii=False)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(stats[0]) if stats else [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(stats)
    (folder / "heads.csv").write_text(buffer.getvalue(), encoding="utf-8")


def _replace(staging: Path, target: Path) -> None:
    """Move the finished staging folder onto target; an old target is removed only after that succeeds."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError as exc:
        if old is not None:
            os.replace(old, target)
        raise OutputError(f"cannot create {target}: {exc.strerror or exc}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _chmod_folder(target)


def _chmod_folder(folder: Path) -> None:
    """mkdtemp makes the folder 0700; give it the usual mode."""
    os.chmod(folder, 0o777 & ~current_umask())
