"""Line charts: what attention costs against T (attnviz cost). Builds a Figure, never prints or shows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.


def _reference(ax, T: np.ndarray, anchor_T: float, anchor_value: float, power: int, label: str, style: str) -> None:
    """A dashed c·T^power through one measured point, for comparison (not a measurement)."""
    ax.plot(T, anchor_value * (T / anchor_T) ** power, style, color="0.55", linewidth=1, label=label)


def cost_figure(rows: Sequence, title: str):
    """Time and peak memory against T, full path and streamed path, on log-log axes, beside O(T²) and O(T)
    lines through the first measured point of each path. `rows` are engine.cost.CostRow."""
    from attnviz.render.figure import NotebookFigure as Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    T_all = np.array([r.T for r in rows], dtype=float)
    series = (("time (s)", "full_seconds", "stream_seconds", 1.0), ("peak memory (MiB)", "full_bytes", "stream_bytes",
                                                                   1 / (1 << 20)))
    for ax, (what, full_key, stream_key, unit) in zip(axes, series):
        for key, name, color in ((full_key, "full path (α kept)", "tab:red"),
                                 (stream_key, "streamed (blocks of rows)", "tab:blue")):
            points = [(r.T, getattr(r, key) * unit) for r in rows if getattr(r, key) is not None]
            points = [(t, v) for t, v in points if v > 0]
            if not points:
                continue
            t, v = np.array(points).T
            ax.plot(t, v, "o-", color=color, label=name)
        full = [(r.T, getattr(r, full_key) * unit) for r in rows if getattr(r, full_key)]
        stream = [(r.T, getattr(r, stream_key) * unit) for r in rows if getattr(r, stream_key)]
        refused = [r.T for r in rows if getattr(r, full_key) is None and r.full_note]
        if refused:  # the full path was not run at these lengths: marked where it would be, at the top
            ax.scatter(refused, [0.96] * len(refused), marker="x", s=60, color="tab:red",
                       transform=ax.get_xaxis_transform(), label="full path not run (over the memory budget)")
        if full:
            _reference(ax, T_all, full[0][0], full[0][1], 2, "∝ T² (through the first point)", "--")
        if stream:
            _reference(ax, T_all, stream[0][0], stream[0][1], 1, "∝ T (through the first point)", ":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig
