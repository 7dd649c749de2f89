"""Commands that summarise attention: heads, entropy, rollout, compare. All take --from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.params import (CmapOpt, CsvOpt, HeadSel, ImageOut, JsonOpt, LayerSel, PartOpt, RowsOpt, ScaleOptions,
                                selection_parser, SelfPartOpt, StartOpt, whole_number)
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say, use_color
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CaptureInput, LongTextInput, takes
from attnviz.render import FORMATS
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

ALL_LAYERS = Selection.everything("layer", "layer")


def _sort_key(value: str | None) -> str | None:
    """--sort takes a column's name or its header (entropy, norm_entropy or norm_ent, ...)."""
    from attnviz import metrics

    if value is None or value in metrics.FIXED_COLUMNS:
        return value
    metric = metrics.find_metric(value)
    if metric is None:
        keys = [*metrics.FIXED_COLUMNS, *(m.header for m in metrics.METRICS)]
        raise typer.BadParameter(f"{value!r} is not a column; choose from {', '.join(keys)}", param_hint="--sort")
    return metric.name


@app.command(help='A table of every head: entropy, max weight, distance, positional scores, mass on special tokens and '
                  'punctuation, and a pattern label (attnviz explain defines each).')
@cli_errors
@takes(inp=CaptureInput)
def heads(layer: LayerSel = ALL_LAYERS, head: HeadSel = Selection.everything("head", "head"),
          label: Annotated[Optional[str], typer.Option(help="Only heads with this pattern label.",
                                                       show_default=False)] = None,
          sort: Annotated[Optional[str], typer.Option(help="Sort by this column (its header or name: entropy, "
                                                           "prev, norm_ent, …).", show_default=False)] = None,
          desc: Annotated[bool, typer.Option("--desc", help="Sort largest first.")] = False,
          top: Annotated[Optional[int], typer.Option(help="Show only the first N rows.", parser=whole_number(1),
                                                     metavar="N", show_default=False)] = None,
          rows: RowsOpt = None, part: PartOpt = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *,
          inp: CaptureInput) -> None:
    from attnviz.metrics import LABELS, columns, head_records, repeats_note
    from attnviz.render.tables import heads_table

    key = _sort_key(sort)
    if label is not None and label not in LABELS:
        raise typer.BadParameter(f"{label!r} is not a label; choose from {', '.join(LABELS)}", param_hint="--label")
    capture = inp.capture(pictures=False, part=part)
    layers, chosen_heads = set(layer.indices(capture.n_layers)), set(head.indices(capture.n_heads))
    queries = _query_rows(capture, rows)
    records = [r for r in head_records(capture, queries) if r["layer"] in layers and r["head"] in chosen_heads
               and (label is None or r["label"] == label)]
    if key is not None:
        nan = float("nan")
        records.sort(key=lambda r: (r.get(key, nan) != r.get(key, nan), r.get(key, nan)), reverse=desc)  # NaN last
    matching = len(records)
    records = records[:top] if top else records
    if not emit_records(records, as_json, as_csv, columns(records[0] if records else None)):
        shown = f"top {len(records)} of {matching} heads" if len(records) < matching else f"{len(records)} heads"
        out.print(heads_table(records, f"{_named(capture)}: {shown}, {_size(capture)}{_rows_note(rows, queries)}",
                              width=out.width, caption="column definitions: attnviz explain; sort by any column "
                                                       "header with --sort", keep=key))
        note = repeats_note(capture)
        if note:
            say(note, style="dim", wrap=True)


