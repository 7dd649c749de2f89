"""Commands that summarise attention: heads, entropy, rollout; and explain, what every term means."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.base.selection import Selection
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import (CmapOpt, CsvOpt, HeadSel, ImageOut, JsonOpt, LayerSel, ModelOptions, PartOpt, RowsOpt,
                                SelfPartOpt, whole_number)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

SEEN = ("text", "image", "audio", "seq2seq", "long", "saved")  # what these commands look at


@app.command(help='A table of every head: entropy, max weight, distance, positional scores, mass on special tokens and '
                  'punctuation, and a pattern label (attnviz explain defines each).')
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN))
def heads(layer: LayerSel = Selection.everything("layer", "layer"),
          head: HeadSel = Selection.everything("head", "head"),
          label: Annotated[Optional[str], typer.Option(help="Only heads with this pattern label.",
                                                       show_default=False)] = None,
          sort: Annotated[Optional[str], typer.Option(help="Sort by this column (its header or name: entropy, "
                                                           "prev, norm_ent, …).", show_default=False)] = None,
          desc: Annotated[Optional[bool], typer.Option(
              "--desc/--asc", help="Largest first, or smallest first [default: --asc; with --top, --desc]",
              show_default=False)] = None,
          top: Annotated[Optional[int], typer.Option(help="Show only the N highest of the --sort column (the lowest "
                                                          "with --asc).", parser=whole_number(1),
                                                     metavar="N", show_default=False)] = None,
          rows: RowsOpt = None, part: PartOpt = None, output: ImageOut = None, as_json: JsonOpt = False,
          as_csv: CsvOpt = False, *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.heads(given, model=model.later_for(given), layer=layer, head=head, label=label, sort=sort,
                           descending=desc, top=top, rows=rows, part=part, **inp.options(), truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(help='Mean attention entropy of every head, layers × heads, beside the uniform baseline ln T.')
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN))
def entropy(output: ImageOut = None,
            normalised: Annotated[bool, typer.Option("--normalised", "--normalized",
                                                     help="Divide each row by ln(keys it may attend to): 0 "
                                                          "one-hot, 1 uniform.")] = False,
            layer: LayerSel = Selection.everything("layer", "layer"),
            cmap: CmapOpt = "viridis", rows: RowsOpt = None, part: PartOpt = None, as_json: JsonOpt = False,
            as_csv: CsvOpt = False, *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.entropy(given, model=model.later_for(given), layer=layer, normalised=normalised, rows=rows,
                             part=part, **inp.options(), truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, style={"cmap": cmap}, files=[figure_file(output, result, cmap=cmap)])


@app.command(help='Attention rollout (Abnar & Zuidema 2020): how much each input token reaches a chosen position '
                  'through all layers, with the residual stream counted as identity attention.')
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(*SEEN))
def rollout(token: Annotated[Optional[str], typer.Option(
                help="Token to explain: an index, or its text. Default: [CLS]/the first start token for "
                     "encoders, the last token for causal models.", show_default=False)] = None,
            output: ImageOut = None, cmap: CmapOpt = "viridis", part: SelfPartOpt = None, as_json: JsonOpt = False,
            as_csv: CsvOpt = False, *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.rollout(given, model=model.later_for(given), token=token, part=part, **inp.options(),
                             truncate=model.truncate)
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result, cmap=cmap)])


@app.command(help="What every number and word in attnviz's tables means: each metric, pattern label and term.")
@cli_errors
def explain(term: Annotated[Optional[str], typer.Argument(
                help="A column (entropy, prev, norm_ent, …), a label (previous-token, …) or a term (rollout, "
                     "alpha, scale). Default: everything.", show_default=False)] = None,
            as_json: JsonOpt = False, as_csv: CsvOpt = False) -> None:
    import attnviz

    emit(attnviz.explain(term), as_json=as_json, as_csv=as_csv)
