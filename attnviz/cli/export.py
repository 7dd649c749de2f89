"""attnviz export: every head as an image, a grid overview, the data and an offline gallery."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from attnviz.cli.common import CaptureInput, CmapOpt, HeadSel, LayerSel, ScaleOptions, app, cli_errors, err, say, takes
from attnviz.selection import Selection



@app.command("export",
             help='Write every layer × head as a labelled image, a head-mean image per layer, a grid overview, the '
                            'capture, heads.csv/heads.json and an index.html that works offline.')
@cli_errors
@takes(inp=CaptureInput, look=ScaleOptions)
def export_command(out_dir: Annotated[Path, typer.Option(
                       "--out-dir", "--output", "-o", "-d", help="Folder to create.",
                       file_okay=False)] = Path("attnviz_export"),
                   layer: LayerSel = Selection.everything("layer", "--layer"),
                   head: HeadSel = Selection.everything("head", "--head"),
                   fmt: Annotated[str, typer.Option("--format", help="png, svg or pdf.")] = "png",
                   dpi: Annotated[int, typer.Option(help="Resolution of raster images.", min=20, max=600)] = 100,
                   workers: Annotated[int, typer.Option(help="Processes drawing images (at most the cores you "
                                                             "have). Default: the cores you have.",
                                                        min=1, max=1024)] = os.cpu_count() or 1,
                   force: Annotated[bool, typer.Option("--force", help="Replace an earlier attnviz export in "
                                                                       "--out-dir (never other files).")] = False,
                   cmap: CmapOpt = "viridis", *, inp: CaptureInput, look: ScaleOptions) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.export import FORMATS, check_target, export, export_folder

    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: choose one of {', '.join(FORMATS)}", param_hint="--format")
    check_target(export_folder(out_dir), force)  # before any model work
    capture = inp.capture()
    layers = layer.indices(capture.n_layers)
    heads = head.indices(capture.n_heads)
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    progress = Progress(*columns, console=err, transient=True, disable=not err.is_terminal)
    tasks: list = []

    def start(total: int) -> None:  # the bar appears once the export folder could be created
        progress.start()
        tasks.append(progress.add_task("Exporting", total=total))

    try:
        target = export(capture, out_dir, layers=layers, heads=heads, fmt=fmt, dpi=dpi, cmap=cmap,
                        workers=workers, force=force, scale=look.choice(), on_total=start,
                        on_done=lambda n: progress.advance(tasks[0], n))
    finally:
        progress.stop()
    images = len(layers) * (len(heads) + 1)
    say(f"{target}  ({images} images, grid.{fmt}, attention.npz, heads.csv, heads.json, index.html)")
