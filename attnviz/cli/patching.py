"""Activation patching: attnviz patch CLEAN CORRUPT (and path patching, --from-heads)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

import attnviz.analyses.patch as PATCH
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes, two_prompts
from attnviz.cli.output import check_output, emit, figure_file, page_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help=PATCH.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=PATCH.Options)
def patch(corrupt: Annotated[Optional[str], typer.Argument(
              metavar="CORRUPT", help="The corrupted prompt: the clean one (TEXT, -, or --text-file) with one fact "
                                      "changed, as many tokens (or --align).", show_default=False)] = None,
          page: Annotated[Optional[str], typer.Option(
              "--html", metavar="FILE", show_default=False,
              help="Write the interactive page to FILE (.html): the views of α on both prompts and the patching "
                   "panel (each head's map, each layer and position's; choose a head to see its α on both "
                   "prompts).")] = None,
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
          *, model: ModelOptions, inp: Source, options: PATCH.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    check_output(page, (".html", ".htm"))
    if options.senders is not None and page is not None:
        raise typer.BadParameter("the page shows activation patching; path patching (--senders) prints its "
                                 "scores", param_hint="--html")
    clean, corrupt = two_prompts(inp, corrupt, "attnviz patch CLEAN CORRUPT")
    result = attnviz.patch(clean, corrupt, model=model.later_for(clean), **as_keywords(options),
                           truncate=model.truncate, reporter=inp.options()["reporter"])
    files = [] if options.senders is not None else [figure_file(output, result), page_file(page, result)]
    emit(result, as_json=as_json, as_csv=as_csv, files=files)
