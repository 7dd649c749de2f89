"""attnviz why drawn: the largest query parts × key parts of a head's score, and each side's totals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz.render.figure import canvas, titled


def why_figure(matrix: np.ndarray, query: Sequence[str], key: Sequence[str], query_totals: Sequence[tuple[str, float]],
               key_totals: Sequence[tuple[str, float]], title: str, *, cmap: str = "RdBu_r", ax=None):
    """`matrix` (A, B): the terms of the largest query parts (rows) × key parts (columns), on a scale symmetric
    about 0; beside it the two sides' totals as bars. With ax=, the matrix alone, on those axes (returned)."""
    fig, axes = canvas(ax, (13.0, 6.5), cols=3, width_ratios=[2.2, 1, 1])
    main, left, right = axes
    top = float(np.abs(matrix).max()) or 1.0
    image = main.imshow(matrix, cmap=cmap, vmin=-top, vmax=top, aspect="auto")
    main.set_yticks(range(len(query)), list(query), fontsize=7)
    main.set_xticks(range(len(key)), list(key), rotation=60, ha="right", fontsize=7)
    main.set_ylabel("query side (the stream at the query)")
    main.set_xlabel("key side (the stream at the key)")
    main.figure.colorbar(image, ax=main, shrink=0.8, label="q(a)·k(b)·scale")
    for where, totals, side in ((left, query_totals, "query"), (right, key_totals, "key")):
        names = [n for n, _ in totals][::-1]
        values = [v for _, v in totals][::-1]
        where.barh(range(len(values)), values, color=["#b2182b" if v > 0 else "#2166ac" for v in values])
        where.set_yticks(range(len(names)), names, fontsize=7)
        where.axvline(0, color="black", linewidth=0.6)
        where.set_title(f"{side} side: Σ over the other side", fontsize=9)
    return titled(fig, ax, title, fontsize=10)
