"""The generate command: a causal language model writes, and its attention is kept step by step."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.params import finite_float, HeadSel, JsonOpt, LayerSel, PartOpt, whole_number
from attnviz.cli.output import check_output, err, out, output_path, print_json, say, use_color
from attnviz.cli.errors import cli_errors, usage_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes, TextInput
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

STOPPED = {"eos": "the model's end-of-sequence token", "max_new_tokens": "--max-new-tokens",
           "max_positions": "the model's maximum positions"}


@app.command(help="A causal language model (e.g. -m smollm2, offline) continues the text with the KV cache; every "
                  "layer's and head's attention row of every new token is kept as it is produced. Prints the "
                  "generated text; -o saves the capture for heatmap, heads, export … --from (--rows generated shows "
                  "only the new tokens' rows); --terminal shows, per new token, the earlier tokens it attends to most.")
@cli_errors
@takes(inp=TextInput)
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
             part: PartOpt = None, as_json: JsonOpt = False, *, inp: TextInput) -> None:
    from attnviz.api import Decoding, generate as run_generate

    check_output(output, (".npz",))
    if not sample and (temperature is not None or top_p is not None):
        raise typer.BadParameter("--temperature and --top-p choose how to sample: add --sample")
    if temperature is not None and temperature <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--top-p")
    decoding = Decoding(max_new_tokens=inp.max_new_tokens or 20, sample=sample, seed=seed,
                        temperature=1.0 if temperature is None else temperature, top_p=1.0 if top_p is None else top_p)
    if inp.image is not None:
        raise typer.BadParameter("generate writes text after a text; a picture is for vision models' attention "
                                 "(heatmap, heads, verify, norms, sinks)", param_hint="--image")
    if inp.audio is not None:
        raise typer.BadParameter("generate writes text after a text; for a sound, heatmap, capture and view --audio "
                                 "keep the transcript Whisper writes, step by step", param_hint="--audio")
    text = inp.require_text()
    loaded = inp.load(lm_head=True)
    inp.check_model_kind(loaded, part, writes=True)
    if loaded.seq2seq and inp.target is not None:
        raise typer.BadParameter("generate writes the target; --target is for the viewing commands")
    with usage_errors():
        generation = run_generate(text, model=loaded, decoding=decoding, part=part, truncate=inp.truncate,
                                  reporter=CliReporter())
    capture, whole = generation.capture, generation.whole
    layers = layer.indices(capture.n_layers)
    heads = head.resolve(capture.n_heads)
    if len(layers) != 1 or len(heads) != 1:
        raise typer.BadParameter("the per-step view shows one layer and one head (or the head mean)",
                                 param_hint="--layer" if len(layers) != 1 else "--head")
    from attnviz.panels import PART_TITLES, head_label, short_model
    from attnviz.base.text import visible

    path = generation.save(output_path(output, "generation.npz")) if output is not None else None
    steps = generation.steps(layers[0], heads[0], top)
    meta = capture.meta
    if as_json:
        print_json(generation.to_dict(layers[0], heads[0], top, None if path is None else str(path)))
        return
    from rich.text import Text

    written = Text(visible(meta["prompt"]) + (" → " if whole is not None else ""))
    written.append(visible(meta["generated_text"]), style="bold green" if use_color() else "")
    out.print(written)
    n_new = generation.new_tokens
    say(f"{n_new} new token{'s' if n_new != 1 else ''} ({meta['decoding']}); stopped at {STOPPED[meta['stopped']]}.",
        console=err, style="dim")
    if terminal:
        from attnviz.render.tables import generation_table

        which = head_label(heads[0], capture.n_heads) if isinstance(heads[0], str) else f"head {heads[0]}"
        what = f"{PART_TITLES[capture.part]}: " if capture.part else ""
        title = (f"{short_model(capture.model)} · {what}layer {layers[0]} · {which}: what each new token attends to "
                 f"as it is read in (its row of α)")
        out.print(generation_table(steps, title, color=use_color()))
    if path is not None:
        say(f"{path}  ({capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} tokens, "
            f"{n_new} generated) · see it: attnviz heatmap --from {path} --rows generated")

