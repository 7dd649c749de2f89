"""The live app (`attnviz serve`): a FastAPI application that holds one model and answers with what the
notebook functions give — attnviz.capture (or capture_image, capture_audio), attnviz.heads, attnviz.steps,
attnviz.contributions, attnviz.ablate — and the interactive page of each capture.

    GET  /                  the live page: a text box (or a file for a vision or speech model), the views
    GET  /api/model         the model, what it reads, this server's limits
    POST /api/capture       a text (or a picture, a sound, base64) -> tokens, the head table, the page's address
    GET  /view/{id}         that capture's interactive page (the last few are kept)
    POST /api/steps         one head step by step (JSON); /api/steps.png: its picture
    POST /api/ablate        the text with heads removed against the clean model; /api/ablate.png: Δα drawn
    GET  /api/analyses      the analyses of a text this server answers (from attnviz.analyses), with options
    POST /api/analyses/{name}  one of them of a text, with its options: what run.<name>() gives, as its --json
    GET  /api/queue         where a request waits in line (its ticket), and how many wait
    GET  /openapi.json      the JSON API described (FastAPI's own; no page that loads script from elsewhere)

One request runs at a time (queue.OneAtATime); what fails is a JSON {"error": "…"} with a 4xx status for the
user's own mistake and 500 otherwise, and the server goes on serving.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

import attnviz
from attnviz.errors import AttnvizError, InputError
from attnviz.base.text import check_text
from attnviz.serve.queue import Busy, OneAtATime

PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
            "frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
VIEW_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; media-src data:; "
            "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
TICKET = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: characters of text, tokens, the bytes of a picture or sound file, the
    body, requests waiting in line, and the pages kept for /view."""

    max_chars: int = 2_000
    max_tokens: int = 512
    max_file: int = 8 << 20
    max_body: int = 12 << 20
    max_waiting: int = 16
    pages: int = 8
    max_alpha_tokens: int = 256  # a layer's α in the JSON answer: H·T² numbers, T at most this
    runs: int = 4  # texts whose run (α and what the analyses read) is kept: every view of a text asks it again

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class CaptureRequest(BaseModel):
    """A text to look at (or, for a vision or speech model, a picture or a sound as base64)."""

    text: str | None = Field(None, description="The text (a text model).")
    image: str | None = Field(None, description="A PNG, JPEG or WebP file, base64 (a vision model).")
    audio: str | None = Field(None, description="A WAV or FLAC file, base64 (a speech model).")
    words: bool = Field(False, description="Attention between words instead of sub-word tokens.")
    contributions: bool = Field(False, description="Add the contributions panel (ALTI) to the page.")
    alpha_layer: int | None = Field(None, description="Also answer α of this layer (heads × T × T).")
    ticket: str | None = Field(None, description="A name for this request, to ask its place in line by.")


class StepsRequest(BaseModel):
    """One head step by step: what `attnviz steps` and attnviz.steps compute."""

    text: str = Field(description="The text.")
    layer: int = Field(0, description="The layer (negative: from the end).")
    head: int = Field(0, description="The head (negative: from the end).")
    token: int | str | None = Field(None, description="The query row to follow: its position (3), or its token's "
                                                      "text (\"cat\"), as the command line's --token takes it.")


class AblateRequest(BaseModel):
    """The text with heads removed, against the clean model: attnviz.ablate."""

    text: str = Field(description="The text.")
    heads: str = Field(description="The heads to remove: LAYER.HEAD separated by commas, e.g. \"0.3,1.5\".")
    mode: str = Field("zero", description="zero, or mean (each head's mean output over the text).")


class AnalysisRequest(BaseModel):
    """One registered analysis of a text: what `attnviz NAME TEXT --json` prints, the options by their Python
    names (GET /api/analyses lists them)."""

    text: str = Field(description="The text.")
    words: bool = Field(False, description="Attention between words instead of sub-word tokens.")
    options: dict[str, Any] = Field({}, description="The analysis's options: {\"top\": 5}.")


def served() -> tuple[str, ...]:
    """The registered analyses this server answers: those a text's run answers from its own pass and that are not
    α itself (/api/capture and /view serve that): no intervention, nothing read beside the run, no file written —
    so a new analysis of that kind is a route without a line here."""
    import dataclasses

    from attnviz import analyses

    def writes(analysis: Any) -> bool:
        return any(f.name in ("out_dir", "output") for f in dataclasses.fields(analysis.options))

    return tuple(name for name in analyses.available()
                 if (a := analyses.get(name)).reads == "run" and not a.intervenes and not a.shows_alpha
                 and not a.inputs and not writes(a))


