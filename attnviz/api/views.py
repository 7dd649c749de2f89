"""The views of α itself: heatmap (a layer and head as a heatmap), token (one token through every layer and
head), compare (layers, or two models, side by side) and view (the interactive page). Each takes a text, a
picture, a sound or a saved capture, as attnviz.capture does, and returns a result that owns its output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, overload, TYPE_CHECKING

import numpy as np


from attnviz.api.capturing import Keep, attention_of, one_attention
from attnviz.api.result import Result
from attnviz.base.arguments import checked
from attnviz.base.selection import Selection, find_token, selection
from attnviz.base.text import visible
from attnviz.data.capture import Capture
from attnviz.data.parts import heard, Parts
from attnviz.errors import CaptureMismatchError, InputError, SelectionError, UsageError, arg
from attnviz.panels.attention import SELECTED, with_selection
from attnviz.panels.names import kept_tokens
from attnviz.panels.one_token import group_name, group_rows
from attnviz.panels import (Page, Panel, ScaleChoice, apply_scale, attention_panels, coarsen, heatmap_page,
                            image_page, pool_columns, short_model, text_subtitle, token_links, token_page,
                            window_page)

if TYPE_CHECKING:
    import os
    from pathlib import Path

__all__ = ["heatmap", "Heatmap", "token", "TokenAttention", "compare", "Comparison", "view", "View",
           "scale_choice"]

SCALES = ("shared", "per-head")
NORMS = ("auto", "linear", "sqrt", "log")


def scale_choice(scale: str = "shared", norm: str = "auto", vmax: float | None = None) -> ScaleChoice:
    """How weights map to colours: one scale for every panel or each its own, the mapping, the top."""
    if scale not in SCALES:
        raise UsageError(f"{arg('scale')} is one of {', '.join(SCALES)}, not {visible(str(scale))[:20]!r}", "scale")
    if norm not in NORMS:
        raise UsageError(f"{arg('norm')} is one of {', '.join(NORMS)}, not {visible(str(norm))[:20]!r}", "norm")
    if vmax is not None and not vmax > 0:
        raise UsageError(f"{arg('vmax')} must be above 0", "vmax")
    return ScaleChoice(kind=scale, norm=norm, vmax=vmax)


# --- heatmap ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heatmap(Result):
    """α of the chosen layers and heads as drawn: `page` its panels (one per layer and head), over a picture's
    grid, under a sound's spectrogram, or an exact window of rows and columns."""

    command: ClassVar[str] = "heatmap"
    capture: Capture
    page: Page
    over_time: bool  # a sound: each row over time, under its spectrogram
    window: bool  # an exact window of rows and columns
    selection: tuple[int, ...] = ()  # tokens selected (--tokens): positions in the capture
    local: tuple[int, ...] = ()  # the same tokens' rows in each panel of `alpha` (with special tokens hidden)
    alpha: Page | None = None  # with a selection: the panels without its row and column (`page` draws both)

    @property
    def figure_name(self) -> str:
        return f"{self.page.name}.png"

    def to_dict(self) -> dict:
        """What `attnviz heatmap --json` prints: each panel's matrix as drawn, with its rows and columns."""
        c = self.capture
        data = {"model": c.model, **heard(c.meta), "part": c.part, "tokens": list(c.tokens),
                "key_tokens": list(c.key_tokens),
                "title": self.page.title,
                "panels": [{"layer": p.layer, "head": p.head, "title": p.title_text, "rows": list(p.rows),
                            "cols": list(p.cols), "alpha": p.matrix} for p in (self.alpha or self.page).panels]}
        if self.selection:  # each panel's selected rows and columns, summed and averaged
            data["selection"] = {"tokens": list(self.selection), "texts": [c.tokens[i] for i in self.selection]}
            local = list(self.local)
            for record, p in zip(data["panels"], (self.alpha or self.page).panels):
                rows, cols = p.matrix[local], p.matrix[:, local]
                record["selection"] = {"rows_sum": rows.sum(0), "rows_mean": rows.mean(0),
                                       "cols_sum": cols.sum(1), "cols_mean": cols.mean(1)}
        return data

    def report(self, *, width: int = 100, color: bool = False, cmap: str = "viridis", start: int = 0,
               **style: Any) -> list:
        """Each panel in the terminal; a long or pooled input, or a sound, pooled again to the terminal's width."""
        from rich.text import Text

        from attnviz.render.terminal import panel_renderable

        shown: list = []
        for panel in self.page.panels:
            if (self.capture.pooled or self.over_time) and not self.window:
                fits = max((width - 18) // 2, 8)
                k = -(-panel.matrix.shape[1] // fits)
                panel = pool_columns(panel, k) if self.over_time else coarsen(panel, k)
            shown.append(panel_renderable(panel, width=width, color=color, cmap=cmap, start=start))
        return shown + [Text(note, style="cyan") for note in self.page.notes if self.selection]

    def figure(self, *, cmap: str = "viridis", ax=None):
        """The page as a matplotlib figure (a sound's: under its spectrogram, in seconds)."""
        if self.over_time:
            from attnviz.render.sound import sound_figure

            return sound_figure(self.page, cmap=cmap, ax=ax)
        from attnviz.render.png import page_figure

        return page_figure(self.page, cmap=cmap, ax=ax)

    def _repr_png_(self) -> bytes:
        return self.figure()._repr_png_()


@checked
def heatmap(source: Any, *, layer: Any = -1, head: Any = "mean", rows: Any = None, cols: Any = None,
            cell: tuple[int, int] | None = None, hide_special: bool = False, values: bool = False,
            scale: str = "shared", norm: str = "auto", vmax: float | None = None, part: str | None = None,
            tokens: Any = None, **capture_options: Any) -> Heatmap:
    """α of `layer` (an index, a list, a range "0-2" or "all") and `head` (also "mean" or "max") of `source` (a
    text, picture, sound or saved capture; `capture_options` as attnviz.capture takes them), as drawn by
    `attnviz heatmap`. `rows`, `cols`: an exact window of query rows and key columns (a long input's window is
    kept exactly while the rest is streamed). `cell` (row, col): a picture's cell whose row of α to draw
    instead of [CLS]'s. `tokens` (as `token` takes them: "2,3", "2-4", "cat,sat", [2, 3]): tokens selected —
    marked, and each panel drawn with one more row, the mean of their rows, and one more column, the sum of
    their columns (to_dict: both summed and averaged)."""
    layers_sel = selection(layer, "layer", field="layer")
    specs = None if tokens is None else _token_specs(tokens)
    heads_sel = selection(head, "head", keywords=("mean", "max"), field="head")
    rows_sel = None if rows is None else selection(rows, "row", keywords=("generated", "prompt"), field="rows")
    cols_sel = None if cols is None else selection(cols, "col", keywords=("generated", "prompt"), field="cols")
    choice = scale_choice(scale, norm, vmax)
    window = rows_sel is not None or cols_sel is not None
    if specs is not None and (window or cell is not None):  # decided before the model runs
        raise SelectionError(f"{arg('tokens')} selects rows and columns of a text's whole α, not of a window "
                             f"({arg('rows')}, {arg('cols')}) or a picture's {arg('cell')}", "tokens")
    if window:
        keep = capture_options.pop("keep", None) or Keep()
        capture_options["keep"] = replace(keep, rows=rows_sel, cols=cols_sel, layers=layers_sel)
    capture = one_attention(source, part=part, **capture_options)
    layers = layers_sel.indices(capture.n_layers)
    heads = heads_sel.resolve(capture.n_heads)
    over_time = capture.mel is not None and capture.part != "decoder" and not window
    if cell is not None and (over_time or capture.grid is None or window):
        raise UsageError(f"{arg('cell')} is for the capture of a picture", "cell")
    if over_time:
        from attnviz.panels.sound import sound_page

        page = sound_page(capture, layers, heads)
    elif capture.grid is not None and not window:
        page = image_page(capture, layers, heads, cell)
    elif window:
        T, S = capture.n_tokens, capture.n_keys
        page = window_page(capture, layers, heads,
                           rows_sel.indices(T, capture.named_positions()) if rows_sel and not capture.pooled else None,
                           cols_sel.indices(S, capture.named_key_positions()) if cols_sel and not capture.pooled
                           else None, scale=choice)
    else:
        page = heatmap_page(capture, layers, heads, hide_special=hide_special,
                            all_layers=len(layers) == capture.n_layers and len(layers) > 1, scale=choice)
    if values:
        page = replace(page, panels=tuple(replace(p, values=True) for p in page.panels))
    if specs is None:
        return Heatmap(capture, page, over_time, window)
    drawn = "a sound" if over_time else "a picture" if capture.grid is not None else "text"
    group, local = _selected(capture, specs, hide_special, drawn)
    name = group_name([visible(t) for t in capture.tokens], group)
    alpha, page = page, with_selection(page, local, SELECTED)
    note = (f"{SELECTED} selected: {name}; below the line the mean of their rows (what they attend to), right of "
            f"it the sum of their columns (each query's share of attention on them)")
    return Heatmap(capture, replace(page, notes=(*page.notes, note)), over_time, window, group, local, alpha)


def _selected(capture: Capture, specs: Sequence[str], hide_special: bool, drawn: str
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The positions `specs` name (heatmap --tokens), and their rows in the panels drawn (`drawn`: "text" for a
    text's whole α, else what is drawn instead)."""
    if not capture.square:
        raise SelectionError(f"{arg('tokens')} selects tokens of self-attention; cross-attention's rows and columns "
                             f"are different texts ({arg('part')} encoder or decoder)", "tokens")
    if capture.pooled or drawn != "text":
        what = "a long input streamed and pooled" if capture.pooled else drawn
        raise SelectionError(f"{arg('tokens')} selects rows and columns of a text's whole α, not of {what}",
                             "tokens")
    group = _token_group(capture.tokens, specs)
    shown = np.flatnonzero(kept_tokens(capture, hide_special))
    where = {int(i): n for n, i in enumerate(shown)}
    hidden = [i for i in group if i not in where]
    if hidden:
        raise SelectionError(f"{arg('tokens')} selects token {hidden[0]} ({visible(capture.tokens[hidden[0]])!r}), "
                             f"a special token that {arg('hide_special')} leaves out", "tokens")
    return group, tuple(where[i] for i in group)


# --- token --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenAttention(Result):
    """One token in every layer and head: what it attends to (its row of α) and which tokens attend to it (its
    column); `links` the heads in which it singles out another token. Of several tokens (`group`): their rows
    and their columns summed, and averaged (`to_dict`)."""

    command: ClassVar[str] = "token"
    capture: Capture
    token: int
    layers: tuple[int, ...]
    links: tuple[dict, ...]
    scale: ScaleChoice | None = None
    group: tuple[int, ...] = ()  # several tokens at once (attnviz token --tokens): their rows and columns summed

    @property
    def figure_name(self) -> str:
        return f"{self.page().name}.png"

    @property
    def chosen(self) -> tuple[int, ...]:
        return self.group or (self.token,)

    def to_dict(self) -> dict:
        """What `attnviz token --json` prints."""
        c, i, layers = self.capture, self.token, list(self.layers)
        if not self.group:
            return {"model": c.model, "tokens": list(c.tokens), "token": i, "layers": layers,
                    "attends_to": c.attentions[layers, :, i, :], "attended_by": c.attentions[layers, :, :, i],
                    "strongest_links": list(self.links)}
        rows, columns = group_rows(c, layers, self.group)
        n = len(self.group)
        return {"model": c.model, "tokens": list(c.tokens), "group": list(self.group), "layers": layers,
                "attends_to_sum": rows, "attends_to_mean": rows / n, "attended_by_sum": columns,
                "attended_by_mean": columns / n}

    def to_rows(self) -> list[dict]:
        """One row per layer, head and other token: the token's weight on it, and its weight on the token (of
        several tokens: their sums)."""
        c = self.capture
        rows, columns = group_rows(c, list(self.layers), self.chosen)
        return [{"layer": n, "head": h, "other": j, "other_token": c.tokens[j],
                 "attends_to": float(rows[k, h, j]), "attended_by": float(columns[k, h, j])}
                for k, n in enumerate(self.layers) for h in range(c.n_heads) for j in range(c.n_tokens)]

    def report(self, *, width: int = 100, color: bool = False, cmap: str = "viridis", **style: Any) -> list:
        from attnviz.render.terminal import token_renderable

        return [token_renderable(self.capture, list(self.chosen) if self.group else self.token, list(self.layers),
                                 list(self.links), width=width, color=color, cmap=cmap)]

    def page(self) -> Page:
        return token_page(self.capture, list(self.chosen) if self.group else self.token, list(self.layers),
                          self.scale)

    def figure(self, *, cmap: str = "viridis", ax=None):
        """Per layer, the token's row and column of α, heads × tokens."""
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(), cmap=cmap, ncols=2, ax=ax)


@checked
def token(source: Any, token: str | int | None = None, *, tokens: Any = None, layer: Any = "all",
          part: str | None = None, scale: str = "shared", norm: str = "auto", vmax: float | None = None,
          **capture_options: Any) -> TokenAttention:
    """One token of `source` (its index, its text, or text#n for the n-th occurrence) through every layer
    (`layer`) and head: what it attends to, who attends to it, and the heads that link it most strongly to
    another token. Or several at once, `tokens` (indices, ranges "2-4", texts, or a list of them: "2,3",
    "cat,sat", [2, 3]): their rows and columns summed (and averaged in to_dict). Self-attention only (of an
    encoder-decoder model: the encoder's, or `part`)."""
    if (token is None) == (tokens is None):
        raise UsageError(f"give one token, or several as {arg('tokens')}, one of them", "tokens")
    layers_sel = selection(layer, "layer", field="layer")
    choice = scale_choice(scale, norm, vmax)
    if tokens is not None:
        specs = _token_specs(tokens)
    capture = one_attention(source, part=part, default_part="encoder", **capture_options)
    if not capture.square:
        raise SelectionError(f"token follows one token through self-attention; for what a target token attends "
                             f"to in the source draw the cross-attention's row ({arg('part')} cross with "
                             f"{arg('rows')} N)", "part")
    if capture.pooled:
        raise InputError(f"token needs each token's own row of α, and this long input was streamed and pooled; "
                         f"for one token of a long input draw its row ({arg('rows')} N:N+1)")
    layers = tuple(layers_sel.indices(capture.n_layers))
    if tokens is not None:
        group = _token_group(capture.tokens, specs)
        return TokenAttention(capture, group[0], layers, (), choice, group=group)
    i = find_token(capture.tokens, str(token), field="token_argument")
    return TokenAttention(capture, i, layers, tuple(token_links(capture, i)), choice)


MAX_TOKEN_SPECS = 256


def _token_specs(tokens: Any) -> list[str]:
    """The parts of `tokens` as typed: "2,3", "2-4", "cat,sat#2", or a list of indices and texts."""
    if isinstance(tokens, (list, tuple)):
        parts = [str(t) for t in tokens]
    elif isinstance(tokens, (int, str)) and not isinstance(tokens, bool):
        parts = [p for p in str(tokens).split(",")]
    else:
        raise UsageError(f"{arg('tokens')} takes indices, ranges or texts (\"2,3\", \"2-4\", \"cat,sat\"), or a "
                         f"list of them; got {type(tokens).__name__}", "tokens")
    parts = [p.strip() for p in parts]
    if not parts or any(not p for p in parts):
        raise UsageError(f"{arg('tokens')} is empty or has an empty part: give indices, ranges or texts, e.g. 2,3",
                         "tokens")
    if len(parts) > MAX_TOKEN_SPECS:
        raise UsageError(f"{arg('tokens')} names {len(parts):,} parts; at most {MAX_TOKEN_SPECS}", "tokens")
    return parts


def _token_group(tokens: tuple[str, ...] | list[str], specs: Sequence[str]) -> tuple[int, ...]:
    """The positions the specs name, in order, each once: a range a-b of indices, or one token as `token` takes
    it (an index, its text, text#n)."""
    import re

    chosen: list[int] = []
    T = len(tokens)
    for spec in specs:
        if re.fullmatch(r"-?\d+--?\d+", spec):  # a range of indices, as every selection reads one
            chosen.extend(Selection.parse(spec, "token", field="tokens").indices(T))
        else:
            chosen.append(find_token(tokens, spec, field="tokens"))
    group = tuple(dict.fromkeys(j % T for j in chosen))
    return group


# --- compare ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison(Result):
    """Layers side by side, the head mean or one head, on one colour scale, each with a stats line; of one
    capture, or the same layers of two (two models on one text, or two saved captures)."""

    command: ClassVar[str] = "compare"
    captures: tuple[Capture, ...]
    panels: tuple[Panel, ...]
    records: tuple[dict, ...]
    rows_spec: str | None = None  # the query rows the stats are over, as typed
    shown_rows: tuple[int, ...] | None = None

    figure_name: ClassVar[str] = "attnviz_compare.png"

    def to_dict(self) -> dict:
        """What `attnviz compare --json` prints: each panel's stats and its matrix."""
        return {"tokens": list(self.captures[0].tokens), "panels": [dict(r) for r in self.records]}

    def to_rows(self) -> list[dict]:
        """One row per panel: its summary (the matrices are in to_dict)."""
        return [{k: v for k, v in r.items() if k != "alpha"} for r in self.records]

    def report(self, *, width: int = 100, color: bool = False, cmap: str = "viridis", start: int = 0,
               **style: Any) -> list:
        from attnviz.render.terminal import panels_side_by_side

        key = ("H: the mean row entropy (nats) of the matrix shown — for mean, of the heads' mean α, which is not "
               "attnviz entropy's mean of each head's own entropy · sp: mass on special tokens · d: mean distance "
               "(tokens)")
        key += f"; over query rows {self.rows_spec}" if self.rows_spec is not None else ""
        return [panels_side_by_side(list(self.panels), width=width, color=color, cmap=cmap, key=key, start=start,
                                    rows=None if self.shown_rows is None else list(self.shown_rows))]

    def figure(self, *, cmap: str = "viridis", ax=None):
        from attnviz.render.png import page_figure

        title = " vs ".join(short_model(c.model) for c in self.captures) + " · layers side by side"
        page = Page(panels=tuple(replace(p, short=f"{p.short} ({p.footer})") for p in self.panels), title=title,
                    name="attnviz_compare", subtitle=text_subtitle(self.captures[0]))
        return page_figure(page, cmap=cmap, ax=ax)


@checked
def compare(sources: Sequence[Any], *, layer: Any = None, head: Any = "mean", rows: Any = None,
            part: str | None = None, scale: str = "shared", norm: str = "auto", vmax: float | None = None,
            models: Sequence[Any] | None = None, **capture_options: Any) -> Comparison:
    """Layers side by side (`layer`; default the first, middle and last), the head mean or one `head`, on one
    colour scale: of one source, of one text through two `models`, or of two sources (saved captures). `rows`:
    the stats over these query rows only."""
    from attnviz.metrics import matrix_summary

    given = list(sources)
    if models is not None:
        if len(given) != 1 or not 1 <= len(models) <= 2:
            raise UsageError(f"give one text and at most two {arg('models')}", "models")
        captures = [one_attention(given[0], part=part, **{**capture_options, "model": m}) for m in models]
    else:
        if not 1 <= len(given) <= 2:
            raise UsageError("give one or two captures to compare", "sources")
        captures = [one_attention(s, part=part, **capture_options) for s in given]
    if len(captures) == 2 and ((captures[0].tokens, captures[0].key_tokens)
                               != (captures[1].tokens, captures[1].key_tokens)):
        a, b = captures
        first, second = visible(" ".join(a.tokens)), visible(" ".join(b.tokens))
        raise CaptureMismatchError(f"the two models tokenise the text differently ({a.n_tokens} tokens: {first} | "
                                   f"{b.n_tokens} tokens: {second}), so their attention cannot be compared "
                                   f"cell by cell")
    n_layers = min(c.n_layers for c in captures)
    layers_sel = (selection(layer, "layer", field="layer") if layer is not None else
                  Selection.parse(f"0,{n_layers // 2},{n_layers - 1}" if n_layers > 2 else "all", "layer",
                                  field="layer"))
    chosen = layers_sel.indices(n_layers)
    heads = selection(head, "head", keywords=("mean", "max"), field="head").resolve(min(c.n_heads for c in captures))
    rows_sel = None if rows is None else selection(rows, "row", keywords=("generated", "prompt"), field="rows")
    shown_rows = query_rows(captures[0], rows_sel)
    panels: list[Panel] = []
    records: list[dict] = []
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
    panels = apply_scale(panels, scale_choice(scale, norm, vmax))
    return Comparison(tuple(captures), tuple(panels), tuple(records), None if rows_sel is None else rows_sel.spec,
                      None if shown_rows is None else tuple(shown_rows))


def query_rows(capture: Capture, rows: Selection | None) -> list[int] | None:
    """`rows` as query positions of this capture (indices, ranges, generated, prompt); None for all."""
    if rows is None:
        return None
    if capture.pooled:
        raise SelectionError(f"this capture is pooled (a long input) and holds statistics of all rows; {arg('rows')} "
                             f"needs a token-level capture", "rows")
    return rows.indices(capture.n_tokens, capture.named_positions())


# --- view ---------------------------------------------------------------------------------------------------

PRECISIONS = ("auto", "16", "8")


@dataclass(frozen=True)
class View(Result):
    """The interactive page of a capture (or of an encoder-decoder model's parts): head view, model view and
    matrix view, in one offline HTML file. `html()` the page; in a notebook, inline."""

    command: ClassVar[str] = "view"
    whole: Capture | Parts
    layers: tuple[int, ...] | None = None
    precision: str = "auto"
    origin: str | None = "attnviz in Python"  # what the page says made it (None: the command line running)

    page_name: ClassVar[str] = "attnviz_view.html"

    def html(self) -> str:
        from attnviz.render.viewer import viewer_data, viewer_html

        return viewer_html(viewer_data(self.whole, layers=None if self.layers is None else list(self.layers),
                                       precision=self.precision, command=self.origin))

    def to_dict(self) -> dict:
        """What `attnviz view --json` prints: what the page shows (its file name is said beside it)."""
        whole = self.whole
        parts = whole.captures if isinstance(whole, Parts) else {"": whole}
        return {"model": whole.model, "parts": [name for name in parts if name],
                "tokens": list(next(iter(parts.values())).tokens),
                "layers": list(self.layers) if self.layers is not None else
                [list(range(c.n_layers)) for c in parts.values()][0], "precision": self.precision}

    def report(self, **style: Any) -> list:
        return []

    def _repr_html_(self) -> str:
        from attnviz.render.viewer import framed

        return framed(self.html())


@overload
def view(source: Any, path: None = None, *, layers: Any = None, precision: str = "auto",
         origin: str | None = "attnviz in Python", **capture_options: Any) -> View: ...


@overload
def view(source: Any, path: str | os.PathLike, *, layers: Any = None, precision: str = "auto",
         origin: str | None = "attnviz in Python", **capture_options: Any) -> Path: ...


@checked
def view(source: Any, path: Any = None, *, layers: Any = None, precision: str = "auto",
         origin: str | None = "attnviz in Python", **capture_options: Any) -> Any:
    """The interactive page of `source` (a capture, an encoder-decoder model's parts, or an input run through
    the model as attnviz.capture does): a View, whose html() is the page; with `path`, the page written there
    (atomically), and its path returned. `layers`: the layers to include (of an encoder-decoder model every
    layer of every part is shown); `precision`: bits per stored weight, 16, 8 or auto; `origin`: what the page
    says made it (None: the command line that is running)."""
    if str(precision) not in PRECISIONS:
        raise UsageError(f"{arg('precision')}: choose one of {', '.join(PRECISIONS)}, not "
                         f"{visible(str(precision))[:20]!r}", "precision")
    whole = attention_of(source, default_part=None, **capture_options)
    chosen: list[int] | None = None
    if layers is not None:
        count = (whole if isinstance(whole, Capture) else whole.part(whole.names[0])).n_layers
        if isinstance(whole, Parts):
            if selection(layers, "layer", field="layers").items != ("all",):
                raise UsageError("an encoder-decoder model's view shows every layer of every part", "layers")
        else:
            chosen = sorted(set(selection(layers, "layer", field="layers").indices(count)))
    result = View(whole, None if chosen is None else tuple(chosen), str(precision), origin)
    if path is None:
        return result
    from pathlib import Path

    from attnviz.base.files import atomic_output, check_suffix

    target = check_suffix(Path(path).expanduser(), (".html", ".htm"))
    with atomic_output(target) as tmp:
        tmp.write_text(result.html(), encoding="utf-8")
    return target