@app.command(help='Mean attention entropy of every head, layers × heads, beside the uniform baseline ln T.')
@cli_errors
@takes(inp=CaptureInput)
def entropy(output: ImageOut = None,
            normalised: Annotated[bool, typer.Option("--normalised", "--normalized",
                                                     help="Divide each row by ln(keys it may attend to): 0 "
                                                          "one-hot, 1 uniform.")] = False,
            layer: LayerSel = Selection.everything("layer", "layer"),
            cmap: CmapOpt = "viridis", rows: RowsOpt = None, part: PartOpt = None, as_json: JsonOpt = False,
            as_csv: CsvOpt = False, *, inp: CaptureInput) -> None:
    from attnviz import metrics
    from attnviz.panels import entropy_panel
    from attnviz.render.tables import entropy_table

    check_output(output, FORMATS)
    capture = inp.capture(pictures=False, part=part)  # the figure shows the statistics, not α
    queries = _query_rows(capture, rows)
    layers = layer.indices(capture.n_layers)
    values = metrics.value_grid(capture, "norm_entropy" if normalised else "entropy", queries)[layers]
    uniform = 1.0 if normalised else metrics.uniform_entropy(capture.input_keys)
    records = [{"layer": n, "head": head, "entropy": float(values[row, head]), "uniform": uniform}
               for row, n in enumerate(layers) for head in range(capture.n_heads)]
    if not emit_records(records, as_json, as_csv):
        out.print(entropy_table(values, uniform, f"{_named(capture)}: mean attention entropy"
                                f"{' (normalised)' if normalised else ''}, {_size(capture)}"
                                f"{_rows_note(rows, queries)}", color=use_color(),
                                cmap=cmap, layers=layers))
    if output is not None:
        from attnviz.render.png import panel_figure, save_figure

        panel = entropy_panel(values, uniform, capture.model, normalised=normalised, layers=layers)
        say(save_figure(panel_figure(panel, cmap=cmap), output_path(output, "attnviz_entropy.png")),
            console=err if as_json or as_csv else out)


@app.command(help='Attention rollout (Abnar & Zuidema 2020): how much each input token reaches a chosen position '
                  'through all layers, with the residual stream counted as identity attention.')
@cli_errors
@takes(inp=CaptureInput)
def rollout(token: Annotated[Optional[str], typer.Option(
                help="Token to explain: an index, or its text. Default: [CLS]/the first start token for "
                     "encoders, the last token for causal models.", show_default=False)] = None,
            output: ImageOut = None, cmap: CmapOpt = "viridis", part: SelfPartOpt = None, as_json: JsonOpt = False,
            as_csv: CsvOpt = False, *, inp: CaptureInput) -> None:
    import numpy as np

    from attnviz.api import rollout as roll_out
    from attnviz.panels import short_model, token_labels
    from attnviz.render.terminal import bar_chart
    from attnviz.base.text import visible

    check_output(output, FORMATS)
    capture = inp.capture(rollout_token=token, part=part, default_part="encoder")
    result = roll_out(capture, token=token)
    i, row = result.token, result.row
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        if capture.grid is not None:  # a picture: its patches that reach the token most
            top = np.argsort(-row, kind="stable")[:20]
            out.print(bar_chart([f"{j} {result.tokens[j]}" for j in top], row[top].tolist(), width=out.width,
                                title=f"{short_model(capture.model)}: rollout into {result.tokens[i]!r}, the 20 "
                                      f"largest of {len(row)} tokens (sums to {row.sum():.3f}); -o draws it over "
                                      f"the picture"))
        elif result.matrix is not None:
            labels = token_labels(capture)
            out.print(bar_chart(labels, row.tolist(), width=out.width,
                                title=f"{short_model(capture.model)}: rollout for token {i} {labels[i]!r} "
                                      f"(sums to {row.sum():.3f})"))
        else:  # a long input: the rows its streamed pass computed, as bars of the largest values
            top = np.argsort(-row)[:20]
            top_labels = [f"{j} {visible(result.tokens[j])}" for j in top]
            out.print(bar_chart(top_labels, row[top].tolist(), width=out.width,
                                title=f"{short_model(capture.model)}: rollout for token {i} "
                                      f"{visible(result.tokens[i])!r}, its 20 largest of {len(result.tokens)} "
                                      f"(sums to {row.sum():.3f})"))
    if output is not None:
        from attnviz.render.png import save_figure

        path = save_figure(result.figure(cmap=cmap), output_path(output, "attnviz_rollout.png"))
        say(path, console=err if as_json or as_csv else out)


