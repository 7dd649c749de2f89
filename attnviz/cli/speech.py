"""Word timings from cross-attention (whisper's timing.py): attnviz align."""

from __future__ import annotations

import typer

import attnviz.analyses.align as ALIGN
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help=ALIGN.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(
    "audio", "saved", audio="The sound (WAV or FLAC, at most 30 s; - reads standard input); the model defaults to "
                            "whisper."), options=ALIGN.Options)
def align(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *, model: ModelOptions,
          inp: Source, options: ALIGN.Options) -> None:
    import attnviz

    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if (inp.audio is None) == (inp.source is None):
        raise typer.BadParameter("give the sound to look at (--audio FILE) or a capture of one (--from "
                                 "CAPTURE.npz), one of them")
    if options.heads is not None:
        from attnviz.base.selection import pair_form

        pair_form(options.heads)  # before the sound is read and the model loads
    given = inp.resolve()
    result = attnviz.align(given, model=model.later_for(given), **as_keywords(options),
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])
