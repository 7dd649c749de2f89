"""Statistics read from a capture: the head table (heads), mean entropy per head (entropy), attention rollout
(rollout), and the glossary of every column, label and term (explain)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from attnviz.api.capturing import Keep, one_attention
from attnviz.api.result import Line, Result
from attnviz.api.views import query_rows
from attnviz.base.arguments import checked
from attnviz.base.records import plain
from attnviz.base.blocks import sum_blocks
from attnviz.base.selection import Selection, find_token, selection
from attnviz.base.text import visible
from attnviz.data.capture import Capture
from attnviz.data.modality import of_capture
from attnviz.data.parts import heard
from attnviz.errors import SelectionError, UsageError, arg
from attnviz.panels import PART_TITLES, Panel, Scale, rollout_panel, short_model, text_subtitle
from attnviz.render.tables import records_html

__all__ = ["heads", "HeadTable", "entropy", "Entropy", "rollout", "Rollout", "explain", "Glossary"]


def named(capture: Capture) -> str:
    """The model's short name, and the part of an encoder-decoder model."""
    return short_model(capture.model) + (f" · {PART_TITLES[capture.part]}" if capture.part else "")


def rows_note(rows: Selection | None, queries: list[int] | None) -> str:
    return "" if rows is None or queries is None else f", query rows {rows.spec} ({len(queries)} of them)"


# --- heads --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadTable(Result):
    """The head statistics of a capture: one record per layer and head, every registered metric and the
    pattern label (those chosen, in the order asked for). Shown as an HTML table in a notebook;
    `to_records()` for data."""

    command: ClassVar[str] = "heads"
    records: tuple[dict, ...]
    title: str = ""
    matching: int | None = None  # heads that matched before `top` cut the list
    sort: str | None = None  # the column the rows are sorted by
    note: str = ""
    model: str = ""
    heard: tuple[tuple[str, Any], ...] = ()  # a speech model's language and task (data.parts.heard), as items

    figure_name: ClassVar[str] = "attnviz_heads.png"

    def to_records(self) -> list[dict]:
        return [dict(r) for r in self.records]

    def to_dict(self) -> dict:
        """What `attnviz heads --json` prints: the model (and a speech model's language and task), how the rows
        were chosen, and under "heads" one record per head."""
        return {"model": self.model, **dict(self.heard), "sort": self.sort, "matching": self.matching,
                "heads": self.to_records()}

    def figure(self, *, column: str | None = None, cmap: str = "viridis", ax=None):
        """The heads as a layers × heads grid coloured by `column` (the sorted one, else entropy), each cell
        written with its pattern label; with ax=, drawn on those axes (returned)."""
        from attnviz.render.charts import head_grid_figure

        chosen = sort_key(column) if column is not None else self.sort
        key = chosen if chosen is not None and chosen not in ("layer", "head", "label") else "entropy"
        return head_grid_figure(self.records, key, self.title, cmap=cmap, ax=ax)

    def to_rows(self) -> list[dict]:
        return self.to_records()

    def csv_columns(self) -> list[str]:
        from attnviz.metrics import columns

        return columns(self.records[0] if self.records else None)

    def __len__(self) -> int:
        return len(self.records)

    def report(self, *, width: int = 100, **style: Any) -> list:
        from attnviz.render.tables import heads_table

        items: list = [heads_table(self.records, self.title, width=width, keep=self.sort,
                                   caption="column definitions: attnviz explain; sort by any column header with "
                                           "--sort")]
        if self.note:
            items.append(Line(self.note, style="dim"))
        return items

    def _repr_html_(self) -> str:
        from attnviz.metrics import METRICS

        present = self.records[0] if self.records else {}
        columns = ["layer", "head", "label", *(m.name for m in METRICS if m.name in present)]
        return records_html(self.records, columns).replace('class="attnviz-table"', 'class="attnviz-heads"', 1)


def sort_key(value: str | None) -> str | None:
    """A column by its name or its header (entropy, norm_entropy or norm_ent, …)."""
    from attnviz import metrics

    if value is None or value in metrics.FIXED_COLUMNS:
        return value
    metric = metrics.find_metric(value)
    if metric is None:
        keys = [*metrics.FIXED_COLUMNS, *(m.header for m in metrics.METRICS)]
        raise UsageError(f"{visible(value)!r} is not a column; choose from {', '.join(keys)}", "sort")
    return metric.name