def _named(capture) -> str:
    """The model's short name, and the part of an encoder-decoder model."""
    from attnviz.panels import PART_TITLES, short_model

    return short_model(capture.model) + (f" · {PART_TITLES[capture.part]}" if capture.part else "")


def _size(capture) -> str:
    if capture.frames:  # a sound: its frames, and the silence after it as one more key
        silence = " and the silence after it" if capture.n_keys > capture.frames else ""
        queries = f"{capture.n_tokens} target tokens" if not capture.square else f"T = {capture.n_tokens}"
        return f"{queries} over {capture.frames} frames of sound ({capture.frame_seconds * 1000:.0f} ms each){silence}"
    if capture.square:
        blocks = capture.n_tokens if capture.long is not None else 0
        return f"T = {capture.input_tokens}" + (f" (pictures: {blocks} blocks)" if blocks > 1 else "")
    return f"{capture.n_tokens} target × {capture.n_keys} source tokens"


def _query_rows(capture, rows: Selection | None) -> list[int] | None:
    """--rows as query positions of this capture (indices, ranges, generated, prompt); None for all."""
    if rows is None:
        return None
    if capture.pooled:
        from attnviz.errors import SelectionError

        raise SelectionError("this capture is pooled (a long input) and holds statistics of all rows; --rows needs "
                             "a token-level capture", "rows")
    return rows.indices(capture.n_tokens, capture.named_positions())


def _rows_note(rows: Selection | None, queries: list[int] | None) -> str:
    return "" if rows is None or queries is None else f", query rows {rows.spec} ({len(queries)} of them)"


@app.command(help="Layers side by side in the terminal (the head mean or one head), on one colour scale, each "
                  "with a stats line; or the same layers of two models (-m A,B or --models A,B) or of two "
                  "captures (--from twice).")
