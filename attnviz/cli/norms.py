"""Value-weighted norms (Kobayashi et al. 2020) and the attention sinks they judge (Gu et al. 2024): norms,
sinks."""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.cli.common import (CmapOpt, CsvOpt, HeadSel, ImageOut, JsonOpt, LayerSel, TextSource, app,
                                check_output, cli_errors, emit_records, err, out, output_path, print_json, say, takes)
from attnviz.selection import Selection


def _norms(inp: TextSource, what: str = "norms"):
    text = inp.require_text()
    loaded = inp.load_single(what)
    from attnviz.engine.fromscratch.norms import norms_capture

    with err.status("Running the model and recomputing each head's value vectors…"):
        capture, result = norms_capture(loaded, text, truncate=inp.truncate)
    return loaded, capture, result


@app.command(help="Value-weighted norms (Kobayashi et al. 2020): how much key j actually moves query i, "
                  "‖α_ij·f_h(x_j)‖ with f_h(x) = (x·W_V^h + b_V^h)·W_O^h. Per layer, the share of attention "
                  "on special tokens by α and by norm; the exact check that the parts add up to the block's "
                  "output; -o draws one head's α beside its norms.")
@cli_errors
@takes(inp=TextSource)
def norms(layer: LayerSel = Selection.parse("-1", "layer", option="--layer"),
          head: HeadSel = Selection.parse("0", "head", keywords=("mean", "max"), option="--head"),
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, cmap: CmapOpt = "viridis",
          *, inp: TextSource) -> None:
    from dataclasses import replace

    import numpy as np

    from attnviz.blocks import row_shares
    from attnviz.panels import Page, attention_panels, short_model, text_subtitle
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import norms_table

    check_output(output, FORMATS)
    loaded, capture, result = _norms(inp)
    alpha = result.alpha[:, 0].astype(np.float64)  # (L, H, T, T)
    shares = row_shares(capture.attentions.astype(np.float64))
    special = np.asarray(capture.special)
    records = [{"layer": n, "alpha_on_special": float(alpha[n][..., special].sum(-1).mean()),
                "norm_on_special": float(shares[n][..., special].sum(-1).mean()),
                "alpha_on_first": float(alpha[n][..., 0].mean()), "norm_on_first": float(shares[n][..., 0].mean()),
                "output_check": float(result.output_diff[n])} for n in range(capture.n_layers)]
    if not emit_records(records, as_json, as_csv):
        out.print(norms_table(records, f"{short_model(capture.model)}: where attention goes, by α and by ‖α·f(x)‖"))
        say(f"Check: Σ_h Σ_j α_ij f_h(x_j) + b_O equals the attention block's own output (before the residual) to "
            f"within {result.output_diff.max():.1e} in every layer.", wrap=True)
    if output is not None:
        from attnviz.render.png import mixed_figure, save_figure

        which_layer = layer.indices(capture.n_layers)[:1]
        which_head = head.resolve(capture.n_heads)[:1]
        alpha_capture = replace(capture, attentions=result.alpha[:, 0].astype(np.float32),
                                meta={**capture.meta, "quantity": "alpha"}).validate()
        pair = [*attention_panels(alpha_capture, which_layer, which_head),
                *attention_panels(capture, which_layer, which_head)]
        pair = [replace(pair[0], short="α (the weights)"), replace(pair[1], short="‖α·f(x)‖ (what actually moves)")]
        title = f"{pair[0].title[0]}{pair[0].title[1]}: α beside value-weighted norms"
        page = Page(panels=tuple(pair), title=title,
                    name=f"attnviz_norms_{pair[0].name}", subtitle=text_subtitle(capture),
                    notes=("Kobayashi et al. 2020: a key with a large α but a small value vector moves the query "
                           "little",))
        say(save_figure(mixed_figure(page, cmap=cmap, ncols=2), output_path(output, f"{page.name}.png")),
            console=err if as_json or as_csv else out)


@app.command(help="Attention sinks (Gu et al. 2024): keys that receive a large mean weight from the queries that "
                  "can see them, which tokens are sinks in which layers, the share of sink heads per layer, and "
                  "(by value-weighted norms) whether a sink actually moves anything.")
@cli_errors
@takes(inp=TextSource)
def sinks(threshold: Annotated[float, typer.Option(
              help="Sink score above which a key is a sink (Gu et al. 2024 use 0.3).", min=0.0, max=1.0,
              metavar="NUMBER")] = 0.3,
          output: ImageOut = None, cmap: CmapOpt = "viridis",
          as_json: JsonOpt = False, as_csv: CsvOpt = False, *, inp: TextSource) -> None:
    import numpy as np

    from attnviz.blocks import row_shares
    from attnviz.metrics import Tokens, sink_scores
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import sinks_table

    check_output(output, FORMATS)
    loaded, capture, result = _norms(inp, "sinks")
    alpha = result.alpha[:, 0].astype(np.float64)  # (L, H, T, T)
    shares = row_shares(capture.attentions.astype(np.float64))
    tokens = Tokens.of(capture)
    records, per_layer = [], []
    best = np.zeros((capture.n_layers, capture.n_heads))  # each head's largest sink score, for -o
    for n in range(capture.n_layers):
        seen = tokens.at_layer(capture.windows, n)  # with the layer's sliding window, if it has one
        by_alpha = sink_scores(alpha[n].mean(axis=-2), seen)  # (H, T)
        by_norm = sink_scores(shares[n].mean(axis=-2), seen)
        best[n] = by_alpha.max(axis=-1)
        heads = []
        for h in range(capture.n_heads):
            key = int(by_alpha[h].argmax())
            if by_alpha[h, key] > threshold:
                heads.append(h)
                records.append({"layer": n, "head": h, "key": key, "token": capture.tokens[key],
                                "sink_score": float(by_alpha[h, key]), "norm_score": float(by_norm[h, key])})
        mine = [r for r in records if r["layer"] == n]
        counts: dict[str, int] = {}
        for r in mine:
            counts[f"{r['key']}:{r['token']}"] = counts.get(f"{r['key']}:{r['token']}", 0) + 1
        per_layer.append({"layer": n, "sink_heads": len(heads), "share": len(heads) / capture.n_heads,
                          "tokens": counts,
                          "alpha": float(np.mean([r["sink_score"] for r in mine])) if mine else 0.0,
                          "norm": float(np.mean([r["norm_score"] for r in mine])) if mine else 0.0})
    if as_json:
        print_json({"model": capture.model, "threshold": threshold, "tokens": list(capture.tokens),
                    "layers": per_layer, "sinks": records})
    elif not emit_records(records, False, as_csv):
        out.print(sinks_table(per_layer, capture.n_heads,
                              f"{short_model(capture.model)}: attention sinks (score > {threshold:g})"))
        say("sink score: the mean weight a key receives from the queries that can see it; by norm: the same for "
            "each query's share of ‖α·f(x)‖. A sink whose norm score is far below its score takes attention but "
            "moves little (the \"no-op\" reading).", wrap=True)
    if output is not None:
        from attnviz.panels import Scale, head_grid_panel
        from attnviz.render.png import panel_figure, save_figure

        panel = head_grid_panel(best, Scale(0.0, 1.0, f"largest sink score (a sink above {threshold:g})"),
                                f"{short_model(capture.model)} · attention sinks: each head's largest sink score",
                                "attnviz_sinks")
        say(save_figure(panel_figure(panel, cmap=cmap), output_path(output, "attnviz_sinks.png")),
            console=err if as_json or as_csv else out)
