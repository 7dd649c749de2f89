"""attnviz capture: run the model once and save its attention as a .npz capture, for any command's --from."""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import File, check_output, emit
from attnviz.cli.params import JsonOpt, ModelOptions

# Imports inside the command (the API, numpy) keep `attnviz --help` light.


@app.command(help="Run the model once and save α, the tokens and the metadata as a .npz capture, for any command's "
                  '--from later (which then needs neither torch nor transformers). An encoder-decoder model\'s '
                  'capture holds all three parts (encoder, decoder, cross).')
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "long"))
def capture(output: Annotated[str, typer.Option(
                "--output", "-o", metavar="FILE",
                help="Capture file (.npz); a folder gets capture.npz inside.")] = "capture.npz",
            norms: Annotated[bool, typer.Option(
                "--norms", help="Save value-weighted norms ‖α·f(x)‖ instead of α (meta quantity: norm).")] = False,
            as_json: JsonOpt = False, *, model: ModelOptions, inp: Source) -> None:
    import attnviz

    check_output(output, (".npz",))
    given = inp.resolve()
    options = inp.options()
    if norms:  # the norms of the full α: nothing to stream or keep
        options.pop("keep", None)
        options.pop("stream", None)
    result = attnviz.capture(given, model=model.later_for(given), norms=norms, **options, truncate=model.truncate)
    emit(result, as_json=as_json, report=False, files=[File(output, "capture.npz", result.save, note=result.saved)])
