"""Commands that draw or save attention: heatmap, capture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.capture import check_suffix
from attnviz.cli.common import (CmapOpt, DeviceOpt, DtypeOpt, FromOpt, HeadOpt, HideOpt, LayerOpt, ModelOpt,
                                RemoteOpt, RevisionOpt, TextArg, TruncateOpt, app, cli_errors,
                                get_capture, out, parse_head, parse_layer)

@app.command()
@cli_errors
def heatmap(text: TextArg = None, output: Annotated[Optional[Path], typer.Option(
                "--output", "-o", help="Image file: .png, .svg or .pdf. Default: attnviz_<layer>_<head>.png")] = None,
            terminal: Annotated[bool, typer.Option("--terminal", "-t", help="Draw in the terminal (and write "
                                                                              "an image only if -o is given).")] = False,
            layer: LayerOpt = "-1", head: HeadOpt = "mean", hide_special: HideOpt = False,
            cmap: CmapOpt = "viridis",
            start: Annotated[int, typer.Option(help="--terminal: first key column shown when the matrix is "
                                                    "wider than the terminal.")] = 0,
            source: FromOpt = None, model: ModelOpt = None, revision: RevisionOpt = None,
            device: DeviceOpt = "auto", dtype: DtypeOpt = "float32", trust_remote_code: RemoteOpt = False,
            truncate: TruncateOpt = True) -> None:
    """Draw attention weights α as a heatmap: to an image file, or in the terminal with --terminal."""
    which_layer, which_head = parse_layer(layer), parse_head(head)
    if output is not None:
        from attnviz.render.png import FORMATS

        check_suffix(output, FORMATS)
    from attnviz.render.png import colormap

    colormap(cmap)  # an unknown colormap fails before any model work
    capture = get_capture(text, source, model, revision, device, dtype, trust_remote_code, truncate)
    layers = list(range(capture.n_layers)) if which_layer == "all" else [capture.layer_index(which_layer)]
    if terminal:
        from attnviz.render.terminal import heatmap_renderable

        color = out.color_system is not None and not out.no_color
        for n in layers:
            out.print(heatmap_renderable(capture, n, which_head, hide_special=hide_special, width=out.width,
                                         color=color, cmap=cmap, start=start))
        if output is None:  # --terminal alone draws only; with -o the image is written too
            return
    from attnviz.render.png import layers_figure, save_figure

    path = output or Path(f"attnviz_{'all' if which_layer == 'all' else f'layer{layers[0]}'}_{which_head}.png")
    fig = layers_figure(capture, layers, which_head, hide_special=hide_special, cmap=cmap)
    out.print(str(save_figure(fig, path)), highlight=False, soft_wrap=True)


@app.command()
@cli_errors
def capture(text: TextArg = None,
            output: Annotated[Path, typer.Option("--output", "-o", help="Capture file (.npz).")] = Path("capture.npz"),
            model: ModelOpt = None, revision: RevisionOpt = None, device: DeviceOpt = "auto",
            dtype: DtypeOpt = "float32", trust_remote_code: RemoteOpt = False, truncate: TruncateOpt = True) -> None:
    """Run the model and save α, tokens and metadata as a .npz capture for later --from use."""
    check_suffix(output, (".npz",))
    result = get_capture(text, None, model, revision, device, dtype, trust_remote_code, truncate)
    path = result.save(output)
    out.print(f"{path}  ({result.n_layers} layers × {result.n_heads} heads × {result.n_tokens} tokens)",
              highlight=False, soft_wrap=True)


