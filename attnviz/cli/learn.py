"""Commands for the learner: steps (one head's formula, step by step), positions (what position embeddings
do), token (one token's attention in every layer and head)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.common import (SelfPartOpt, CaptureInput, CmapOpt, CsvOpt, ImageOut, JsonOpt, LayerSel, OneHead,
                                OneLayer, ScaleOptions, TextSource, app, check_output, cli_errors, err, out,
                                output_path, print_json, say, takes, use_color, whole_number)
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
    from attnviz.model import encode, layers_and_heads
    from attnviz.panels import steps_page
    from attnviz.scratch import head_steps
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
    from attnviz.model import layers_and_heads
    from attnviz.panels import positions_page
    from attnviz.scratch import positions_experiment

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


@app.command(help="One token in every layer and head: what it attends to (its row of α) and which tokens "
                  "attend to it (its column), with the heads that link it most strongly to another token.")
@cli_errors
@takes(inp=CaptureInput, look=ScaleOptions)
def token(token: Annotated[Optional[str], typer.Argument(
              help="The token: its index, its text (case-insensitive) or text#n for the n-th occurrence "
                   "(after TEXT, or alone with --from).", show_default=False, metavar="TOKEN")] = None,
          layer: LayerSel = Selection.everything("layer", "--layer"),
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          part: SelfPartOpt = None, *, inp: CaptureInput, look: ScaleOptions) -> None:
    from attnviz.panels import token_links, token_page
    from attnviz.render.png import FORMATS
    from attnviz.selection import find_token

    check_output(output, FORMATS)
    if token is None and inp.source is not None and inp.text is not None:  # attnviz token --from F TOKEN
        from dataclasses import replace

        token, inp = inp.text, replace(inp, text=None)
    if token is None:
        raise typer.BadParameter("give the TOKEN to look at: attnviz token \"TEXT\" TOKEN, or --from FILE TOKEN")
    capture = inp.capture(part=part, default_part="encoder")
    if not capture.square:
        from attnviz.errors import SelectionError

        raise SelectionError("token follows one token through self-attention; for what a target token attends to "
                             "in the source use attnviz heatmap --part cross --rows N", "--part")
    if capture.pooled:
        from attnviz.errors import InputError

        raise InputError("token needs each token's own row of α, and this long input was streamed and pooled; "
                         "for one token of a long input use attnviz heatmap TEXT --rows N:N+1")
    i = find_token(capture.tokens, token, option="TOKEN")
    layers = layer.indices(capture.n_layers)
    links = token_links(capture, i)
    if as_json:
        print_json({"model": capture.model, "tokens": list(capture.tokens), "token": i, "layers": layers,
                    "attends_to": capture.attentions[layers, :, i, :],
                    "attended_by": capture.attentions[layers, :, :, i], "strongest_links": links})
    elif as_csv:  # one row per layer, head and other token: the token's weight on it, and its weight on the token
        from attnviz.cli.common import emit_records

        emit_records([{"layer": n, "head": h, "other": j, "other_token": capture.tokens[j],
                       "attends_to": float(capture.attentions[n, h, i, j]),
                       "attended_by": float(capture.attentions[n, h, j, i])}
                      for n in layers for h in range(capture.n_heads) for j in range(capture.n_tokens)], False, True)
    else:
        from attnviz.render.terminal import token_renderable

        out.print(token_renderable(capture, i, layers, links, width=out.width, color=use_color(), cmap=cmap))
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        page = token_page(capture, i, layers, look.choice())
        say(save_figure(mixed_figure(page, cmap=cmap, ncols=2), output_path(output, f"{page.name}.png")),
            console=err if as_json else out)
