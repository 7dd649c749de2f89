"""serve: the live app on one loaded model (attnviz serve; attnviz.load(...).serve() in Python): a page where each
sentence typed redraws every view, and a JSON API whose analysis routes are this registry's (attnviz.serve.app)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.analyses import register
from attnviz.base.options import option

SUMMARY = ("A live local app: the model loaded once, a page where each sentence typed redraws every view (head, model, "
           "matrix), the head table, one head's steps and heads removed, and a JSON API for scripts (/openapi.json). "
           "Listens on 127.0.0.1 only unless --host says otherwise (then every request needs the token printed in "
           "the address at start); Ctrl-C stops it.")


@dataclass(frozen=True)
class Options:
    host: str = option("127.0.0.1", "The address to listen on. Anything but 127.0.0.1, localhost or ::1 lets other "
                                    "machines in: said loudly at start, and every request must carry the token (see "
                                    "--token).", metavar="ADDRESS")
    port: int = option(8000, "The port, 0 to 65,535 (0: any free one; the URL printed says which).", minimum=0,
                       maximum=65535, metavar="PORT")
    max_chars: int = option(2_000, "The longest text a request may send, in characters.", minimum=1,
                            maximum=100_000, metavar="N")
    max_tokens: int = option(512, "The most tokens a text may become.", minimum=2, maximum=8192, metavar="N")
    max_waiting: int = option(16, "Requests that may wait in line while one runs; more are refused (503, try "
                                  "again).", minimum=0, maximum=1000, metavar="N")
    token: str | None = option(None, "What every request must carry (16 to 256 letters, digits, - _ . ~; or "
                                     "$ATTNVIZ_TOKEN, which other users of this machine cannot read from the process "
                                     "list). Default: a new random one whenever --host lets other machines in, "
                                     "printed once in the address; none on this machine only.", metavar="TOKEN",
                               envvar="ATTNVIZ_TOKEN")


def check(options: Options) -> None:
    """What can be refused before the model loads and the port is bound: the token's form."""
    from attnviz.errors import UsageError
    from attnviz.serve.guard import token_problem

    problem = token_problem(options.token) if options.token is not None else None
    if problem:
        raise UsageError(f"token: {problem}", "token")


@register("serve", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options, *, announce: Any = print, warn: Any = None, load: Any = None,
            whole_process: bool = False) -> None:
    """Serve `model` until Ctrl-C (blocks, as uvicorn.run does): `announce` hears the address line and the stop
    line, `warn` the warning of a host beyond this machine. The command line's: `load()` gives the model once the
    port is bound (a port in use is said before a model loads); `whole_process`: a request still running at the
    stop ends the process (in Python it finishes in the background)."""
    import importlib.util

    from attnviz.errors import InputError
    from attnviz.serve import INSTALL

    check(options)
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"attnviz serve needs {' and '.join(missing)}: {INSTALL}")
    from attnviz.serve.run import bind, serve_forever

    sock = bind(options.host, options.port)
    try:
        serve_forever(model if load is None else load(), sock, options.host, max_chars=options.max_chars,
                      max_tokens=options.max_tokens, max_waiting=options.max_waiting, announce=announce,
                      warn=warn or announce, token=options.token, whole_process=whole_process)
    finally:
        sock.close()
