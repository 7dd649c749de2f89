"""The cost command: time and memory of the full and the streamed path against T, measured."""

from __future__ import annotations



import attnviz.analyses.cost as COST
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import ImageOut, JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.




@app.command(help=COST.SUMMARY)
@cli_errors
@takes(model=ModelOptions, options=COST.Options)
def cost(output: ImageOut = None, as_json: JsonOpt = False, *, model: ModelOptions, options: COST.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    result = attnviz.cost(model=model.later(), **as_keywords(options), reporter=CliReporter())
    emit(result, as_json=as_json, files=[figure_file(output, result)])
