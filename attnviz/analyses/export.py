"""export: every head as an image, with a grid, the capture, the head table and an offline page, written as one
folder (attnviz.export, attnviz export): an analysis of a run that writes files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.analyses.looks import Look
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.gallery import Gallery

SUMMARY = ("Write every layer × head as a labelled image, a head-mean image per layer, a grid overview, the capture, "
           "heads.csv/heads.json and an index.html that works offline.")


@dataclass(frozen=True)
class Options(Look):
    out_dir: Path = option(Path("attnviz_export"), "Folder to create.", names=("--output", "-o", "-d"),
                           folder=True)
    layer: Any = option("all", "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    head: Any = option("all", "Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's heads.",
                       shared="HeadSel")
    format: str = option("png", "png, svg or pdf.", choices=("png", "svg", "pdf"))
    dpi: int = option(100, "Resolution of raster images, 20 to 600.", minimum=20, maximum=600, metavar="DPI")
    workers: int | None = option(None, "Processes drawing images (at most the cores you have). Default: the cores "
                                       "you have.", minimum=1, maximum=1024, metavar="N")
    force: bool = option(False, "Replace an earlier attnviz export in --out-dir (never other files).")
    cmap: str = option("viridis", "Matplotlib colormap name.", shared="CmapOpt")
    part: str | None = option(None, "", shared="AllPartsOpt")


@register("export", Options, SUMMARY, shows_alpha=True)
def compute(run: Any, options: Options) -> Gallery:
    from attnviz.api.gallery import export

    return export(run.capture, **as_keywords(options))
