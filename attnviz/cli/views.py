"""Commands that draw or save attention: heatmap, capture, view (the interactive page), token (one token in
every layer and head)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Optional

import typer

from attnviz.cli.output import check_output, err, out, output_path, print_json, say, use_color
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.params import (CmapOpt, ColsOpt, CsvOpt, HeadSel, HideOpt, ImageOut, JsonOpt, LayerSel, PartOpt,
                                RowsOpt, ScaleOptions, SelfPartOpt, StartOpt, ValuesOpt)
from attnviz.cli.inputs import CaptureInput, LongTextInput, takes
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(help='Draw the attention weights α as a heatmap: to an image file (PNG, SVG, PDF), or in the terminal with'
                  ' --terminal. Several layers or heads give a panel each.')
@cli_errors
@takes(inp=CaptureInput, look=ScaleOptions)
def heatmap(output: Annotated[Optional[str], typer.Option(
                "--output", "-o", metavar="FILE", show_default=False,
                help="Image file: .png, .svg or .pdf by the suffix; a folder gets the default name inside. "
                     "Default: attnviz_layer5_mean.png and the like (layer and head in the name), here.")] = None,
            terminal: Annotated[bool, typer.Option(
                "--terminal", "-t", help="Draw in the terminal (and write an image only if -o is given).")] = False,
            layer: LayerSel = Selection.parse("-1", "layer", field="layer"),
            head: HeadSel = Selection.parse("mean", "head", keywords=("mean", "max"), field="head"),
            hide_special: HideOpt = False, values: ValuesOpt = False, cmap: CmapOpt = "viridis",
            start: StartOpt = 0, rows: RowsOpt = None, cols: ColsOpt = None, part: PartOpt = None,
            patch: Annotated[Optional[str], typer.Option(
                "--patch", metavar="ROW,COL", show_default=False,
                help="A picture's capture: draw where this patch looks (its row of α) instead of [CLS].")] = None,
            *, inp: CaptureInput, look: ScaleOptions) -> None:
    from attnviz.panels import Page, coarsen, heatmap_page, image_page, pool_columns, text_subtitle, window_panels
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    chosen_patch = _patch(patch)
    window = rows is not None or cols is not None
    capture = inp.capture(window=(rows, cols, layer) if window else None, part=part)
    layers = layer.indices(capture.n_layers)
    heads = head.resolve(capture.n_heads)
    sound = capture.mel is not None and capture.part != "decoder" and not window
    if sound:  # a sound: attention over time, under its spectrogram
        from attnviz.panels.sound import sound_page

        if chosen_patch is not None:
            raise typer.BadParameter("--patch is for the capture of a picture (--image)", param_hint="--patch")
        page = sound_page(capture, layers, heads)
    elif capture.grid is not None and not window:  # a picture: its patch grid over the picture
        page = image_page(capture, layers, heads, chosen_patch)
    elif chosen_patch is not None:
        raise typer.BadParameter("--patch is for the capture of a picture (--image)", param_hint="--patch")
    elif window:
        T, S = capture.n_tokens, capture.n_keys
        panels = window_panels(capture, layers, heads,
                               rows.indices(T, capture.named_positions()) if rows and not capture.pooled else None,
                               cols.indices(S, capture.named_key_positions()) if cols and not capture.pooled else None,
                               scale=look.choice())
        page = Page(panels=tuple(panels), title=panels[0].title_text if len(panels) == 1 else
                    f"{panels[0].title[0].split(' · ')[0]} · exact window", name=f"{panels[0].name}",
                    subtitle=text_subtitle(capture))
    else:
        page = heatmap_page(capture, layers, heads, hide_special=hide_special,
                            all_layers=len(layers) == capture.n_layers and len(layers) > 1, scale=look.choice())
    if values:
        page = replace(page, panels=tuple(replace(p, values=True) for p in page.panels))
    if terminal:
        from attnviz.render.terminal import panel_renderable

        for panel in page.panels:
            if (capture.pooled or sound) and not window:  # the terminal view pools to its width
                fits = max((out.width - 18) // 2, 8)
                k = -(-panel.matrix.shape[1] // fits)
                panel = pool_columns(panel, k) if sound else coarsen(panel, k)
            out.print(panel_renderable(panel, width=out.width, color=use_color(), cmap=cmap, start=start))
        if output is None:  # --terminal alone draws only; with -o the image is written too
            return
    from attnviz.render.png import page_figure, save_figure

    if sound:
        from attnviz.render.sound import sound_figure

        figure = sound_figure(page, cmap=cmap)
    else:
        figure = page_figure(page, cmap=cmap)
    path = save_figure(figure, output_path(output, f"{page.name}.png"))
    say(path)


def _patch(value: str | None) -> tuple[int, int] | None:
    """--patch ROW,COL as two whole numbers (checked against the grid once the capture is known)."""
    if value is None:
        return None
    pieces = value.replace(" ", "").split(",")
    if len(pieces) != 2 or not all(p.isdigit() and len(p) <= 6 for p in pieces):
        raise typer.BadParameter(f"{value!r}: give the patch as ROW,COL, e.g. 3,7", param_hint="--patch")
    return int(pieces[0]), int(pieces[1])


@app.command(help="Run the model once and save α, the tokens and the metadata as a .npz capture, for any command's "
                  '--from later (which then needs neither torch nor transformers). An encoder-decoder model\'s '
                  'capture holds all three parts (encoder, decoder, cross).')
@cli_errors
@takes(inp=LongTextInput)
def capture(output: Annotated[str, typer.Option(
                "--output", "-o", metavar="FILE",
                help="Capture file (.npz); a folder gets capture.npz inside.")] = "capture.npz",
            norms: Annotated[bool, typer.Option(
                "--norms", help="Save value-weighted norms ‖α·f(x)‖ instead of α (meta quantity: norm).")] = False,
            *, inp: LongTextInput) -> None:
    check_output(output, (".npz",))
    if norms:
        from attnviz.api import norms as value_norms, to_words
        from attnviz.cli.inputs import CliReporter

        text = inp.require_text()
        loaded = inp.load()
        loaded.require_single("capture --norms")
        shares = value_norms(text, model=loaded, truncate=inp.truncate, reporter=CliReporter()).capture
        result: Any = to_words(shares) if inp.words else shares
    else:
        result = _whole(inp)
    path = result.save(output_path(output, "capture.npz"))
    if hasattr(result, "captures"):  # an encoder-decoder model's parts
        sizes = ", ".join(f"{name} {c.n_layers}×{c.n_heads}×{c.n_tokens}×{c.n_keys}"
                          for name, c in result.captures.items())
        say(f"{path}  ({sizes}: layers × heads × rows × columns)")
    else:
        say(f"{path}  ({result.n_layers} layers × {result.n_heads} heads × {result.n_tokens} tokens)")


def _whole(inp: LongTextInput):
    """The text's capture, or all parts of an encoder-decoder model."""
    return inp.capture(default_part=None)


