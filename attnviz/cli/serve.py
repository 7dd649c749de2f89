"""attnviz serve: the live app, the model loaded once."""

from __future__ import annotations

import typer

import attnviz.analyses.serve as SERVE
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import takes
from attnviz.cli.output import err, out, say
from attnviz.cli.params import ModelOptions

# Imports inside the command (FastAPI, uvicorn, the API) keep `attnviz --help` light.


@app.command(help=SERVE.SUMMARY)
@cli_errors
@takes(inp=ModelOptions, options=SERVE.Options)
def serve(*, inp: ModelOptions, options: SERVE.Options) -> None:
    from attnviz.errors import UsageError

    try:
        SERVE.check(options)
    except UsageError as exc:
        raise typer.BadParameter(str(exc).removeprefix("token: "), param_hint="--token") from None
    SERVE.compute(None, options, announce=lambda line: say(line, console=out),
                  warn=lambda line: say(line, console=err, style="bold red"), load=inp.load, whole_process=True)