@cli_errors
@takes(inp=LongTextInput, look=ScaleOptions)
def compare(layer: Annotated[Optional[Selection], typer.Option(
                "--layer", "--layers", "-l", parser=selection_parser("layer"), metavar="LAYERS", show_default=False,
                help="Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all. Default: first, "
                     "middle and last.")] = None,
            head: HeadSel = Selection.parse("mean", "head", keywords=("mean", "max"), field="head"),
            models: Annotated[Optional[str], typer.Option(
                help="Two models, comma-separated (or -m A,B), compared layer by layer on the same text.",
                show_default=False, metavar="A,B")] = None,
            sources: Annotated[Optional[list[Path]], typer.Option(
                "--from", help="Saved capture(s); give two to compare two captures.", dir_okay=False,
                show_default=False, metavar="FILE")] = None,
            start: StartOpt = 0, rows: RowsOpt = None, output: ImageOut = None, as_json: JsonOpt = False,
            as_csv: CsvOpt = False, cmap: CmapOpt = "viridis", part: PartOpt = None, *, inp: LongTextInput,
            look: ScaleOptions) -> None:
    from dataclasses import replace

    from attnviz.errors import CaptureMismatchError
    from attnviz.metrics import matrix_summary
    from attnviz.panels import Page, apply_scale, attention_panels, short_model, text_subtitle
    from attnviz.base.text import visible

    check_output(output, FORMATS)
    names = [m.strip() for m in (models or inp.model or "").split(",")] if (models or "," in (inp.model or "")) \
        else [inp.model]
    if len(names) > 2:
        raise typer.BadParameter("give at most two models", param_hint="--models")
    if sources:
        if len(sources) > 2 or models:
            raise typer.BadParameter("give one or two --from captures, and no --models with them")
        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT or --from, not both")
        captures = [CaptureInput(source=path).capture(part=part) for path in sources]
    else:
        text = inp.given_text()  # read once (standard input, a file), then given to each model as TEXT
        captures = [replace(inp, model=name, text=text, text_file=None).capture(part=part) for name in names]
    if len(captures) == 2 and ((captures[0].tokens, captures[0].key_tokens)
                               != (captures[1].tokens, captures[1].key_tokens)):
        a, b = captures
        first, second = visible(" ".join(a.tokens)), visible(" ".join(b.tokens))
        raise CaptureMismatchError(f"the two models tokenise the text differently ({a.n_tokens} tokens: {first} | "
                                   f"{b.n_tokens} tokens: {second}), so their attention cannot be compared "
                                   f"cell by cell")
    n_layers = min(c.n_layers for c in captures)
    chosen = (layer or Selection.parse(f"0,{n_layers // 2},{n_layers - 1}" if n_layers > 2 else "all", "layer",
                                       field="layer")).indices(n_layers)
    heads = head.resolve(min(c.n_heads for c in captures))
    shown_rows = _query_rows(captures[0], rows)
    panels, records = [], []
    for n in chosen:
        for cap in captures:
            for panel in attention_panels(cap, [n], heads):
                if cap.pooled:  # block means: a summary of the pooled matrix would mislead
                    panels.append(replace(panel, short=f"layer {n} · pooled", footer="block means (heads: exact)"))
                    records.append({"model": cap.model, "layer": n, "head": panel.head, "alpha": panel.matrix})
                    continue
                entropy_, special_mass, distance = matrix_summary(panel.matrix, cap.key_special, shown_rows,
                                                                  square=cap.square)
                name = f"{short_model(cap.model)} " if len(captures) == 2 else ""
                which = panel.title[1] if panel.head != "mean" else "mean"
                shown_distance = "–" if distance != distance else f"{distance:.1f}"  # NaN: cross-attention
                panels.append(replace(panel, short=f"{name}layer {n} · {which}",
                                      footer=f"H={entropy_:.2f} sp={special_mass:.2f} d={shown_distance}"))
                records.append({"model": cap.model, "layer": n, "head": panel.head, "entropy": entropy_,
                                "special_mass": special_mass, "mean_distance": distance, "alpha": panel.matrix})
    panels = apply_scale(panels, look.choice())
    if as_json:
        print_json({"tokens": list(captures[0].tokens), "panels": records})
    elif as_csv:  # one row per panel: its summary (the matrices are in --json)
        emit_records([{k: v for k, v in r.items() if k != "alpha"} for r in records], False, True)
    else:
        from attnviz.render.terminal import panels_side_by_side

        key = "H: mean entropy (nats) · sp: mass on special tokens · d: mean distance (tokens)"
        key += f"; over query rows {rows.spec}" if rows is not None else ""
        out.print(panels_side_by_side(panels, width=out.width, color=use_color(), cmap=cmap, key=key, start=start,
                                      rows=shown_rows))
    if output is not None:
        from attnviz.render.png import page_figure, save_figure

        title = " vs ".join(short_model(c.model) for c in captures) + " · layers side by side"
        page = Page(panels=tuple(replace(p, short=f"{p.short} ({p.footer})") for p in panels), title=title,
                    name="attnviz_compare", subtitle=text_subtitle(captures[0]))
        say(save_figure(page_figure(page, cmap=cmap), output_path(output, f"{page.name}.png")),
            console=err if as_json else out)


@app.command(help="What every number and word in attnviz's tables means: each metric, pattern label and term.")
@cli_errors
def explain(term: Annotated[Optional[str], typer.Argument(
                help="A column (entropy, prev, norm_ent, …), a label (previous-token, …) or a term (rollout, "
                     "alpha, scale). Default: everything.", show_default=False)] = None) -> None:
    from rich.table import Table
    from rich.text import Text

    from attnviz.errors import SelectionError
    from attnviz.metrics import glossary
    from attnviz.base.text import visible

    rows = glossary()
    if term is not None:
        from attnviz.metrics import lookup

        rows = lookup(term)
        if not rows:
            known = ", ".join(r[0] for r in glossary())
            raise SelectionError(f"nothing is called {visible(term)!r}; try one of: {known}", "TERM")
    table = Table(show_header=True, box=None, padding=(0, 1), expand=False)
    table.add_column("term", style="bold", no_wrap=True)
    table.add_column("definition")
    for name, other, definition in rows:
        label = Text(name) if not other or other == "label" else Text.assemble(name, (f" ({other})", "dim"))
        table.add_row(label, Text(definition))
    out.print(table)
