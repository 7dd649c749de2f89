"""Commands that summarise attention: heads, entropy, rollout, compare. All take --from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from attnviz.capture import check_suffix
from attnviz.render.png import FORMATS  # numpy-only at import; matplotlib loads on use
from attnviz.cli.common import (CsvOpt, DeviceOpt, DtypeOpt, FromOpt, HeadOpt, JsonOpt, ModelOpt, RemoteOpt,
                                RevisionOpt, TextArg, TruncateOpt, app, cli_errors, emit_records,
                                err, get_capture, out, parse_head, parse_indices)

ImageOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write a figure (.png/.svg/.pdf).")]


@app.command()
@cli_errors
def heads(text: TextArg = None,
          layer: Annotated[Optional[str], typer.Option("--layer", "-l", help="Layers to list: 0,3 or 0-2.")] = None,
          label: Annotated[Optional[str], typer.Option(help="Only heads with this pattern label.")] = None,
          sort: Annotated[Optional[str], typer.Option(help="Sort by this column (e.g. entropy, prev).")] = None,
          desc: Annotated[bool, typer.Option("--desc", help="Sort largest first.")] = False,
          top: Annotated[Optional[int], typer.Option(help="Show only the first N rows.", min=1)] = None,
          as_json: JsonOpt = False, as_csv: CsvOpt = False, source: FromOpt = None, model: ModelOpt = None,
          revision: RevisionOpt = None, device: DeviceOpt = "auto", dtype: DtypeOpt = "float32",
          trust_remote_code: RemoteOpt = False, truncate: TruncateOpt = True) -> None:
    """A table of every head: entropy, max weight, distance, positional scores, special-token mass, label."""
    from attnviz.metrics import COLUMNS, LABELS, head_stats
    from attnviz.render.tables import heads_table

    if sort is not None and sort not in COLUMNS:
        raise typer.BadParameter(f"{sort!r} is not a column; choose from {', '.join(COLUMNS)}", param_hint="--sort")
    if label is not None and label not in LABELS:
        raise typer.BadParameter(f"{label!r} is not a label; choose from {', '.join(LABELS)}", param_hint="--label")
    capture = get_capture(text, source, model, revision, device, dtype, trust_remote_code, truncate)
    layers = set(parse_indices(layer, capture.n_layers, "layer"))
    stats = [s for s in head_stats(capture) if s.layer in layers and (label is None or s.label == label)]
    if sort is not None:
        stats.sort(key=lambda s: getattr(s, sort), reverse=desc)
    stats = stats[:top] if top else stats
    if not emit_records([s.as_dict() for s in stats], as_json, as_csv):
        out.print(heads_table(stats, f"{capture.model}: {len(stats)} heads, T = {capture.n_tokens}", width=out.width,
                              caption="H/lnN: normalised entropy; dist in tokens; start/end/punct/first: mean mass "
                                      "on those keys; top key: the key column with the most weight"))


@app.command()
@cli_errors
def entropy(text: TextArg = None, output: ImageOpt = None,
            normalised: Annotated[bool, typer.Option("--normalised", help="Divide each row by ln(keys it may "
                                                                         "attend to): 0 one-hot, 1 uniform.")] = False,
            as_json: JsonOpt = False, as_csv: CsvOpt = False, source: FromOpt = None, model: ModelOpt = None,
            revision: RevisionOpt = None, device: DeviceOpt = "auto", dtype: DtypeOpt = "float32",
            trust_remote_code: RemoteOpt = False, truncate: TruncateOpt = True) -> None:
    """Mean attention entropy of every head, layers × heads, beside the uniform baseline ln T."""
    from attnviz import metrics
    from attnviz.render.tables import entropy_table

    if output is not None:
        check_suffix(output, FORMATS)
    capture = get_capture(text, source, model, revision, device, dtype, trust_remote_code, truncate)
    values = metrics.normalised_entropy(capture) if normalised else metrics.entropy(capture)
    uniform = 1.0 if normalised else metrics.uniform_entropy(capture.n_tokens)
    records = [{"layer": layer, "head": head, "entropy": float(values[layer, head]), "uniform": uniform}
               for layer in range(capture.n_layers) for head in range(capture.n_heads)]
    if not emit_records(records, as_json, as_csv):
        color = out.color_system is not None and not out.no_color
        out.print(entropy_table(values, uniform, f"{capture.model}: mean attention entropy"
                                f"{' (normalised)' if normalised else ''}, T = {capture.n_tokens}", color=color))
    if output is not None:
        from attnviz.render.png import entropy_figure, save_figure

        path = save_figure(entropy_figure(values, uniform, capture.model), output)
        (err if as_json or as_csv else out).print(str(path), highlight=False, soft_wrap=True)


@app.command()
@cli_errors
def rollout(text: TextArg = None,
            token: Annotated[Optional[str], typer.Option(
                help="Token to explain: an index, or its text. Default: [CLS]/the first start token for "
                     "encoders, the last token for causal models.")] = None,
            output: ImageOpt = None, as_json: JsonOpt = False, source: FromOpt = None, model: ModelOpt = None,
            revision: RevisionOpt = None, device: DeviceOpt = "auto", dtype: DtypeOpt = "float32",
            trust_remote_code: RemoteOpt = False, truncate: TruncateOpt = True) -> None:
    """Attention rollout (Abnar & Zuidema 2020): how much each input token reaches a chosen position
    through all layers, with the residual stream counted as identity attention."""
    from attnviz.metrics import rollout as compute_rollout
    from attnviz.render.terminal import bar_chart

    if output is not None:
        check_suffix(output, FORMATS)
    capture = get_capture(text, source, model, revision, device, dtype, trust_remote_code, truncate)
    matrix = compute_rollout(capture)  # (T, T)
    i = pick_token(capture, token)
    if as_json:
        import json

        print(json.dumps({"model": capture.model, "tokens": list(capture.tokens), "token": i,
                          "rollout": matrix[i].tolist(), "matrix": matrix.tolist()}, ensure_ascii=False))
    else:
        out.print(bar_chart(capture.tokens, matrix[i], width=out.width,
                            title=f"{capture.model}: rollout for token {i} {capture.tokens[i]!r} "
                                  f"(sums to {matrix[i].sum():.3f})"))
    if output is not None:
        from attnviz.render.png import rollout_figure, save_figure

        path = save_figure(rollout_figure(matrix, capture.tokens, capture.model), output)
        if not as_json:
            out.print(str(path), highlight=False, soft_wrap=True)


def pick_token(capture, token: str | None) -> int:
    from attnviz.errors import SelectionError

    if token is None:
        starts = [n for n, kind in enumerate(capture.special_kind) if kind == "start"]
        return capture.n_tokens - 1 if capture.causal or not starts else starts[0]
    try:
        index = int(token)
    except ValueError:
        if token in capture.tokens:
            return capture.tokens.index(token)
        raise SelectionError(f"no token {token!r} in {' '.join(capture.tokens)}") from None
    if not -capture.n_tokens <= index < capture.n_tokens:
        raise SelectionError(f"token {index} is out of range: there are {capture.n_tokens} tokens "
                             f"(0..{capture.n_tokens - 1})")
    return index % capture.n_tokens


@app.command()
@cli_errors
def compare(text: TextArg = None,
            layers: Annotated[Optional[str], typer.Option(
                "--layers", help="Layers side by side: 0,3,5 or 0-2. Default: first, middle and last.")] = None,
            head: HeadOpt = "mean",
            models: Annotated[Optional[str], typer.Option(
                help="Two models, comma-separated, compared layer by layer on the same text.")] = None,
            sources: Annotated[Optional[List[Path]], typer.Option(
                "--from", help="Saved capture(s); give two to compare two captures.", dir_okay=False)] = None,
            revision: RevisionOpt = None, device: DeviceOpt = "auto", dtype: DtypeOpt = "float32",
            trust_remote_code: RemoteOpt = False, truncate: TruncateOpt = True) -> None:
    """Layers side by side in the terminal (head mean or one head), each with a stats line; or the same
    layers of two models."""
    from attnviz.render.terminal import compare_renderable

    which_head = parse_head(head)
    names = [m.strip() for m in models.split(",")] if models else [None]
    if len(names) > 2:
        raise typer.BadParameter("give at most two models", param_hint="--models")
    if sources:
        if len(sources) > 2 or models:
            raise typer.BadParameter("give one or two --from captures, and no --models with them")
        captures = [get_capture(text, path, None, None, device, dtype, False) for path in sources]
    else:
        captures = [get_capture(text, None, name, revision, device, dtype, trust_remote_code, truncate)
                    for name in names]
    n_layers = min(c.n_layers for c in captures)
    default = f"0,{n_layers // 2},{n_layers - 1}" if n_layers > 2 else "all"
    chosen = parse_indices(layers or default, n_layers, "layer")
    color = out.color_system is not None and not out.no_color
    out.print(compare_renderable(captures, chosen, which_head, width=out.width, color=color))
