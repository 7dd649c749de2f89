"""The commands computed from the model's own weights: steps (one head's formula, step by step), positions (what
position embeddings do), verify (α recomputed from the formula) and scaling (why divide by √d_k)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.base.selection import Selection
from attnviz.base.text import visible
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, err, figure_file, say
from attnviz.cli.params import (CmapOpt, ImageOut, JsonOpt, ModelOptions, OneHead, OneLayer, finite_float,
                                whole_number)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

TokenOpt = Annotated[Optional[str], typer.Option(
    "--token", metavar="TOKEN", show_default=False,
    help="A token: its index, its text (case-insensitive) or text#n for the n-th occurrence (the#2).")]


@app.command(help="One head's attention step by step, from the model's own weights: Q and K, the scores "
                  "Q·Kᵀ, the scaling by √d_k, the mask, the softmax → α, and α·V; α is checked against the "
                  "model's own. --token follows one query row.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def steps(layer: OneLayer = Selection.parse("0", "layer", field="layer"),
          head: OneHead = Selection.parse("0", "head", field="head"),
          token: TokenOpt = None, output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
          *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.steps(given, model=model.later_for(given), layer=layer.one(), head=head.one(), token=token,
                           truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, files=[figure_file(output, result, cmap=cmap)])


@app.command(help="Why transformers need positions: shuffle the words and run the model twice. With its "
                  "position embeddings zeroed, α of the shuffled text is exactly the same permutation of α "
                  "(self-attention alone sees a set); with them it is not. Encoder models (BERT-like). With "
                  "--image, a vision model's position embeddings over the picture's patch grid: how similar each "
                  "patch position is to each other (-o draws a small map per patch).")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio"))
def positions(layer: OneLayer = Selection.parse("-1", "layer", field="layer"),
              seed: Annotated[int, typer.Option(help="Seed of the word shuffle.", parser=whole_number(0),
                                                metavar="N")] = 0,
              output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
              *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.positions(given, model=model.later_for(given), seed=seed, layer=layer.one(),
                               reporter=inp.options()["reporter"])
    style: dict = {} if isinstance(result, attnviz.GridPositions) else {"cmap": cmap}
    emit(result, as_json=as_json, files=[figure_file(output, result, **style)])


@app.command(help="Recompute α = softmax(Q·Kᵀ/√d_k) from the model's own weights and compare it with what the model "
                  'reports, per layer. Exit 0 within the tolerance, 3 outside it.')
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq", "saved"))
def verify(tolerance: Annotated[Optional[float], typer.Option(
               parser=finite_float(0.0), show_default=False,
               help="Largest |Δα| that passes. Default 1e-5 in float32, 5e-3 in float16, 5e-2 in bfloat16.")] = None,
           norms: Annotated[bool, typer.Option(
               "--norms", help="Check the value-weighted norms instead: Σ_h Σ_j α_ij f_h(x_j) + b_O must equal the "
                               "attention block's own output.")] = False,
           as_json: JsonOpt = False, *, model: ModelOptions, inp: Source) -> None:
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
        result = attnviz.verify(given, source=str(inp.source), model=loaded, tolerance=tolerance,
                                reporter=reading["reporter"])
    else:
        loaded = model.load_for(given)
        result = attnviz.verify(given, model=loaded, norms=norms, tolerance=tolerance, truncate=model.truncate,
                                target=inp.target, max_new_tokens=inp.max_new_tokens, reporter=reading["reporter"])
    emit(result, as_json=as_json)


def _dk_list(value) -> list[int]:
    """--dk 16,64,256: up to MAX_DK_VALUES whole numbers from 1 to MAX_DK."""
    from attnviz.api.scratch.scaling import MAX_DK, MAX_DK_VALUES  # here: --help loads no numpy

    if isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",")]
    if not 1 <= len(parts) <= MAX_DK_VALUES or not all(p.isascii() and p.isdigit() and 1 <= int(p) <= MAX_DK
                                                        for p in parts):
        raise typer.BadParameter(f"{visible(str(value))[:40]!r}: give up to {MAX_DK_VALUES} whole numbers from 1 to "
                                 f"{MAX_DK:,}, comma-separated (16,64,256)")
    return [int(p) for p in parts]


@app.command(help="Why attention divides by √d_k: per layer of the real model, the spread of the scores Q·Kᵀ "
                  "and the entropy and peak of the softmax, with and without the division; then the "
                  "random-vector check at the model's own d_k and at d_k = 64.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def scaling(output: ImageOut = None, as_json: JsonOpt = False,
            dk: Annotated[Optional[str], typer.Option(
                "--dk", metavar="LIST", show_default=False, parser=_dk_list,
                help="The random-vector check also at these d_k (e.g. 16,64,256; each 1 to 4,096, at most 8), "
                     "beside the model's own.")] = None,
            *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.scaling(given, model=model.later_for(given), dk=_dk_list(dk) if dk else None,
                             truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, files=[figure_file(output, result)])
