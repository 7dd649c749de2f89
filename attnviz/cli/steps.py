"""The teaching commands computed from the model's own weights: steps (one head's formula, step by step) and
positions (what position embeddings do)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.output import check_output, err, out, output_path, print_json, say, use_color
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.params import CmapOpt, ImageOut, JsonOpt, OneHead, OneLayer, whole_number
from attnviz.cli.inputs import CliReporter, PictureSource, takes, TextSource
from attnviz.base.selection import Selection

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
                  "(self-attention alone sees a set); with them it is not. Encoder models (BERT-like). With "
                  "--image, a vision model's position embeddings over the picture's patch grid: how similar each "
                  "patch position is to each other (-o draws a small map per patch).")
@cli_errors
@takes(inp=PictureSource)
def positions(layer: OneLayer = Selection.parse("-1", "layer", field="layer"),
              seed: Annotated[int, typer.Option(help="Seed of the word shuffle.", parser=whole_number(0),
                                                metavar="N")] = 0,
              output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
              *, inp: PictureSource) -> None:
    from attnviz.api import positions as positions_experiment
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if inp.image is not None:
        _patch_positions(inp, output, as_json)
        return
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


def _patch_positions(inp, output, as_json: bool) -> None:
    """positions --image: the position embeddings over the picture's patch grid."""
    from attnviz.api import POSITION_TOLERANCE, patch_positions
    from attnviz.panels import short_model
    from attnviz.render.tables import records_table, verdict

    chosen = inp.require_text()
    result = patch_positions(chosen, model=inp.load())
    if as_json:
        print_json(result.to_dict())
    else:
        rows, cols = result.grid
        shown = result.records()[:12]
        out.print(records_table(shown, [("distance", "distance (patches)", "d"), ("similarity", "mean similarity",
                                                                                  ".3f"), ("pairs", "pairs", "d")],
                                f"{short_model(result.model)}: position embeddings over {rows} × {cols} patches, "
                                f"by distance on the grid"))
        out.print(verdict(result.passed, f"they are what the model's embedding layer adds to the patches, within "
                                         f"{result.check:.1e} of its output (tolerance {POSITION_TOLERANCE:.0e})"))
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_patch_positions.png")),
            console=err if as_json else out)

