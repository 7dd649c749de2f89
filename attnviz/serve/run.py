"""Running the app: the socket bound first (a port in use is one line, and port 0 picks a free one that the
URL names), the app wrapped in its guard, uvicorn serving until Ctrl-C or SIGTERM."""

from __future__ import annotations

import socket
from collections.abc import Callable

from attnviz.errors import InputError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or InputError in one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InputError(f"cannot listen on {host!r}: {getattr(exc, 'strerror', None) or exc}", "host") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = "the port is in use: choose another with --port" if exc.errno == 98 else exc.strerror or str(exc)
        raise InputError(f"cannot listen on {host}:{port}: {why}", "port") from None
    sock.setblocking(False)
    return sock


STOP_GRACE_SECONDS = 1  # what a request in progress gets to finish after Ctrl-C before it is dropped


def url(sock: socket.socket, host: str) -> str:
    name, port = sock.getsockname()[:2]
    shown = host if host in ("localhost",) else name
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def token_for(host: str, given: str | None) -> str | None:
    """The token requests must carry: the one given; a new random one when the server listens beyond this
    machine (printed once, in the address the start line gives); none on loopback unless given."""
    from attnviz.serve.guard import new_token

    if given is not None:
        return given
    return None if host in LOOPBACK_NAMES else new_token()


def serve_forever(model, sock: socket.socket, host: str, *, max_chars: int, max_tokens: int, max_waiting: int,
                  announce: Callable[[str], None], warn: Callable[[str], None], token: str | None = None,
                  whole_process: bool = True) -> None:
    """Serve until Ctrl-C or SIGTERM. A request still running on the model's thread then: `whole_process` (the
    command line) ends the process at once; else (a Python caller's process) it finishes in the background."""
    import uvicorn

    from attnviz.serve.app import Limits, make_app
    from attnviz.serve.guard import allowed_hosts, Guard

    limits = Limits(max_chars=max_chars, max_tokens=max_tokens, max_waiting=max_waiting)
    port = sock.getsockname()[1]
    app = make_app(model, limits=limits)
    token = token_for(host, token)
    guarded = Guard(app, hosts=allowed_hosts(host), port=lambda: port, max_body=limits.max_body, token=token)
    if host not in LOOPBACK_NAMES:
        warn(f"attnviz serves on {host}, not only on this machine: anyone who can reach it and has its token (in "
             f"the address below: keep it to yourself) can run the model and read what it is sent"
             + (" (and on every interface the Host check is off)" if allowed_hosts(host) is None else ""))
    config = uvicorn.Config(guarded, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=STOP_GRACE_SECONDS)
    address = url(sock, host) + (f"/?token={token}" if token is not None else "")
    line = f"attnviz serves {address}  ({model.name}; Ctrl-C stops it)"

    import logging

    class NoCancelNote(logging.Filter):  # the stop line says it (a request in progress was dropped), once
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.getMessage()).startswith("Cancel ")

    logging.getLogger("uvicorn.error").addFilter(NoCancelNote())

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            announce(line)  # once it listens and Ctrl-C is its own to handle

    try:
        Announcing(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn stopped cleanly, then passed Ctrl-C on
        pass
    finally:
        app.state.line.close()
    if app.state.line.busy and whole_process:  # a request still runs on the model's thread: it cannot be stopped
        announce("stopped (the request in progress was dropped)")
        _exit_now()
    if app.state.line.busy:
        announce("stopped (the request in progress finishes in the background)")
        return
    announce("stopped")


def _exit_now() -> None:
    """End the process without waiting for the model's thread (Python would join it first): the exit handlers
    run (temporary folders removed), then the process exits at once. The server writes no file of its own."""
    import atexit
    import os
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
