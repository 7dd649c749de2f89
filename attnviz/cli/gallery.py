"""attnviz export: every head as an image, a grid overview, the data and an offline gallery."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.params import AllPartsOpt, CmapOpt, HeadSel, LayerSel, ScaleOptions, whole_number
from attnviz.cli.output import err, say
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CaptureInput, takes
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.



@app.command("export",
             help='Write every layer × head as a labelled image, a head-mean image per layer, a grid overview, the '
                            'capture, heads.csv/heads.json and an index.html that works offline.')
@cli_errors
@takes(inp=CaptureInput, look=ScaleOptions)
def export_command(out_dir: Annotated[Path, typer.Option(
                       "--out-dir", "--output", "-o", "-d", help="Folder to create.",
                       file_okay=False)] = Path("attnviz_export"),
                   layer: LayerSel = Selection.everything("layer", "layer"),
                   head: HeadSel = Selection.everything("head", "head"),
                   fmt: Annotated[str, typer.Option("--format", help="png, svg or pdf.")] = "png",
                   dpi: Annotated[int, typer.Option(help="Resolution of raster images, 20 to 600.",
                                                    parser=whole_number(20, 600), metavar="DPI")] = 100,
                   workers: Annotated[int, typer.Option(help="Processes drawing images (at most the cores you "
                                                             "have). Default: the cores you have.",
                                                        parser=whole_number(1, 1024),
                                                        metavar="N")] = os.cpu_count() or 1,
                   force: Annotated[bool, typer.Option("--force", help="Replace an earlier attnviz export in "
                                                                       "--out-dir (never other files).")] = False,
                   cmap: CmapOpt = "viridis", part: AllPartsOpt = None, *, inp: CaptureInput,
                   look: ScaleOptions) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.api.gallery import FORMATS, export
    from attnviz.base.files import check_target, export_folder

    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: choose one of {', '.join(FORMATS)}", param_hint="--format")
    check_target(export_folder(out_dir), force)  # before any model work
    from attnviz.data.parts import Parts
    from attnviz.api.gallery import ExportPart

    whole = inp.whole()
    if isinstance(whole, Parts):  # an encoder-decoder model: each part its own images, grid and section
        names = whole.names if part in (None, "all") else [whole.part(part).part or part]
        chosen = [whole.part(name) for name in names]
        items = [ExportPart(c, layer.indices(c.n_layers), head.indices(c.n_heads), f"{c.part}_") for c in chosen]
        saved = whole if len(names) == len(whole.names) else Parts({c.part or "": c for c in chosen})
    else:
        if part not in (None, "all"):
            raise typer.BadParameter("this input has one kind of attention (self-attention); --part is for "
                                     "encoder-decoder models", param_hint="--part")
        items = [ExportPart(whole, layer.indices(whole.n_layers), head.indices(whole.n_heads))]
        saved = whole
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    progress = Progress(*columns, console=err, transient=True, disable=not err.is_terminal)
    tasks: list = []

    def start(total: int) -> None:  # the bar appears once the export folder could be created
        progress.start()
        tasks.append(progress.add_task("Exporting", total=total))

    try:
        target = export(saved, out_dir, items=items, fmt=fmt, dpi=dpi, cmap=cmap, workers=workers, force=force,
                        scale=look.choice(), on_total=start, on_done=lambda n: progress.advance(tasks[0], n))
    finally:
        progress.stop()
    images = sum(item.images for item in items)
    grids = ", ".join(f"{item.prefix}grid.{fmt}" for item in items)
    say(f"{target}  ({images} images, {grids}, attention.npz, heads.csv, heads.json, index.html)")
