"""attnviz export: every head as an image, a grid overview, the data and an offline gallery."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.common import (CmapOpt, DeviceOpt, DtypeOpt, FromOpt, ModelOpt, RemoteOpt, RevisionOpt, TextArg,
                                TruncateOpt, app, cli_errors, err, get_capture, out, parse_indices)


@app.command("export")
@cli_errors
def export_command(text: TextArg = None,
                   out_dir: Annotated[Path, typer.Option("--out-dir", "-d", help="Folder to create.",
                                                         file_okay=False)] = Path("attnviz_export"),
                   layers: Annotated[Optional[str], typer.Option(help="Layers: 0-2, 0,3,5 or all.")] = None,
                   heads: Annotated[Optional[str], typer.Option(help="Heads: 0-2, 0,5 or all.")] = None,
                   fmt: Annotated[str, typer.Option("--format", help="png, svg or pdf.")] = "png",
                   dpi: Annotated[int, typer.Option(help="Resolution of raster images.", min=20, max=600)] = 100,
                   workers: Annotated[int, typer.Option(help="Processes drawing images. Default: the cores you have.",
                                                        min=1)] = os.cpu_count() or 1,
                   force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out-dir.")] = False,
                   cmap: CmapOpt = "viridis", source: FromOpt = None, model: ModelOpt = None,
                   revision: RevisionOpt = None, device: DeviceOpt = "auto", dtype: DtypeOpt = "float32",
                   trust_remote_code: RemoteOpt = False, truncate: TruncateOpt = True) -> None:
    """Write every layer × head as a labelled image, a head-mean image per layer, a grid overview,
    attention.npz, heads.csv/heads.json and an index.html that works offline."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.export import FORMATS, check_target, export
    from attnviz.render.png import colormap

    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: choose one of {', '.join(FORMATS)}", param_hint="--format")
    check_target(out_dir, force)  # before any model work
    colormap(cmap)  # an unknown colormap fails now, not after the model ran
    capture = get_capture(text, source, model, revision, device, dtype, trust_remote_code, truncate)
    chosen_layers = parse_indices(layers, capture.n_layers, "layer")
    chosen_heads = parse_indices(heads, capture.n_heads, "head")
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    progress = Progress(*columns, console=err, transient=False)
    tasks: list = []

    def start(total: int) -> None:  # the bar appears once the export folder could be created
        progress.start()
        tasks.append(progress.add_task("Exporting", total=total))

    try:
        target = export(capture, out_dir, layers=chosen_layers, heads=chosen_heads, fmt=fmt, dpi=dpi, cmap=cmap,
                        workers=workers, force=force, on_total=start,
                        on_done=lambda n: progress.advance(tasks[0], n))
    finally:
        progress.stop()
    images = len(chosen_layers) * (len(chosen_heads) + 1)
    out.print(f"{target}  ({images} images, grid.{fmt}, attention.npz, heads.csv, heads.json, index.html)",
              highlight=False, soft_wrap=True)
