"""attnviz serve: the live app, the model loaded once."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import takes
from attnviz.cli.output import err, out, say
from attnviz.cli.params import ModelOptions, whole_number

def token_option(value: str) -> str:
    from attnviz.serve.guard import token_problem

    problem = token_problem(value)
    if problem:
        raise typer.BadParameter(problem)
    return value


# Imports inside the command (FastAPI, uvicorn, the API) keep `attnviz --help` light.


@app.command(help="A live local app: the model loaded once, a page where each sentence typed redraws every view "
                  "(head, model, matrix), the head table, one head's steps and heads removed, and a JSON API for "
                  "scripts (/openapi.json). Listens on 127.0.0.1 only unless --host says otherwise (then every "
                  "request needs the token printed in the address at start); Ctrl-C stops it.")
@cli_errors
@takes(inp=ModelOptions)
def serve(host: Annotated[str, typer.Option(
              "--host", metavar="ADDRESS",
              help="The address to listen on. Anything but 127.0.0.1, localhost or ::1 lets other machines in: "
                   "said loudly at start, and every request must carry the token (see --token).")] = "127.0.0.1",
          port: Annotated[int, typer.Option(
              "--port", parser=whole_number(0, 65535), metavar="PORT",
              help="The port, 0 to 65,535 (0: any free one; the URL printed says which).")] = 8000,
          max_chars: Annotated[int, typer.Option(
              "--max-chars", parser=whole_number(1, 100_000), metavar="N",
              help="The longest text a request may send, in characters.")] = 2_000,
          max_tokens: Annotated[int, typer.Option(
              "--max-tokens", parser=whole_number(2, 8192), metavar="N",
              help="The most tokens a text may become.")] = 512,
          max_waiting: Annotated[int, typer.Option(
              "--max-waiting", parser=whole_number(0, 1000), metavar="N",
              help="Requests that may wait in line while one runs; more are refused (503, try again).")] = 16,
          token: Annotated[Optional[str], typer.Option(
              "--token", metavar="TOKEN", envvar="ATTNVIZ_TOKEN", parser=token_option, show_default=False,
              help="What every request must carry (16 to 256 letters, digits, - _ . ~; or $ATTNVIZ_TOKEN, which "
                   "other users of this machine cannot read from the process list). Default: a new random one "
                   "whenever --host lets other machines in, printed once in the address; none on this machine "
                   "only.")] = None,
          *, inp: ModelOptions) -> None:
    import importlib.util

    from attnviz.errors import InputError
    from attnviz.serve import INSTALL

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"attnviz serve needs {' and '.join(missing)}: {INSTALL}")
    from attnviz.serve.run import bind, serve_forever

    sock = bind(host, port)  # before the model loads: a port in use is said at once
    try:
        loaded = inp.load()
        serve_forever(loaded, sock, host, max_chars=max_chars, max_tokens=max_tokens, max_waiting=max_waiting,
                      announce=lambda line: say(line, console=out), warn=lambda line: say(line, console=err,
                                                                                            style="bold red"),
                      token=token)
    finally:
        sock.close()
