"""What every request passes before the app sees it, as plain ASGI: the Host header must name this server (a
page on another site cannot reach it by pointing its own name at 127.0.0.1: DNS rebinding), a request that
changes anything must come from this server's own page or from no page at all (a script; not a cross-origin
form or fetch), and a body may not pass its limit (counted as it arrives, not trusted from Content-Length).
A server with a token (always, when it listens beyond this machine) lets in only requests that carry it: in
the address (`?token=`, swapped at once for a cookie by a redirect, so it leaves the address bar), in that
cookie, or as `Authorization: Bearer TOKEN`; compared in constant time. Every response carries headers that
keep the pages to themselves."""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable, Iterable

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
TOKEN_COOKIE = "attnviz_token"
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")
TOKEN_LENGTH = (16, 256)


def token_problem(token: str) -> str | None:
    """Why a token given by hand cannot be used (None: it can): 16 to 256 characters that an address carries
    as they are (letters, digits, - _ . ~)."""
    if not TOKEN_LENGTH[0] <= len(token) <= TOKEN_LENGTH[1]:
        return (f"a token has {TOKEN_LENGTH[0]} to {TOKEN_LENGTH[1]} characters (a short one is guessed); "
                f"this one has {len(token)}")
    if not set(token) <= TOKEN_CHARS:
        return "a token is made of letters, digits and - _ . ~ (it travels in an address)"
    return None


def new_token() -> str:
    import secrets

    return secrets.token_urlsafe(24)
HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
           (b"cross-origin-opener-policy", b"same-origin"), (b"cross-origin-resource-policy", b"same-origin"),
           (b"permissions-policy", b"camera=(), microphone=(), geolocation=()")]


def allowed_hosts(host: str) -> tuple[str, ...] | None:
    """The names a Host header may carry for a server bound to `host` (its port checked apart); None: any
    (bound to every interface, where the machine's own names are not known: said loudly at start)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    return tuple(dict.fromkeys((*LOOPBACK, host.lower(), f"[{host.lower()}]" if ":" in host else host.lower())))


def split_host(value: str) -> tuple[str, str]:
    """("name", "port") of a Host header: [::1]:8000, localhost:8000, example.org."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        return name + "]", rest.removeprefix(":")
    name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return name, port


