"""What happens inside a model: circuits (QK and OV circuits from the weights), retrieval (retrieval heads) and
massive (massive activations and the sinks they make)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

import attnviz.analyses.massive as MASSIVE
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, read_texts, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, whole_number

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.

MAX_REFERENCE_TEXTS = 1000  # --reference: the texts whose mean the intervention sets the entries to


@app.command(help="QK and OV circuits from the weights alone, no text (Elhage et al. 2021; TransformerLens's "
                  "FactoredMatrix and all_composition_scores): each head's OV copying score Σλ/Σ|λ| on the "
                  "vocabulary's common words (1: it copies what it attends to), its strongest QK token pairs, and "
                  "Q-, K-, V-composition between heads of different layers. A causal LM (-m gemma3).")
@cli_errors
@takes(model=ModelOptions)
def circuits(tokens: Annotated[int, typer.Option(
                 "--tokens", parser=whole_number(10, 20000), metavar="N",
                 help="The circuits are read on the vocabulary's first N tokens that are words.")] = 2000,
             top: Annotated[int, typer.Option("--top", parser=whole_number(1, 50), metavar="K",
                                              help="How many heads and head pairs to list.")] = 8,
             output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
             *, model: ModelOptions) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    result = attnviz.circuits(model=model.later(), tokens=tokens, top=3, listed=top,
                              reporter=_reporter())
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


def _numbers(value: str, kind: type, name: str) -> list:
    try:
        found = [kind(part) for part in value.split(",") if part.strip()]
    except ValueError:
        found = []
    if not found:
        raise typer.BadParameter(f"{value!r}: give numbers separated by commas", param_hint=name)
    return found


@app.command(help="Retrieval heads (Wu et al. 2024): needle-in-a-haystack prompts made by attnviz (a secret number "
                  "among plain sentences, then the question), the model's answer written token by token, and each "
                  "head's share of the needle it copies (its most-attended key in the needle, holding the token "
                  "just written), over the prompts answered correctly. The causal test: the top heads removed "
                  "against as many random heads, by the answer tokens still predicted. A causal LM (-m gemma3).")
@cli_errors
@takes(model=ModelOptions)
def retrieval(lengths: Annotated[str, typer.Option(
                  "--lengths", metavar="N,N",
                  help="Prompt lengths in tokens, about (60 to 16,384).")] = "300,600,1200",
              depths: Annotated[str, typer.Option(
                  "--depths", metavar="D,D",
                  help="Where the needle sits: 0 at the start, 1 at the end.")] = "0.1,0.5,0.9",
              remove: Annotated[int, typer.Option(
                  "--remove", parser=whole_number(0, 1000), metavar="K",
                  help="The causal test removes the K top heads (0: no test).")] = 10,
              draws: Annotated[int, typer.Option(
                  "--draws", parser=whole_number(0, 100), metavar="N",
                  help="…against N draws of K random heads.")] = 5,
              seed: Annotated[int, typer.Option(
                  "--seed", parser=whole_number(0, 2**32 - 1), metavar="N",
                  help="The random seed of the prompts and of the random heads.")] = 0,
              top: Annotated[int, typer.Option("--top", parser=whole_number(1, 100), metavar="K",
                                               help="How many heads to list.")] = 10,
              output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
              *, model: ModelOptions) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    chosen_lengths = _numbers(lengths, int, "--lengths")
    chosen_depths = _numbers(depths, float, "--depths")
    result = attnviz.retrieval(model=model.later(), lengths=chosen_lengths, depths=chosen_depths,
                               remove=remove, draws=draws, seed=seed, top=top, reporter=_reporter())
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
