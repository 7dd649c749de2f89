"""attnviz export: every head as an image, a grid overview, the data and an offline gallery."""

from __future__ import annotations

import typer

import attnviz.analyses.export as EXPORT
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import emit
from attnviz.cli.params import JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command("export", help=EXPORT.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "long", "saved"),
       options=EXPORT.Options)
def export_command(as_json: JsonOpt = False, *, model: ModelOptions, inp: Source, options: EXPORT.Options) -> None:
    import attnviz
    from attnviz.base.files import check_target, export_folder

    if options.vmax is not None and options.vmax <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--vmax")
    check_target(export_folder(options.out_dir), options.force)  # before any model work
    given = inp.resolve()
    result = attnviz.export(given, model=model.later_for(given), **as_keywords(options), **inp.options(),
                            truncate=model.truncate)
    emit(result, as_json=as_json)