class Guard:
    """The ASGI middleware: Host, Origin and body checks, and the headers every response carries."""

    def __init__(self, app, *, hosts: Iterable[str] | None, port: Callable[[], int], max_body: int,
                 report: Callable[[str], None] | None = None, token: str | None = None) -> None:
        self.app = app
        self.token = token
        self.hosts = None if hosts is None else set(hosts)
        self.port = port  # the bound port, known once the socket is bound
        self.max_body = max_body
        self.report = report or _to_stderr  # a request that failed inside: one line, never a traceback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *HEADERS]}
            await send(message)

        host = headers.get("host", "")
        name, port = split_host(host)
        if not host or (self.hosts is not None and (name not in self.hosts or (port and port != str(self.port())))):
            await refuse(send_with_headers, 421, "this server answers to its own address only (the Host header "
                                                 f"names {host[:80]!r})")
            return
        if self.token is not None:
            valid, in_address = self.presented(headers, scope)
            if not valid:
                await refuse(send_with_headers, 401, "this server asks for its token: open the address attnviz "
                                                     "serve printed (…/?token=…), or send the header "
                                                     "Authorization: Bearer TOKEN",
                             [(b"www-authenticate", b'Bearer realm="attnviz"')])
                return
            if in_address and scope["method"] in ("GET", "HEAD") and not is_api(scope.get("path", "")):
                await self.swap_for_cookie(send_with_headers, scope)  # a page: the token leaves the address bar
                return
        if scope["method"] not in SAFE_METHODS:
            origin = headers.get("origin")
            site = headers.get("sec-fetch-site")
            if (origin is not None and origin not in self.origins(host)) or site == "cross-site":
                await refuse(send_with_headers, 403, "requests from another site's page are refused")
                return
            declared = headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
                await refuse(send_with_headers, 413, f"the request is over {self.max_body:,} bytes")
                return
            body = await self.read_body(receive)
            if body is None:
                await refuse(send_with_headers, 413, f"the request is over {self.max_body:,} bytes")
                return
            receive = replay(body, receive)
        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:  # the app has answered 500 already; the server goes on
            from attnviz.base.text import visible

            self.report(visible(f"attnviz serve: {scope['method']} {scope.get('path', '')[:80]} failed "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                                f"serving on"))

    def cookie_name(self) -> str:
        """One cookie per port: two servers on one machine keep their own tokens."""
        return f"{TOKEN_COOKIE}_{self.port()}"

    def presented(self, headers: dict[str, str], scope: Scope) -> tuple[bool, bool]:
        """(whether the request carries this server's token, whether it came in the address)."""
        assert self.token is not None
        expected = self.token.encode()

        def same(given: str | None) -> bool:
            return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), expected)

        scheme, _, bearer = headers.get("authorization", "").partition(" ")
        in_header = same(bearer.strip()) if scheme.lower() == "bearer" else False
        in_address = any(same(value) for name, value in _query(scope) if name == "token")
        in_cookie = any(same(value) for name, value in _cookies(headers.get("cookie", ""))
                        if name == self.cookie_name())
        return in_header or in_address or in_cookie, in_address

    async def swap_for_cookie(self, send: Send, scope: Scope) -> None:
        """303 to the same address without the token, setting the cookie that carries it from then on."""
        from urllib.parse import urlencode

        path = own_path(scope.get("path", "/"))
        rest = [(name, value) for name, value in _query(scope) if name != "token"]
        location = path + (f"?{urlencode(rest)}" if rest else "")
        cookie = f"{self.cookie_name()}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location.encode("latin-1", "replace")),
                                (b"set-cookie", cookie.encode("latin-1")), (b"cache-control", b"no-store"),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    def origins(self, host: str) -> set[str]:
        """The origins of this server's own page: http:// and the Host it was reached by."""
        return {f"http://{host}"}

    async def read_body(self, receive: Receive) -> bytes | None:
        """The whole body, counted as it arrives; None past the limit (the rest is not read)."""
        parts: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(parts)
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


API_PREFIXES = ("/api/", "/openapi.json")


def is_api(path: str) -> bool:
    """A request a script makes (JSON routes and the route list): with the token in its address it is answered
    directly, as a script that follows a redirect without keeping its cookie would otherwise end at a 401."""
    return path.startswith(API_PREFIXES)


def own_path(path: str) -> str:
    """The path a redirect may lead to: on this server whatever the request held. A browser reads a backslash as
    a slash and drops tabs and newlines, so `/\\evil.example/`, or a tab between two slashes, would open another site:
    backslashes become slashes, runs of slashes one, and every character outside a path's own set is
    percent-encoded; the result starts with exactly one slash."""
    from urllib.parse import quote

    path = re.sub(r"/{2,}", "/", "/" + path.replace("\\", "/"))
    return "/" + quote(path, safe="/-._~!$&'()*+,;=:@").lstrip("/")


def _query(scope: Scope) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    try:
        return parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True,
                         max_num_fields=100)
    except ValueError:  # more fields than any page of this app sends
        return []


def _cookies(header: str) -> list[tuple[str, str]]:
    """name=value pairs of a Cookie header, read leniently (a malformed pair is skipped, never an error)."""
    pairs = []
    for part in header.split(";")[:100]:
        name, sep, value = part.strip().partition("=")
        if sep:
            pairs.append((name.strip(), value.strip().strip('"')))
    return pairs


def _to_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then what the client sends next (its disconnect)."""
    given = False

    async def wrapped() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped


async def refuse(send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