@checked
def heads(source: Any, *, layer: Any = "all", head: Any = "all", label: str | None = None, sort: str | None = None,
          descending: bool | None = None, top: int | None = None, rows: Any = None, part: str | None = None,
          **capture_options: Any) -> HeadTable:
    """The head statistics of `source` (a capture, or a text, picture or sound captured with `capture_options`):
    one record per layer and head, every registered metric and the pattern label. Only the heads of `layer` and
    `head` with `label`; sorted by the column `sort`, smallest first, or largest first with `descending` (the
    default with `top`: the `top` highest; `descending=False` for the lowest); over the query rows `rows` only.
    Heads a metric does not apply to (NaN) come last either way."""
    from attnviz.metrics import LABELS, head_records, repeats_note

    key = sort_key(sort)
    if label is not None and label not in LABELS:
        raise UsageError(f"{visible(label)!r} is not a label; choose from {', '.join(LABELS)}", "label")
    if top is not None and top < 1:
        raise UsageError(f"{arg('top')} is at least 1", "top")
    if top is not None and key is None:
        raise UsageError(f"{arg('top')} keeps the N highest of a column: say which with {arg('sort')} (entropy, "
                         f"prev, sink, …)", "top")
    if descending is None:
        descending = top is not None
    keep = capture_options.pop("keep", None) or Keep()
    capture_options["keep"] = replace(keep, pictures=False)
    capture = one_attention(source, part=part, **capture_options)  # the table shows statistics, not α
    layers = set(selection(layer, "layer", field="layer").indices(capture.n_layers))
    chosen = set(selection(head, "head", field="head").indices(capture.n_heads))
    rows_sel = None if rows is None else selection(rows, "row", keywords=("generated", "prompt"), field="rows")
    queries = query_rows(capture, rows_sel)
    records = [r for r in head_records(capture, queries) if r["layer"] in layers and r["head"] in chosen
               and (label is None or r["label"] == label)]
    if key is not None:
        def known(r: dict) -> bool:
            value = r.get(key)
            return value is not None and value == value  # NaN: the metric does not apply to this head

        records = (sorted((r for r in records if known(r)), key=lambda r: r[key], reverse=descending)
                   + [r for r in records if not known(r)])
    matching = len(records)
    records = records[:top] if top else records
    if len(records) < matching:
        shown = f"{'highest' if descending else 'lowest'} {len(records)} of {matching} heads by {key}"
    else:
        shown = f"{len(records)} heads" + (f" by {key}, {'highest' if descending else 'lowest'} first" if key else "")
    title = f"{named(capture)}: {shown}, {of_capture(capture).size(capture)}{rows_note(rows_sel, queries)}"
    return HeadTable(tuple(records), title, matching, key, repeats_note(capture), capture.model,
                     tuple(heard(capture.meta).items()))


# --- entropy ------------------------------------------------------------------------------------------------


# what `entropy` reports, said so that it is never read as compare's H (the entropy of the heads' mean α)
ENTROPY_QUANTITY = "each head's own mean row entropy (nats), the mean over its query rows of −Σ α log α"


@dataclass(frozen=True)
class Entropy(Result):
    """Mean attention entropy of every head (nats; normalised: over ln of the keys a row may attend to, 0
    one-hot, 1 uniform), layers × heads, beside the uniform baseline."""

    command: ClassVar[str] = "entropy"
    model: str
    values: np.ndarray  # (len(layers), H)
    layers: tuple[int, ...]
    uniform: float
    normalised: bool
    title: str
    heard: tuple[tuple[str, Any], ...] = ()

    figure_name: ClassVar[str] = "attnviz_entropy.png"

    def to_dict(self) -> dict:
        """What `attnviz entropy --json` prints: the model (and a speech model's language and task), what was
        averaged, and under "heads" one record per layer and head."""
        return {"model": self.model, **dict(self.heard), "normalised": self.normalised, "uniform": self.uniform,
                "quantity": ENTROPY_QUANTITY, "heads": self.to_rows()}

    def to_rows(self) -> list[dict]:
        return [{"layer": n, "head": head, "entropy": float(self.values[row, head]), "uniform": self.uniform}
                for row, n in enumerate(self.layers) for head in range(self.values.shape[1])]

    def report(self, *, color: bool = False, cmap: str = "viridis", **style: Any) -> list:
        from attnviz.render.tables import entropy_table

        return [entropy_table(self.values, self.uniform, self.title, color=color, cmap=cmap,
                              layers=list(self.layers))]

    def figure(self, *, cmap: str = "viridis", ax=None):
        from attnviz.panels import entropy_panel
        from attnviz.render.png import panel_figure

        return panel_figure(entropy_panel(self.values, self.uniform, self.model, normalised=self.normalised,
                                          layers=list(self.layers)), cmap=cmap, ax=ax)


