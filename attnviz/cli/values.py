"""What attention actually moves: value-weighted norms (Kobayashi et al. 2020) and the attention sinks they judge
(Gu et al. 2024): norms, sinks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Annotated, Optional

import typer

from attnviz.base.selection import Selection
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, read_texts, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CmapOpt, CsvOpt, HeadSel, ImageOut, JsonOpt, LayerSel, ModelOptions

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(help="Value-weighted norms (Kobayashi et al. 2020): how much key j actually moves query i, "
                  "‖α_ij·f_h(x_j)‖ with f_h(x) = (x·W_V^h + b_V^h)·W_O^h. Per layer, the share of attention "
                  "on special tokens by α and by norm; the exact check that the parts add up to the block's "
                  "output; -o draws one head's α beside its norms.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio"))
def norms(layer: LayerSel = Selection.parse("-1", "layer", field="layer"),
          head: HeadSel = Selection.parse("0", "head", keywords=("mean", "max"), field="head"),
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.norms(given, model=model.later_for(given), layer=layer, head=head, truncate=model.truncate,
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result, cmap=cmap)])


MAX_CORPUS_TEXTS = 10_000  # sinks --corpus


@app.command(help="Attention sinks (Gu et al. 2024): keys that receive a large mean weight from the queries that "
                  "can see them, which tokens are sinks in which layers, the share of sink heads per layer, and "
                  "(by value-weighted norms) whether a sink actually moves anything.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text", "image", "audio"))
def sinks(threshold: Annotated[float, typer.Option(
              help="Sink score above which a key is a sink (Gu et al. 2024 use 0.3).", min=0.0, max=1.0,
              metavar="NUMBER")] = 0.3,
          corpus: Annotated[Optional[Path], typer.Option(
              "--corpus", metavar="FILE", dir_okay=False, show_default=False,
              help="Instead of one text: the model-level sink rate Sink₁^ε of Gu et al. 2024 over the texts of "
                   "FILE (one per line, or JSON lines with a text field; - reads standard input; each cut to "
                   "its first --tokens tokens): the share of heads whose first "
                   "token's sink score passes --threshold.")] = None,
          tokens: Annotated[int, typer.Option(
              "--tokens", min=2, max=4096, metavar="N",
              help="--corpus: each text's first N tokens (Gu et al.: 64).")] = 64,
          output: ImageOut = None, cmap: CmapOpt = "viridis",
          as_json: JsonOpt = False, as_csv: CsvOpt = False, *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if corpus is not None:
        if inp.given_text() is not None or inp.image is not None or inp.audio is not None:
            raise typer.BadParameter("give TEXT or --corpus FILE, not both", param_hint="--corpus")
        if output is not None:
            raise typer.BadParameter("--corpus prints the rate; -o draws one text's sinks", param_hint="-o")
        if not 0 < threshold < 1:
            raise typer.BadParameter("--corpus takes a threshold above 0 and below 1", param_hint="--threshold")
        given: Any = read_texts(corpus, MAX_CORPUS_TEXTS, "--corpus")
        loaded = model.load()
    else:
        given = inp.resolve()
        loaded = model.load_for(given)
    result = attnviz.sinks(given, model=loaded, threshold=threshold, tokens=tokens, truncate=model.truncate,
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result, cmap=cmap)])
