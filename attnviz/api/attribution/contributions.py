"""contributions: what each token contributes to each token's output, layer by layer, beside where attention looks
(ALTI, Ferrando et al. 2022; value zeroing, Mohebbi et al. 2023), the rollout of the contributions, the
strongest paths into a token, the contribution graph and the interactive page."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from attnviz.api.attribution.contribution_methods import CONTRIBUTIONS, MAX_ZEROING_TOKENS
from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.selection import find_token, selection
from attnviz.base.text import check_text, shorten, visible
from attnviz.data.capture import Capture
from attnviz.errors import InputError, arg, UsageError
from attnviz.metrics import strongest_paths
from attnviz.panels import Page, Scale, short_model
from attnviz.progress import Reporter
from attnviz.render.tables import records_html

__all__ = ["contributions", "Contributions", "MAX_ZEROING_TOKENS", "METHODS"]

JSON_MAX_CELLS = 4_000_000  # --json holds every layer's scores and the rollout up to this many numbers (L·T²)
AGREEMENT_ROWS = 256  # the agreement of α and contribution is averaged over at most this many rows a layer
MAX_GRAPH_TOKENS = 200  # the contribution graph draws a column per token: at most this many
GRAPH_THRESHOLD = 0.05  # the contribution graph's edges: contributions at least this large
METHODS = CONTRIBUTIONS.names()  # the registry's (attnviz.api.attribution.contribution_methods)
METHOD_NAMES = {cls.name: cls.title for cls in CONTRIBUTIONS}


@dataclass(frozen=True)
class Contributions(Result):
    """How much each token contributes to each token's layer output, beside where attention looks. `capture`
    holds, per layer, row i the share each token j has in token i's output, as a Capture of one "head" per
    layer (quantity: the method); `alpha` the model's own attention of the same text.

    method "alti" (Ferrando et al. 2022): the attention block's output, residual included, split into one
    vector per input token, c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), rows normalised; `checks` (L,): how far
    the parts are from the block's own output, over its size. method "value-zeroing" (Mohebbi et al. 2023):
    the change of token i's layer output (1 − cos) when j's value vector is zeroed in that layer, rows
    normalised; `distances` (L, T, T) the 1 − cos before normalising.

    `records`: per layer, the share on special tokens and on each token itself, by α (mean over heads) and by
    contribution, and how well the two orders agree (Spearman's ρ per row, averaged over the rows, or over
    AGREEMENT_ROWS rows spread evenly where there are more). `rollout()`: the layers' contributions multiplied
    through.

    `streamed` (a long input, ALTI only): the model was never asked for its L·H·T² weights; `alpha` then
    holds the mean over heads of α recomputed from the model's weights (L, 1, T, T), the α whose parts the
    decomposition check rebuilds the blocks' outputs from."""

    command: ClassVar[str] = "contributions"
    method: str
    capture: Capture
    alpha: Capture
    records: tuple[dict, ...]
    checks: np.ndarray | None = None  # (L,) ALTI's decomposition check
    distances: np.ndarray | None = None  # (L, T, T) value zeroing's 1 − cos
    streamed: bool = False
    layer: int = -1  # the layer the report and the figure show
    token: int | None = None  # whose paths are listed and drawn (None: the last token that is not special)
    threshold: float = GRAPH_THRESHOLD  # the graph's and the page's smallest edge
    faithful: Any = None  # an attnviz.Faithfulness of α, rollout and this method on the same text, when asked

    graph_name: ClassVar[str] = "attnviz_contribution_graph.png"
    page_name: ClassVar[str] = "attnviz_contributions.html"

    @property
    def figure_name(self) -> str:
        return f"attnviz_contributions_layer{self.layer % self.capture.n_layers}.png"

    @property
    def chosen(self) -> int:
        """The token whose paths are listed and drawn."""
        return self.default_token() if self.token is None else self.token

    def to_rows(self) -> list[dict]:
        return [dict(r) for r in self.records]

    def report(self, **style: Any) -> list:
        """Per layer the shares and the agreement of α and contribution; each token's largest contributors in
        the layer asked for and through all layers; the strongest paths into the token; the check."""
        from attnviz.render.tables import records_table, verdict

        chosen_layer = self.layer % self.capture.n_layers
        items: list = [records_table(list(self.records), [
            ("layer", "layer", "d"), ("alpha_on_special", "α on special", ".2f"),
            ("contribution_on_special", "contribution on special", ".2f"), ("alpha_on_self", "α on self", ".2f"),
            ("contribution_on_self", "contribution on self", ".2f"), ("agreement", "agreement", ".2f")],
            f"{short_model(self.model)}: where attention looks, and what each token contributes ({self.method})")]
        tokens = [visible(t) for t in self.capture.tokens]
        rolled = self.rollout(range(min(40, len(tokens))))
        if self.streamed:
            items.append(Line(f"Streamed ({len(tokens)} tokens): the model's α was never held whole; α here is its "
                              f"mean over heads, recomputed from the weights."))
        items.append(Line(f"Each token's largest contributors: in layer {chosen_layer}, and through all layers (the "
                          f"rollout)"))
        for i, row in enumerate(self.scores[chosen_layer][:40]):
            top = np.argsort(-row, kind="stable")[:3]
            through = np.argsort(-rolled[i], kind="stable")[:3]
            items.append(Line(f"  {tokens[i]} ← " + ", ".join(f"{tokens[j]} {row[j]:.2f}" for j in top if row[j] > 0)
                              + "   |   " + ", ".join(f"{tokens[j]} {rolled[i, j]:.2f}" for j in through)))
        if len(tokens) > 40:
            items.append(Line(f"  … and {len(tokens) - 40} more (--json has every row)", wrap=False))
        target = self.chosen
        items.append(Line(f"The strongest paths of contribution into {tokens[target]!r} (token {target}), input "
                          f"first, weight = the product of the contributions along the path:"))
        for weight, path in self.paths(target, 5):
            items.append(Line(f"  {weight:.3f}  " + " → ".join(tokens[j] for j in path)))
        if self.checks is not None:
            items.append(verdict(True, f"in every layer the parts add up to the attention block's own output within "
                                       f"{float(self.checks.max()):.1e} of its size"))
        if self.faithful is not None:
            items.extend(self.faithful.report(**style)[:2])
        items.append(Line("agreement: Spearman's ρ between a token's α (mean over heads) and its contributions over "
                          "the keys, averaged over tokens; α can be large where a token contributes little (often on "
                          "[CLS] and [SEP]).", style="dim"))
        return items

    @property
    def model(self) -> str:
        return self.capture.model

    @property
    def scores(self) -> np.ndarray:
        """(L, T, T): row i of layer l is what each token contributes to token i there (rows sum to 1)."""
        return self.capture.attentions[:, 0]

    def rollout(self, rows=None) -> np.ndarray:
        """The layers' contribution matrices multiplied through, bottom to top: row i is how much each input
        token reaches token i at the top (rows sum to 1). (T, T); with `rows` (token indices), those rows only,
        (len(rows), T), multiplied from the top down (a vector per row and layer: what a long input needs)."""
        T = self.capture.n_tokens
        if rows is None:
            total = np.eye(T)
            for layer in self.scores.astype(np.float64):
                total = layer @ total
            return total
        picked = np.asarray(list(rows), np.int64)
        if picked.size and not (-T <= picked.min() and picked.max() < T):
            raise InputError(f"{arg('rows')} holds a token index out of range: there are {T} tokens", "rows")
        total = np.eye(T)[picked % T] if picked.size else np.zeros((0, T))
        for layer in self.scores[::-1]:
            total = total @ layer.astype(np.float64)
        return total

    def to_dict(self) -> dict:
        """What `attnviz contributions --json` prints: every layer's scores and the rollout where they take at
        most JSON_MAX_CELLS numbers (else `omitted` says why; the Python API has them all)."""
        L, T = self.capture.n_layers, self.capture.n_tokens
        data: dict = {"model": self.model, "method": self.method, "tokens": list(self.capture.tokens),
                      "streamed": self.streamed, "layers": [dict(r) for r in self.records]}
        if (L + 1) * T * T <= JSON_MAX_CELLS:
            data["scores"] = self.scores.tolist()
            data["rollout"] = self.rollout().tolist()
        else:
            data["omitted"] = (f"scores and rollout: {(L + 1) * T * T:,} numbers, more than {JSON_MAX_CELLS:,}; "
                               f"attnviz.contributions(...) in Python holds them")
        if self.checks is not None:
            data["checks"] = self.checks.tolist()
        data["paths_into"] = self.chosen
        data["paths"] = [{"weight": weight, "tokens": list(path)} for weight, path in self.paths(self.chosen, 5)]
        if self.faithful is not None:
            data["faithfulness"] = {"quantity": self.faithful.quantity, "f_full": self.faithful.f_full,
                                    "methods": self.faithful.to_rows()}
        return data

    def _repr_html_(self) -> str:
        from attnviz.render.viewer import framed

        return records_html(self.records, list(self.records[0]) if self.records else [],
                            f"{self.model}: contributions ({self.method}) beside α") + framed(
            self.html(command="attnviz in a notebook"))

    def html(self, token: int | None = None, *, threshold: float | None = None, command: str | None = None) -> str:
        """The interactive page: the views of α (head, model, matrix) and the contributions panel (the graph;
        choose a token: its strongest incoming paths, and how much of each input token reaches it by
        contribution and by α's rollout), `token` chosen first (default: the last that is not special). One
        self-contained HTML file."""
        from attnviz.metrics import rollout
        from attnviz.render.viewer import contribution_section, viewer_data, viewer_html

        T = self.capture.n_tokens
        threshold = self.threshold if threshold is None else threshold
        if T > MAX_GRAPH_TOKENS:
            raise InputError(f"the contributions page draws a column per token, at most {MAX_GRAPH_TOKENS}; this "
                             f"text is {T} tokens")
        if not 0 < threshold <= 1:
            raise UsageError(f"{arg('threshold')} takes a number above 0 and at most 1; got {threshold}", "threshold")
        chosen = self.chosen if token is None else token
        if not -T <= chosen < T:
            raise InputError(f"{arg('token')} {chosen} is out of range: there are {T} tokens", "token")
        section = contribution_section(self.scores, self.rollout(), rollout(self.alpha), METHOD_NAMES[self.method],
                                       threshold, chosen % T)
        if self.faithful is not None:
            section["faithfulness"] = {"quantity": visible(self.faithful.quantity), "rows": self.faithful.to_rows()}
        return viewer_html(viewer_data(self.alpha, command=command, contributions=section))

    def default_token(self) -> int:
        """The last token that is not special ([SEP], </s>): whose paths are shown first."""
        special = self.capture.special
        return max((i for i in range(self.capture.n_tokens) if not special[i]), default=self.capture.n_tokens - 1)

    def page(self, layer: int | None = None) -> Page:
        """A layer's attention (the mean over its heads) beside its contributions, on one scale from 0 to 1."""
        from attnviz.panels import attention_panels, text_subtitle

        chosen = selection(self.layer if layer is None else layer, "layer").indices(self.capture.n_layers)[:1]
        seen = attention_panels(self.alpha, chosen, ["mean"])[0]
        moved = attention_panels(self.capture, chosen, [0])[0]
        scale = Scale(0.0, 1.0, "share")
        pair = (replace(seen, short="α, mean over heads (where it looks)", scale=scale),
                replace(moved, short=f"{METHOD_NAMES[self.method]} (what each token contributes)", scale=scale))
        title = f"{short_model(self.model)} · layer {chosen[0]}: attention beside contribution"
        note = ("Ferrando et al. 2022: the attention block's output, residual included, split into one vector per "
                "token; row i, each token's share (closeness to the output, L1)" if self.method == "alti" else
                "Mohebbi et al. 2023: token j's value vector zeroed in this layer; row i, the share of the change "
                "in token i's output (1 − cos) each token causes")
        return Page(panels=pair, title=title, name=f"attnviz_contributions_layer{chosen[0]}",
                    subtitle=text_subtitle(self.capture), notes=(note,))

    def figure(self, layer: int | None = None, *, ax=None):
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(layer), ncols=2, ax=ax)

    def paths(self, token: int = -1, top: int = 5) -> list[tuple[float, tuple[int, ...]]]:
        """The `top` strongest paths of contribution into `token` at the top: (weight, (j_0, j_1, …, j_L)), the
        input token j_0 first, the weight the product of the layers' contributions along the path."""
        T = self.capture.n_tokens
        if not -T <= token < T:
            raise InputError(f"{arg('token')} {token} is out of range: there are {T} tokens", "token")
        if not 1 <= top <= 50:
            raise UsageError(f"{arg('top')} takes a whole number from 1 to 50; got {top}", "top")
        return strongest_paths(self.scores, token % T, top)

    def graph(self, token: int | None = None, *, threshold: float | None = None, top: int = 5):
        """The contribution graph (llm-transparency-tool's picture): tokens across, layers up, an edge where a
        contribution reaches `threshold`, and the strongest paths into `token` in colour. A matplotlib Figure."""
        from attnviz.render.charts import contribution_graph_figure

        token = self.chosen if token is None else token
        threshold = self.threshold if threshold is None else threshold
        if not 0 < threshold <= 1:
            raise UsageError(f"{arg('threshold')} takes a number above 0 and at most 1; got {threshold}", "threshold")
        tokens = [visible(t) for t in self.capture.tokens]
        T = len(tokens)
        if T > MAX_GRAPH_TOKENS:
            raise InputError(f"the contribution graph draws a column per token, at most {MAX_GRAPH_TOKENS}; this "
                             f"text is {T} tokens (the strongest paths are listed all the same)")
        figure, _ = contribution_graph_figure(
            self.scores, tokens, threshold, self.paths(token, top),
            f"{short_model(self.model)} · contribution graph ({METHOD_NAMES[self.method]}): edges ≥ {threshold:g}, "
            f"the strongest paths into {tokens[token % T]!r}", f"“{visible(shorten(self.text, 200))}”")
        return figure

    @property
    def text(self) -> str:
        return str(self.capture.meta.get("text", ""))


