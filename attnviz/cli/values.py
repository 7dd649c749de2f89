"""Value-weighted norms (Kobayashi et al. 2020) and the attention sinks they judge (Gu et al. 2024): norms,
sinks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.params import CmapOpt, CsvOpt, HeadSel, ImageOut, JsonOpt, LayerSel
from attnviz.cli.inputs import CliReporter, PictureSource, read_texts, takes
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(help="Value-weighted norms (Kobayashi et al. 2020): how much key j actually moves query i, "
                  "‖α_ij·f_h(x_j)‖ with f_h(x) = (x·W_V^h + b_V^h)·W_O^h. Per layer, the share of attention "
                  "on special tokens by α and by norm; the exact check that the parts add up to the block's "
                  "output; -o draws one head's α beside its norms.")
@cli_errors
@takes(inp=PictureSource)
def norms(layer: LayerSel = Selection.parse("-1", "layer", field="layer"),
          head: HeadSel = Selection.parse("0", "head", keywords=("mean", "max"), field="head"),
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          *, inp: PictureSource) -> None:
    from attnviz.api import norms as value_norms
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import norms_table

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load_single("norms")
    result = value_norms(text, model=loaded, truncate=inp.truncate, reporter=CliReporter())
    capture, records = result.capture, result.to_dict()
    if not emit_records(records, as_json, as_csv):
        out.print(norms_table(records, f"{short_model(capture.model)}: where attention goes, by α and by ‖α·f(x)‖"))
        say(f"Check: Σ_h Σ_j α_ij f_h(x_j) + b_O equals the attention block's own output (before the residual) to "
            f"within {result.output_diff.max():.1e} in every layer.", wrap=True)
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        page = result.page(layer.indices(capture.n_layers)[0], head.resolve(capture.n_heads)[0])
        say(save_figure(mixed_figure(page, cmap=cmap, ncols=2), output_path(output, f"{page.name}.png")),
            console=err if as_json or as_csv else out)


@app.command(help="Attention sinks (Gu et al. 2024): keys that receive a large mean weight from the queries that "
                  "can see them, which tokens are sinks in which layers, the share of sink heads per layer, and "
                  "(by value-weighted norms) whether a sink actually moves anything.")
@cli_errors
@takes(inp=PictureSource)
def sinks(threshold: Annotated[float, typer.Option(
              help="Sink score above which a key is a sink (Gu et al. 2024 use 0.3).", min=0.0, max=1.0,
              metavar="NUMBER")] = 0.3,
          corpus: Annotated[Optional[Path], typer.Option(
              "--corpus", metavar="FILE", dir_okay=False, show_default=False,
              help="Instead of one text: the model-level sink rate Sink₁^ε of Gu et al. 2024 over the texts of "
                   "FILE (one per line, each cut to its first --tokens tokens): the share of heads whose first "
                   "token's sink score passes --threshold.")] = None,
          tokens: Annotated[int, typer.Option(
              "--tokens", min=2, max=4096, metavar="N",
              help="--corpus: each text's first N tokens (Gu et al.: 64).")] = 64,
          output: ImageOut = None, cmap: CmapOpt = "viridis",
          as_json: JsonOpt = False, as_csv: CsvOpt = False, *, inp: PictureSource) -> None:
    from attnviz.api import sinks as find_sinks
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import sinks_table

    check_output(output, FORMATS)
    if corpus is not None:
        if inp.given_text() is not None:
            raise typer.BadParameter("give TEXT or --corpus FILE, not both", param_hint="--corpus")
        if output is not None:
            raise typer.BadParameter("--corpus prints the rate; -o draws one text's sinks", param_hint="-o")
        _corpus_rate(corpus, inp, threshold, tokens, as_json, as_csv)
        return
    text = inp.require_text()
    loaded = inp.load_single("sinks")
    result = find_sinks(text, model=loaded, threshold=threshold, truncate=inp.truncate, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records([dict(r) for r in result.sinks], False, as_csv):
        out.print(sinks_table([dict(r) for r in result.layers], result.n_heads,
                              f"{short_model(result.model)}: attention sinks (score > {threshold:g})"))
        say("sink score: the mean weight a key receives from the queries that can see it; by norm: the same for "
            "each query's share of ‖α·f(x)‖. A sink whose norm score is far below its score takes attention but "
            "moves little (the \"no-op\" reading).", wrap=True)
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(cmap=cmap), output_path(output, "attnviz_sinks.png")),
            console=err if as_json or as_csv else out)


MAX_CORPUS_TEXTS = 10_000  # sinks --corpus


def _corpus_rate(path: Path, inp: PictureSource, epsilon: float, tokens: int, as_json: bool, as_csv: bool) -> None:
    """sinks --corpus: Sink₁^ε over the texts of a file, and each layer's share of sink heads."""
    from attnviz.api import sink_rate
    from attnviz.panels import short_model
    from attnviz.render.tables import records_table

    if not 0 < epsilon < 1:
        raise typer.BadParameter("--corpus takes a threshold above 0 and below 1", param_hint="--threshold")
    texts = read_texts(path, MAX_CORPUS_TEXTS, "--corpus")
    loaded = inp.load_single("sinks")
    result = sink_rate(texts, model=loaded, epsilon=epsilon, tokens=tokens, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
        return
    if emit_records(result.records(), False, as_csv):
        return
    by_layer = result.by_head.mean(axis=1)
    rows = [{"layer": n, "share": float(v)} for n, v in enumerate(by_layer)]
    out.print(records_table(rows, [("layer", "layer", "d"), ("share", "sink heads (first token)", ".1%")],
                            f"{short_model(result.model)}: the first token as a sink, {result.texts} texts"))
    say(f"Sink₁^{epsilon:g} (Gu et al. 2024) = {result.rate:.1%}: the share of heads, over {result.texts} texts "
        f"(each its first {tokens} tokens), whose first token receives a mean weight above {epsilon:g} from the "
        f"queries that can see it.", wrap=True)
