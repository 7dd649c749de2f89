"""Circuits found, not guessed: attnviz discover CLEAN CORRUPT --answers A,B (or --pairs FILE)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

import attnviz.analyses.discover as DISCOVER
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes, two_prompts
from attnviz.cli.output import check_output, emit, figure_file, page_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, answer_pair

# Imports inside the command (the API, numpy, matplotlib) keep `attnviz --help` light.


@app.command(help=DISCOVER.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=DISCOVER.Options)
def discover(corrupt: Annotated[Optional[str], typer.Argument(
                 metavar="CORRUPT", help="The corrupted prompt: the clean one (TEXT, -, or --text-file) with one fact "
                                         "changed, as many tokens.", show_default=False)] = None,
             answers: Annotated[Optional[str], typer.Option(
                 "--answers", metavar="A,B", show_default=False,
                 help="The answer and the other, two tokens of the vocabulary as text (a word's leading space is "
                      "part of its token): ' Paris',' Rome'.")] = None,
             pairs: Annotated[Optional[str], typer.Option(
                 "--pairs", metavar="FILE", show_default=False,
                 help="Many pairs instead: JSON lines of {\"clean\": …, \"corrupt\": …, \"answers\": [A, B]} (- reads "
                      "standard input; at most 1,000 pairs, 16 MB); the scores summed, the curve over all of them.")]
             = None,
             page: Annotated[Optional[str], typer.Option(
                 "--html", metavar="FILE", show_default=False,
                 help="Write a page (.html): the circuit and its curve, and every listed edge, searchable.")] = None,
             output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
             *, model: ModelOptions, inp: Source, options: DISCOVER.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    check_output(page, (".html", ".htm"))
    model.require_causal("discover")  # said first: no other argument matters for an encoder
    if pairs is not None:
        if inp.text is not None or inp.text_file is not None or corrupt is not None or answers is not None:
            raise typer.BadParameter("give CLEAN CORRUPT --answers A,B, or --pairs FILE, not both",
                                     param_hint="--pairs")
        result = attnviz.discover(pairs=pairs, model=model.later_for(None), **as_keywords(options),
                                  reporter=inp.options()["reporter"])
    else:
        clean, corrupt = two_prompts(inp, corrupt, "attnviz discover CLEAN CORRUPT --answers A,B (or --pairs FILE)")
        if answers is None:
            raise typer.BadParameter("give the two answers: --answers ' Paris',' Rome'", param_hint="--answers")
        result = attnviz.discover(clean, corrupt, answers=answer_pair(answers), model=model.later_for(clean),
                                  **as_keywords(options), reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result), page_file(page, result)])