@checked
def entropy(source: Any, *, layer: Any = "all", normalised: bool = False, rows: Any = None, part: str | None = None,
            **capture_options: Any) -> Entropy:
    """Mean attention entropy of every head of `layer` (an index, list, range or "all"), over the query rows
    `rows` when given; `normalised`: each row over ln of the keys it may attend to."""
    from attnviz import metrics

    rows_sel = None if rows is None else selection(rows, "row", keywords=("generated", "prompt"), field="rows")
    layer_sel = selection(layer, "layer", field="layer")  # both read before the model runs
    keep = capture_options.pop("keep", None) or Keep()
    capture_options["keep"] = replace(keep, pictures=False)
    capture = one_attention(source, part=part, **capture_options)  # the figure shows the statistics, not α
    queries = query_rows(capture, rows_sel)
    layers = layer_sel.indices(capture.n_layers)
    values = metrics.value_grid(capture, "norm_entropy" if normalised else "entropy", queries)[layers]
    uniform = 1.0 if normalised else metrics.uniform_entropy(capture.input_keys)
    title = (f"{named(capture)}: each head's mean row entropy{' (normalised)' if normalised else ''}, "
             f"{of_capture(capture).size(capture)}{rows_note(rows_sel, queries)}")
    return Entropy(capture.model, values, tuple(layers), uniform, normalised, title, tuple(heard(capture.meta).items()))


# --- rollout ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rollout(Result):
    """Attention rollout (Abnar & Zuidema 2020): how much each input token reaches token `token` through all
    layers, the residual stream counted as identity attention. `row` (T,) sums to 1; `matrix` (T, T) every
    token's row, or None for a streamed long input (only the rows its pass computed are kept)."""

    command: ClassVar[str] = "rollout"
    model: str
    tokens: tuple[str, ...]
    token: int
    row: np.ndarray
    matrix: np.ndarray | None
    capture: Capture

    figure_name: ClassVar[str] = "attnviz_rollout.png"

    def records(self) -> list[dict]:
        return [{"index": j, "token": t, "rollout": float(self.row[j])} for j, t in enumerate(self.tokens)]

    def to_rows(self) -> list[dict]:
        return self.records()

    def to_dict(self) -> dict:
        """What `attnviz rollout --json` prints."""
        return plain({"model": self.model, "tokens": list(self.tokens), "token": self.token, "rollout": self.row,
                      "matrix": self.matrix})

    def report(self, *, width: int = 100, **style: Any) -> list:
        """The row as bars: every token's, or of a picture or a long input the 20 largest."""
        from attnviz.panels import token_labels
        from attnviz.render.terminal import bar_chart

        i, row, model = self.token, self.row, short_model(self.capture.model)
        if self.capture.grid is not None:  # a picture: its cells that reach the token most
            top = np.argsort(-row, kind="stable")[:20]
            return [bar_chart([f"{j} {self.tokens[j]}" for j in top], row[top].tolist(), width=width,
                              title=f"{model}: rollout into {self.tokens[i]!r}, the 20 largest of {len(row)} tokens "
                                    f"(sums to {row.sum():.3f}); -o draws it over the picture")]
        if self.matrix is not None:
            labels = token_labels(self.capture)
            return [bar_chart(labels, row.tolist(), width=width,
                              title=f"{model}: rollout for token {i} {labels[i]!r} (sums to {row.sum():.3f})")]
        top = np.argsort(-row)[:20]  # a long input: the rows its streamed pass computed, the largest values
        return [bar_chart([f"{j} {visible(self.tokens[j])}" for j in top], row[top].tolist(), width=width,
                          title=f"{model}: rollout for token {i} {visible(self.tokens[i])!r}, its 20 largest of "
                                f"{len(self.tokens)} (sums to {row.sum():.3f})")]

    def panel(self):
        """The rollout matrix as a panel; of a long input, the row summed over the capture's blocks; of a
        picture, the token's row over its grid, laid on the picture."""
        grid = self.capture.grid
        if grid is not None:
            start = self.capture.grid_start
            over = np.asarray(self.row[start:], np.float32).reshape(grid)  # (rows, cols)
            name = visible(self.tokens[self.token])
            return Panel(over, tuple(str(r) for r in range(grid[0])), tuple(str(c) for c in range(grid[1])), None,
                         Scale(0.0, max(float(over.max()), 1e-9), f"rolled-out attention into {name}"),
                         (f"{short_model(self.model)} · attention rollout into {name} over the patches",),
                         "attnviz_rollout", row_axis="patch row", col_axis="patch column",
                         picture=self.capture.image,
                         mark=divmod(self.token - start, grid[1]) if self.token >= start else None)
        if self.matrix is not None:
            return rollout_panel(self.capture, self.matrix)
        long = self.capture.long
        assert long is not None  # no matrix: a streamed long input
        pooled = sum_blocks(self.row, long.edges)[None, :].astype(np.float32)  # (1, P)
        return Panel(pooled, (visible(long.tokens[self.token]),), self.capture.tokens, None,
                     Scale(0.0, max(float(pooled.max()), 1e-9), "rolled-out attention (sum over the block)"),
                     (f"{short_model(self.model)} · rollout of token {self.token}, summed over "
                      f"{long.block}-token blocks",), "attnviz_rollout", row_axis="token", col_axis="input block")

    def figure(self, *, cmap: str = "viridis", ax=None):
        """The rollout as a picture, the input text under its title."""
        from attnviz.render.png import panel_figure

        return panel_figure(self.panel(), cmap=cmap, subtitle=text_subtitle(self.capture), ax=ax)

    def _repr_html_(self) -> str:
        return records_html(self.records(), ["index", "token", "rollout"],
                            f"{self.model}: rollout for token {self.token}")


