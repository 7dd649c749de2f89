"""Commands that summarise attention: heads, entropy, rollout; and explain, what every term means."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

import attnviz.analyses.entropy as ENTROPY
import attnviz.analyses.explain as EXPLAIN
import attnviz.analyses.heads as HEADS
import attnviz.analyses.rollout as ROLLOUT
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import (CmapOpt, CsvOpt, ImageOut, JsonOpt, ModelOptions)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

SEEN = ("text", "image", "audio", "seq2seq", "long", "saved")  # what these commands look at


@app.command(help=HEADS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN), options=HEADS.Options)
def heads(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *, model: ModelOptions,
          inp: Source, options: HEADS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.heads(given, model=model.later_for(given), **as_keywords(options), **inp.options(),
                           truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(help=ENTROPY.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN), options=ENTROPY.Options)
def entropy(output: ImageOut = None, cmap: CmapOpt = "viridis", as_json: JsonOpt = False, as_csv: CsvOpt = False,
            *, model: ModelOptions, inp: Source, options: ENTROPY.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.entropy(given, model=model.later_for(given), **as_keywords(options), **inp.options(),
                             truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, style={"cmap": cmap}, files=[figure_file(output, result, cmap=cmap)])


@app.command(help=ROLLOUT.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN), options=ROLLOUT.Options)
def rollout(output: ImageOut = None, cmap: CmapOpt = "viridis", as_json: JsonOpt = False, as_csv: CsvOpt = False,
            *, model: ModelOptions, inp: Source, options: ROLLOUT.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.rollout(given, model=model.later_for(given), **as_keywords(options), **inp.options(),
                             truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result, cmap=cmap)])


@app.command(help=EXPLAIN.SUMMARY)
@cli_errors
def explain(term: Annotated[Optional[str], typer.Argument(
                metavar="TERM", help="A column (entropy, prev, norm_ent, …), a label (previous-token, …), a term "
                                     "(rollout, alpha, scale) or a command (heads, patch). Default: everything.",
                show_default=False)] = None,
            as_json: JsonOpt = False, as_csv: CsvOpt = False) -> None:
    import attnviz

    emit(attnviz.explain(term), as_json=as_json, as_csv=as_csv)