@app.command(help="An interactive view in one HTML file that works offline in any browser: a head view (hover a "
                  "token to see what it attends to), a model view (every layer × head) and a matrix view (exact α "
                  "on hover). Script, styles and data are inside the file; nothing is fetched.")
@cli_errors
@takes(inp=CaptureInput)
def view(output: Annotated[Optional[str], typer.Option(
             "--output", "-o", metavar="FILE", show_default=False,
             help="The page: FILE.html; a folder gets attnviz_view.html inside. Default: attnviz_view.html here.")]
         = None,
         layer: LayerSel = Selection.everything("layer", "layer"),
         precision: Annotated[str, typer.Option(
             "--precision", metavar="BITS",
             help="Bits per stored weight: 16, 8, or auto (16 while the weights take at most 4 MB, else 8).")]
         = "auto",
         open_page: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
         *, inp: CaptureInput) -> None:
    from attnviz.data.parts import Parts
    from attnviz.base.files import check_suffix
    from attnviz.base.files import atomic_output
    from attnviz.render.viewer import PRECISIONS, viewer_data, viewer_html

    if precision not in PRECISIONS:
        raise typer.BadParameter(f"{precision!r}: choose one of {', '.join(PRECISIONS)}", param_hint="--precision")
    check_output(output, (".html", ".htm"))
    whole = inp.whole()
    layers = None if isinstance(whole, Parts) else layer.indices(whole.n_layers)
    if isinstance(whole, Parts) and layer.items != ("all",):
        raise typer.BadParameter("an encoder-decoder model's view shows every layer of every part",
                                 param_hint="--layer")
    page = viewer_html(viewer_data(whole, layers=layers, precision=precision))
    path = check_suffix(output_path(output, "attnviz_view.html"), (".html", ".htm"))
    with atomic_output(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    say(path)
    if open_page:
        import webbrowser

        webbrowser.open(path.resolve().as_uri())


@app.command(help="One token in every layer and head: what it attends to (its row of α) and which tokens "
                  "attend to it (its column), with the heads that link it most strongly to another token.")
@cli_errors
@takes(inp=CaptureInput, look=ScaleOptions)
def token(token: Annotated[Optional[str], typer.Argument(
              help="The token: its index, its text (case-insensitive) or text#n for the n-th occurrence "
                   "(after TEXT, or alone with --from).", show_default=False, metavar="TOKEN")] = None,
          layer: LayerSel = Selection.everything("layer", "layer"),
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          part: SelfPartOpt = None, *, inp: CaptureInput, look: ScaleOptions) -> None:
    from attnviz.panels import token_links, token_page
    from attnviz.render.png import FORMATS
    from attnviz.base.selection import find_token

    check_output(output, FORMATS)
    if token is None and (inp.source is not None or inp.audio is not None or inp.image is not None) \
            and inp.text is not None:  # attnviz token --from F TOKEN (or --audio F, --image F)
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
    i = find_token(capture.tokens, token, field="token_argument")
    layers = layer.indices(capture.n_layers)
    links = token_links(capture, i)
    if as_json:
        print_json({"model": capture.model, "tokens": list(capture.tokens), "token": i, "layers": layers,
                    "attends_to": capture.attentions[layers, :, i, :],
                    "attended_by": capture.attentions[layers, :, :, i], "strongest_links": links})
    elif as_csv:  # one row per layer, head and other token: the token's weight on it, and its weight on the token
        from attnviz.cli.output import emit_records

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
