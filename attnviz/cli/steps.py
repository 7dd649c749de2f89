"""The teaching commands computed from the model's own weights: steps (one head's formula, step by step) and
positions (what position embeddings do)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.output import check_output, err, out, output_path, print_json, say, use_color
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.params import CmapOpt, ImageOut, JsonOpt, OneHead, OneLayer, whole_number
from attnviz.cli.inputs import CliReporter, takes, TextSource
from attnviz.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

TokenOpt = Annotated[Optional[str], typer.Option(
    "--token", metavar="TOKEN", show_default=False,
    help="A token: its index, its text (case-insensitive) or text#n for the n-th occurrence (the#2).")]


def _one(selection: Selection, n: int, what: str) -> int:
    chosen = selection.indices(n)
    if len(chosen) != 1:
        from attnviz.errors import SelectionError

        raise SelectionError(f"--{what}: {what} shows one {what} at a time; give one index, not {selection.spec!r}",
                             f"--{what}")
    return chosen[0]


@app.command(help="One head's attention step by step, from the model's own weights: Q and K, the scores "
                  "Q·Kᵀ, the scaling by √d_k, the mask, the softmax → α, and α·V; α is checked against the "
                  "model's own. --token follows one query row.")
@cli_errors
@takes(inp=TextSource)
def steps(layer: OneLayer = Selection.parse("0", "layer", field="layer"),
          head: OneHead = Selection.parse("0", "head", field="head"),
          token: TokenOpt = None, output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
          *, inp: TextSource) -> None:
    from attnviz.api import steps as head_steps
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load_single("steps")
    n_layers, n_heads = loaded.shape
    which_layer, which_head = _one(layer, n_layers, "layer"), _one(head, n_heads, "head")
    result = head_steps(text, model=loaded, layer=which_layer, head=which_head, token=token, truncate=inp.truncate,
                        reporter=CliReporter())
    page = result.page()
    if as_json:
        print_json(result.to_dict())
    else:
        from attnviz.render.terminal import steps_renderable

        out.print(steps_renderable(page, result.computed, width=out.width, color=use_color(), token=result.token))
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        path = save_figure(mixed_figure(page, cmap=cmap), output_path(output, f"{page.name}.png"))
        say(path, console=err if as_json else out)


@app.command(help="Why transformers need positions: shuffle the words and run the model twice. With its "
                  "position embeddings zeroed, α of the shuffled text is exactly the same permutation of α "
                  "(self-attention alone sees a set); with them it is not. Encoder models (BERT-like).")
@cli_errors
@takes(inp=TextSource)
def positions(layer: OneLayer = Selection.parse("-1", "layer", field="layer"),
              seed: Annotated[int, typer.Option(help="Seed of the word shuffle.", parser=whole_number(0),
                                                metavar="N")] = 0,
              output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
              *, inp: TextSource) -> None:
    from attnviz.api import positions as positions_experiment
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load_single("positions")
    which = _one(layer, loaded.shape[0], "layer")
    result = positions_experiment(text, model=loaded, seed=seed, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    else:
        from attnviz.render.terminal import positions_renderable

        out.print(positions_renderable(result.result, loaded.name))
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        page = result.page(which)
        say(save_figure(mixed_figure(page, cmap=cmap), output_path(output, f"{page.name}.png")),
            console=err if as_json else out)
