"""What one picture shows, decided once. A Panel holds a matrix, its row and column labels, the cells
that are not drawn, the colour scale, the title and the file name; a Page is the panels that go into one
figure or one screen, with the title over them. Every renderer (PNG/SVG/PDF, terminal, the export and
its gallery) consumes these and decides nothing about content: head selection, hidden special tokens,
the causal mask, titles and names are all made here. Labels and titles are display-safe (control
characters made visible). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import SelectionError
from attnviz.text import shorten, visible

HeadChoice = int | str  # a head index, "mean" or "max"


NORMS = ("linear", "sqrt", "log")
AUTO_LINEAR_MAX_T = 64  # --norm auto: linear up to this many tokens, log beyond (long inputs are mostly tiny
# weights, about 1/T each, beside a few near 1: only a log scale shows both; a linear one is flat purple)
LOG_RANGE = 1e-3  # a log scale spans three decades below vmax


@dataclass(frozen=True)
class Scale:
    """How values map to colours: from vmin to vmax, linearly, by square root, or logarithmically (three
    decades below vmax); `shared` says whether the panels of a picture share it."""

    vmin: float = 0.0
    vmax: float = 1.0
    label: str = "attention weight α"
    norm: str = "linear"
    shared: bool = True

    @property
    def low(self) -> float:
        """The value drawn in the lowest colour (for a log scale, vmax / 1000)."""
        return max(self.vmin, self.vmax * LOG_RANGE) if self.norm == "log" else self.vmin

    def unit(self, values) -> np.ndarray:
        """Values mapped to [0, 1] as the colours show them (the same mapping matplotlib's norm makes)."""
        x = np.asarray(values, dtype=np.float64)
        if self.norm == "log":
            low, high = np.log(self.low), np.log(max(self.vmax, self.low * (1 + 1e-9)))
            with np.errstate(divide="ignore", invalid="ignore"):
                out = (np.log(np.maximum(x, self.low)) - low) / max(high - low, 1e-12)
        else:
            out = (x - self.vmin) / max(self.vmax - self.vmin, 1e-12)
            if self.norm == "sqrt":
                out = np.sqrt(np.clip(out, 0.0, None))
        return np.clip(out, 0.0, 1.0)

    def mpl_norm(self):
        """The matplotlib Normalize equal to `unit` (for images and colorbars)."""
        from matplotlib import colors

        if self.norm == "log":
            return colors.LogNorm(self.low, max(self.vmax, self.low * (1 + 1e-9)), clip=True)
        if self.norm == "sqrt":
            return colors.PowerNorm(0.5, self.vmin, self.vmax, clip=True)
        return colors.Normalize(self.vmin, self.vmax, clip=True)

    def describe(self) -> str:
        """What the legend says: "√ scale, per head" and the like."""
        kind = {"linear": "linear scale", "sqrt": "√ scale", "log": "log scale"}[self.norm]
        return f"{kind}, {'one for every panel' if self.shared else 'each panel its own'}"


@dataclass(frozen=True)
class ScaleChoice:
    """What the user asked for: --scale shared|per-head, --norm linear|sqrt|log|auto, --vmax."""

    kind: str = "shared"
    norm: str = "auto"
    vmax: float | None = None

    def norm_for(self, n_tokens: int) -> str:
        if self.norm != "auto":
            return self.norm
        return "linear" if n_tokens <= AUTO_LINEAR_MAX_T else "log"


@dataclass(frozen=True)
class Panel:
    """One matrix as it will be drawn.

    matrix   (R, C) float32    what is drawn; rows are queries (attending), columns keys (attended to)
    rows     (R,) str          row labels;  cols (C,) str: column labels (display-safe)
    hidden   (R, C) bool|None  cells not drawn (a causal model's future keys)"""

    matrix: np.ndarray
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    hidden: np.ndarray | None
    scale: Scale
    title: tuple[str, ...]  # pieces joined into the title; the export draws the first piece once per layer
    name: str  # file stem: layer00_head02, layer05_mean
    short: str = ""  # the title inside a page of several panels: "layer 3"
    layer: int | None = None
    head: HeadChoice | None = None
    row_axis: str = "query (attending)"
    col_axis: str = "key (attended to)"
    footer: str = ""  # a line under the picture (the stats line of `compare`)
    values: bool = False  # write each cell's value in it
    cmap: str | None = None  # this panel's own colormap (e.g. diverging for Q·Kᵀ), else the page's
    row_split: int | None = None  # the first row (and column) of generated tokens: a line is drawn before it
    col_split: int | None = None

    @property
    def title_text(self) -> str:
        return "".join(self.title)

    @property
    def shown(self) -> np.ndarray:
        """The matrix with hidden cells masked, as matplotlib draws it. (R, C) masked array"""
        return np.ma.masked_where(self.hidden, self.matrix) if self.hidden is not None else self.matrix


@dataclass(frozen=True)
class Page:
    """Panels shown together (one figure, one screen), on one colour scale, under one title."""

    panels: tuple[Panel, ...]
    title: str
    name: str = "attnviz"  # default file stem
    notes: tuple[str, ...] = field(default_factory=tuple)
    subtitle: str = ""  # the input text, display-safe (shortened to fit by the renderer)

    @property
    def scale(self) -> Scale:
        return self.panels[0].scale


# --- names and titles ------------------------------------------------------------------------------


def short_model(name: str) -> str:
    """The last part of a model id or folder: "sentence-transformers/all-MiniLM-L6-v2" -> "all-MiniLM-L6-v2"."""
    return visible(name.rstrip("/").split("/")[-1] or name)


def head_label(head: HeadChoice, n_heads: int) -> str:
    if head == "mean":
        return f"mean of {n_heads} heads"
    if head == "max":
        return f"max over {n_heads} heads"
    return f"head {head}"


def head_filename(layer: int, head: HeadChoice, fmt: str = "") -> str:
    """layer03_head07, layer03_mean (with ".fmt" when fmt is given)."""
    stem = f"layer{layer:02d}_{head if isinstance(head, str) else f'head{head:02d}'}"
    return f"{stem}.{fmt}" if fmt else stem


def token_labels(capture: Capture, keep: np.ndarray | None = None) -> tuple[str, ...]:
    """The tokens as labels, control characters made visible."""
    tokens = capture.tokens if keep is None else [t for t, k in zip(capture.tokens, keep) if k]
    return tuple(visible(t) for t in tokens)


def key_labels(capture: Capture, keep: np.ndarray | None = None) -> tuple[str, ...]:
    """The key tokens as labels: the tokens themselves, or the source of cross-attention."""
    tokens = capture.key_tokens if keep is None else [t for t, k in zip(capture.key_tokens, keep) if k]
    return tuple(visible(t) for t in tokens)


def _keep(capture: Capture, hide_special: bool) -> np.ndarray:
    keep = capture.keep_mask(hide_special)
    if not keep.any() or not capture.key_keep_mask(hide_special).any():
        raise SelectionError("every token of this input is a special token, so --hide-special leaves nothing "
                             "to show; drop --hide-special", "--hide-special")
    return keep


PART_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention (target → source)"}


def generated_split(capture: Capture, positions: Sequence[int] | np.ndarray | None = None) -> int | None:
    """Where generated tokens begin among `positions` (token indices shown in order; default all): the index
    of the first generated one, or None when they are all prompt or all generated (no line to draw)."""
    if capture.generated is None:
        return None
    flags = capture.generated if positions is None else capture.generated[np.asarray(positions, dtype=np.intp)]
    if not flags.any() or flags.all():
        return None
    first = int(np.argmax(flags))
    return first if flags[first:].all() and not flags[:first].any() else None


def splits(capture: Capture, rows: Sequence[int] | np.ndarray | None = None,
           cols: Sequence[int] | np.ndarray | None = None) -> dict[str, int | None]:
    """Panel fields marking where the prompt ends, for the rows and columns shown."""
    return {"row_split": generated_split(capture, rows),
            "col_split": generated_split(capture, cols) if capture.square else None}


# --- attention panels ------------------------------------------------------------------------------


def attention_panels(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], *,
                     hide_special: bool = False, vmax: float | None = None,
                     scale: ScaleChoice | None = None) -> list[Panel]:
    """One panel per (layer, head), layer-major, on the chosen scale (default: one shared linear-or-√ scale
    from 0 to the largest weight shown, or to vmax). Heads may be indices, "mean" or "max"."""
    keep = _keep(capture, hide_special)
    key_keep = capture.key_keep_mask(hide_special)
    labels, cols = token_labels(capture, keep), key_labels(capture, key_keep)
    everything = bool(keep.all() and key_keep.all())
    future = capture.future_mask
    hidden = None if future is None else (future if everything else future[np.ix_(keep, keep)])
    model = short_model(capture.model)
    extra: tuple[str, ...] = (f" · {PART_TITLES[capture.part]}",) if capture.part else ()
    extra += (" · special tokens hidden",) if hide_special else ()
    shown = None if everything else np.flatnonzero(keep)
    axes: dict[str, Any] = dict(splits(capture, shown, None if everything else np.flatnonzero(key_keep)))
    if capture.part == "cross":
        axes |= {"row_axis": "target token (query)", "col_axis": "source token (key)"}
    if capture.quantity == "norm":
        extra += (" · ‖α·f(x)‖",)
    if capture.long is not None and capture.long.block > 1:
        extra += (f" · mean over {capture.long.block}×{capture.long.block}-token blocks",)
        axes = {"row_axis": "query block (token positions)", "col_axis": "key block (token positions)"}
    if capture.generated is not None and capture.generated.any():
        axes |= {"row_axis": "query (attending) · generated below the line",
                 "col_axis": "key (attended to) · generated right of the line"}
    panels = []
    for layer in layers:
        layer = capture.layer_index(layer)
        for head in heads:
            alpha = capture.head_matrix(layer, head)  # (T, S)
            if not everything:
                alpha = alpha[np.ix_(keep, key_keep)]  # (T', S')
            if not isinstance(head, str):
                head = capture.head_index(head)
            label = head_label(head, capture.n_heads)
            layer_hidden, note = hidden, capture.window_note(layer)
            if note:  # this layer's sliding window, drawn like the causal mask
                masked = capture.masked(layer)
                layer_hidden = masked if everything or masked is None else masked[np.ix_(keep, keep)]
            panels.append(Panel(matrix=alpha, rows=labels, cols=cols, hidden=layer_hidden,
                                scale=quantity_scale(capture),
                                title=(f"{model} · layer {layer} · ", label, *extra,
                                       *((f" · {note}",) if note else ())),
                                name=head_filename(layer, head), short=f"layer {layer}", layer=layer, head=head,
                                **axes))
    choice = scale or ScaleChoice()
    return apply_scale(panels, replace(choice, vmax=vmax) if vmax is not None else choice)


