"""Line charts: what attention costs against T (attnviz cost). Builds a Figure, never prints or shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# matplotlib is imported inside the functions that draw, so that reading a capture and --help never load it.


def _reference(ax, T: np.ndarray, anchor_T: float, anchor_value: float, power: int, label: str, style: str) -> None:
    """A dashed c·T^power through one measured point, for comparison (not a measurement)."""
    ax.plot(T, anchor_value * (T / anchor_T) ** power, style, color="0.55", linewidth=1, label=label)


def cost_figure(rows: Sequence, title: str, ax=None):
    """Time and peak memory against T, full path and streamed path, on log-log axes, beside O(T²) and O(T)
    lines through the first measured point of each path. `rows` are engine.cost.CostRow."""
    from attnviz.render.figure import canvas, titled

    main = ax
    fig, axes = canvas(main, (12, 4.8), cols=2)
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
    return titled(fig, main, title, fontsize=11)


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


def position_mosaic_figure(similarity: np.ndarray, grid: tuple[int, int], title: str, subtitle: str = "",
                           ax=None):
    """The ViT paper's picture of position embeddings: for each patch (a small map at its place in the grid),
    the cosine similarity of its position embedding to every patch's. similarity (N, N), N = rows × cols."""
    from attnviz.render.figure import canvas, titled

    rows, cols = grid
    mosaic = np.full((rows * (rows + 1) - 1, cols * (cols + 1) - 1), np.nan)
    for r in range(rows):
        for c in range(cols):
            block = similarity[r * cols + c].reshape(rows, cols)
            mosaic[r * (rows + 1):r * (rows + 1) + rows, c * (cols + 1):c * (cols + 1) + cols] = block
    side = min(11.0, max(5.0, 0.3 * max(rows, cols) + 3))
    main = ax
    fig, (ax,) = canvas(main, (side * cols / max(rows, cols) + 1.2, side * rows / max(rows, cols) + 0.9))
    shown = ax.imshow(np.ma.masked_invalid(mosaic), cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([c * (cols + 1) + (cols - 1) / 2 for c in range(cols)], [str(c) for c in range(cols)], fontsize=7)
    ax.set_yticks([r * (rows + 1) + (rows - 1) / 2 for r in range(rows)], [str(r) for r in range(rows)], fontsize=7)
    ax.set_xlabel("patch column")
    ax.set_ylabel("patch row")
    fig.colorbar(shown, ax=ax, shrink=0.8, label="cosine similarity of position embeddings")
    return titled(fig, main, title + (f"\n{subtitle}" if subtitle else ""), fontsize=10, x=0.01, ha="left")


def massive_figure(tops: np.ndarray, medians: np.ndarray, profile: np.ndarray | None, layer: int,
                   dims: Sequence[int], tokens: Sequence[str], value_ratio: np.ndarray, minimum: float, ratio: float,
                   title: str, subtitle: str = "", ax=None):
    """Massive activations in three panels: each layer's three largest |h| and its median on a log scale (Sun et
    al. 2024's Figure 1), with the threshold (over `minimum` and `ratio` × the median); |h| of every token on
    the massive dimensions at `layer` (profile (T, k)); the massive tokens' value-vector norms over the median
    token's, by layer (1: as large as a typical token's)."""
    from attnviz.render.figure import canvas, titled

    main = ax
    fig, axes = canvas(main, (15, 4.8), cols=3, width_ratios=[1.0, 1.4, 1.0])
    L = len(medians)
    x = np.arange(L)
    ax = axes[0]
    for k, (style, name) in enumerate((("o-", "largest"), ("s--", "second"), ("^:", "third"))):
        ax.plot(x, tops[:, k], style, label=f"{name} |h|", markersize=4)
    ax.plot(x, medians, "k-", label="median |h|", linewidth=1)
    ax.plot(x, np.maximum(minimum, ratio * medians), color="tab:red", linestyle="-.", linewidth=0.8,
            label=f"massive above: {minimum:g} and {ratio:g}× median")
    ax.set_yscale("log")
    ax.set_xlabel("layer (the block's output)")
    ax.set_ylabel("|h|")
    ax.set_title("the residual stream's largest entries", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    if profile is not None and len(dims):
        T = profile.shape[0]
        width = 0.8 / len(dims)
        for k, dim in enumerate(dims):
            ax.bar(np.arange(T) + (k - (len(dims) - 1) / 2) * width, profile[:, k], width=width, label=f"dim {dim}")
        ax.set_yscale("log")
        step = max(1, T // 40)
        ax.set_xticks(np.arange(0, T, step))
        ax.set_xticklabels([tokens[i][:12] for i in range(0, T, step)], rotation=90, fontsize=7)
        ax.legend(fontsize=7)
    ax.set_ylabel("|h|")
    ax.set_title(f"layer {layer}: every token on the massive dimensions", fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax = axes[2]
    finite = np.isfinite(value_ratio)
    if finite.any():
        ax.plot(x[finite], value_ratio[finite], "o-", color="tab:purple", markersize=4)
        ax.set_yscale("log")
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("‖f(x)‖ of the massive tokens / the median token's")
    ax.set_title("their value vectors (through W_O), by layer", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    return titled(fig, main, title + ("\n" + subtitle if subtitle else ""), fontsize=11)


def faithfulness_figure(result, ax=None):
    """Which explanation to trust, drawn: the perturbation curves (f_full − f against the fraction of the
    erasable tokens erased, comprehensiveness, and kept, sufficiency), one line per method and the random
    orders as a band (mean ± sd); beneath, every method's scores of the tokens side by side, each row scaled by
    its largest |score| (red: for f, blue: against it). `result` is an api Faithfulness."""
    from attnviz.panels import short_model
    from attnviz.render.figure import NotebookFigure as Figure, canvas, titled
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import NullFormatter

    from attnviz.render.fonts import families_for
    from attnviz.base.text import visible

    methods = result.ranking()
    by_name = {m.name: m for m in methods}
    groups = [[by_name[name] for name in group] for group in result.ties()]  # tied methods: one curve, one entry
    tokens = [visible(t) for t in result.tokens]
    T = len(tokens)
    from attnviz.render.png import wrap_text

    width = max(12.0, 0.5 * T + 4)
    main = ax
    if main is None:
        fig = Figure(figsize=(width, 4.6 + 0.32 * len(methods) + 1.6), layout="constrained")
        grid = fig.add_gridspec(2, 2, height_ratios=[3.2, 0.32 * max(1, len(methods)) + 1.2])
        curves = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
        table_ax = fig.add_subplot(grid[1, :])
    else:  # the comprehensiveness curves on the caller's axes; the rest on a scratch figure, dropped
        fig, (first, second, table_ax) = canvas(main, (width, 6.0), cols=3)
        curves = [first, second]
    fractions = np.array(result.bins) * 100
    colors = [f"C{n % 10}" for n in range(len(groups))]
    for ax, what, field in ((curves[0], "comprehensiveness: top tokens erased\n(higher is better)",
                             "comprehensiveness"),
                            (curves[1], "sufficiency: only the top tokens kept\n(lower is better)", "sufficiency")):
        if result.random is not None:
            rows = np.array([(m, s) for _, m, s in getattr(result.random, field)])
            ax.fill_between(fractions, rows[:, 0] - rows[:, 1], rows[:, 0] + rows[:, 1], color="0.85",
                            label=f"random ({result.random.orders} orders, mean ± sd)")
            ax.plot(fractions, rows[:, 0], color="0.5", linewidth=1)
        for group, color in zip(groups, colors):
            drops = [result.f_full - f for _, _, f in getattr(group[0], field)]
            ax.plot(fractions, drops, "o-", color=color, markersize=3, linewidth=1.4,
                    label=" = ".join(m.name for m in group) + (" (tied)" if len(group) > 1 else ""))
        ax.set_xscale("log")
        ax.set_xticks(fractions)
        ax.set_xticklabels([f"{b:g}%" for b in fractions])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("share of the erasable tokens")
        ax.set_ylabel("f_full − f")
        ax.set_title(what, fontsize=9)
        ax.grid(True, alpha=0.3)
    (curves[1] if main is None else curves[0]).legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax = table_ax
    table = np.full((len(methods), T), np.nan)  # NaN: not ranked (special tokens, the explained position)
    erasable = np.array(result.erasable)
    for n, m in enumerate(methods):
        row = np.asarray(m.scores, np.float64)[erasable]
        peak = np.abs(row).max()
        table[n, erasable] = row / peak if peak > 0 else row
    cmap = colormaps["RdBu_r"].with_extremes(bad="white")
    image = ax.imshow(np.ma.masked_invalid(table), cmap=cmap, vmin=-1, vmax=1, aspect="auto",
                      interpolation="nearest")
    for column in range(T):  # the blank columns hatched, so that "not ranked" never reads as a score of 0
        if column not in set(erasable.tolist()):
            ax.add_patch(Rectangle((column - 0.5, -0.5), 1, len(methods), fill=False, hatch="///",
                                   edgecolor="0.7", linewidth=0))
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.03, pad=0.01, ticks=[-1, 0, 1])
    bar.ax.set_yticklabels(["−1: against f", "0", "+1: for f"], fontsize=7)
    families = families_for("".join(tokens))
    ax.set_xticks(range(T))
    ax.set_xticklabels(tokens, rotation=90, fontfamily=families, fontsize=8)
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels([m.name for m in methods], fontsize=8)
    ax.set_title(wrap_text("each method's scores of the erasable tokens, each row over its largest |score| (red: "
                           "for f, blue: against it; hatched: not ranked, the special tokens and the explained "
                           "position)", width * 0.8, 9), fontsize=9)
    heading = f"{short_model(result.model)}: which explanation to trust — f = {result.quantity} = {result.f_full:.4f}"
    heading = wrap_text(heading, width * 0.95, 10) + "\n" + wrap_text(result.verdict(), width * 0.95, 10)
    return titled(fig, main, heading, fontsize=10, x=0.01, ha="left", fontfamily=families_for(result.quantity))


def faithfulness_corpus_figure(result, ax=None):
    """Over a corpus: each method's mean comprehensiveness and sufficiency AOPC with its 95 % interval, best
    first, beside the random orders' means. `result` is an api FaithfulnessCorpus."""
    from attnviz.panels import short_model
    from attnviz.render.figure import canvas, titled

    from matplotlib.lines import Line2D

    methods = list(result.methods)
    main = ax
    fig, axes = canvas(main, (10.0, 1.6 + 0.42 * len(methods)), cols=2,
                       **({} if main is not None else {"sharey": True}))
    ys = np.arange(len(methods))[::-1]
    for ax, field, what, n in ((axes[0], "comprehensiveness", "comprehensiveness (higher is better)", 0),
                               (axes[1], "sufficiency", "sufficiency (lower is better)", 1)):
        values = np.array([getattr(m, field) for m in methods])  # (M, 3): mean, low, high (NaN: no interval)
        spread = np.nan_to_num([values[:, 0] - values[:, 1], values[:, 2] - values[:, 0]])
        ax.errorbar(values[:, 0], ys, xerr=spread, fmt="o", color="tab:blue", ecolor="tab:blue", capsize=3)
        if result.random is not None:
            ax.axvline(result.random[n], color="0.5", linestyle="--", linewidth=1)
        ax.set_title(what, fontsize=9)
        ax.set_xlabel("mean AOPC over the texts" + (", 95 % bootstrap interval" if np.isfinite(values[:, 1]).all()
                                                     else " (too few texts for intervals)"))
        ax.grid(True, axis="x", alpha=0.3)
    key = [Line2D([], [], color="0.5", linestyle="--", linewidth=1, label="random orders (mean)")]
    if result.random is not None and main is None:  # the key under the panels, where it covers no method's point
        fig.legend(handles=key, loc="outside lower center", fontsize=7, frameon=False)
    elif result.random is not None:
        main.legend(handles=key, fontsize=7)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels([m.name for m in methods], fontsize=8)
    from attnviz.render.png import wrap_text

    return titled(fig, main, f"{short_model(result.model)}: which explanation to trust, over {result.texts:,} texts\n"
                  + wrap_text(result.verdict(), 9.5, 10), fontsize=10, x=0.01, ha="left")


def comparison_figure(exact: np.ndarray, estimate: np.ndarray, method: str, r: float | None,
                      disagree: Sequence[dict], title: str, subtitle: str = "", ax=None):
    """Exact activation patching against an estimate of it (AtP), head by head: both layers × heads grids on
    one diverging scale, and the scatter of every head (exact across, the estimate up) beside the line where
    they agree, the heads where they disagree most named. exact, estimate (L, H)."""
    from attnviz.render.figure import canvas, titled
    from attnviz.render.fonts import families_for

    L, H = exact.shape
    main = ax
    ratios: dict[str, Any] = {} if main is not None else {"width_ratios": [1, 1, 1.15]}
    fig, axes = canvas(main, (max(11.0, 0.5 * H * 2 + 5), max(4.2, 0.22 * L + 2.2)), cols=3, **ratios)
    edge = max(1.0, float(np.abs(exact).max()), float(np.abs(estimate).max()))
    for ax, values, name in ((axes[0], exact, "exact patching"), (axes[1], estimate, method)):
        shown = ax.imshow(values, cmap="RdBu_r", vmin=-edge, vmax=edge, aspect="auto", interpolation="nearest",
                          origin="lower")
        ax.set_title(f"{name}: each head", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
    fig.colorbar(shown, ax=axes[:2] if main is None else main, shrink=0.8, label="restored (0 corrupted, 1 clean)")
    ax = axes[2]
    ax.scatter(exact.ravel(), estimate.ravel(), s=12, color="0.3", zorder=2)
    low = min(float(exact.min()), float(estimate.min()), 0.0)
    high = max(float(exact.max()), float(estimate.max()), 0.0)
    ax.plot([low, high], [low, high], "--", color="tab:red", linewidth=1, label="estimate = exact")
    for d in disagree:
        ax.annotate(f"{d['layer']}.{d['head']}", (d["exact"], d["estimate"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points", color="tab:blue")
    ax.set_xlabel("exact patching")
    ax.set_ylabel(method)
    ax.set_title(f"every head ({L * H}): Pearson r = " + ("–" if r is None else f"{r:.3f}"), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return titled(fig, main, title + (f"\n{subtitle}" if subtitle else ""), fontsize=10, x=0.01, ha="left",
                  fontfamily=families_for(title + subtitle))


CIRCUIT_EDGES = 150  # the most edges the circuit picture draws


def _circuit_place(name: str, H: int, G: int) -> tuple[float, float]:
    """Where a node or a receiver sits in the circuit picture: input at the bottom, each layer's heads in a row
    (x the head), its MLP in the middle above them, the logits on top; a receiver at its node (a key or value
    head's in the middle of its group), q, k and v a little apart."""
    centre = (H - 1) / 2
    if name == "input":
        return centre, 0.0
    if name == "logits":
        return centre, float("inf")
    if name.startswith("m"):
        return H + 0.2, 2 * int(name[1:]) + 2
    parts = name[1:].split(".")
    layer = int(parts[0])
    if parts[1].startswith("kv"):
        group = int(parts[1][2:])
        size = H // max(1, G)
        x = group * size + (size - 1) / 2
    else:
        x = float(parts[1])
    shift = {"q": -0.18, "k": 0.0, "v": 0.18}.get(parts[2], 0.0) if len(parts) > 2 else 0.0
    return x + shift, 2 * layer + 1 - (0.12 if len(parts) > 2 else 0.0)


def discovery_figure(result, ax=None):
    """The circuit found, drawn (layers up: input, each layer's heads then its MLP, logits on top; an edge's
    width by |score|, red where the clean run's contribution raises the logit difference, blue where it lowers
    it), beside its faithfulness curve. The circuit drawn is the smallest on the curve keeping 80 % (at most
    CIRCUIT_EDGES of its top edges). `result` is an api Discovery."""
    from matplotlib.collections import LineCollection

    from attnviz.panels import short_model
    from attnviz.render.figure import canvas, titled

    heads = [n for n in result.nodes if n.startswith("a")]
    L = sum(1 for n in result.nodes if n.startswith("m"))
    H = len(heads) // max(1, L)
    G = len({r.split(".")[1] for r in result.receivers if r.endswith(".k")} & {f"kv{g}" for g in range(H)}) or H
    found = result.smallest()
    size = min(CIRCUIT_EDGES, found[0] if found else CIRCUIT_EDGES)
    edges = result.edges(max(1, size))
    top_y = 2 * L + 1
    main = ax
    ratios: dict[str, Any] = {} if main is not None else {"width_ratios": [max(1.0, H / 6), 1]}
    fig, (ax, curve) = canvas(main, (max(9.0, 0.55 * H + 7.5), max(5.0, 0.16 * top_y + 2.5)), cols=2, **ratios)
    peak = max((abs(e["score"]) for e in edges), default=1.0) or 1.0
    segments, widths, colors = [], [], []
    used: set[str] = set()
    for e in edges:
        x0, y0 = _circuit_place(e["from"], H, G)
        x1, y1 = _circuit_place(e["to"], H, G)
        y1 = top_y if y1 == float("inf") else y1
        segments.append([(x0, y0), (x1, y1)])
        widths.append(0.3 + 3.2 * abs(e["score"]) / peak)
        colors.append((0.8, 0.1, 0.1, 0.75) if e["score"] > 0 else (0.1, 0.3, 0.8, 0.75))
        used.update((e["from"], e["to"].rsplit(".", 1)[0] if e["to"].count(".") == 2 else e["to"]))
    ax.add_collection(LineCollection(segments, linewidths=widths, colors=colors, zorder=1))
    ends = np.array([segment[1] for segment in segments]).reshape(-1, 2)
    ax.scatter(ends[:, 0], ends[:, 1], s=5, color="0.2", marker="^", zorder=2)  # each receiver's input (q, k, v)
    for name in result.nodes + ("logits",):
        x, y = _circuit_place(name, H, G)
        y = top_y if y == float("inf") else y
        on = name in used
        ax.scatter([x], [y], s=28 if on else 6, color="black" if on else "0.75",
                   marker="s" if name.startswith("m") else "o", zorder=2)
        if on and (name.startswith("a") or name.startswith("m")):
            ax.annotate(name, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_yticks([0] + [2 * n + 1.5 for n in range(L)] + [top_y])
    ax.set_yticklabels(["input"] + [f"layer {n}" for n in range(L)] + ["logits"], fontsize=7)
    ax.set_xticks([*range(H), H + 0.2])
    ax.set_xticklabels([*(str(h) for h in range(H)), "MLP"])
    ax.set_xlabel("head (● a head, ■ the layer's MLP; ▲ a head's q, k, v input, left to right)")
    ax.set_xlim(-0.8, H + 0.8)
    ax.set_ylim(-0.8, top_y + 0.8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(f"the top {len(edges)} edges of {result.total:,}" + (f" (faithfulness {found[1]:.2f})" if found and
                                                                      found[0] <= CIRCUIT_EDGES else ""), fontsize=9)
    shares = np.array([n for n, _ in result.curve], np.float64) / max(1, result.total)
    kept_share = np.array([f for _, f in result.curve])
    curve.plot(np.maximum(shares, 1e-4), kept_share, "o-", color="tab:blue", markersize=4)
    curve.axhline(1.0, color="0.5", linestyle="--", linewidth=1)
    curve.axhline(0.0, color="0.5", linewidth=0.8)
    curve.set_xscale("log")
    curve.set_xlabel("share of the edges kept (0 drawn at 0.01 %)")
    curve.set_ylabel("faithfulness (1: the clean run)")
    curve.set_title(f"faithfulness curve, area {result.area:.3f}", fontsize=9)
    curve.grid(True, alpha=0.3)
    method = {"eap": "EAP", "eap-ig": f"EAP-IG ({result.steps} steps)"}[result.method]
    return titled(fig, main, f"{short_model(result.model)}: the circuit found by {method} over {len(result.pairs)} pair"
                  f"{'s' if len(result.pairs) != 1 else ''}", fontsize=10, x=0.01, ha="left")


def head_grid_figure(records: Sequence[dict], key: str, title: str, *, cmap: str = "viridis", ax=None):
    """attnviz heads drawn: a layers × heads grid coloured by the column `key` (heads not in `records` and NaN
    values left light grey), each cell written with the head's pattern label in black or white by the cell's
    luminance, a colour bar naming the column. With `ax`, drawn on those axes (returned); else a new figure."""
    from attnviz.base.text import visible
    from attnviz.metrics import find_metric
    from attnviz.render.colors import colormap, text_on
    from attnviz.render.figure import NotebookFigure as Figure
    from attnviz.render.png import wrap_text

    layers = sorted({int(r["layer"]) for r in records}) or [0]
    heads = sorted({int(r["head"]) for r in records}) or [0]
    grid = np.full((len(layers), len(heads)), np.nan)
    labels = np.full(grid.shape, "", dtype=object)
    for r in records:
        row, column = layers.index(int(r["layer"])), heads.index(int(r["head"]))
        value = r.get(key)
        grid[row, column] = float(value) if isinstance(value, (int, float)) and value == value else np.nan
        labels[row, column] = visible(str(r.get("label", "")))
    own = ax is None
    if own:
        fig = Figure(figsize=(max(5.0, 0.7 * len(heads) + 2.5), max(3.0, 0.45 * len(layers) + 1.8)),
                     layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    mapping = colormap(cmap)
    finite = grid[np.isfinite(grid)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    high = high if high > low else low + 1e-9
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=mapping, vmin=low, vmax=high, aspect="auto",
                      interpolation="nearest")
    shades = np.asarray(mapping(np.ma.masked_invalid((grid - low) / (high - low)), bytes=True))[..., :3]
    for (row, column), text in np.ndenumerate(labels):
        if text:
            ax.text(column, row, text, ha="center", va="center", fontsize=7,
                    color="0.15" if text_on(shades[row, column]) else "white")
    ax.set_xticks(range(len(heads)), [str(h) for h in heads])
    ax.set_yticks(range(len(layers)), [str(n) for n in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    metric = find_metric(key)
    name = metric.header if metric is not None else key
    fig.colorbar(image, ax=ax, label=name, shrink=0.9)
    ax.set_title(wrap_text(title, fig.get_figwidth() * 0.9, 9) + f"\ncolour: {name}; text: the pattern label",
                 fontsize=9)
    return fig if own else ax
