"""The commands computed from the model's own weights: steps (one head's formula, step by step), positions (what
position embeddings do), verify (α recomputed from the formula) and scaling (why divide by √d_k)."""

from __future__ import annotations

import attnviz.analyses.positions as POSITIONS
import attnviz.analyses.scaling as SCALING
import attnviz.analyses.steps as STEPS
import attnviz.analyses.verify as VERIFY
from attnviz.base.options import as_keywords
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, err, figure_file, say
from attnviz.cli.params import CmapOpt, ImageOut, JsonOpt, ModelOptions

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(help=STEPS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=STEPS.Options)
def steps(output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
          *, model: ModelOptions, inp: Source, options: STEPS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.steps(given, model=model.later_for(given), **as_keywords(options), truncate=model.truncate,
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, files=[figure_file(output, result, cmap=cmap)])


@app.command(help=POSITIONS.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio"), options=POSITIONS.Options)
def positions(output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
              *, model: ModelOptions, inp: Source, options: POSITIONS.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.positions(given, model=model.later_for(given), **as_keywords(options),
                               reporter=inp.options()["reporter"])
    style: dict = {} if isinstance(result, attnviz.GridPositions) else {"cmap": cmap}
    emit(result, as_json=as_json, files=[figure_file(output, result, **style)])


@app.command(help=VERIFY.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "saved"), options=VERIFY.Options)
def verify(as_json: JsonOpt = False, *, model: ModelOptions, inp: Source, options: VERIFY.Options) -> None:
    import attnviz
    from attnviz.api.scratch.verify import model_of, refuse_windows

    given = inp.resolve()
    reading = inp.options()
    if isinstance(given, (attnviz.Capture, attnviz.Parts)):
        refuse_windows(given)  # before the model loads
        again = model_of(given)  # how the capture's model loads again
        if model.model is None:
            say(f"Model: {again} (named by the capture; --model chooses another)", console=err, style="dim")
        from dataclasses import replace

        loaded = replace(model, model=model.model or again).load()
        result = attnviz.verify(given, source=str(inp.source), model=loaded, tolerance=options.tolerance,
                                reporter=reading["reporter"])
    else:
        loaded = model.load_for(given)
        result = attnviz.verify(given, model=loaded, **as_keywords(options), truncate=model.truncate,
                                target=inp.target, max_new_tokens=inp.max_new_tokens, reporter=reading["reporter"])
    emit(result, as_json=as_json)


@app.command(help=SCALING.SUMMARY)
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"), options=SCALING.Options)
def scaling(output: ImageOut = None, as_json: JsonOpt = False, *, model: ModelOptions, inp: Source,
            options: SCALING.Options) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.scaling(given, model=model.later_for(given), **as_keywords(options), truncate=model.truncate,
                             reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, files=[figure_file(output, result)])
