"""attnviz export: every head as an image, a grid overview, the data and an offline gallery."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from attnviz.base.selection import Selection
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import emit
from attnviz.cli.params import (AllPartsOpt, CmapOpt, HeadSel, JsonOpt, LayerSel, ModelOptions, ScaleOptions,
                                whole_number)

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command("export",
             help='Write every layer × head as a labelled image, a head-mean image per layer, a grid overview, the '
                            'capture, heads.csv/heads.json and an index.html that works offline.')
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "long", "saved"), look=ScaleOptions)
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
                   cmap: CmapOpt = "viridis", part: AllPartsOpt = None, as_json: JsonOpt = False, *,
                   model: ModelOptions, inp: Source, look: ScaleOptions) -> None:
    import attnviz
    from attnviz.api.gallery import FORMATS

    if fmt not in FORMATS:
        raise typer.BadParameter(f"{fmt!r}: choose one of {', '.join(FORMATS)}", param_hint="--format")
    from attnviz.base.files import check_target, export_folder

    check_target(export_folder(out_dir), force)  # before any model work
    given = inp.resolve()
    result = attnviz.export(given, out_dir, model=model.later_for(given), layers=layer, heads=head, part=part,
                            fmt=fmt, dpi=dpi, cmap=cmap, workers=workers, force=force, scale=look.choice(),
                            **inp.options(), truncate=model.truncate)
    emit(result, as_json=as_json)
