"""Commands that draw or save attention: heatmap, capture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.common import (CaptureInput, CmapOpt, HeadSel, HideOpt, LayerSel, TextInput, app, cli_errors, out, say,
                                takes, use_color)
from attnviz.selection import Selection


@app.command()
@cli_errors
@takes(inp=CaptureInput)
def heatmap(output: Annotated[Optional[Path], typer.Option(
                "--output", "-o", help="Image file: .png, .svg or .pdf. Default: attnviz_layer<L>_<head>.png "
                                       "(e.g. attnviz_layer5_mean.png) in the current folder.",
                show_default=False)] = None,
            terminal: Annotated[bool, typer.Option(
                "--terminal", "-t", help="Draw in the terminal (and write an image only if -o is given).")] = False,
            layer: LayerSel = Selection.parse("-1", "layer", option="--layer"),
            head: HeadSel = Selection.parse("mean", "head", keywords=("mean", "max"), option="--head"),
            hide_special: HideOpt = False, cmap: CmapOpt = "viridis",
            start: Annotated[int, typer.Option(help="--terminal: first key column shown when the matrix is "
                                                    "wider than the terminal.", min=0)] = 0,
            *, inp: CaptureInput) -> None:
    """Draw attention weights α as a heatmap: to an image file, or in the terminal with --terminal.
    Several layers or heads give one panel each, on one colour scale."""
    from attnviz.capture import check_suffix
    from attnviz.panels import heatmap_page

    if output is not None:
        from attnviz.render.png import FORMATS

        check_suffix(output, FORMATS)
    capture = inp.capture()
    layers = layer.indices(capture.n_layers)
    page = heatmap_page(capture, layers, head.resolve(capture.n_heads), hide_special=hide_special,
                        all_layers=len(layers) == capture.n_layers and len(layers) > 1)
    if terminal:
        from attnviz.render.terminal import panel_renderable

        for panel in page.panels:
            out.print(panel_renderable(panel, width=out.width, color=use_color(), cmap=cmap, start=start))
        if output is None:  # --terminal alone draws only; with -o the image is written too
            return
    from attnviz.render.png import page_figure, save_figure

    path = save_figure(page_figure(page, cmap=cmap), output or Path(f"{page.name}.png"))
    say(path)


@app.command()
@cli_errors
@takes(inp=TextInput)
def capture(output: Annotated[Path, typer.Option("--output", "-o", help="Capture file (.npz).")] = Path("capture.npz"),
            *, inp: TextInput) -> None:
    """Run the model and save α, tokens and metadata as a .npz capture for later --from use."""
    from attnviz.capture import check_suffix

    check_suffix(output, (".npz",))
    result = inp.capture()
    path = result.save(output)
    say(f"{path}  ({result.n_layers} layers × {result.n_heads} heads × {result.n_tokens} tokens)")
