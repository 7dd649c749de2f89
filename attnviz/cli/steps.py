"""The teaching commands computed from the model's own weights: steps (one head's formula, step by step) and
positions (what position embeddings do)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.common import (CmapOpt, ImageOut, JsonOpt, OneHead, OneLayer, TextSource, app, check_output,
                                cli_errors, err, out, output_path, print_json, say, takes, use_color, whole_number)
from attnviz.selection import Selection

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
def steps(layer: OneLayer = Selection.parse("0", "layer", option="--layer"),
          head: OneHead = Selection.parse("0", "head", option="--head"),
          token: TokenOpt = None, output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
          *, inp: TextSource) -> None:
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load_single("steps")
    from attnviz.engine.forward import encode
    from attnviz.engine.loading import layers_and_heads
    from attnviz.panels import steps_page
    from attnviz.engine.fromscratch.steps import head_steps
    from attnviz.selection import find_token

    n_layers, n_heads = layers_and_heads(loaded.model.config)
    which_layer, which_head = _one(layer, n_layers, "layer"), _one(head, n_heads, "head")
    with err.status("Running the model and the from-scratch path…"):
        encoded = encode(loaded, text, truncate=inp.truncate)
        result = head_steps(loaded, encoded, which_layer, which_head)
    row = find_token(encoded.tokens, token) if token is not None else None
    page = steps_page(result, encoded.tokens, loaded.name, text)
    if as_json:
        print_json({"model": loaded.name, "layer": which_layer, "head": which_head, "tokens": encoded.tokens,
                    "token": row, "d_k": result.d_k, "sqrt_d_k": result.d_k ** 0.5, "q": result.q, "k": result.k,
                    "v": result.v, "scores": result.scores, "scaled": result.scaled, "allowed": result.allowed,
                    "alpha": result.alpha, "out": result.out, "model_alpha": result.model_alpha,
                    "max_abs_diff": result.max_diff})
    else:
        from attnviz.render.terminal import steps_renderable

        out.print(steps_renderable(page, result, width=out.width, color=use_color(), token=row))
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        path = save_figure(mixed_figure(page, cmap=cmap), output_path(output, f"{page.name}.png"))
        say(path, console=err if as_json else out)


@app.command(help="Why transformers need positions: shuffle the words and run the model twice. With its "
                  "position embeddings zeroed, α of the shuffled text is exactly the same permutation of α "
                  "(self-attention alone sees a set); with them it is not. Encoder models (BERT-like).")
@cli_errors
@takes(inp=TextSource)
def positions(layer: OneLayer = Selection.parse("-1", "layer", option="--layer"),
              seed: Annotated[int, typer.Option(help="Seed of the word shuffle.", parser=whole_number(0),
                                                metavar="N")] = 0,
              output: ImageOut = None, as_json: JsonOpt = False, cmap: CmapOpt = "viridis",
              *, inp: TextSource) -> None:
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load_single("positions")
    from attnviz.engine.loading import layers_and_heads
    from attnviz.panels import positions_page
    from attnviz.engine.fromscratch.positions import positions_experiment

    which = _one(layer, layers_and_heads(loaded.model.config)[0], "layer")
    with err.status("Running the model on both word orders, with and without positions…"):
        result = positions_experiment(loaded, text, seed=seed)
    if as_json:
        print_json({"model": loaded.name, "words": result.words, "shuffled": result.shuffled,
                    "tokens": result.tokens, "permutation": result.permutation,
                    "without_positions": {"max_abs_diff": float(result.diff_without.max()),
                                          "per_layer": result.diff_without},
                    "with_positions": {"max_abs_diff": float(result.diff_with.max()), "per_layer": result.diff_with},
                    "position_similarity": result.similarity})
    else:
        from attnviz.render.terminal import positions_renderable

        out.print(positions_renderable(result, loaded.name))
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        page = positions_page(result, loaded.name, which, text)
        say(save_figure(mixed_figure(page, cmap=cmap), output_path(output, f"{page.name}.png")),
            console=err if as_json else out)
