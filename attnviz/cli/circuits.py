"""QK and OV circuits from the weights alone (Elhage et al. 2021): attnviz circuits."""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="QK and OV circuits from the weights alone, no text (Elhage et al. 2021; TransformerLens's "
                  "FactoredMatrix and all_composition_scores): each head's OV copying score Σλ/Σ|λ| on the "
                  "vocabulary's common words (1: it copies what it attends to), its strongest QK token pairs, and "
                  "Q-, K-, V-composition between heads of different layers. A causal LM (-m gemma3).")
@cli_errors
@takes(inp=ModelOptions)
def circuits(tokens: Annotated[int, typer.Option(
                 "--tokens", parser=whole_number(10, 20000), metavar="N",
                 help="The circuits are read on the vocabulary's first N tokens that are words.")] = 2000,
             top: Annotated[int, typer.Option("--top", parser=whole_number(1, 50), metavar="K",
                                              help="How many heads and head pairs to list.")] = 8,
             output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
             *, inp: ModelOptions) -> None:
    from attnviz.api import circuits as read_circuits
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table

    check_output(output, FORMATS)
    loaded = inp.load(lm_head="auto")
    result = read_circuits(model=loaded, tokens=tokens, top=3, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        rows = []
        for n, t in enumerate(result.top_copying(top)):
            pair = result.qk[t["layer"]][t["head"]][0]
            rows.append({"rank": n + 1, "head": f"{t['layer']}.{t['head']}", "copying": t["copying"],
                         "positive": t["positive"], "pair": f"{pair['query']!r} → {pair['key']!r}"})
        out.print(records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""),
                                       ("copying", "copying Σλ/Σ|λ|", "+.3f"), ("positive", "λ > 0", ".0%"),
                                       ("pair", "strongest QK pair (query → key)", "")],
                                f"{short_model(result.model)}: the heads that copy most (OV circuit on "
                                f"{result.tokens:,} tokens)"))
        least = min(result.top_copying(result.shape[0] * result.shape[1]), key=lambda r: r["copying"])
        say(f"Most anti-copying: {least['layer']}.{least['head']} ({least['copying']:+.3f}). Mean over heads: "
            f"{float(result.copying.mean()):+.3f}.", wrap=True)
        for mode, what in (("q", "queries"), ("k", "keys"), ("v", "values")):
            rows = [{"sender": r["sender"], "receiver": r["receiver"], "score": r["score"]}
                    for r in result.top_composition(mode, top)]
            out.print(records_table(rows, [("sender", "sender", ""), ("receiver", "receiver", ""),
                                           ("score", "score", ".4f")],
                                    f"{mode.upper()}-composition: the receiver's {what} read the sender's output"))
        say("From the weights alone: each norm's gain folded in, its normalisation, biases and rotary positions "
            "left out; W_U centred over the vocabulary. Composition: ‖OV_sender · R‖ / (‖OV_sender‖ ‖R‖), R the "
            "receiver's QK (Q), QKᵀ (K) or OV (V).", style="dim", wrap=True)
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_circuits.png")),
            console=err if as_json or as_csv else out)
