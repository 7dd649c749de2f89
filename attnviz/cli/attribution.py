"""What attention contributes: logit-attr (direct logit attribution per head) and contributions (ALTI, value
zeroing)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

import attnviz.analyses.contributions as CONTRIBUTIONS_ANALYSIS
import attnviz.analyses.lens as LENS
import attnviz.analyses.logit_attr as LOGIT_ATTR
import attnviz.analyses.why as WHY
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import File, check_output, emit, figure_file, page_file
from attnviz.cli.params import (CsvOpt, ImageOut, JsonOpt, ModelOptions)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


def _one_text(function: str, output, as_json: bool, as_csv: bool, model: ModelOptions, inp: Source,
              options) -> None:
    """logit-attr, lens, why: attnviz.FUNCTION on the one text given, printed (or --json, --csv) and drawn (-o)."""
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = getattr(attnviz, function)(given, model=model.later_for(given), **as_keywords(options),
                                        truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(name="logit-attr", help=LOGIT_ATTR.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=LOGIT_ATTR.Options)
def logit_attr(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
               *, model: ModelOptions, inp: Source, options: LOGIT_ATTR.Options) -> None:
    _one_text("logit_attr", output, as_json, as_csv, model, inp, options)


@app.command(help=LENS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=LENS.Options)
def lens(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
         *, model: ModelOptions, inp: Source, options: LENS.Options) -> None:
    _one_text("lens", output, as_json, as_csv, model, inp, options)


@app.command(help=WHY.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=WHY.Options)
def why(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
        *, model: ModelOptions, inp: Source, options: WHY.Options) -> None:
    _one_text("why", output, as_json, as_csv, model, inp, options)


@app.command(help=CONTRIBUTIONS_ANALYSIS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=CONTRIBUTIONS_ANALYSIS.Options)
def contributions(graph: Annotated[Optional[str], typer.Option(
                      "--graph", metavar="FILE", show_default=False,
                      help="Draw the contribution graph (tokens across, layers up, an edge where a contribution "
                           "reaches --threshold, the strongest paths into --token in colour) to FILE (.png, .svg, "
                           ".pdf).")] = None,
                  page: Annotated[Optional[str], typer.Option(
                      "--html", metavar="FILE", show_default=False,
                      help="Write the interactive page to FILE (.html): the views of α and the contributions "
                           "panel (the graph; choose a token: its strongest incoming paths, and what reaches it by "
                           "contribution beside α's rollout), --token chosen first.")] = None,
                  output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
                  *, model: ModelOptions, inp: Source, options: CONTRIBUTIONS_ANALYSIS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    check_output(graph, FORMATS)
    check_output(page, (".html", ".htm"))
    if not 0 < options.threshold <= 1:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--threshold")
    given = inp.resolve()
    result = attnviz.contributions(given, model=model.later_for(given), **as_keywords(options),
                                   truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv,
         files=[figure_file(output, result),
                File(graph, result.graph_name, lambda path: _save(result.graph(), path)),
                page_file(page, result)])


def _save(figure, path):
    from attnviz.render.png import save_figure

    return save_figure(figure, path)