def window_panels(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], rows: Sequence[int] | None,
                  cols: Sequence[int] | None, *, scale: ScaleChoice | None = None) -> list[Panel]:
    """Exact α for query rows × key columns (a window into a long input): sliced from a full capture, or the
    window a streamed run computed. One panel per layer and head."""
    from attnviz.errors import SelectionError

    long = capture.long
    if long is None:
        rows = list(range(capture.n_tokens)) if rows is None else list(rows)
        cols = list(range(capture.n_keys)) if cols is None else list(cols)
        tokens, keys, future = capture.tokens, capture.key_tokens, capture.future_mask
        source = {layer: capture.attentions[layer][:, rows][:, :, cols] for layer in layers}  # (H, r, c)
    else:
        if long.window is None or long.window_rows is None or long.window_cols is None:
            raise SelectionError("this capture is pooled (a long input): an exact window needs the text run again, "
                                 "e.g. attnviz heatmap TEXT --rows 4000:4100", "--rows")
        rows, cols = [int(i) for i in long.window_rows], [int(j) for j in long.window_cols]
        tokens = keys = long.tokens
        future = np.triu(np.ones((long.n_tokens, long.n_tokens), bool), 1) if capture.causal else None
        missing = [layer for layer in layers if layer not in long.window_layers]
        if missing:
            raise SelectionError(f"layer {missing[0]} was not streamed into the window", "--layer")
        source = {layer: long.window[long.window_layers.index(layer)] for layer in layers}
    hidden = None if future is None else future[np.ix_(rows, cols)]
    row_labels = tuple(f"{i} {visible(tokens[i])}" for i in rows)
    col_labels = tuple(f"{j} {visible(keys[j])}" for j in cols)
    model = short_model(capture.model)
    where = f" · queries {_span(rows)}, keys {_span(cols)}"
    marks = splits(capture, rows, cols) if long is None else {"row_split": None, "col_split": None}
    row_split, col_split = marks["row_split"], marks["col_split"]
    panels = []
    for layer in layers:
        per_head = np.asarray(source[layer], np.float32)  # (H, r, c)
        for head in heads:
            matrix = (per_head.mean(0) if head == "mean" else per_head.max(0) if head == "max"
                      else per_head[int(head)])
            label = head_label(head, per_head.shape[0])
            panels.append(Panel(matrix=matrix, rows=row_labels, cols=col_labels, hidden=hidden, scale=Scale(),
                                title=(f"{model} · layer {layer} · ", label, where),
                                name=f"{head_filename(layer, head)}_window", short=f"layer {layer}", layer=layer,
                                head=head, row_split=row_split, col_split=col_split))
    return apply_scale(panels, scale)