class CaptureAnswer(BaseModel):
    id: str
    view: str
    model: str
    kind: str
    tokens: list[str]
    layers: int
    heads: int
    seconds: float
    head_table: list[dict[str, Any]]
    alpha: list | None = None
    part: str | None = None
    transcript: str | None = None


class Failure(BaseModel):
    error: str


def _asset(name: str) -> bytes:
    return resources.files("attnviz.serve").joinpath("static").joinpath(name).read_bytes()


def make_app(model: Any, *, limits: Limits | None = None, command: str = "attnviz serve") -> FastAPI:
    """The app for one loaded model (an attnviz Model from load_model). Its routes call the public API."""
    limits = limits or Limits()
    line = OneAtATime(limits.max_waiting)
    pages: OrderedDict[str, str] = OrderedDict()
    runs = Runs(model, limits.runs)
    numbers = itertools.count(1)
    kind = "image" if model.vision else "sound" if model.speech else "text"
    app = FastAPI(title="attnviz", version=attnviz.__version__, docs_url=None, redoc_url=None,
                  description="The attention of one model, live: what attnviz's Python functions give, as JSON.",
                  responses={400: {"model": Failure}, 413: {"model": Failure}, 422: {"model": Failure},
                             503: {"model": Failure}})
    app.state.line = line
    app.state.limits = limits

    @app.exception_handler(AttnvizError)
    async def user_error(request: Request, exc: AttnvizError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid" or not first:
            return JSONResponse({"error": "malformed request: the body is not valid JSON"}, status_code=422)
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse({"error": f"malformed request ({where or 'the body'}): {first.get('msg', '')}"},
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def refused(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """What the framework refuses itself (no such route, a method a route does not take, a body it cannot
        parse) in the one shape of every refusal: {"error": "…"}."""
        asked = f"{request.method} {request.url.path}"[:120]
        if exc.status_code == 404:
            message, status = f"no such route: {asked} (GET /openapi.json lists them)", 404
        elif exc.status_code == 405:
            message, status = f"this route does not take {request.method}: {asked}", 405
        elif exc.status_code == 400:
            message, status = "malformed request: the body is not valid JSON (or is nested too deep)", 422
        else:
            message, status = f"refused: {str(exc.detail)[:200]}", exc.status_code
        return JSONResponse({"error": message}, status_code=status, headers=getattr(exc, "headers", None))

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"retry-after": "2"})

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"the server failed on this request ({type(exc).__name__}); it goes on "
                                      f"serving"}, status_code=500)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> Response:
        return Response(_asset("live.html"), media_type="text/html; charset=utf-8",
                        headers={"content-security-policy": PAGE_CSP, "cache-control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        types = {"live.js": "text/javascript; charset=utf-8", "live.css": "text/css; charset=utf-8"}
        if name not in types:
            return JSONResponse({"error": "no such file"}, status_code=404)
        return Response(_asset(name), media_type=types[name], headers={"cache-control": "no-store"})

    @app.get("/api/model")
    async def describe() -> dict:
        """The model this server holds, what it reads (text, image or sound), and the limits of a request."""
        layers, heads = model.shape
        return {"model": model.name, "kind": kind, "layers": layers, "heads": heads, "device": model.device,
                "dtype": model.dtype, "seq2seq": bool(model.seq2seq), "limits": limits.to_dict(),
                "version": attnviz.__version__}

    @app.get("/api/queue")
    async def queue(ticket: str | None = None) -> dict:
        """How many requests wait, and where `ticket` stands: 0 while it runs, k with k requests before it,
        null when it is not in line (done, or not yet arrived)."""
        return {"waiting": line.waiting, "position": line.position(ticket) if ticket else None,
                "served": line.served}

    @app.post("/api/capture", response_model=CaptureAnswer)
    async def capture(request: CaptureRequest) -> dict:
        """Run the model once: the tokens, every head's statistics and pattern label, the address of the
        interactive page (/view/ID), and with `alpha_layer` that layer's α."""
        run = _capture_work(model, kind, request, limits, command, runs)
        started = time.perf_counter()
        answer, html = await line.run(_ticket(request.ticket, line), run)
        page_id = f"v{next(numbers)}"
        pages[page_id] = html
        while len(pages) > limits.pages:
            pages.popitem(last=False)
        return {**answer, "id": page_id, "view": f"/view/{page_id}", "seconds": time.perf_counter() - started}

    @app.get("/view/{page_id}", response_class=HTMLResponse, include_in_schema=False)
    async def view(page_id: str) -> Response:
        html = pages.get(page_id)
        if html is None:
            return JSONResponse({"error": f"no page {page_id[:40]!r}: the server keeps the last {limits.pages}"},
                                status_code=404)
        return Response(html, media_type="text/html; charset=utf-8",
                        headers={"content-security-policy": VIEW_CSP, "cache-control": "no-store"})

    @app.post("/api/steps")
    async def steps(request: StepsRequest) -> Response:
        """One head step by step, from the model's own weights: Q, K, Q·Kᵀ, ÷√d_k, softmax → α, α·V, and α
        checked against the model's (max_abs_diff)."""
        result = await line.run(line.new_ticket(), _steps_work(model, request, limits))
        return Response(attnviz_json(result.to_dict()), media_type="application/json")

    @app.post("/api/steps.png", response_class=Response)
    async def steps_png(request: StepsRequest) -> Response:
        """The same steps drawn: one PNG of every step."""
        result = await line.run(line.new_ticket(), _steps_work(model, request, limits))
        return Response(result.figure()._repr_png_(), media_type="image/png")  # the figure as a notebook shows it

    @app.post("/api/ablate")
    async def ablate(request: AblateRequest) -> Response:
        """The text with heads removed against the clean model (attnviz.ablate, what `attnviz ablate --json`
        prints): a causal LM's next-token distributions and loss before and after, an encoder's sentence
        embedding (cosine before and after), how much the later layers' attention changed, and the check
        against editing the weights."""
        result = await line.run(line.new_ticket(), _ablate_work(model, request, limits))
        return Response(attnviz_json(result.to_dict()), media_type="application/json")

    @app.post("/api/ablate.png", response_class=Response)
    async def ablate_png(request: AblateRequest) -> Response:
        """The later layers' Δα drawn (α with the heads removed − α clean)."""
        result = await line.run(line.new_ticket(), _ablate_work(model, request, limits))
        return Response(result.figure()._repr_png_(), media_type="image/png")

    @app.get("/api/analyses")
    async def registered() -> dict:
        """The analyses of a text this server answers (POST /api/analyses/NAME), each with what it does and its
        options: name, default, help (the command line's --the-name)."""
        return {"analyses": [_described(name) for name in served()]}

    @app.post("/api/analyses/{name}")
    async def analysis(name: str, request: AnalysisRequest) -> Response:
        """One analysis of the text, of its kept run (every analysis of one text reads one forward pass): the
        result's to_dict(), what `attnviz NAME TEXT --json` prints."""
        result = await line.run(line.new_ticket(), _analysis_work(name, model, request, limits, runs))
        return Response(attnviz_json(result.to_dict()), media_type="application/json")

    return app


def _described(name: str) -> dict:
    import dataclasses

    from attnviz import analyses
    from attnviz.base.options import flag
    from attnviz.base.records import plain

    analysis = analyses.get(name)
    return {"name": name, "summary": analysis.summary,
            "options": [{"name": f.name, "default": plain(f.default), "help": flag(f).help}
                        for f in dataclasses.fields(analysis.options)]}


def _analysis_work(name: str, model, request: AnalysisRequest, limits: Limits, runs: Runs):
    import dataclasses

    from attnviz import analyses

    if name not in served():
        raise InputError(f"no analysis {name[:40]!r} here: GET /api/analyses lists {', '.join(served())}")
    analysis = analyses.get(name)
    if model.vision or model.speech or model.seq2seq:
        raise InputError(f"the analyses routes read a text's run; {model.name} reads "
                         f"{'a picture' if model.vision else 'a sound' if model.speech else 'a source and a target'}")
    text = _check_text(request.text, limits, model)
    known = [f.name for f in dataclasses.fields(analysis.options)]
    unknown = [k for k in request.options if k not in known]
    if unknown:
        raise InputError(f"{name} has no option {unknown[0][:40]!r}; its options: {', '.join(known) or 'none'}")

    def work():
        n = _count_tokens(model, text, limits)
        if n is not None and n > limits.max_alpha_tokens:  # an answer holds up to L·T² numbers, as α does
            raise InputError(f"the text is {n:,} tokens; the analyses are answered for texts of at most "
                             f"{limits.max_alpha_tokens:,} (as α is in /api/capture: their answers grow as T²)")
        return analysis(runs.of(text, request.words), **request.options)

    return work


def _ablate_work(model, request: AblateRequest, limits: Limits):
    text = _check_text(request.text, limits, model)
    if request.mode not in ("zero", "mean"):
        raise InputError(f"mode is zero or mean, not {request.mode[:20]!r}")

    def work():
        _count_tokens(model, text, limits)
        return attnviz.ablate(text, heads=request.heads, model=model, mode=request.mode)

    return work


def _ticket(given: str | None, line: OneAtATime) -> str:
    if given is None:
        return line.new_ticket()
    if not TICKET.match(given):
        raise InputError("a ticket is 1 to 64 letters, digits, - or _")
    return given


def _check_text(text: str | None, limits: Limits, model) -> str:
    if text is None:
        raise InputError(f"{model.name} reads text: give \"text\"")
    if len(text) > limits.max_chars:
        raise InputError(f"the text is {len(text):,} characters; this server takes at most "
                                   f"{limits.max_chars:,}")
    return check_text(text)


def _count_tokens(model, text: str, limits: Limits) -> int | None:
    tokenizer = model.tokenizer
    if tokenizer is None:
        return None
    try:
        n = len(tokenizer(text)["input_ids"])
    except Exception:  # the API says what is wrong with the text, in its own words
        return None
    if n > limits.max_tokens:
        raise InputError(f"the text is {n:,} tokens; this server takes at most {limits.max_tokens:,}")
    return n


def _file(data: str | None, what: str, limits: Limits) -> bytes:
    if data is None:
        raise InputError(f"this model reads {'a picture' if what == 'image' else 'a sound'}: give "
                                   f"\"{what}\" (the file, base64)")
    if len(data) > limits.max_file * 4 // 3 + 4:
        raise InputError(f"the {what} file is over {limits.max_file >> 20} MB")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"\"{what}\" is not base64") from None


class Runs:
    """The last `size` texts' runs (attnviz.Run), newest last: every view of a text — its page, its contributions,
    its head table — read from one forward pass, as long as the text is among the last ones asked. Used on the
    model's thread only (OneAtATime)."""

    def __init__(self, model: Any, size: int):
        self.model, self.size = attnviz.load(model), max(1, size)
        self.kept: OrderedDict[tuple[str, bool], Any] = OrderedDict()

    def of(self, text: str, words: bool) -> Any:
        key = (text, words)
        run = self.kept.pop(key, None) or self.model.run(text, words=words)
        self.kept[key] = run
        while len(self.kept) > self.size:
            self.kept.popitem(last=False)
        return run


def _capture_work(model, kind: str, request: CaptureRequest, limits: Limits, command: str, runs: Runs):
    """What runs on the model's thread for one capture: (the JSON answer, the page)."""
    from attnviz.render.viewer import viewer_data, viewer_html

    if kind == "text":
        text = _check_text(request.text, limits, model)
    elif kind == "image":
        raw = _file(request.image, "image", limits)
    else:
        raw = _file(request.audio, "audio", limits)

    def work() -> tuple[dict, str]:
        contributions = None
        if kind == "text":
            _count_tokens(model, text, limits)  # here, on the model's thread: the tokenizer is used by one
        given: Any = (text if kind == "text" else attnviz.picture(raw) if kind == "image" else attnviz.sound(raw))
        whole: Any
        if kind == "text" and not model.seq2seq:  # every view of a text from its one run
            run = runs.of(text, request.words and not request.contributions)
            if request.contributions:
                contributions = run.contributions()
                whole = contributions.capture
            else:
                whole = run.capture
        else:
            whole = attnviz.capture(given, model=model, words=request.words and kind == "text", stream=False)
        shown = whole.part("cross") if isinstance(whole, attnviz.Parts) else whole
        html = contributions.html(command=command) if contributions is not None else \
            viewer_html(viewer_data(whole, command=command))
        written = str(whole.meta.get("target_text", "")).strip() if isinstance(whole, attnviz.Parts) else ""
        answer = {"model": model.name, "kind": kind, "tokens": list(shown.tokens), "layers": shown.n_layers,
                  "heads": shown.n_heads, "head_table": attnviz.heads(shown).to_records(),
                  "part": shown.part, "transcript": written or None}
        if request.alpha_layer is not None:
            if shown.n_tokens > limits.max_alpha_tokens:
                raise InputError(f"α in the answer is for texts of at most {limits.max_alpha_tokens} "
                                           f"tokens; this one is {shown.n_tokens}")
            if not -shown.n_layers <= request.alpha_layer < shown.n_layers:
                raise InputError(f"alpha_layer {request.alpha_layer} is out of range: there are "
                                           f"{shown.n_layers} layers")
            answer["alpha"] = shown.attentions[request.alpha_layer].round(6).tolist()
        return answer, html

    return work


def _steps_work(model, request: StepsRequest, limits: Limits):
    text = _check_text(request.text, limits, model)

    def work():
        _count_tokens(model, text, limits)
        return attnviz.steps(text, model=model, layer=request.layer, head=request.head, token=request.token)

    return work


def attnviz_json(data: dict) -> bytes:
    from attnviz.base.records import to_json

    return to_json(data).encode("utf-8")
