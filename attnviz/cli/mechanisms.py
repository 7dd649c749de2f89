"""What happens inside a model: circuits (QK and OV circuits from the weights), retrieval (retrieval heads) and
massive (massive activations and the sinks they make)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import attnviz.analyses.circuits as CIRCUITS
import attnviz.analyses.retrieval as RETRIEVAL
import attnviz.analyses.massive as MASSIVE
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, read_texts, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.

MAX_REFERENCE_TEXTS = 1000  # --reference: the texts whose mean the intervention sets the entries to


@app.command(help=CIRCUITS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, options=CIRCUITS.Options)
def circuits(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
             *, model: ModelOptions, options: CIRCUITS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    result = attnviz.circuits(model=model.later(), **as_keywords(options), reporter=_reporter())
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(help=RETRIEVAL.SUMMARY)
@cli_errors
@takes(model=ModelOptions, options=RETRIEVAL.Options)
def retrieval(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
              *, model: ModelOptions, options: RETRIEVAL.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    result = attnviz.retrieval(model=model.later(), **as_keywords(options), reporter=_reporter())
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(help=MASSIVE.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=MASSIVE.Options)
def massive(reference: Annotated[Optional[Path], typer.Option(
                "--reference", metavar="FILE", dir_okay=False, show_default=False,
                help="--intervene: the texts (one per line, or JSON lines with a text field) whose mean the "
                     "entries are set to. Default: 16 sentences of attnviz's own.")] = None,
            output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
            *, model: ModelOptions, inp: Source, options: MASSIVE.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if reference is not None and not options.intervene:
        raise typer.BadParameter("--reference gives the means of --intervene; add --intervene",
                                 param_hint="--reference")
    texts = None if reference is None else read_texts(reference, MAX_REFERENCE_TEXTS, "--reference",
                                                        text_on_stdin=inp.text == "-")
    given = inp.resolve()
    result = attnviz.massive(given, model=model.later_for(given), **as_keywords(options), reference=texts,
                             truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


def _reporter():
    from attnviz.cli.inputs import CliReporter

    return CliReporter()