def _span(positions: Sequence[int]) -> str:
    """"4–9" for a run of positions, "4–9 (3 of them)" when some are left out."""
    first, last = min(positions), max(positions)
    whole = len(positions) == last - first + 1
    return f"{first}–{last}" if whole else f"{first}–{last} ({len(positions)} of them)"


def quantity_scale(capture: Capture) -> Scale:
    """The scale's label for what a capture holds: α, or value-weighted norms."""
    if capture.quantity == "norm":
        return Scale(label="‖α·f(x)‖, value-weighted norm")
    return Scale()


def with_shared_scale(panels: Sequence[Panel], vmax: float | None = None, vmin: float = 0.0,
                      norm: str | None = None) -> list[Panel]:
    """The panels on one colour scale: vmin to vmax (default: the largest value drawn)."""
    if vmax is None:
        vmax = max((float(p.matrix.max()) for p in panels if p.matrix.size), default=1.0)
    vmax = max(vmax, vmin + 1e-9)
    return [replace(p, scale=replace(p.scale, vmin=vmin, vmax=vmax, norm=norm or p.scale.norm, shared=True))
            for p in panels]


def apply_scale(panels: Sequence[Panel], choice: ScaleChoice | None) -> list[Panel]:
    """Panels on the scale the user chose: one shared scale (to --vmax, or the largest weight shown), or
    each panel its own (0 to its largest weight); the norm, for --norm auto, from the number of tokens."""
    if not panels:
        return []
    choice = choice or ScaleChoice()
    norm = choice.norm_for(max(panels[0].matrix.shape))
    if choice.kind == "per-head":
        return [replace(p, scale=replace(p.scale, vmin=0.0, norm=norm, shared=False,
                                         vmax=max(choice.vmax or float(p.matrix.max()) if p.matrix.size else 1.0,
                                                  1e-9)))
                for p in panels]
    return with_shared_scale(panels, choice.vmax, norm=norm)


