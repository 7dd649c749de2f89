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


PATH_COLORS = ("#cc3311", "#ee7733", "#009988", "#0077bb", "#aa3377")  # Paul Tol's vivid: one colour per path


def contribution_graph_figure(layers: np.ndarray, tokens: Sequence[str], threshold: float, paths: Sequence,
                              title: str, subtitle: str = ""):
    """The contribution graph, as llm-transparency-tool draws it: tokens across, layers up (0: the input), an
    edge from token j at one level to token i at the next where layers[l][i, j] ≥ threshold, its width and
    darkness growing with the contribution; `paths` ((weight, (j_0, …, j_L)), …) drawn over it in colour.
    layers (L, T, T), rows summing to 1. Returns (figure, number of edges drawn)."""
    from matplotlib.collections import LineCollection

    from attnviz.render.figure import NotebookFigure as Figure
    from attnviz.render.fonts import families_for

    L, T, _ = layers.shape
    fig = Figure(figsize=(max(6.0, 0.55 * T + 2), max(4.0, 0.42 * L + 2.4)), layout="constrained")
    ax = fig.subplots()
    segments, widths, shades = [], [], []
    for level, layer in enumerate(layers):
        for i, j in zip(*np.nonzero(layer >= threshold)):
            segments.append([(j, level), (i, level + 1)])
            widths.append(0.4 + 3.0 * float(layer[i, j]))
            shades.append((0.2, 0.2, 0.2, min(1.0, 0.15 + float(layer[i, j]))))
    ax.add_collection(LineCollection(segments, linewidths=widths, colors=shades, zorder=1))
    for n, (weight, path) in enumerate(paths):
        color = PATH_COLORS[n % len(PATH_COLORS)]
        ax.plot(path, range(len(path)), "-", color=color, linewidth=2.4, zorder=3,
                label=f"{' → '.join(tokens[j] for j in (path[0], path[-1]))}: {weight:.3f}")
    xs, ys = np.meshgrid(np.arange(T), np.arange(L + 1))
    ax.scatter(xs.ravel(), ys.ravel(), s=14, color="0.35", zorder=2)
    families = families_for("".join(tokens) + title)
    ax.set_xticks(range(T))
    ax.set_xticklabels(tokens, rotation=90, fontfamily=families)
    ax.set_yticks(range(L + 1))
    ax.set_yticklabels(["input"] + [f"layer {n}" for n in range(L)])
    ax.set_xlim(-0.5, T - 0.5)
    ax.set_ylim(-0.3, L + 0.3)
    ax.spines[["top", "right"]].set_visible(False)
    if paths:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="strongest paths")
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10, x=0.01, ha="left",
                 fontfamily=families)
    return fig, len(segments)


def position_mosaic_figure(similarity: np.ndarray, grid: tuple[int, int], title: str, subtitle: str = ""):
    """The ViT paper's picture of position embeddings: for each patch (a small map at its place in the grid),
    the cosine similarity of its position embedding to every patch's. similarity (N, N), N = rows × cols."""
    from attnviz.render.figure import NotebookFigure as Figure

    rows, cols = grid
    mosaic = np.full((rows * (rows + 1) - 1, cols * (cols + 1) - 1), np.nan)
    for r in range(rows):
        for c in range(cols):
            block = similarity[r * cols + c].reshape(rows, cols)
            mosaic[r * (rows + 1):r * (rows + 1) + rows, c * (cols + 1):c * (cols + 1) + cols] = block
    side = min(11.0, max(5.0, 0.3 * max(rows, cols) + 3))
    fig = Figure(figsize=(side * cols / max(rows, cols) + 1.2, side * rows / max(rows, cols) + 0.9),
                 layout="constrained")
    ax = fig.subplots()
    shown = ax.imshow(np.ma.masked_invalid(mosaic), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([c * (cols + 1) + (cols - 1) / 2 for c in range(cols)], [str(c) for c in range(cols)], fontsize=7)
    ax.set_yticks([r * (rows + 1) + (rows - 1) / 2 for r in range(rows)], [str(r) for r in range(rows)], fontsize=7)
    ax.set_xlabel("patch column")
    ax.set_ylabel("patch row")
    fig.colorbar(shown, ax=ax, shrink=0.8, label="cosine similarity of position embeddings")
    fig.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=10, x=0.01, ha="left")
    return fig
