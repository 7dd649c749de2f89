"""Rich tables for the numeric commands (verify, scaling, heads, entropy). Build, never print.
Every cell is a plain Text (a token like "[/x]" is data, not markup), widths are terminal cells."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from attnviz import metrics
from attnviz.render.colors import rgb, text_on
from attnviz.base.text import visible


def titled(title: str, table: Table) -> Group:
    """A bold title line above a table (Rich would wrap a long title to the table's width)."""
    return Group(Text(title, style="bold"), table)


def verify_table(diffs: Sequence, tolerance: float, title: str) -> Group:
    """One row per layer: max |Δα|, mean |Δα|, worst head; failing layers in red."""
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("layer", "max |Δ|", "mean |Δ|", "worst head"):
        table.add_column(name, justify="right")
    for d in diffs:
        style = "" if d.max_abs <= tolerance else "red"
        table.add_row(*(Text(v, style=style) for v in (str(d.layer), f"{d.max_abs:.2e}", f"{d.mean_abs:.2e}",
                                                        str(d.worst_head))))
    return titled(title, table)


def scaling_table(rows: Sequence, T: int, d_k: int, title: str) -> Group:
    """Raw Q·Kᵀ against Q·Kᵀ/√d_k per layer, beside the uniform entropy ln T."""
    table = Table(caption=Text(f"entropy in nats; uniform attention over T={T} keys has ln T = {np.log(T):.3f}; "
                               f"d_k = {d_k}, √d_k = {np.sqrt(d_k):.2f}"), caption_justify="left",
                  box=box.SIMPLE_HEAD)
    for name in ("layer", "std QKᵀ", "std QKᵀ/√d_k", "entropy raw", "entropy scaled", "max α raw",
                 "max α scaled"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(*(Text(v) for v in (str(r.layer), f"{r.std_raw:.2f}", f"{r.std_scaled:.2f}",
                                          f"{r.entropy_raw:.3f}", f"{r.entropy_scaled:.3f}", f"{r.max_raw:.3f}",
                                          f"{r.max_scaled:.3f}")))
    return titled(title, table)


def verdict(ok: bool, message: str) -> Text:
    return Text.assemble(("PASS" if ok else "FAIL", "bold green" if ok else "bold red"), ": ", message)


TEXT_WIDTHS = {"label": 14, "layer": 5, "head": 4}  # the widest a text column gets, in cells
TEXT_METRIC_WIDTH = 8
LABEL_STYLES = {"induction": "bold red", "duplicate-token": "red",
                "previous-token": "cyan", "next-token": "cyan", "self": "magenta", "vertical": "yellow",
                "block": "green", "broad": "blue", "mixed": "dim"}


def head_columns() -> list[tuple[str, str, int, bool]]:
    """(key, header, width, is_text) for the heads table, in the order they are kept when the terminal
    is narrow: layer, head, label, then the metric registry's order."""
    out = [("layer", "layer", 5, True), ("head", "head", 4, True), ("label", "label", 14, True)]
    for m in metrics.METRICS:
        text = m.kind == "text"
        out.append((m.name, m.header, TEXT_METRIC_WIDTH if text else max(len(m.header), 4), text))
    return out


def heads_table(records: Sequence[dict], title: str, caption: str | None = None, width: int = 200,
                keep: str | None = None) -> Group:
    """One row per head with every registered metric and its pattern label. Columns that do not fit in
    `width` are left out (last in registry order first), and the caption says which; the column `keep` (the
    one the rows are sorted by) is always shown, in place of the last that fits. A metric the records leave
    out (one that does not apply to this model) is not a column."""
    keys, used = [], 0
    all_columns = [c for c in head_columns() if not records or c[0] in records[0]]
    kept = next((c for c in all_columns if c[0] == keep), None)
    room = width - 1 - (kept[2] + 1 if kept is not None else 0)
    for column in all_columns:  # each column: its width plus one separator
        if column is kept:
            continue
        need = column[2] + 1
        if used + need > room:
            break
        keys.append(column)
        used += need
    if kept is not None:  # in its own place among the columns shown
        order = [c[0] for c in all_columns]
        keys = sorted([*keys, kept], key=lambda c: order.index(c[0]))
    dropped = [header for column_key, header, _, _ in all_columns if column_key not in {k[0] for k in keys}]
    if dropped:
        note = f"not shown at this width: {', '.join(dropped)} (see --json, --csv or a wider terminal)"
        caption = f"{caption}\n{note}" if caption else note
    table = Table(caption=Text(caption) if caption else None, caption_justify="left", box=box.SIMPLE_HEAD,
                  padding=0, pad_edge=False)
    for _, header, width_, text in keys:
        table.add_column(header, justify="left" if text else "right", no_wrap=True, overflow="ellipsis",
                         max_width=width_ if text else None)
    for record in records:
        cells = []
        for key, _, _, _ in keys:
            value = record[key]
            metric = metrics.find_metric(key)
            if key == "label":
                cells.append(Text(value, style=LABEL_STYLES.get(value, "")))
            elif metric is not None:
                cells.append(Text(visible(metric.format(value))))
            else:
                cells.append(Text(visible(str(value))))
        table.add_row(*cells)
    return titled(title, table)


def _cell_style(value: float, vmax: float, cmap: str = "viridis") -> str:
    """Background from the colormap, text black or white by the background's luminance."""
    colour = rgb(cmap, np.clip(np.float64(value) / vmax if vmax > 0 else 0.0, 0.0, 1.0))
    r, g, b = (int(c) for c in colour)
    fg = "black" if text_on(colour) else "white"
    return f"{fg} on rgb({r},{g},{b})"


def synthetic_table(rows: Sequence, T: int, model_dk: int) -> Group:
    """The random-vector check at several d_k: the spread of q·k and the softmax over T keys, raw and scaled."""
    table = Table(box=box.SIMPLE_HEAD, caption=Text(f"random q, k with N(0, 1) entries; softmax over T = {T} keys "
                                                    f"(ln T = {np.log(max(T, 2)):.3f} is uniform)"),
                  caption_justify="left")
    for name in ("d_k", "√d_k", "std QKᵀ", "std QKᵀ/√d_k", "entropy raw", "entropy scaled", "max α raw",
                 "max α scaled"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(f"{r.d_k}{' (this model)' if r.d_k == model_dk else ''}", f"{np.sqrt(r.d_k):.2f}",
                      f"{r.std_raw:.2f}", f"{r.std_scaled:.2f}", f"{r.entropy_raw:.3f}", f"{r.entropy_scaled:.3f}",
                      f"{r.max_raw:.3f}", f"{r.max_scaled:.3f}")
    return titled("the same check at the d_k you chose", table)


def entropy_table(values: np.ndarray, uniform: float, title: str, *, color: bool = True,
                  cmap: str = "viridis", layers: Sequence[int] | None = None) -> Group:
    """Layers × heads of mean entropy (nats), cells coloured on [0, ln T], with row and column means. `values`
    holds the rows of `layers` (default 0..L-1)."""
    L, H = values.shape
    names = list(range(L)) if layers is None else list(layers)
    table = Table(caption=Text(f"0 = one-hot; {uniform:.3f} = uniform over every key"
                               f"{' (ln T nats)' if uniform != 1.0 else ''}; definitions: attnviz explain entropy"),
                  caption_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    table.add_column("layer", justify="right")
    for h in range(H):
        table.add_column(str(h), justify="right")
    table.add_column("mean", justify="right", style="bold")
    for layer in range(L):
        row = [Text(f"{v:.2f}", style=_cell_style(v, uniform, cmap) if color else "") for v in values[layer]]
        table.add_row(Text(str(names[layer])), *row, Text(f"{values[layer].mean():.2f}"))
    table.add_row(Text("mean"), *[Text(f"{v:.2f}") for v in values.mean(axis=0)], Text(f"{values.mean():.2f}"),
                  style="bold", end_section=True)
    return titled(title, table)


def norms_table(records: Sequence[dict], title: str) -> Group:
    """Per layer: the share of attention on special tokens and on token 0, by α and by value-weighted norm."""
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("layer", "special, by α", "special, by norm", "token 0, by α", "token 0, by norm", "check |Δ|"):
        table.add_column(name, justify="right")
    for r in records:
        values = (str(r["layer"]), f"{r['alpha_on_special']:.2f}", f"{r['norm_on_special']:.2f}",
                  f"{r['alpha_on_first']:.2f}", f"{r['norm_on_first']:.2f}", f"{r['output_check']:.1e}")
        table.add_row(*(Text(v) for v in values))
    return titled(title, table)


def sinks_table(layers: Sequence[dict], n_heads: int, title: str) -> Group:
    """Per layer: how many heads have a sink, which tokens, and their mean score by α and by norm."""
    table = Table(box=box.SIMPLE_HEAD)
    for name, justify in (("layer", "right"), ("sink heads", "right"), ("sinks (token: heads)", "left"),
                          ("score by α", "right"), ("by norm", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in layers:
        tokens = ", ".join(f"{visible(t)} ×{c}" for t, c in sorted(r["tokens"].items(), key=lambda kv: -kv[1]))
        table.add_row(Text(str(r["layer"])), Text(f"{r['sink_heads']}/{n_heads}"), Text(tokens or "–"),
                      Text(f"{r['alpha']:.2f}" if r["sink_heads"] else "–"),
                      Text(f"{r['norm']:.2f}" if r["sink_heads"] else "–"))
    return titled(title, table)


def norms_check_table(diffs: Sequence[float], tolerance: float, title: str,
                      scales: Sequence[float] | None = None) -> Group:
    """Per layer: how far the recomputed parts are from the attention block's own output, and that
    difference relative to the output's largest |value| (the verdict's measure)."""
    table = Table(box=box.SIMPLE_HEAD)
    names = ["layer", "max |Δ| of the output"] + (["largest |output|", "relative |Δ|"] if scales is not None else [])
    for name in names:
        table.add_column(name, justify="right")
    for n, d in enumerate(diffs):
        if scales is None:
            table.add_row(Text(str(n)), Text(f"{d:.2e}", style="" if d <= tolerance else "red"))
            continue
        relative = d / max(float(scales[n]), 1.0)
        table.add_row(Text(str(n)), Text(f"{d:.2e}"), Text(f"{scales[n]:.3g}"),
                      Text(f"{relative:.2e}", style="" if relative <= tolerance else "red"))
    return titled(title, table)


def generation_table(steps: Sequence[dict], title: str, *, color: bool = True) -> Group:
    """One row per generated token: its position, the token, the earlier tokens it attends to most (with
    their weights) and its weight on itself."""
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("pos", justify="right")
    table.add_column("token", style="bold green" if color else "")
    table.add_column("attends most to (weight)")
    table.add_column("itself", justify="right")
    for step in steps:
        links = Text()
        for n, link in enumerate(step["top"]):
            if n:
                links.append("  ")
            links.append(f"{link['position']} {visible(link['token'])}", style="bold" if n == 0 else "")
            links.append(f" {link['weight']:.2f}", style="dim")
        itself = "–" if step["self"] is None else f"{step['self']:.2f}"
        table.add_row(Text(str(step["position"])), Text(visible(step["token"])), links, Text(itself))
    return titled(title, table)


def corpus_layers_table(records: Sequence[dict], title: str) -> Group:
    """Per layer: the mean weight on start, end and punctuation tokens (over texts; token-weighted beside)."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    table.add_column("layer", justify="right")
    names = [(name, header) for name, header in (("start_mass", "[CLS]/BOS"), ("end_mass", "[SEP]/EOS"),
                                                 ("punct_mass", "punct")) if records and name in records[0]]
    for _, header in names:
        table.add_column(header, justify="right")
        table.add_column("tok-w", justify="right", style="dim")
    for record in records:
        cells = [str(record["layer"])]
        for name, _ in names:
            cells += [f"{record[name]:.3f}", f"{record[name + '_tokens']:.3f}"]
        table.add_row(*cells)
    return titled(title, table)


def records_table(records: Sequence[dict], columns: Sequence[tuple[str, str, str]], title: str,
                  caption: str | None = None, min_widths: dict[str, int] | None = None) -> Group:
    """One row per record: columns are (key, header, format) — format "" for text (made visible), else a
    format spec for numbers ("–" for None or NaN). A list or tuple of texts is one to a line, each cut with …
    rather than broken where the column is too narrow (a broken token would read as two). `min_widths`: a
    column's narrowest width, by key (a name that must stay whole)."""
    table = Table(box=box.SIMPLE_HEAD, caption=Text(caption) if caption else None, caption_justify="left")
    for key, header, fmt in columns:
        table.add_column(header, justify="left" if not fmt else "right", overflow="fold",
                         min_width=(min_widths or {}).get(key))
    for record in records:
        cells = []
        for key, _, fmt in columns:
            value = record.get(key)
            if not fmt and isinstance(value, (list, tuple)):
                cells.append(Text("\n".join(visible(str(v)) for v in value) or "–", no_wrap=True,
                                  overflow="ellipsis"))
            elif not fmt:
                cells.append(Text(visible(str(value if value is not None else "–"))))
            elif value is None or (isinstance(value, float) and not np.isfinite(value)):
                cells.append(Text("–"))
            else:
                cells.append(Text(format(value, fmt)))
        table.add_row(*cells)
    return titled(title, table)


def records_html(records: Sequence[dict], columns: Sequence[str], title: str = "") -> str:
    """Records as an HTML table (numbers to 3 significant digits, every string escaped)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)

    def cell(value) -> str:
        return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))

    rows = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in records)
    caption = f"<caption>{html.escape(title)}</caption>" if title else ""
    return f'<table class="attnviz-table">{caption}<thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