def heatmap_page(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice], *,
                 hide_special: bool = False, vmax: float | None = None, all_layers: bool = False,
                 scale: ScaleChoice | None = None) -> Page:
    """What `attnviz heatmap` draws: a panel per selected layer and head, on the chosen colour scale."""
    panels = attention_panels(capture, layers, heads, hide_special=hide_special, vmax=vmax, scale=scale)
    model = short_model(capture.model)
    if len(panels) == 1:
        title = panels[0].title_text
    else:
        same_head = len({p.head for p in panels}) == 1
        if not same_head:
            panels = [replace(p, short=f"layer {p.layer} · {p.title[1]}") for p in panels]
        title = f"{model} · " + (panels[0].title[1] if same_head else "heads side by side")
        title += " · special tokens hidden" if hide_special else ""
    layer_part = "all" if all_layers else "-".join(str(p) for p in dict.fromkeys(p.layer for p in panels))
    head_part = "-".join(str(h) if isinstance(h, str) else f"head{h}" for h in dict.fromkeys(p.head for p in panels))
    name = f"attnviz_{'all' if all_layers else 'layer' + layer_part}_{head_part}"
    return Page(panels=tuple(panels), title=title, name=name, subtitle=text_subtitle(capture))


# --- other pictures ------------------------------------------------------------------------------


def rollout_panel(capture: Capture, matrix: np.ndarray) -> Panel:
    """Attention rollout (T, T) over the input tokens."""
    labels = token_labels(capture)
    vmax = float(matrix.max()) if matrix.size else 1.0
    return Panel(matrix=np.asarray(matrix, np.float32), rows=labels, cols=labels, hidden=capture.future_mask,
                 scale=Scale(0.0, max(vmax, 1e-9), "rolled-out attention"),
                 title=(f"{short_model(capture.model)} · attention rollout (Abnar & Zuidema 2020)",),
                 name="attnviz_rollout", row_axis="position at the top layer", col_axis="input token",
                 row_split=generated_split(capture), col_split=generated_split(capture))


