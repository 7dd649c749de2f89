"""Rich tables for the numeric commands (verify, scaling, heads, entropy). Build, never print."""

from __future__ import annotations

from typing import Sequence

import numpy as np
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
