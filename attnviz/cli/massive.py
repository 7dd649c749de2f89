"""Massive activations and the sinks they make (Sun et al. 2024; Gu et al. 2024): attnviz massive TEXT."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, read_texts, takes, TextSource
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt

MAX_REFERENCE_TEXTS = 1000  # --reference: the texts whose mean the intervention sets the entries to

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="Massive activations (Sun et al. 2024): entries of the residual stream over 100 and about 1000× "
                  "the layer's median, on a few fixed dimensions and tokens; the attention sinks they make (Gu et "
                  "al. 2024: which sink heads' keys hold them) and how small those tokens' value vectors are. "
                  "--intervene sets them to 0 and to their mean over other texts where they first appear, and "
                  "measures the next-token loss and the sinks (a causal LM, e.g. -m gemma3).")
@cli_errors
@takes(inp=TextSource)
def massive(ratio: Annotated[float, typer.Option(
                "--ratio", min=1.0, metavar="NUMBER",
                help="Massive: over this many times the layer's median |h| (Sun et al.: about 1000).")] = 1000.0,
            minimum: Annotated[float, typer.Option(
                "--minimum", min=0.0, metavar="NUMBER", help="…and over this magnitude (Sun et al.: 100).")] = 100.0,
            epsilon: Annotated[float, typer.Option(
                "--epsilon", min=0.0, max=1.0, metavar="NUMBER",
                help="A sink head: a key's importance (its mean weight from the queries that can see it) above "
                     "this (Gu et al.: 0.3).")] = 0.3,
            intervene: Annotated[bool, typer.Option(
                "--intervene", help="Run again with the massive entries set to 0, and to their mean over other "
                                    "texts, where each first appears: the next-token loss and the sink rate of "
                                    "each run.")] = False,
            reference: Annotated[Optional[Path], typer.Option(
                "--reference", metavar="FILE", dir_okay=False, show_default=False,
                help="--intervene: the texts (one per line) whose mean the entries are set to. Default: 16 "
                     "sentences of attnviz's own.")] = None,
            output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
            *, inp: TextSource) -> None:
    from attnviz.api import massive as find_massive
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table
    from attnviz.base.text import visible

    check_output(output, FORMATS)
    if reference is not None and not intervene:
        raise typer.BadParameter("--reference gives the means of --intervene; add --intervene",
                                 param_hint="--reference")
    texts = None
    if reference is not None:
        texts = read_texts(reference, MAX_REFERENCE_TEXTS, "--reference")
    text = inp.require_text()
    loaded = inp.load(lm_head="auto")
    loaded.require_single("massive")
    result = find_massive(text, model=loaded, ratio=ratio, minimum=minimum, epsilon=epsilon, intervene=intervene,
                          reference=texts, truncate=inp.truncate, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        rows = []
        for n, top in enumerate(result.top):
            e = top[0]
            held = sorted({x.position for x in result.entries if x.layer == n})
            rows.append({"layer": n, "median": float(result.medians[n]), "largest": abs(e.value),
                         "ratio": e.ratio, "where": f"{visible(result.tokens[e.position])} · dim {e.dim}",
                         "massive": len([x for x in result.entries if x.layer == n]),
                         "tokens": ", ".join(visible(result.tokens[p]) for p in held[:4])
                         + (f" +{len(held) - 4}" if len(held) > 4 else "")})
        columns = [("layer", "layer", "d"), ("median", "median |h|", ".3g"), ("largest", "largest |h|", ".4g"),
                   ("ratio", "× median", ".0f"), ("where", "token · dim", ""), ("massive", "massive", "d"),
                   ("tokens", "tokens holding them", "")]
        out.print(records_table(rows, columns, f"{short_model(result.model)}: the residual stream after each block "
                                               f"(massive: over {minimum:g} and {ratio:g}× the median)"))
        if result.entries:
            dims = ", ".join(str(d) for d in result.dims[:6])
            holders = ", ".join(f"{visible(result.tokens[p])} ({p})" for p in result.positions[:8])
            say(f"{len(result.entries)} massive entries on dimension(s) {dims}, held by {holders}"
                + (f" and {len(result.positions) - 8} more tokens" if len(result.positions) > 8 else "") + ".",
                wrap=True)
        else:
            say("No entry passes both thresholds: this text has no massive activations by this definition "
                "(try a lower --ratio).", wrap=True)
        text = (f"Sink heads (a key's importance over {epsilon:g}): {len(result.sink_heads)} of "
                f"{result.n_layers * result.n_heads}")
        if result.sink_heads:
            text += f"; {result.tied:.0%} of them sink on a token that holds a massive activation"
            later = result.tied_where_present
            if later == later:
                text += f", {later:.0%} of those in the layers that read one"
        say(text + f". Sink₁^{epsilon:g} (Gu et al., this text): {result.sink_rate:.1%} of heads.", wrap=True)
        finite = [(n, v) for n, v in enumerate(result.value_ratio) if v == v]
        if finite:
            low = min(finite, key=lambda p: p[1])
            below = sum(v < 1 for _, v in finite)
            say(f"Their value vectors (‖f_h(x)‖ through W_O) against the median token's: "
                f"{min(v for _, v in finite):.2f}–{max(v for _, v in finite):.2f}× over layers "
                f"{finite[0][0]}–{finite[-1][0]} (smallest {low[1]:.2f}× in layer {low[0]}); smaller than a typical "
                f"token's in {below} of those {len(finite)} layers: where a sink's value is small, the weight it "
                f"takes moves little.", wrap=True)
        if result.intervention is not None:
            runs = result.intervention
            rows = [{"run": name, "loss": runs[key]["loss"], "perplexity": runs[key]["perplexity"],
                     "sink_rate": runs[key]["sink_rate"], "first_token": runs[key]["first_token"]}
                    for key, name in (("plain", "as it is"), ("zero", "set to 0"),
                                      ("mean", f"set to their mean ({runs['texts']} texts)"))]
            out.print(records_table(rows, [("run", "massive entries", ""), ("loss", "loss (nats)", ".3f"),
                                           ("perplexity", "perplexity", ".1f"), ("sink_rate", "Sink₁^ε", ".1%"),
                                           ("first_token", "first token's importance", ".3f")],
                                    f"the intervention (Sun et al. 2024): {len(runs['entries'])} entries, each "
                                    f"where it first appears"))
        say(f"Check: α and the value vectors recomputed from the weights add up to each attention output within "
            f"{result.output_check:.1e} of its size.", style="dim", wrap=True)
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_massive.png")),
            console=err if as_json or as_csv else out)
