"""The generate command: a causal language model writes, and its attention is kept step by step."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.base.selection import Selection
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, output_path
from attnviz.cli.params import HeadSel, JsonOpt, LayerSel, ModelOptions, PartOpt, finite_float, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="A causal language model (e.g. -m smollm2, offline) continues the text with the KV cache; every "
                  "layer's and head's attention row of every new token is kept as it is produced. Prints the "
                  "generated text; -o saves the capture for heatmap, heads, export … --from (--rows generated shows "
                  "only the new tokens' rows); --terminal shows, per new token, the earlier tokens it attends to most.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio", "seq2seq"))
def generate(sample: Annotated[bool, typer.Option(
                 "--sample", help="Sample the next token instead of taking the most likely (greedy).")] = False,
             temperature: Annotated[Optional[float], typer.Option(
                 parser=finite_float(0.0), metavar="T", show_default=False,
                 help="With --sample: divide the logits by T (below 1 sharper, above 1 flatter). Default 1.")] = None,
             top_p: Annotated[Optional[float], typer.Option(
                 "--top-p", parser=finite_float(0.0), metavar="P", show_default=False,
                 help="With --sample: draw only from the most likely tokens that together hold P of the "
                      "probability (nucleus sampling). Default 1.")] = None,
             seed: Annotated[int, typer.Option(parser=whole_number(0, 2**64 - 1), metavar="N",
                                               help="With --sample: the random seed, 0 to 2⁶⁴−1 (same seed, same "
                                                    "text).")] = 0,
             output: Annotated[Optional[str], typer.Option(
                 "--output", "-o", metavar="FILE", show_default=False,
                 help="Save the capture of prompt + generated tokens (.npz; a folder gets generation.npz).")] = None,
             terminal: Annotated[bool, typer.Option(
                 "--terminal", "-t", help="Per new token: the earlier tokens it attends to most.")] = False,
             layer: LayerSel = Selection.parse("-1", "layer", field="layer"),
             head: HeadSel = Selection.parse("mean", "head", keywords=("mean", "max"), field="head"),
             top: Annotated[int, typer.Option(parser=whole_number(1, 20), metavar="K",
                                              help="--terminal and --json: the K earlier tokens shown per step (1 "
                                                   "to 20).")] = 3,
             part: PartOpt = None, as_json: JsonOpt = False, *, model: ModelOptions, inp: Source) -> None:
    import attnviz

    check_output(output, (".npz",))
    if not sample and (temperature is not None or top_p is not None):
        raise typer.BadParameter("--temperature and --top-p choose how to sample: add --sample")
    if temperature is not None and temperature <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--top-p")
    if inp.image is not None:
        raise typer.BadParameter("generate writes text after a text; a picture is for vision models' attention "
                                 "(heatmap, heads, verify, norms, sinks)", param_hint="--image")
    if inp.audio is not None:
        raise typer.BadParameter("generate writes text after a text; for a sound, heatmap, capture and view --audio "
                                 "keep the transcript Whisper writes, step by step", param_hint="--audio")
    decoding = attnviz.Decoding(max_new_tokens=inp.max_new_tokens or 20, sample=sample, seed=seed,
                                temperature=1.0 if temperature is None else temperature,
                                top_p=1.0 if top_p is None else top_p)
    given = inp.resolve()
    loaded = model.load_for(given, lm_head=True)
    loaded.check_inputs(part=part, target=inp.target, max_new_tokens=inp.max_new_tokens, writes=True)
    if loaded.seq2seq and inp.target is not None:
        raise typer.BadParameter("generate writes the target; --target is for the viewing commands")
    result = attnviz.generate(given, model=loaded, decoding=decoding, part=part, layer=layer, head=head, top=top,
                              save=None if output is None else output_path(output, "generation.npz"),
                              truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, style={"terminal": terminal})