@borrows
@checked
def contributions(text: str, *, model: Any = None, tokenizer: Any = None, method: str = "alti",
                  layer: Any = -1, token: str | int | None = None, threshold: float = GRAPH_THRESHOLD,
                  stream: bool | None = None, truncate: bool = True, device: str = "auto", dtype: str = "float32",
                  faithfulness: bool = False, reporter: Reporter | None = None, run: Any = None) -> Contributions:
    """How much each token contributes to each token's output, layer by layer: `method` "alti" (Ferrando et
    al. 2022; one run of the model, checked against each attention block's output) or "value-zeroing"
    (Mohebbi et al. 2023; one run per token in batches, at most MAX_ZEROING_TOKENS tokens).

    `stream` (ALTI): True never asks the model for its L·H·T² weights and keeps the mean of α over heads
    instead, holding 4·(2·L + 4·H)·T² bytes (engine.memory.alti_bytes); None (the default) does so
    when the full path would pass the memory budget; False never does. Value zeroing does not stream.

    `layer` the one the report and figure() show; `token` (an index or a token's text; default the last that is
    not special) whose strongest paths are listed and drawn; `threshold` the graph's and the page's smallest
    edge (above 0, at most 1). `faithfulness`: also measure how faithful α, its rollout and this method are on
    the text (attnviz.faithfulness: erasure, leave-one-out and random orders; no sanity check), shown in the
    report, --json and the page beside the contributions. (`run`: an attnviz.Run of this text, whose pass ALTI
    reads: attnviz.Run.contributions.)"""
    check_text(text)
    if faithfulness and not isinstance(text, str):
        raise UsageError(f"{arg('faithfulness')} erases tokens of a text; this input is not one", "faithfulness")
    if not 0 < threshold <= 1:
        raise UsageError(f"{arg('threshold')} takes a number above 0 and at most 1; got {threshold}", "threshold")
    layer_sel = selection(layer, "layer", field="layer")
    contributor = CONTRIBUTIONS.get(method)()
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("contributions")
    from attnviz.engine.forward import encode, make_capture
    from attnviz.metrics import spearman

    if stream and not contributor.streams:
        contributor.streamed(loaded, 0, stream)  # refused before the text is read
    encoded = encode(loaded, text, truncate=truncate) if run is None else run.encoded
    T = len(encoded.tokens)
    streamed = contributor.streamed(loaded, T, stream)
    scores, checks, distances, seen_alpha = contributor.compute(loaded, encoded, streamed, reporter or Reporter(),
                                                                run)
    alpha = make_capture(loaded, encoded, seen_alpha, text, source="scratch, mean over heads" if streamed else "model")
    moved = make_capture(loaded, encoded, scores[:, None].astype(np.float32, copy=False), text,
                         source=METHOD_NAMES[method])
    del scores
    moved = replace(moved, meta={**moved.meta, "quantity": METHOD_NAMES[method]})
    special = np.asarray(moved.special)
    records = []
    sampled = np.unique(np.linspace(0, T - 1, min(T, AGREEMENT_ROWS)).round().astype(int))
    for n in range(moved.n_layers):
        seen = alpha.attentions[n].astype(np.float64).mean(axis=0)  # (T, T): the mean over heads
        moves = moved.attentions[n, 0].astype(np.float64)  # (T, T)
        # each row's keys (a causal model's: itself and earlier ones), where there are at least three to order
        keys = {i: np.arange(T) <= i if moved.causal else np.ones(T, bool) for i in sampled}
        rhos = [spearman(seen[i][keys[i]], moves[i][keys[i]]) for i in sampled if keys[i].sum() > 2]
        rhos = [r for r in rhos if np.isfinite(r)]
        rho = float(np.mean(rhos)) if rhos else float("nan")
        records.append({"layer": n, "alpha_on_special": float(seen[:, special].sum(-1).mean()),
                        "contribution_on_special": float(moves[:, special].sum(-1).mean()),
                        "alpha_on_self": float(np.diagonal(seen).mean()),
                        "contribution_on_self": float(np.diagonal(moves).mean()),
                        "agreement": rho})
    chosen_layer = layer_sel.indices(moved.n_layers)[0]
    chosen_token = None if token is None else find_token(moved.tokens, str(token), field="token")
    faithful = None
    if faithfulness:
        from attnviz.api.attribution.faithfulness import faithfulness as measure

        faithful = measure(text, model=loaded, methods=["attention", "rollout", method, "loo", "random"], sanity=0,
                           truncate=truncate, reporter=reporter)
    return Contributions(method, moved, alpha, tuple(records), checks, distances, streamed, chosen_layer,
                         chosen_token, threshold, faithful)