def entropy_panel(values: np.ndarray, uniform: float, model: str, *, normalised: bool = False,
                  title: str = "mean attention entropy per head", layers: Sequence[int] | None = None) -> Panel:
    """Layers × heads of mean entropy, each value written in its cell, on [0, uniform]."""
    unit = "normalised entropy (1 is uniform)" if normalised else f"entropy, nats (ln T = {uniform:.2f} is uniform)"
    return head_grid_panel(values, Scale(0.0, uniform, unit), f"{short_model(model)} · {title}", "attnviz_entropy",
                           layers=layers)


def head_grid_panel(values: np.ndarray, scale: Scale, title: str, name: str, short: str = "",
                    layers: Sequence[int] | None = None) -> Panel:
    """One number per layer and head as a layers × heads heatmap with the value in each cell; `values` holds
    the rows of `layers` (default 0..L-1)."""
    L, H = values.shape
    names = range(L) if layers is None else layers
    return Panel(matrix=np.asarray(values, np.float32), rows=tuple(str(n) for n in names),
                 cols=tuple(str(n) for n in range(H)), hidden=None, scale=scale, title=(title,), name=name,
                 short=short, row_axis="layer", col_axis="head", values=True)


def label_share_page(counts: np.ndarray, labels: Sequence[str], title: str, subtitle: str = "") -> Page:
    """For each pattern label, the share of texts in which each head got it: one layers × heads panel per
    label, on one scale from 0 to 1. counts (L, H, len(labels))"""
    total = np.maximum(counts.sum(axis=-1, keepdims=True), 1)
    share = counts / total
    scale = Scale(0.0, 1.0, "share of texts")
    panels = tuple(head_grid_panel(share[..., n], scale, title, f"labels_{label}", short=label)
                   for n, label in enumerate(labels))
    return Page(panels=panels, title=title, name="labels", subtitle=subtitle)


def grid_title(capture: Capture, panels: Sequence[Panel]) -> str:
    scale = panels[0].scale if panels else Scale()
    shared = all(p.scale == scale for p in panels)
    which = f"one colour scale (0–{scale.vmax:.2f}, {scale.describe().split(',')[0]})" if shared else \
        f"each head its own scale ({scale.describe().split(',')[0]})"
    return f"{short_model(capture.model)} · every head · T = {capture.input_tokens} · {which}"


