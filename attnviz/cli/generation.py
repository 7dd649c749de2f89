"""The generate command: a causal language model writes, and its attention is kept step by step."""

from __future__ import annotations

from typing import Annotated

import typer

import attnviz.analyses.generate as GENERATE
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, output_path
from attnviz.cli.params import JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help=GENERATE.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq"), options=GENERATE.Options)
def generate(terminal: Annotated[bool, typer.Option(
                 "--terminal", "-t", help="Per new token: the earlier tokens it attends to most.")] = False,
             as_json: JsonOpt = False, *, model: ModelOptions, inp: Source, options: GENERATE.Options) -> None:
    import attnviz

    output = options.output
    check_output(output, (".npz",))
    if not options.sample and (options.temperature is not None or options.top_p is not None):
        raise typer.BadParameter("--temperature and --top-p choose how to sample: add --sample")
    if options.temperature is not None and options.temperature <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--temperature")
    if options.top_p is not None and not 0 < options.top_p <= 1:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--top-p")
    if inp.image is not None:
        raise typer.BadParameter("generate writes text after a text; a picture is for vision models' attention "
                                 "(heatmap, heads, verify, norms, sinks)", param_hint="--image")
    if inp.audio is not None:
        raise typer.BadParameter("generate writes text after a text; for a sound, heatmap, capture and view --audio "
                                 "keep the transcript Whisper writes, step by step", param_hint="--audio")
    given = inp.resolve()
    loaded = model.load_for(given, lm_head=True)
    loaded.check_inputs(part=options.part, target=inp.target, max_new_tokens=inp.max_new_tokens, writes=True)
    if loaded.seq2seq and inp.target is not None:
        raise typer.BadParameter("generate writes the target; --target is for the viewing commands")
    result = attnviz.generate(given, model=loaded, **{**as_keywords(options), "output": None if output is None
                                                      else output_path(output, "generation.npz")},
                              max_new_tokens=inp.max_new_tokens or 20, truncate=model.truncate,
                              reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, style={"terminal": terminal})
