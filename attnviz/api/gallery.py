"""attnviz export: every head as an image, a head-mean image per layer, a grid overview, the capture, head
statistics (CSV, JSON) and an offline index.html, written as one folder atomically. The images are drawn by
attnviz.render.heads (fast: one layout, the pixels swapped per head, over worker processes)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from attnviz.api.capturing import attention_of
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.options import renamed
from attnviz.base.files import MANIFEST, write_folder
from attnviz.base.selection import selection
from attnviz.base.records import to_csv, to_json
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.errors import InputError, OutputError, SelectionError, UsageError, arg
from attnviz.metrics import head_records
from attnviz.panels import ScaleChoice, text_subtitle
from attnviz.progress import Reporter
from attnviz.render.gallery import Section, gallery_html
from attnviz.render.heads import (DEFAULT_DPI, FORMATS, HeadImageWriter, MAX_DPI, MAX_WORKERS, MIN_DPI, capture_arrays,
                                  export_panels, render_panels, worker_count)
from attnviz.render.grid import grid_figure, save_grid
from attnviz.render.viewer import viewer_data, viewer_fragment

__all__ = ["export", "Gallery", "ExportPart", "FORMATS", "MANIFEST", "HeadImageWriter", "export_panels",
           "render_panels", "worker_count"]


# --- the whole export -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportPart:
    """What one section of an export draws: a capture (an encoder-decoder model's part, or the whole
    capture), its layers and heads, and the prefix of its file names ("cross_" or "")."""

    capture: Capture
    layers: Sequence[int]
    heads: Sequence[int]
    prefix: str = ""

    @property
    def images(self) -> int:
        return len(self.layers) * (len(self.heads) + 1)


def _indices(chosen: Sequence[int] | None, count: int, name: str) -> list[int]:
    if chosen is None:
        return list(range(count))
    if not chosen or not all(-count <= i < count for i in chosen):
        raise SelectionError(f"{arg(name)} takes indices from 0 to {count - 1} (or -1 for the last); got "
                             f"{str(list(chosen))[:60]}", name)
    return sorted({i % count for i in chosen})


@dataclass(frozen=True, eq=False)
class Gallery(Result, os.PathLike):
    """An export folder, written: `path` (symbolic links resolved), the images drawn and the grid overviews. It
    is a path too (os.fspath, `/`, ==), as export() returned before it returned this."""

    command: ClassVar[str] = "export"
    path: Path
    images: int
    grids: tuple[str, ...]

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, other: Any) -> Path:
        return self.path / other

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Gallery):
            return self.path == other.path
        return isinstance(other, (str, os.PathLike)) and Path(other) == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __getattr__(self, name: str) -> Any:  # the rest of pathlib.Path's (iterdir, name, …)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.path, name)

    def __str__(self) -> str:
        return str(self.path)

    def to_dict(self) -> dict:
        """What `attnviz export --json` prints: the folder and what it holds."""
        return {"folder": str(self.path), "images": self.images, "grids": list(self.grids),
                "files": ["attention.npz", "heads.csv", "heads.json", "index.html"]}

    def report(self, **style: Any) -> list:
        return [Line(f"{self.path}  ({self.images} images, {', '.join(self.grids)}, attention.npz, heads.csv, "
                     f"heads.json, index.html)", wrap=False)]


def _chosen(value: Any, count: int, name: str) -> list[int]:
    """Layers or heads to draw: all (None), indices (-1 the last), or a selection as typed ("0-3", "all")."""
    if value is None:
        return list(range(count))
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return _indices(value, count, name)
    return sorted(set(selection(value, name.rstrip("s"), field=name).indices(count)))


@renamed(folder="out_dir", layers="layer", heads="head", fmt="format")
@checked
def export(source: Any, out_dir: str | os.PathLike = Path("attnviz_export"), *, layer: Any = "all", head: Any = "all",
           part: str | None = None, items: Sequence[ExportPart] | None = None, format: str = "png",
           dpi: int = DEFAULT_DPI, cmap: str = "viridis", workers: int | None = None, force: bool = False,
           scale: ScaleChoice | str = "shared", norm: str = "auto", vmax: float | None = None,
           on_total: Callable[[int], None] | None = None, on_done: Callable[[int], None] | None = None,
           reporter: Reporter | None = None, **capture_options: Any) -> Gallery:
    """Write the export folder of `source` (a Capture, an encoder-decoder model's Parts, or an input run through
    the model as attnviz.capture does) into `out_dir` atomically: every file goes into a staging folder beside it,
    which takes its place only when complete. Returns the Gallery written (a path: the folder, symbolic links
    resolved). What is drawn is `layer` × `head` (all; indices, -1 the last; or selections such as "0-3") of
    every part (`part`: one of them), or `items`. An encoder-decoder model's parts each get their own images
    (encoder_…, decoder_…, cross_…), grid and gallery section, and a `part` column in heads.csv/heads.json.
    `format` png, svg or pdf; `workers` the processes drawing (default: the cores there are). `scale` ("shared"
    or "per-head"), `norm`, `vmax`: the colour scale. `reporter` (or `on_total` and `on_done`, the images to draw
    and drawn) hears the progress. The old keywords folder, layers, heads and fmt work with a DeprecationWarning."""
    fmt = format
    workers = (os.cpu_count() or 1) if workers is None else workers
    if fmt not in FORMATS:
        raise OutputError(f"unknown format {fmt!r}: use {', '.join(FORMATS)}")
    if not MIN_DPI <= dpi <= MAX_DPI:
        raise UsageError(f"{arg('dpi')} takes a resolution from {MIN_DPI} to {MAX_DPI}; got {dpi}", "dpi")
    if not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"{arg('workers')} takes a whole number from 1 to {MAX_WORKERS:,}; got {workers}", "workers")
    if isinstance(scale, str):
        from attnviz.api.views import scale_choice

        scale = scale_choice(scale or "shared", norm, vmax)
    from attnviz.base.files import check_target, export_folder

    check_target(export_folder(Path(out_dir).expanduser()), force)  # before any model work
    whole = attention_of(source, default_part=None, **capture_options)
    if items is None:  # every part's layers and heads, or those chosen
        if isinstance(whole, Parts):
            names = whole.names if part in (None, "all") else [whole.part(part).part or part]
            chosen = [whole.part(name) for name in names]
            saved: Capture | Parts = (whole if len(names) == len(whole.names)
                                      else Parts({c.part or "": c for c in chosen}))
        else:
            if part not in (None, "all"):
                raise UsageError(f"this input has one kind of attention (self-attention); {arg('part')} is for "
                                 f"encoder-decoder models", "part")
            chosen, saved = [whole], whole
        items = [ExportPart(c, _chosen(layer, c.n_layers, "layer"), _chosen(head, c.n_heads, "head"),
                            f"{c.part}_" if isinstance(whole, Parts) else "") for c in chosen]
    else:
        saved = whole
    reporter = reporter or Reporter()
    total = sum(item.images for item in items) + 1

    def fill(staging: Path, advance: Callable[[int], None]) -> None:
        if on_total:
            on_total(total)
        sections, records = [], []
        for item in items:
            part_name = item.capture.part
            panels = [replace(p, name=item.prefix + p.name) for p in
                      export_panels(item.capture, item.layers, item.heads, scale)]
            render_panels(panels, staging, fmt=fmt, dpi=dpi, cmap=cmap, workers=workers, on_done=advance,
                          spawn_args=(capture_arrays(item.capture), list(item.layers), list(item.heads), scale,
                                      item.prefix),
                          subtitle=text_subtitle(item.capture))
            grid_name = f"{item.prefix}grid.{fmt}"
            per_head = [p for p in panels if p.head != "mean"]
            every = head_records(item.capture)
            labels = {(r["layer"], r["head"]): str(r["label"]) for r in every}  # each head's pattern, on the grid
            save_grid(grid_figure(item.capture, per_head, item.layers, item.heads, cmap=cmap, dpi=dpi,
                                  labels=labels), staging / grid_name, dpi=dpi)
            chosen_layers, chosen_heads = set(item.layers), set(item.heads)
            kept = [({"part": part_name, **r} if part_name else r) for r in every
                    if r["layer"] in chosen_layers and r["head"] in chosen_heads]
            sections.append(Section(item.capture, panels, kept, grid_name, part_name))
            records += kept
        saved.save(staging / "attention.npz")
        (staging / "heads.json").write_text(to_json(records, indent=1) + "\n", encoding="utf-8")
        (staging / "heads.csv").write_text(to_csv(records), encoding="utf-8")
        try:  # the interactive view; a capture too large for one page goes without it, saying why
            viewer: tuple[str, str, str] | str = viewer_fragment(viewer_data(saved))
        except InputError:
            viewer = ("The interactive view is left out: this capture holds more weights than one page allows "
                      "(see attnviz view); `attnviz view --from attention.npz --layer 0-1` makes a page of some "
                      "layers.")
        (staging / "index.html").write_text(gallery_html(sections, fmt, viewer), encoding="utf-8")

    progress: list = []

    def advance(n: int) -> None:
        if on_done:
            on_done(n)
        if progress:
            progress[0](n)

    def start(staging: Path) -> None:  # the bar appears once the export folder could be created
        with reporter.progress("Exporting", total, "images") as step:
            progress.append(step)
            fill(staging, advance)
            advance(1)

    written = write_folder(out_dir, force, start, what="export")
    return Gallery(Path(written), sum(item.images for item in items),
                   tuple(f"{item.prefix}grid.{fmt}" for item in items))
