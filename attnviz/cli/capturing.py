"""attnviz capture: run the model once and save its attention as a .npz capture, for any command's --from."""

from __future__ import annotations

from typing import Annotated

import typer

import attnviz.analyses.capture as CAPTURE
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import File, check_output, emit
from attnviz.cli.params import JsonOpt, ModelOptions

# Imports inside the command (the API, numpy) keep `attnviz --help` light.


@app.command(help=CAPTURE.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "long"), options=CAPTURE.Options)
def capture(output: Annotated[str, typer.Option(
                "--output", "-o", metavar="FILE",
                help="Capture file (.npz); a folder gets capture.npz inside.")] = "capture.npz",
            as_json: JsonOpt = False, *, model: ModelOptions, inp: Source, options: CAPTURE.Options) -> None:
    import attnviz

    check_output(output, (".npz",))
    given = inp.resolve()
    reading = inp.options()
    if options.norms:  # the norms of the full α: nothing to stream or keep
        reading.pop("keep", None)
        reading.pop("stream", None)
    result = attnviz.capture(given, model=model.later_for(given), **as_keywords(options), **reading,
                             truncate=model.truncate)
    emit(result, as_json=as_json, report=False, files=[File(output, "capture.npz", result.save, note=result.saved)])
