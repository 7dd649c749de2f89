"""The views of α: heatmap, token, compare and view (the interactive page). Each parses its options, calls the
API function of its name and hands the result to the emitter."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import attnviz.analyses.compare as COMPARE
import attnviz.analyses.heatmap as HEATMAP
import attnviz.analyses.token as TOKEN
import attnviz.analyses.view as VIEW
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, figure_file, page_file
from attnviz.cli.params import (CmapOpt, CsvOpt, ImageOut, JsonOpt, ModelOptions,
                                StartOpt)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

SEEN = ("text", "image", "audio", "seq2seq", "long", "saved")  # what the viewing commands look at


@app.command(help=HEATMAP.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN), options=HEATMAP.Options)
def heatmap(output: Annotated[Optional[str], typer.Option(
                "--output", "-o", metavar="FILE", show_default=False,
                help="Image file: .png, .svg or .pdf by the suffix; a folder gets the default name inside. "
                     "Default: attnviz_layer5_mean.png and the like (layer and head in the name), here.")] = None,
            terminal: Annotated[bool, typer.Option(
                "--terminal", "-t", help="Draw in the terminal (and write an image only if -o is given).")] = False,
            cmap: CmapOpt = "viridis", start: StartOpt = 0, as_json: JsonOpt = False, *, model: ModelOptions,
            inp: Source, options: HEATMAP.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.heatmap(given, model=model.later_for(given), **as_keywords(options), **inp.options(),
                             truncate=model.truncate)
    emit(result, as_json=as_json, report=terminal, style={"cmap": cmap, "start": start},
         files=[figure_file(output, result, cmap=cmap, wanted=output is not None or not (terminal or as_json))])


@app.command(help=TOKEN.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN), options=TOKEN.Options)
def token(token: Annotated[Optional[str], typer.Argument(
              help="The token: its index, its text (case-insensitive) or text#n for the n-th occurrence "
                   "(after TEXT, or alone with --from).", show_default=False, metavar="TOKEN")] = None,
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          *, model: ModelOptions, inp: Source, options: TOKEN.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if token is None and (inp.source is not None or inp.audio is not None or inp.image is not None) \
            and inp.text is not None and options.tokens is None:  # attnviz token --from F TOKEN (--audio F, …)
        from dataclasses import replace

        token, inp = inp.text, replace(inp, text=None)
    if token is None and options.tokens is None:
        raise typer.BadParameter("give the TOKEN to look at: attnviz token \"TEXT\" TOKEN, or --from FILE TOKEN "
                                 "(or several: --tokens 2,3)")
    if token is not None and options.tokens is not None:
        raise typer.BadParameter("give one TOKEN, or several with --tokens, not both")
    given = inp.resolve()
    result = attnviz.token(given, token, model=model.later_for(given), **as_keywords(options), **inp.options(),
                           truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, style={"cmap": cmap}, files=[figure_file(output, result, cmap=cmap)])


@app.command(help=COMPARE.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "long"), options=COMPARE.Options)
def compare(models: Annotated[Optional[str], typer.Option(
                help="Two models, comma-separated (or -m A,B), compared layer by layer on the same text.",
                show_default=False, metavar="A,B")] = None,
            sources: Annotated[Optional[list[Path]], typer.Option(
                "--from", help="Saved capture(s); give two to compare two captures.", dir_okay=False,
                show_default=False, metavar="FILE")] = None,
            start: StartOpt = 0, output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
            cmap: CmapOpt = "viridis", *, model: ModelOptions, inp: Source, options: COMPARE.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    names = [m.strip() for m in (models or model.model or "").split(",")] if (models or "," in (model.model or "")) \
        else None
    if names is not None and len(names) > 2:
        raise typer.BadParameter("give at most two models", param_hint="--models")
    if sources:
        if len(sources) > 2 or models:
            raise typer.BadParameter("give one or two --from captures, and no --models with them")
        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT or --from, not both")
        given = [attnviz.load_capture(path) for path in sources]
        loaded = None
    else:
        given = [inp.resolve()]  # read once (standard input, a file), then given to each model
        loaded = None if names else model.load_for(given[0])
    loaded_models = None if names is None else [_replace_model(model, n).load_for(given[0]) for n in names]
    result = attnviz.compare(given, models=loaded_models, model=loaded, **as_keywords(options), **inp.options(),
                             truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, style={"cmap": cmap, "start": start},
         files=[figure_file(output, result, cmap=cmap)])


def _replace_model(options: ModelOptions, name: str) -> ModelOptions:
    from dataclasses import replace

    return replace(options, model=name)


@app.command(help=VIEW.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN), options=VIEW.Options)
def view(output: Annotated[Optional[str], typer.Option(
             "--output", "-o", metavar="FILE", show_default=False,
             help="The page: FILE.html; a folder gets attnviz_view.html inside. Default: attnviz_view.html here.")]
         = None,
         open_page: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
         as_json: JsonOpt = False, *, model: ModelOptions, inp: Source, options: VIEW.Options) -> None:
    import attnviz

    check_output(output, (".html", ".htm"))
    given = inp.resolve()
    result = attnviz.view(given, model=model.later_for(given), **as_keywords(options), origin=None,
                          **inp.options(), truncate=model.truncate)
    page = page_file(output, result, wanted=True)
    emit(result, as_json=as_json, files=[page])
    if open_page:
        import webbrowser

        webbrowser.open(page.path.resolve().as_uri())
