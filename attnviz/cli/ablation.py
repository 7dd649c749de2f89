"""What a head does, tested by removing it: ablate, importance, detect."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import attnviz.analyses.ablate as ABLATE
import attnviz.analyses.detect as DETECT
import attnviz.analyses.importance as IMPORTANCE
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, read_texts, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import (CsvOpt, ImageOut, JsonOpt, ModelOptions)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


MeanOverOpt = Annotated[Optional[Path], typer.Option(
    "--mean-over", dir_okay=False, metavar="FILE", show_default=False,
    help="With --mode mean: average each head's output over the texts of this file (one per line, or JSON "
         "lines with a text field; - reads standard input) instead of the text's own tokens.")]


def _mean_texts(mode: str, mean_over: Path | None, text_on_stdin: bool) -> list[str] | None:
    """The texts of --mean-over (read only for --mode mean; otherwise the library says what to add)."""
    if mean_over is None:
        return None
    if mode != "mean":
        return []
    from attnviz.api.ablation.removing import MAX_MEAN_TEXTS

    return read_texts(mean_over, MAX_MEAN_TEXTS, "--mean-over", text_on_stdin=text_on_stdin)


@app.command(help=ABLATE.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=ABLATE.Options)
def ablate(mean_over: MeanOverOpt = None,
           terminal: Annotated[bool, typer.Option("--terminal", "-t", help="Draw Δα in the terminal too.")] = False,
           output: ImageOut = None, as_json: JsonOpt = False, *, model: ModelOptions, inp: Source,
           options: ABLATE.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    texts = _mean_texts(options.mode, mean_over, inp.text == "-")
    result = attnviz.ablate(given, model=model.later_for(given), **as_keywords(options), mean_over=texts,
                            truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, style={"terminal": terminal}, files=[figure_file(output, result)])


@app.command(help=IMPORTANCE.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=IMPORTANCE.Options)
def importance(corpus: Annotated[Optional[Path], typer.Option(
                   "--corpus", dir_okay=False, metavar="FILE", show_default=False,
                   help="Average over the texts of this file (one per line, or JSON lines with a text field; - "
                        "reads standard input; at most 1,000) instead of TEXT.")] = None,
               output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *, model: ModelOptions,
               inp: Source, options: IMPORTANCE.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if corpus is not None:
        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT or --corpus, not both", param_hint="--corpus")
        from attnviz.api.ablation.ranking import MAX_IMPORTANCE_TEXTS

        texts = read_texts(corpus, MAX_IMPORTANCE_TEXTS, "--corpus")
    else:
        texts = [inp.resolve()]
    result = attnviz.importance(texts, model=model.later(), **as_keywords(options),
                                source=None if corpus is None else str(corpus), truncate=model.truncate,
                                reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(help=DETECT.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(
    "audio", audio="A speech model (-m whisper, the default here): which cross-attention heads align with the sound "
                   "(each head's share of weight on the word-timing path; attnviz align), and whether the model "
                   "lists them as its alignment heads."), options=DETECT.Options)
def detect(output: ImageOut = None, as_json: JsonOpt = False,
           *, model: ModelOptions, inp: Source, options: DETECT.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if inp.audio is not None:
        heard = inp.resolve()
        result = attnviz.detect(heard, model=model.later_for(heard), reporter=inp.options()["reporter"])
    else:
        result = attnviz.detect(model=model.later(), **as_keywords(options), reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, files=[figure_file(output, result)])
