"""What attention contributes: logit-attr (direct logit attribution per head), contributions (value zeroing)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes, TextSource
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import choice_parser, CsvOpt, finite_float, ImageOut, JsonOpt, LayerSel, whole_number
from attnviz.base.selection import Selection

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
@takes(inp=TextSource)
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
               *, inp: TextSource) -> None:
    import numpy as np

    from attnviz.api import logit_attribution
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table, verdict
    from attnviz.base.text import visible

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load(lm_head=True)
    result = logit_attribution(text, model=loaded, target=target, position=position, top=top,
                               truncate=inp.truncate, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        after = visible(result.tokens[result.position])
        def shown(token: str) -> str:  # a token's spaces made visible, so a list of them wraps between tokens
            return token.replace(" ", "␣") or "∅"

        rows = [{"rank": n + 1, "head": f"{e.layer}.{e.head}", "effect": e.effect,
                 "promotes": " ".join(shown(t) for t in e.promotes[:3]),
                 "suppresses": " ".join(shown(t) for t in e.suppresses[:3]),
                 "from": " ".join(f"{shown(t)}({v:+.2f})" for t, v in e.sources[:2])}
                for n, e in enumerate(result.top)]
        out.print(records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""), ("effect", "effect", "+.3f"),
                                       ("promotes", "raises", ""), ("suppresses", "lowers", ""),
                                       ("from", "through", "")],
                                f"{short_model(result.model)}: after {after!r}, the logit of "
                                f"{visible(result.target)!r} (p = {result.probability:.2f}, rank {result.rank + 1}) "
                                f"by head"))
        if result.by_input is not None:
            say(f"Which input tokens push {visible(result.target)!r} (ALTI-Logit, Ferrando et al. 2023: each head's "
                f"effect through the token it reads, traced back to the input by ALTI's contributions of the layers "
                f"below):", wrap=True)
            totals = result.by_input.sum(axis=(0, 1))
            for j in np.argsort(-np.abs(totals), kind="stable")[:8]:
                heads = result.by_input[:, :, j]
                strongest = np.argsort(-np.abs(heads), axis=None, kind="stable")[:2]
                through = ", ".join(f"{int(k // heads.shape[1])}.{int(k % heads.shape[1])} "
                                    f"{heads.flat[k]:+.2f}" for k in strongest)
                say(f"  {j:>4}  {shown(visible(result.tokens[j])):<16} {totals[j]:+.3f}   through heads {through}",
                    wrap=True)
        elif result.alti_note:
            say(f"ALTI-Logit is left out: {result.alti_note}", wrap=True, style="dim")
        biases = float(result.attention_bias.sum()) + result.final_bias
        say(f"logit {result.logit:.3f} = heads {result.heads.sum():+.3f} + MLPs {result.mlps.sum():+.3f} + "
            f"embeddings {result.embeddings:+.3f} + biases {biases:+.3f}", wrap=True)
        out.print(verdict(result.passed, f"the parts add up to the model's own logit within "
                                         f"{result.difference:.1e} (tolerance {1e-4:.0e}, relative)"))
        say("effect: the head's output at this position, through the final norm (its scale frozen) and the "
            "target's unembedding row; raises / lowers: the tokens its output pushes up and down most (␣ is a "
            "space); through: the source tokens it reads that effect from (α times each one's share).", wrap=True,
            style="dim")
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_logit_attr.png")),
            console=err if as_json or as_csv else out)
    if not result.passed:
        raise typer.Exit(3)


@app.command(help="What each token contributes to each token's output, layer by layer, beside where attention "
                  "looks. ALTI (Ferrando et al. 2022, the default) splits each attention block's output, residual "
                  "included, into one vector per token and measures how close each is to the output (checked: "
                  "the parts add up to the block's own output); value zeroing (Mohebbi et al. 2023) zeroes token "
                  "j's value vectors in a layer and measures how much each output changes. Per layer, the share "
                  "on special tokens and on each token itself by α and by contribution, and how well the two "
                  "orders agree; per token, its largest contributors in --layer and through all layers (the "
                  "rollout); -o draws that layer's α beside its contributions.")
@cli_errors
@takes(inp=TextSource)
def contributions(method: Annotated[str, typer.Option(
                      "--method", metavar="METHOD", parser=choice_parser(("alti", "value-zeroing"), {
                          "value_zeroing": "value-zeroing", "vz": "value-zeroing", "zeroing": "value-zeroing"}),
                      help="alti (Ferrando et al. 2022; one run) or value-zeroing (Mohebbi et al. 2023; one run "
                           "per token).")] = "alti",
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
                  output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
                  *, inp: TextSource) -> None:
    import numpy as np

    from attnviz.api import contributions as find_contributions
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table, verdict
    from attnviz.base.text import visible

    check_output(output, FORMATS)
    check_output(graph, FORMATS)
    check_output(page, (".html", ".htm"))
    if not 0 < threshold <= 1:
        raise typer.BadParameter("must be above 0 and at most 1", param_hint="--threshold")
    text = inp.require_text()
    loaded = inp.load_single("contributions")
    result = find_contributions(text, model=loaded, method=method, stream=True if stream else None,
                                truncate=inp.truncate, reporter=CliReporter())
    chosen = layer.indices(result.capture.n_layers)[0]
    capture = result.capture
    if token is not None:
        from attnviz.base.selection import find_token

        target = find_token(capture.tokens, token, field="token")
    else:  # the last token that is not special ([SEP], </s>)
        target = result.default_token()
    paths = result.paths(target, 5)
    if as_json:
        print_json({**result.to_dict(), "paths_into": target,
                    "paths": [{"weight": weight, "tokens": list(path)} for weight, path in paths]})
    elif not emit_records([dict(r) for r in result.records], False, as_csv):
        out.print(records_table(result.records, [
            ("layer", "layer", "d"), ("alpha_on_special", "α on special", ".2f"),
            ("contribution_on_special", "contribution on special", ".2f"), ("alpha_on_self", "α on self", ".2f"),
            ("contribution_on_self", "contribution on self", ".2f"), ("agreement", "agreement", ".2f")],
            f"{short_model(result.model)}: where attention looks, and what each token contributes ({method})"))
        tokens = [visible(t) for t in result.capture.tokens]
        rollout = result.rollout(range(min(40, len(tokens))))
        if result.streamed:
            say(f"Streamed ({len(tokens)} tokens): the model's α was never held whole; α here is its mean over "
                f"heads, recomputed from the weights.", wrap=True)
        say(f"Each token's largest contributors: in layer {chosen}, and through all layers (the rollout)", wrap=True)
        for i, row in enumerate(result.scores[chosen][:40]):
            top = np.argsort(-row, kind="stable")[:3]
            through = np.argsort(-rollout[i], kind="stable")[:3]
            say(f"  {tokens[i]} ← " + ", ".join(f"{tokens[j]} {row[j]:.2f}" for j in top if row[j] > 0)
                + "   |   " + ", ".join(f"{tokens[j]} {rollout[i, j]:.2f}" for j in through), wrap=True)
        if len(tokens) > 40:
            say(f"  … and {len(tokens) - 40} more (--json has every row)")
        say(f"The strongest paths of contribution into {tokens[target]!r} (token {target}), input first, weight = the "
            f"product of the contributions along the path:", wrap=True)
        for weight, path in paths:
            say(f"  {weight:.3f}  " + " → ".join(tokens[j] for j in path), wrap=True)
        if result.checks is not None:
            out.print(verdict(True, f"in every layer the parts add up to the attention block's own output within "
                                    f"{float(result.checks.max()):.1e} of its size"))
        say("agreement: Spearman's ρ between a token's α (mean over heads) and its contributions over the keys, "
            "averaged over tokens; α can be large where a token contributes little (often on [CLS] and [SEP]).",
            wrap=True, style="dim")
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(chosen), output_path(output, f"attnviz_contributions_layer{chosen}.png")),
            console=err if as_json or as_csv else out)
    if graph is not None:
        from attnviz.render.png import save_figure

        drawn = result.graph(target, threshold=threshold)
        say(save_figure(drawn, output_path(graph, "attnviz_contribution_graph.png")),
            console=err if as_json or as_csv else out)
    if page is not None:
        from attnviz.base.files import atomic_output, check_suffix

        written = result.html(target, threshold=threshold)
        where = check_suffix(output_path(page, "attnviz_contributions.html"), (".html", ".htm"))
        with atomic_output(where) as tmp:
            tmp.write_text(written, encoding="utf-8")
        say(where, console=err if as_json or as_csv else out)
