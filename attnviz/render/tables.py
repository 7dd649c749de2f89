"""Rich tables for the numeric commands (verify, scaling, heads, entropy). Build, never print."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text


def titled(title: str, table: Table) -> Group:
    """A bold title line above a table (Rich would wrap a long title to the table's width)."""
    return Group(Text(title, style="bold"), table)


def verify_table(diffs: Sequence, tolerance: float, title: str) -> Group:
    """One row per layer: max |Δα|, mean |Δα|, worst head; failing layers in red."""
    table = Table()
    for name in ("layer", "max |Δ|", "mean |Δ|", "worst head"):
        table.add_column(name, justify="right")
    for d in diffs:
        style = None if d.max_abs <= tolerance else "red"
        table.add_row(str(d.layer), f"{d.max_abs:.2e}", f"{d.mean_abs:.2e}", str(d.worst_head), style=style)
    return titled(title, table)


def scaling_table(rows: Sequence, T: int, d_k: int, title: str) -> Group:
    """Raw Q·Kᵀ against Q·Kᵀ/√d_k per layer, beside the uniform entropy ln T."""
    table = Table(caption=f"entropy in nats; uniform attention over T={T} keys has ln T = {np.log(T):.3f}; "
                          f"d_k = {d_k}, √d_k = {np.sqrt(d_k):.2f}", caption_justify="left")
    for name in ("layer", "std QKᵀ", "std QKᵀ/√d_k", "entropy raw", "entropy scaled", "max α raw",
                 "max α scaled"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(str(r.layer), f"{r.std_raw:.2f}", f"{r.std_scaled:.2f}", f"{r.entropy_raw:.3f}",
                      f"{r.entropy_scaled:.3f}", f"{r.max_raw:.3f}", f"{r.max_scaled:.3f}")
    return titled(title, table)


def verdict(ok: bool, message: str) -> Text:
    return Text.assemble(("PASS" if ok else "FAIL", "bold green" if ok else "bold red"), ": ", message)


# column -> header, in the order they are dropped last-first when the terminal is narrow
HEAD_HEADERS = {"layer": "L", "head": "H", "label": "label", "entropy": "H(nats)", "norm_entropy": "H/lnN",
                "max_weight": "maxα", "mean_distance": "dist", "prev": "prev", "self": "self", "next": "next",
                "start_mass": "start", "end_mass": "end", "vertical_token": "top key", "punct_mass": "punct",
                "first_mass": "first"}
TEXT_COLUMNS = {"label": 14, "vertical_token": 7, "layer": 2, "head": 2}
LABEL_STYLES = {"previous-token": "cyan", "next-token": "cyan", "self": "magenta", "vertical": "yellow",
                "block": "green", "broad": "blue", "mixed": "dim"}


def heads_table(stats: Sequence, title: str, caption: str | None = None, width: int = 200) -> Group:
    """One row per head with the metrics of metrics.head_stats and its pattern label. Columns that do not
    fit in `width` are left out (last in HEAD_HEADERS first), and the caption says which."""
    keys, used = [], 0
    for key in HEAD_HEADERS:  # each column: its width plus one separator
        need = TEXT_COLUMNS.get(key, max(len(HEAD_HEADERS[key]), 4)) + 1
        if used + need > width - 1:
            break
        keys.append(key)
        used += need
    dropped = [HEAD_HEADERS[k] for k in HEAD_HEADERS if k not in keys]
    if dropped:
        note = f"not shown at this width: {', '.join(dropped)} (see --json, --csv or a wider terminal)"
        caption = f"{caption}\n{note}" if caption else note
    table = Table(caption=caption, caption_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    for key in keys:
        table.add_column(HEAD_HEADERS[key], justify="left" if key in TEXT_COLUMNS else "right",
                         no_wrap=True, overflow="ellipsis", max_width=TEXT_COLUMNS.get(key))
    for s in stats:
        cells = []
        for key in keys:
            value = getattr(s, key)
            if key == "label":
                cells.append(Text(value, style=LABEL_STYLES.get(value, "")))
            elif isinstance(value, float):
                cells.append(f"{value:.2f}")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    return titled(title, table)


def _cell_style(value: float, vmax: float) -> str:
    from matplotlib import colormaps

    r, g, b, _ = colormaps["viridis"](min(max(value / vmax, 0.0), 1.0) if vmax > 0 else 0.0)
    fg = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
    return f"{fg} on rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})"


def entropy_table(values: np.ndarray, uniform: float, title: str, *, color: bool = True) -> Group:
    """Layers × heads of mean entropy (nats), cells coloured on [0, ln T], with row and column means."""
    L, H = values.shape
    table = Table(caption=f"0 = one-hot; {uniform:.3f} = uniform over every key"
                          f"{' (ln T nats)' if uniform != 1.0 else ''}",
                  caption_justify="left", box=box.SIMPLE_HEAD, padding=0, pad_edge=False)
    table.add_column("layer", justify="right")
    for h in range(H):
        table.add_column(str(h), justify="right")
    table.add_column("mean", justify="right", style="bold")
    for layer in range(L):
        cells = [Text(f"{v:.2f}", style=_cell_style(v, uniform) if color else "") for v in values[layer]]
        table.add_row(str(layer), *cells, f"{values[layer].mean():.2f}")
    table.add_row("mean", *[f"{v:.2f}" for v in values.mean(axis=0)], f"{values.mean():.2f}", style="bold",
                  end_section=True)
    return titled(title, table)
