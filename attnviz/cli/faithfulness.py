"""attnviz faithfulness: which explanation of a prediction to trust, every attribution measured side by side."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import read_texts, Source, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib) keep `attnviz --help` light.

import attnviz.analyses.faithfulness as FAITHFULNESS_ANALYSIS
from attnviz.base.options import as_keywords



@app.command(help=FAITHFULNESS_ANALYSIS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=FAITHFULNESS_ANALYSIS.Options)
def faithfulness(corpus: Annotated[Optional[str], typer.Option(
                     "--corpus", metavar="FILE", show_default=False,
                     help="Many texts instead of TEXT: a file with one per line, or JSON lines with a text field "
                          "(told apart by their first line; - reads standard input; at most 10,000 texts). Per "
                          "method the mean AOPC with a 95 % bootstrap interval (from 10 texts), whether its lead over "
                          "the next is significant (the paired test needs 6 texts or more) and which methods to "
                          "trust.")] = None,
                 output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
                 *, model: ModelOptions, inp: Source, options: FAITHFULNESS_ANALYSIS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if (options.engine != "local" or options.address is not None) and corpus is None:
        raise typer.BadParameter("--engine and --address spread a --corpus; one text runs here",
                                 param_hint="--engine")
    if corpus is not None:
        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT (or --text-file) or --corpus, not both", param_hint="--corpus")
        from attnviz.api.attribution.faithfulness import MAX_CORPUS_TEXTS

        given = read_texts(corpus, MAX_CORPUS_TEXTS, "--corpus")
        loaded = model.spec() if options.engine == "ray" else model.later()
    else:
        given = inp.resolve()
        loaded = model.later_for(given)
    result = attnviz.faithfulness(given, model=loaded, **as_keywords(options), truncate=model.truncate,
                                  reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])
