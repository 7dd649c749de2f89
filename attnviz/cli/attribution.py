"""What attention contributes: logit-attr (direct logit attribution per head) and contributions (ALTI, value
zeroing)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.base.selection import Selection
from attnviz.api.attribution.contribution_methods import CONTRIBUTIONS
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import File, check_output, emit, figure_file, page_file
from attnviz.cli.params import (CsvOpt, ImageOut, JsonOpt, LayerSel, ModelOptions, choice_parser, finite_float,
                                whole_number)

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(name="logit-attr",
             help="Which heads write the predicted token (direct logit attribution): the logit of the next token "
                  "(the model's own prediction, or --target) split into one part per head, MLP, the embeddings "
                  "and the biases, through the final norm with its scale frozen; per top head the tokens it "
                  "raises and lowers and the source tokens it carries its effect from; and which input tokens "
                  "push the prediction, through which heads (ALTI-Logit, Ferrando et al. 2023). Checked: the "
                  "parts add up to the model's own logit. For causal language models (e.g. -m smollm2).")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def logit_attr(target: Annotated[Optional[str], typer.Option(
                   "--target", metavar="TOKEN", show_default=False,
                   help="The token whose logit to split, as text (one token of the model's vocabulary; a word's "
                        "leading space is usually part of it: ' Paris'). Default: the model's own prediction.")] = None,
               position: Annotated[int, typer.Option(
                   "--position", parser=whole_number(-(10**9), 10**9), metavar="N",
                   help="The position whose next token is split (an index; -1 is the last token).")] = -1,
               top: Annotated[int, typer.Option(
                   "--top", parser=whole_number(1, 100), metavar="K",
                   help="How many heads to list (1 to 100), by |effect|.")] = 10,
               output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
               *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    given = inp.resolve()
    result = attnviz.logit_attr(given, model=model.later_for(given), target=target, position=position,
                                top=top, truncate=model.truncate, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])


@app.command(help="What each token contributes to each token's output, layer by layer, beside where attention "
                  "looks. ALTI (Ferrando et al. 2022, the default) splits each attention block's output, residual "
                  "included, into one vector per token and measures how close each is to the output (checked: "
                  "the parts add up to the block's own output); value zeroing (Mohebbi et al. 2023) zeroes token "
                  "j's value vectors in a layer and measures how much each output changes. Per layer, the share "
                  "on special tokens and on each token itself by α and by contribution, and how well the two "
                  "orders agree; per token, its largest contributors in --layer and through all layers (the "
                  "rollout); -o draws that layer's α beside its contributions.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def contributions(method: Annotated[str, typer.Option(
                      "--method", metavar="METHOD", parser=choice_parser(CONTRIBUTIONS.names(), {
                          "value_zeroing": "value-zeroing", "vz": "value-zeroing", "zeroing": "value-zeroing"}),
                      help=CONTRIBUTIONS.help() + ".")] = "alti",
                  layer: LayerSel = Selection.parse("-1", "layer", field="layer"),
                  token: Annotated[Optional[str], typer.Option(
                      "--token", metavar="TOKEN", show_default=False,
                      help="The token whose strongest paths of contribution to list and draw: its index, its text "
                           "or text#n. Default: the last token that is not special.")] = None,
                  graph: Annotated[Optional[str], typer.Option(
                      "--graph", metavar="FILE", show_default=False,
                      help="Draw the contribution graph (tokens across, layers up, an edge where a contribution "
                           "reaches --threshold, the strongest paths into --token in colour) to FILE (.png, .svg, "
                           ".pdf).")] = None,
                  threshold: Annotated[float, typer.Option(
                      "--threshold", parser=finite_float(0.0), metavar="NUMBER",
                      help="--graph and --html: the smallest contribution drawn as an edge (above 0, at most 1; "
                           "the page can change it).")] = 0.05,
                  page: Annotated[Optional[str], typer.Option(
                      "--html", metavar="FILE", show_default=False,
                      help="Write the interactive page to FILE (.html): the views of α and the contributions "
                           "panel (the graph; choose a token: its strongest incoming paths, and what reaches it by "
                           "contribution beside α's rollout), --token chosen first.")] = None,
                  stream: Annotated[bool, typer.Option(
                      "--stream", help="ALTI for a long input: never hold the model's layers × heads × T² weights "
                                       "(keep the mean over heads of α recomputed from the weights instead), "
                                       "holding (2 × layers + 4 × heads) × T² × 4 bytes. Chosen by itself where "
                                       "the full path would pass the memory budget.")] = False,
                  faithfulness: Annotated[bool, typer.Option(
                      "--faithfulness", help="Also measure how faithful α, its rollout and these contributions are "
                                             "on this text (attnviz faithfulness: erasure, leave-one-out, random "
                                             "orders), shown in the report, --json and the page's contributions "
                                             "panel.")] = False,
                  output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
                  *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    check_output(graph, FORMATS)
    check_output(page, (".html", ".htm"))
    if not 0 < threshold <= 1:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--threshold")
    given = inp.resolve()
    result = attnviz.contributions(given, model=model.later_for(given), method=method, layer=layer, token=token,
                                   threshold=threshold, stream=True if stream else None, truncate=model.truncate,
                                   faithfulness=faithfulness, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv,
         files=[figure_file(output, result),
                File(graph, result.graph_name, lambda path: _save(result.graph(), path)),
                page_file(page, result)])


def _save(figure, path):
    from attnviz.render.png import save_figure

    return save_figure(figure, path)