def _default_token(kinds, n: int, causal: bool) -> int:
    """[CLS]/the first start token for encoders, the last token for causal models."""
    starts = [i for i, kind in enumerate(kinds) if kind == "start"]
    return n - 1 if causal or not starts else starts[0]


@checked
def rollout(source: Any, *, token: str | int | None = None, part: str | None = None,
            **capture_options: Any) -> Rollout:
    """Attention rollout of `source` (a capture, or a text, picture or sound captured with `capture_options`)
    for `token` (an index or a token's text; default [CLS]/the first start token for encoders, the last token
    for causal models). Of an encoder-decoder model: its encoder (rollout follows self-attention), or `part`."""
    spec = None if token is None else str(token)
    keep = capture_options.pop("keep", None) or Keep()
    capture_options["keep"] = replace(keep, rollout_token=spec)
    capture = one_attention(source, part=part, default_part="encoder", **capture_options)
    long = capture.long
    if long is None:
        from attnviz.metrics import rollout as compute_rollout

        matrix = compute_rollout(capture)  # (T, T)
        i = (_default_token(capture.special_kind, capture.n_tokens, capture.causal) if spec is None
             else find_token(capture.tokens, spec))
        return Rollout(capture.model, tuple(capture.tokens), i, matrix[i], matrix, capture)
    i = (_default_token(long.special_kind, long.n_tokens, capture.causal) if spec is None
         else find_token(long.tokens, spec))
    if i not in long.rollout:
        stored = ", ".join(f"{t} {visible(long.tokens[t])}" for t in sorted(long.rollout))
        raise SelectionError(f"this long input was streamed with the rollout of token(s) {stored} only; run "
                             f"attnviz rollout TEXT {arg('token')} {i} to compute token {i}'s", "token")
    return Rollout(capture.model, tuple(long.tokens), i, long.rollout[i], None, capture)


# --- explain ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Glossary(Result):
    """What every column, label and term of attnviz's tables means: (term, its other name, its definition)."""

    command: ClassVar[str] = "explain"
    entries: tuple[tuple[str, str, str], ...]

    def to_dict(self) -> list[dict]:
        """What `attnviz explain --json` prints: one record per term."""
        return [{"term": term, "other": other, "definition": definition} for term, other, definition in self.entries]

    def to_rows(self) -> list[dict]:
        return self.to_dict()

    def report(self, **style: Any) -> list:
        from rich.table import Table
        from rich.text import Text

        table = Table(show_header=True, box=None, padding=(0, 1), expand=False)
        table.add_column("term", style="bold", no_wrap=True)
        table.add_column("definition")
        for name, other, definition in self.entries:
            label = Text(name) if not other or other == "label" else Text.assemble(name, (f" ({other})", "dim"))
            table.add_row(label, Text(definition))
        return [table]


def commands() -> list[tuple[str, str, str]]:
    """(command, "command", what it does and its options) of every registered analysis (attnviz.analyses)."""
    import dataclasses

    from attnviz import analyses

    rows = []
    for name in analyses.available():
        analysis = analyses.get(name)
        flags = ", ".join("--" + f.name.replace("_", "-") for f in dataclasses.fields(analysis.options))
        rows.append((name, "command", analysis.summary + (f" Its options: {flags}." if flags else "")))
    return rows


@checked
def explain(term: str | None = None) -> Glossary:
    """The definition of `term` (a column, a label, a term or a command: entropy, prev, previous-token, rollout,
    heads, …), or of everything (the commands last, from attnviz.analyses)."""
    from attnviz.metrics import glossary, lookup
    from attnviz.metrics.terms import close_to

    if term is None:
        return Glossary(tuple(glossary() + commands()))
    found = lookup(term, commands())
    if not found:
        near = close_to(term, more=commands())
        if near:
            raise SelectionError(f"nothing is called {visible(term)!r}; did you mean "
                                 f"{' or '.join(repr(n) for n in near)}?", "term")
        raise SelectionError(f"nothing is called {visible(term)!r}; the terms it knows: attnviz explain (with no "
                             f"term) lists all {len(glossary()) + len(commands())}", "term")
    return Glossary(tuple(found))
