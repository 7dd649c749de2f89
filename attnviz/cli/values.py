"""What attention actually moves: value-weighted norms (Kobayashi et al. 2020) and the attention sinks they judge
(Gu et al. 2024): norms, sinks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Annotated, Optional

import typer

import attnviz.analyses.norms as NORMS
import attnviz.analyses.sinks as SINKS
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, read_texts, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CmapOpt, CsvOpt, ImageOut, JsonOpt, ModelOptions

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(help=NORMS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio"), options=NORMS.Options)
def norms(output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          *, model: ModelOptions, inp: Source, options: NORMS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.norms(given, model=model.later_for(given), **as_keywords(options), truncate=model.truncate,
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result, cmap=cmap)])


MAX_CORPUS_TEXTS = 10_000  # sinks --corpus


@app.command(help=SINKS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio"), options=SINKS.Options)
def sinks(corpus: Annotated[Optional[Path], typer.Option(
              "--corpus", metavar="FILE", dir_okay=False, show_default=False,
              help="Instead of one text: the model-level sink rate Sink₁^ε of Gu et al. 2024 over the texts of "
                   "FILE (one per line, or JSON lines with a text field; - reads standard input; each cut to "
                   "its first --tokens tokens): the share of heads whose first "
                   "token's sink score passes --threshold.")] = None,
          output: ImageOut = None, cmap: CmapOpt = "viridis",
          as_json: JsonOpt = False, as_csv: CsvOpt = False, *, model: ModelOptions, inp: Source,
          options: SINKS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if corpus is not None:
        if inp.given_text() is not None or inp.image is not None or inp.audio is not None:
            raise typer.BadParameter("give TEXT or --corpus FILE, not both", param_hint="--corpus")
        if output is not None:
            raise typer.BadParameter("--corpus prints the rate; -o draws one text's sinks", param_hint="-o")
        if not 0 < options.threshold < 1:
            raise typer.BadParameter("--corpus takes a threshold above 0 and below 1", param_hint="--threshold")
        given: Any = read_texts(corpus, MAX_CORPUS_TEXTS, "--corpus")
        loaded = model.load()
    else:
        given = inp.resolve()
        loaded = model.load_for(given)
    result = attnviz.sinks(given, model=loaded, **as_keywords(options), truncate=model.truncate,
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result, cmap=cmap)])