def text_subtitle(capture: Capture, limit: int = 400) -> str:
    """The input text as one display-safe line in quotes (a renderer shortens it to its width)."""
    half = max(limit // 2, 20)
    if capture.part is not None:  # an encoder-decoder model: the source, and the target read or written
        source, target = str(capture.meta.get("source_text", "")), str(capture.meta.get("target_text", ""))
        how = "generated " if capture.meta.get("target_source") == "generated" else ""
        return f"“{visible(shorten(source, half))}” → {how}“{visible(shorten(target, half))}”"
    prompt, written = capture.meta.get("prompt"), capture.meta.get("generated_text")
    if capture.generated is not None and isinstance(prompt, str) and isinstance(written, str):
        return f"“{visible(shorten(prompt, half))}” → generated “{visible(shorten(written, half))}”"
    text = str(capture.meta.get("text") or " ".join(capture.tokens))
    dropped = capture.meta.get("dropped_tokens")
    cut = (f"cut to the model's {capture.input_tokens} tokens, the last {dropped} dropped: "
           if isinstance(dropped, int) and dropped > 0 else "")
    return cut + "“" + visible(shorten(text, limit)) + "”"


# --- what removing heads changed (attnviz ablate) ------------------------------------------------------


DELTA_PANELS = 12  # later layers drawn at most (the most changed, shown in layer order)


def delta_layers(delta: np.ndarray, after: int) -> list[dict]:
    """Per layer above `after`: the largest and the mean |Δα| and the head that changed most. delta (L, H, T, T)"""
    rows = []
    for layer in range(after + 1, delta.shape[0]):
        per_head = np.abs(delta[layer]).max(axis=(-2, -1))  # (H,)
        rows.append({"layer": layer, "max_abs_delta": float(per_head.max()),
                     "mean_abs_delta": float(np.abs(delta[layer]).mean()), "most_changed_head": int(per_head.argmax())})
    return rows


def delta_page(delta: np.ndarray, tokens: Sequence[str], causal: bool, *, after: int, title: str,
               subtitle: str = "") -> Page | None:
    """Δα = α with the heads removed − α of the clean model, for the most changed head of each later layer (at
    most DELTA_PANELS layers, the most changed), on one colour scale centred on 0. None when no layer follows."""
    layers = delta_layers(delta, after)
    if not layers:
        return None
    chosen = sorted(sorted(layers, key=lambda r: -r["max_abs_delta"])[:DELTA_PANELS], key=lambda r: r["layer"])
    top = max(max(r["max_abs_delta"] for r in chosen), 1e-9)
    scale = Scale(-top, top, "Δα (heads removed − clean)")
    labels = tuple(visible(t) for t in tokens)
    T = len(labels)
    hidden = np.triu(np.ones((T, T), bool), 1) if causal else None
    panels = tuple(Panel(matrix=delta[r["layer"], r["most_changed_head"]].astype(np.float32), rows=labels, cols=labels,
                         hidden=hidden, scale=scale, title=(title,), name="ablation",
                         short=f"layer {r['layer']} · head {r['most_changed_head']}: max |Δα| {r['max_abs_delta']:.2f}",
                         layer=r["layer"], head=r["most_changed_head"], cmap="RdBu_r", values=T <= 12)
                   for r in chosen)
    notes = (f"each later layer's most changed head; one colour scale, centred on 0 (±{top:.2f})"
             + ("" if len(chosen) == len(layers) else
                f"; the {len(chosen)} most changed of {len(layers)} later layers"),)
    return Page(panels=panels, title=title, name="attnviz_ablation", notes=notes, subtitle=subtitle)


# --- one head step by step (attnviz steps) ------------------------------------------------------------


def _signed(matrix: np.ndarray, label: str) -> Scale:
    """A colour scale centred on 0, for values of either sign (Q, K, V, Q·Kᵀ)."""
    m = float(np.abs(matrix[np.isfinite(matrix)]).max()) if np.isfinite(matrix).any() else 1.0
    return Scale(-max(m, 1e-9), max(m, 1e-9), label, shared=False)


def steps_page(steps, capture_tokens: Sequence[str], model: str, text: str = "") -> Page:
    """The computation of one head as six panels: Q, K, Q·Kᵀ, Q·Kᵀ/√d_k (masked keys blank), α, α·V.
    `steps` is a scratch.Steps (numpy arrays)."""
    labels = tuple(visible(t) for t in capture_tokens)
    T = len(labels)
    dims = lambda n: tuple(str(i) if i % 8 == 0 else "" for i in range(n))
    hidden = ~steps.allowed if not steps.allowed.all() else None
    small = T <= 12
    base: dict[str, Any] = dict(rows=labels, layer=steps.layer, head=steps.head, name="steps")
    panels = [
        Panel(matrix=steps.q.astype(np.float32), cols=dims(steps.q.shape[1]), hidden=None,
              scale=_signed(steps.q, "value"), title=("Q = X·W_Q (+ b)",), short=f"Q  ({T} × d_k = {steps.d_k})",
              cmap="RdBu_r", row_axis="token", col_axis="dimension", **base),
        Panel(matrix=steps.k.astype(np.float32), cols=dims(steps.k.shape[1]), hidden=None,
              scale=_signed(steps.k, "value"), title=("K = X·W_K (+ b)",), short=f"K  ({T} × d_k = {steps.d_k})",
              cmap="RdBu_r", row_axis="token", col_axis="dimension", **base),
        Panel(matrix=steps.scores.astype(np.float32), cols=labels, hidden=None, scale=_signed(steps.scores, "score"),
              title=("Q·Kᵀ",), short="scores Q·Kᵀ", cmap="RdBu_r", values=small, **base),
        Panel(matrix=steps.scaled.astype(np.float32), cols=labels, hidden=hidden,
              scale=_signed(np.where(steps.allowed, steps.scaled, 0.0), "score"), title=("Q·Kᵀ / √d_k",),
              short=steps.scaling_text + ("  (masked keys: −∞)" if hidden is not None else ""),
              cmap="RdBu_r", values=small, **base),
        Panel(matrix=steps.alpha.astype(np.float32), cols=labels, hidden=hidden,
              scale=Scale(0.0, 1.0, "attention weight α", shared=False), title=("softmax → α",),
              short="softmax of each row → α", values=small, **base),
        Panel(matrix=steps.out.astype(np.float32), cols=dims(steps.out.shape[1]), hidden=None,
              scale=_signed(steps.out, "value"), title=("α·V",), short=f"α·V  ({T} × d_v = {steps.out.shape[1]})",
              cmap="RdBu_r", row_axis="token", col_axis="dimension", **base),
    ]
    title = (f"{short_model(model)} · layer {steps.layer} · head {steps.head}: "
             f"α = softmax(Q·Kᵀ/√d_k), out = α·V")
    note = (f"d_k = {steps.d_k}, scores {steps.scaling_text}"
            + ("" if steps.sink is None else
               f", sink logit {steps.sink:.2f} (rows keep {steps.alpha.sum(-1).mean():.2f} of their weight)")
            + f" · this α equals the model's own: max |Δ| = {steps.max_diff:.1e}")
    return Page(panels=tuple(panels), title=title, name=f"attnviz_steps_layer{steps.layer}_head{steps.head}",
                notes=(note,), subtitle=("“" + visible(shorten(text, 400)) + "”") if text else "")


def positions_page(result, model: str, layer: int, text: str = "") -> Page:
    """Both experiments for one layer (mean over heads): α of the text, α of the shuffled text put back in
    the original order, and their difference; without position embeddings, then with them.
    `result` is a scratch.PositionsResult."""
    labels = tuple(visible(t) for t in result.tokens)
    panels = []
    for name, alpha, back in (("without positions", result.alpha_without, result.back_without),
                              ("with positions", result.alpha_with, result.back_with)):
        a, b = alpha[layer].mean(axis=0), back[layer].mean(axis=0)  # (T, T)
        top = max(float(a.max()), float(b.max()), 1e-9)
        diff = np.abs(a - b)
        common: dict[str, Any] = dict(rows=labels, cols=labels, hidden=None, name="positions", layer=layer)
        panels += [
            Panel(matrix=a, scale=Scale(0.0, top), title=(name,), short=f"{name}: α of the text", **common),
            Panel(matrix=b, scale=Scale(0.0, top), title=(name,), short=f"{name}: α of the shuffled text, "
                                                                        f"re-ordered", **common),
            Panel(matrix=diff.astype(np.float32), scale=Scale(0.0, max(top, 1e-9), "|difference|", shared=False),
                  title=(name,), short=f"|difference|: max {diff.max():.1e}", cmap="magma", **common),
        ]
    if result.similarity is not None:
        n = len(result.similarity)
        positions = tuple(str(i) for i in range(n))
        panels.append(Panel(matrix=result.similarity.astype(np.float32), rows=positions, cols=positions, hidden=None,
                            scale=Scale(-1.0, 1.0, "cosine similarity", shared=False),
                            title=("position embeddings",), short=f"the position embeddings themselves: cosine "
                                                                 f"similarity of positions 0–{n - 1}",
                            name="positions", cmap="RdBu_r", row_axis="position i", col_axis="position j"))
    title = (f"{short_model(model)} · layer {layer} (mean of heads): without positions, self-attention sees a set")
    note = (f"shuffled: {' '.join(visible(w) for w in result.shuffled)} · max |Δα| over all layers: "
            f"{result.diff_without.max():.1e} without positions, {result.diff_with.max():.2f} with them")
    return Page(panels=tuple(panels), title=title, name=f"attnviz_positions_layer{layer}", notes=(note,),
                subtitle=("“" + visible(shorten(text, 400)) + "”") if text else "")


# --- one token in every layer and head (attnviz token) ----------------------------------------------------


STRIPE_SHARE = 0.5  # a head is a stripe for key j when the other queries give j at least half this weight


def token_links(capture: Capture, i: int, top: int = 5) -> list[dict]:
    """The heads in which query `i` singles out one other, non-special token j: ranked by how much more
    weight i puts on j than the other queries of that head do on average ("lift" = α_ij − mean_q α_qj, over
    the other non-special queries that can see j). A head where every query looks at j (a vertical stripe)
    has a small lift however large α_ij is; `typical` gives that mean and `stripe` says so. (The key with the
    largest α_ij alone would name such stripes first.)"""
    alpha = capture.attentions.astype(np.float64)  # (L, H, T, T)
    T = capture.n_tokens
    keys = ~capture.special.copy()
    keys[i] = False
    queries = ~capture.special.copy()
    queries[i] = False
    if not keys.any():
        return []
    sees = np.ones((T, T), bool) if not capture.causal else np.tril(np.ones((T, T), bool))  # (query, key)
    others = queries[:, None] & sees  # which other queries count for each key (T, T)
    counts = others.sum(axis=0)  # (T,)
    column = np.einsum("lhqk,qk->lhk", alpha, others.astype(np.float64))
    typical = np.where(counts > 0, column / np.maximum(counts, 1), 0.0)  # (L, H, T)
    weight = alpha[:, :, i, :]  # (L, H, T)
    lift = np.where(keys, weight - typical, -np.inf)
    links: list[dict] = []
    for index in np.argsort(-lift.reshape(-1), kind="stable"):
        layer, head, key = (int(v) for v in np.unravel_index(index, lift.shape))
        if not np.isfinite(lift[layer, head, key]) or lift[layer, head, key] <= 0:
            break
        if any((link["layer"], link["head"]) == (layer, head) for link in links):
            continue
        w, t = float(weight[layer, head, key]), float(typical[layer, head, key])
        links.append({"layer": layer, "head": head, "key": key, "token": capture.tokens[key], "weight": w,
                      "typical": t, "lift": w - t, "stripe": bool(t >= STRIPE_SHARE * w)})
        if len(links) == top:
            break
    return links


def generation_steps(capture: Capture, layer: int, head: HeadChoice = "mean", top: int = 3) -> list[dict]:
    """For each generated token, the earlier tokens its row of α (in `layer`, the head mean or one head)
    weighs most, largest first, and the weight on itself: what it attends to as it is read back in to
    choose the next token."""
    matrix = capture.head_matrix(capture.layer_index(layer), head).astype(np.float64)  # (T, T) or (T, S)
    keys = capture.key_tokens
    steps = []
    for t in capture.named_positions()["generated"]:
        earlier = matrix[t, :t] if capture.square else matrix[t]  # cross-attention: every source token
        order = np.argsort(-earlier, kind="stable")[:top]
        steps.append({"position": t, "token": capture.tokens[t],
                      "self": float(matrix[t, t]) if capture.square else None,
                      "top": [{"position": int(j), "token": keys[j], "weight": float(earlier[j])} for j in order]})
    return steps


def token_page(capture: Capture, i: int, layers: Sequence[int], scale: ScaleChoice | None = None) -> Page:
    """For each chosen layer, two panels of heads × tokens: the token's own row of α (what it attends to)
    and its column (who attends to it)."""
    labels = token_labels(capture)
    name = labels[i]
    heads = tuple(f"head {h}" for h in range(capture.n_heads))
    future = capture.future_mask
    panels = []
    for layer in layers:
        row = capture.attentions[layer, :, i, :]  # (H, T)
        column = capture.attentions[layer, :, :, i]  # (H, T)
        hidden_row = None if future is None else np.broadcast_to(future[i], row.shape)
        hidden_column = None if future is None else np.broadcast_to(future[:, i], column.shape)
        common: dict[str, Any] = dict(rows=heads, cols=labels, scale=Scale(), layer=layer, row_axis="head",
                                      name="token", col_split=generated_split(capture))
        panels.append(Panel(matrix=row, hidden=hidden_row, title=(f"layer {layer}",),
                            short=f"layer {layer}: what {name!r} attends to", col_axis="key (attended to)", **common))
        panels.append(Panel(matrix=column, hidden=hidden_column, title=(f"layer {layer}",),
                            short=f"layer {layer}: who attends to {name!r}", col_axis="query (attending)", **common))
    panels = apply_scale(panels, scale)
    title = f"{short_model(capture.model)} · token {i} {name!r} in every layer and head"
    return Page(panels=tuple(panels), title=title, name=f"attnviz_token{i}", subtitle=text_subtitle(capture),
                notes=(panels[0].scale.describe(),))


def coarsen(panel: Panel, k: int) -> Panel:
    """A panel pooled further by k × k cells (rows averaged, columns summed, so a row of attention still
    sums to 1), labelled by each group's first cell: for a terminal narrower than a pooled picture."""
    if k <= 1:
        return panel
    from attnviz.blocks import every, pool_blocks, sum_blocks

    R, C = panel.matrix.shape
    row_edges, col_edges = every(R, k), every(C, k)
    row_groups, col_groups = row_edges[:-1], col_edges[:-1]
    hidden = None
    if panel.hidden is not None:
        visible_cells = sum_blocks(sum_blocks((~panel.hidden).astype(np.int64), col_edges, 1), row_edges, 0)
        hidden = visible_cells == 0
    title = (*panel.title, f" · pooled again ×{k} to fit")
    def split(at: int | None) -> int | None:  # kept where it falls between two groups
        return at // k if at is not None and at % k == 0 else None

    return replace(panel, matrix=pool_blocks(panel.matrix, row_edges, col_edges),
                   rows=tuple(panel.rows[i] for i in row_groups), cols=tuple(panel.cols[j] for j in col_groups),
                   hidden=hidden, title=title,
                   row_split=split(panel.row_split), col_split=split(panel.col_split))
