"""massive: massive activations (Sun et al. 2024), the few huge entries of the residual stream behind the attention
sinks, and what setting them to 0 or to their mean does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, shorten, visible
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter
from attnviz.metrics import (Entry, MASSIVE_MINIMUM, MASSIVE_RATIO, SINK_EPSILON, key_importance, massive_entries,
                             sink_rate as sinks_of)
from attnviz.render.tables import records_html

__all__ = ["massive", "MassiveActivations", "REFERENCE_TEXTS"]

REFERENCE_TEXTS = (
    "The river rose overnight, and by morning the lower fields were under water.",
    "She opened the letter slowly, afraid of what it might say.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "In 1969 two astronauts walked on the Moon while a third orbited above them.",
    "Add the flour, stir until smooth, then bake for twenty minutes.",
    "The committee will meet again on Tuesday to discuss the budget.",
    "A prime number has exactly two divisors: one and itself.",
    "Rain, wind and fog closed the mountain pass for three days.",
    "He plays the violin every evening after dinner.",
    "Most of the library's old maps were stored in the basement.",
    "Prices rose sharply last year, but wages did not keep up.",
    "The children built a small boat out of wood and string.",
    "Light travels about three hundred thousand kilometres every second.",
    "Please leave your shoes by the door before coming in.",
    "The old castle stands on a hill above the quiet town.",
    "Our train was late, so we missed the first half of the concert.",
)



@dataclass(frozen=True)
class MassiveActivations(Result):
    """Massive activations (Sun et al. 2024): entries of the residual stream (each block's output) over
    `minimum` and `ratio` times the layer's median |h|, on a few fixed dimensions and tokens; and the attention
    sinks they make (Gu et al. 2024): for each sink head (a key's importance above ε), whether its key holds a
    massive activation, and how small that key's value vectors are.

    medians (L,), top (L, k): each layer's largest entries; entries: the massive ones; sink_heads: one record per
    sink head (layer, head, key, token, score, massive: the key holds a massive activation in the stream the
    layer reads); value_ratio (L,): the mean over heads of ‖f_h(x_j)‖ at the tokens holding massive activations
    in the stream the layer reads over the median of the other tokens' (NaN where none, or every token, holds
    one); intervention: None, or the runs with the massive
    entries set to 0 and to their mean over REFERENCE_TEXTS at the layer where each first appears, each with
    the next-token loss and the sink rate."""

    command: ClassVar[str] = "massive"
    model: str
    text: str
    tokens: tuple[str, ...]
    ratio: float
    minimum: float
    epsilon: float
    medians: np.ndarray  # (L,)
    top: tuple[tuple[Entry, ...], ...]
    entries: tuple[Entry, ...]
    sink_heads: tuple[dict, ...]
    sink_rate: float  # the share of heads whose first token's importance passes ε (this text)
    value_ratio: np.ndarray  # (L,)
    output_check: float  # the recomputation's largest |Δ| over the attention outputs' size
    causal: bool = True
    intervention: dict | None = None
    n_heads: int = 0
    profile_layer: int = 0  # the layer whose top entry stands out most (over its median)
    profile: np.ndarray | None = None  # (T, k): |h| there of every token on profile_dims
    profile_dims: tuple[int, ...] = ()

    @property
    def n_layers(self) -> int:
        return len(self.medians)

    @property
    def dims(self) -> tuple[int, ...]:
        """The dimensions that hold massive activations, most often first."""
        counts: dict[int, int] = {}
        for e in self.entries:
            counts[e.dim] = counts.get(e.dim, 0) + 1
        return tuple(sorted(counts, key=lambda d: (-counts[d], d)))

    @property
    def positions(self) -> tuple[int, ...]:
        """The token positions that hold massive activations."""
        return tuple(sorted({e.position for e in self.entries}))

    def first_layers(self) -> dict[tuple[int, int], int]:
        """(position, dim) -> the first layer where that entry is massive."""
        first: dict[tuple[int, int], int] = {}
        for e in self.entries:
            first.setdefault((e.position, e.dim), e.layer)
        return first

    @property
    def tied(self) -> float:
        """The share of sink heads whose key holds a massive activation (NaN without sink heads)."""
        if not self.sink_heads:
            return float("nan")
        return sum(bool(r["massive"]) for r in self.sink_heads) / len(self.sink_heads)

    @property
    def tied_where_present(self) -> float:
        """The same share, over the sink heads of the layers that read a massive activation (the layer before
        holds one); NaN where there are none."""
        reading = {e.layer + 1 for e in self.entries}
        later = [r for r in self.sink_heads if r["layer"] in reading]
        return sum(bool(r["massive"]) for r in later) / len(later) if later else float("nan")

    def records(self) -> list[dict]:
        """One record per massive entry (what --csv prints)."""
        return [{"layer": e.layer, "position": e.position, "token": self.tokens[e.position], "dim": e.dim,
                 "value": e.value, "ratio": e.ratio} for e in self.entries]

    def to_dict(self) -> dict:
        """What `attnviz massive --json` prints."""
        def entry(e: Entry) -> dict:
            return {"layer": e.layer, "position": e.position, "token": self.tokens[e.position], "dim": e.dim,
                    "value": e.value, "ratio": e.ratio}

        return {"model": self.model, "text": self.text, "tokens": list(self.tokens), "ratio": self.ratio,
                "minimum": self.minimum, "epsilon": self.epsilon, "medians": self.medians.tolist(),
                "top": [[entry(e) for e in layer] for layer in self.top], "massive": [entry(e) for e in self.entries],
                "dims": list(self.dims), "positions": list(self.positions),
                "sink_heads": [dict(r) for r in self.sink_heads], "sink_rate": self.sink_rate,
                "sink_heads_on_massive": None if not self.sink_heads else self.tied,
                "sink_heads_on_massive_where_present": None if not self.tied_where_present == self.tied_where_present
                else self.tied_where_present,
                "value_ratio": [None if not np.isfinite(v) else float(v) for v in self.value_ratio],
                "output_check": self.output_check, "intervention": self.intervention}

    figure_name: ClassVar[str] = "attnviz_massive.png"

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """Per layer the largest |h| against the median and the tokens holding massive entries; the dimensions;
        the sink heads and how many sink on a massive token; the value vectors' size; the intervention."""
        from attnviz.render.tables import records_table

        rows = []
        for n, top in enumerate(self.top):
            e = top[0]
            held = sorted({x.position for x in self.entries if x.layer == n})
            rows.append({"layer": n, "median": float(self.medians[n]), "largest": abs(e.value),
                         "ratio": e.ratio, "where": f"{visible(self.tokens[e.position])} · dim {e.dim}",
                         "massive": len([x for x in self.entries if x.layer == n]),
                         "tokens": ", ".join(visible(self.tokens[p]) for p in held[:4])
                         + (f" +{len(held) - 4}" if len(held) > 4 else "")})
        columns = [("layer", "layer", "d"), ("median", "median |h|", ".3g"), ("largest", "largest |h|", ".4g"),
                   ("ratio", "× median", ".0f"), ("where", "token · dim", ""), ("massive", "massive", "d"),
                   ("tokens", "tokens holding them", "")]
        items: list = [records_table(rows, columns, f"{short_model(self.model)}: the residual stream after each "
                                                    f"block (massive: over {self.minimum:g} and {self.ratio:g}× the "
                                                    f"median)")]
        if self.entries:
            dims = ", ".join(str(d) for d in self.dims[:6])
            holders = ", ".join(f"{visible(self.tokens[p])} ({p})" for p in self.positions[:8])
            items.append(Line(f"{len(self.entries)} massive entries on dimension(s) {dims}, held by {holders}"
                              + (f" and {len(self.positions) - 8} more tokens" if len(self.positions) > 8 else "")
                              + "."))
        else:
            items.append(Line("No entry passes both thresholds: this text has no massive activations by this "
                              "definition (try a lower --ratio)."))
        text = (f"Sink heads (a key's importance over {self.epsilon:g}): {len(self.sink_heads)} of "
                f"{self.n_layers * self.n_heads}")
        if self.sink_heads:
            text += f"; {self.tied:.0%} of them sink on a token that holds a massive activation"
            later = self.tied_where_present
            if later == later:
                text += f", {later:.0%} of those in the layers that read one"
        items.append(Line(text + f". Sink₁^{self.epsilon:g} (Gu et al., this text): {self.sink_rate:.1%} of heads."))
        finite = [(n, v) for n, v in enumerate(self.value_ratio) if v == v]
        if finite:
            low = min(finite, key=lambda p: p[1])
            below = sum(v < 1 for _, v in finite)
            items.append(Line(f"Their value vectors (‖f_h(x)‖ through W_O) against the median token's: "
                              f"{min(v for _, v in finite):.2f}–{max(v for _, v in finite):.2f}× over layers "
                              f"{finite[0][0]}–{finite[-1][0]} (smallest {low[1]:.2f}× in layer {low[0]}); smaller "
                              f"than a typical token's in {below} of those {len(finite)} layers: where a sink's value "
                              f"is small, the weight it takes moves little."))
        if self.intervention is not None:
            runs = self.intervention
            rows = [{"run": name, "loss": runs[key]["loss"], "perplexity": runs[key]["perplexity"],
                     "sink_rate": runs[key]["sink_rate"], "first_token": runs[key]["first_token"]}
                    for key, name in (("plain", "as it is"), ("zero", "set to 0"),
                                      ("mean", f"set to their mean ({runs['texts']} texts)"))]
            items.append(records_table(rows, [("run", "massive entries", ""), ("loss", "loss (nats)", ".3f"),
                                              ("perplexity", "perplexity", ".1f"), ("sink_rate", "Sink₁^ε", ".1%"),
                                              ("first_token", "first token's importance", ".3f")],
                                       f"the intervention (Sun et al. 2024): {len(runs['entries'])} entries, each "
                                       f"where it first appears"))
        items.append(Line(f"Check: α and the value vectors recomputed from the weights add up to each attention "
                          f"output within {self.output_check:.1e} of its size.", style="dim"))
        return items

    def _repr_html_(self) -> str:
        return records_html(self.records(), ["layer", "position", "token", "dim", "value", "ratio"],
                            f"{self.model}: massive activations (over {self.minimum:g} and {self.ratio:g}× the median)")

    def figure(self, *, ax=None):
        """Each layer's three largest |h| and its median (log scale, Sun et al.'s Figure 1); |h| of every token on
        the massive dimensions at the layer where they stand out most; the massive tokens' value-vector norms
        over the median token's, by layer."""
        from attnviz.render.charts import massive_figure

        tops = np.array([[abs(e.value) for e in layer] + [np.nan] * (3 - len(layer)) for layer in self.top])
        return massive_figure(tops, self.medians, self.profile, self.profile_layer, self.profile_dims,
                              [visible(t) for t in self.tokens], self.value_ratio, self.minimum, self.ratio,
                              f"{short_model(self.model)} · massive activations (Sun et al. 2024)",
                              f"“{visible(shorten(self.text, 150))}”", ax=ax)


def _check_numbers(ratio: float, minimum: float, epsilon: float) -> None:
    if not ratio > 1:
        raise UsageError(f"{arg('ratio')} must be above 1 (times the layer's median); got {ratio:g}", "ratio")
    if not minimum >= 0:
        raise UsageError(f"{arg('minimum')} must be 0 or more; got {minimum:g}", "minimum")
    if not 0 < epsilon < 1:
        raise UsageError(f"{arg('epsilon')} must be above 0 and below 1; got {epsilon:g}", "epsilon")


@borrows
@checked
def massive(text: str, *, model: Any = None, tokenizer: Any = None, ratio: float = MASSIVE_RATIO,
            minimum: float = MASSIVE_MINIMUM, epsilon: float = SINK_EPSILON, intervene: bool = False,
            reference: Sequence[str] | None = None, truncate: bool = True, device: str = "auto",
            dtype: str = "float32", reporter: Reporter | None = None) -> MassiveActivations:
    """Massive activations in each block's output (Sun et al. 2024: |h| over `minimum` and `ratio` times the
    layer's median), the sink heads (a key's importance over `epsilon`, Gu et al. 2024) and whether their keys
    hold them, and the value-vector norms of those tokens. `intervene` (a causal LM): run again with the massive
    entries set to 0, and to their mean over `reference` texts (default REFERENCE_TEXTS), at the layer where
    each first appears; the next-token loss and the sink rate of each run."""
    check_text(text)
    _check_numbers(ratio, minimum, epsilon)
    if reference is not None:
        if not reference or not all(isinstance(t, str) and t.strip() for t in reference):
            raise UsageError(f"{arg('reference')} takes texts that are not empty", "reference")
        if not intervene:
            raise UsageError(f"{arg('reference')} gives the means that {arg('intervene')} sets the massive entries "
                             f"to: add {arg('intervene')}", "reference")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("massive")
    from attnviz.engine.ablation import is_causal_lm
    from attnviz.engine.forward import encode
    from attnviz.engine.mechanisms.massive import record
    from attnviz.engine.memory import check_memory

    causal = is_causal_lm(loaded.model)
    if intervene and not causal:
        raise InputError(f"{arg('intervene')} measures the next-token loss: a causal language model (e.g. "
                         f"{arg('model', 'gemma3')}); {loaded.name} is an encoder", "intervene")
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.tokens)
    if intervene and T < 2:
        raise InputError("the loss needs two tokens or more: give a longer text", "text")
    check_memory(loaded, T, copies=4.0)
    reporter = reporter or Reporter()
    with reporter.status("Running the model, recording each block's output…"):
        run = record(loaded.model, encoded.inputs)
    medians, found, tops = massive_entries(run.hidden, ratio, minimum)
    L, H = run.alpha.shape[:2]
    importance = key_importance(run.alpha, bool(loaded.causal))  # (L, H, T)
    holders: list[set[int]] = [set() for _ in range(L + 1)]  # holders[n]: massive positions in what layer n reads,
    for e in found:  # the output of block n − 1
        holders[e.layer + 1].add(e.position)
    sink_heads = []
    for n in range(L):
        for h in range(H):
            key = int(importance[n, h].argmax())
            if importance[n, h, key] > epsilon:
                sink_heads.append({"layer": n, "head": h, "key": key, "token": encoded.tokens[key],
                                   "score": float(importance[n, h, key]), "massive": key in holders[n]})
    value_ratio = np.full(L, np.nan)
    norms = run.value_norms.astype(np.float64)  # (L, H, T)
    for n in range(L):  # the tokens that hold massive activations in what layer n reads, against the others
        mine = sorted(holders[n])
        others = [j for j in range(T) if j not in holders[n]]
        if mine and others:
            typical = np.median(norms[n][:, others], axis=1)  # (H,)
            value_ratio[n] = float((norms[n][:, mine].mean(axis=1) / np.maximum(typical, 1e-12)).mean())
    rate = float(sinks_of(run.alpha, bool(loaded.causal), epsilon).mean())
    peak = int(np.argmax([t[0].ratio for t in tops]))
    counts: dict[int, int] = {}
    for e in found:
        counts[e.dim] = counts.get(e.dim, 0) + 1
    dims = tuple(sorted(counts, key=lambda d: (-counts[d], d))[:3]) or tuple(dict.fromkeys(e.dim for e in tops[peak]))
    result = MassiveActivations(
        model=loaded.name, text=text, tokens=tuple(encoded.tokens), ratio=ratio, minimum=minimum, epsilon=epsilon,
        medians=medians, top=tuple(tuple(t) for t in tops), entries=tuple(found), sink_heads=tuple(sink_heads),
        sink_rate=rate, value_ratio=value_ratio,
        output_check=float(np.max(run.output_diff / np.maximum(run.output_scale, 1.0))), causal=causal, n_heads=H,
        profile_layer=peak, profile=np.abs(run.hidden[peak][:, list(dims)]).astype(np.float64), profile_dims=dims)
    if not intervene:
        return result
    from dataclasses import replace

    with reporter.status("Setting the massive activations to 0 and to their mean, and running again…"):
        return replace(result, intervention=_intervene(loaded, encoded, result, run.hidden,
                                                       list(reference or REFERENCE_TEXTS), truncate))


def _intervene(loaded, encoded, result: MassiveActivations, hidden: np.ndarray, reference: list[str],
               truncate: bool) -> dict:
    """Sun et al. 2024's intervention: each massive entry (position, dim) set, at the layer where it first
    appears, to 0 or to its empirical mean: the mean over the reference texts of the entry of the same rank (by
    |h|) in that layer and dimension (the largest, for the text's largest: the first token's, as a rule). The
    plain run beside them. {run: {loss, perplexity, sink_rate, first_token}, "entries", "means", "texts"}"""
    from attnviz.engine.forward import encode
    from attnviz.engine.mechanisms.massive import block_outputs, intervened

    if not reference or not all(isinstance(t, str) and t.strip() for t in reference):
        raise UsageError(f"{arg('reference')} takes texts that are not empty", "reference")
    first = result.first_layers()
    value = {(e.layer, e.position, e.dim): e.value for e in result.entries}
    groups: dict[tuple[int, int], list[int]] = {}  # (layer, dim) -> the positions whose entry first appears there
    for (position, dim), layer in first.items():
        groups.setdefault((layer, dim), []).append(position)
    layers = {layer for layer, _ in groups}
    rank: dict[tuple[int, int, int], int] = {}  # (layer, position, dim) -> its rank by |h| in that column
    for (layer, dim), positions in groups.items():
        order = list(np.argsort(-np.abs(hidden[layer][:, dim]), kind="stable"))  # this text's own run
        for position in positions:
            rank[(layer, position, dim)] = order.index(position)
    found: dict[tuple[int, int, int], list[float]] = {}  # (layer, dim, rank) -> the reference texts' values
    for text in reference:
        seen = block_outputs(loaded.model, encode(loaded, text, truncate=truncate).inputs, layers)
        for (layer, dim), positions in groups.items():
            column = seen[layer][:, dim]
            ranked = np.argsort(-np.abs(column), kind="stable")
            for position in positions:
                r = rank[(layer, position, dim)]
                if r < len(ranked):
                    found.setdefault((layer, dim, r), []).append(float(column[ranked[r]]))
    means = {key: float(np.mean(values)) for key, values in found.items()}
    runs = {}
    for name in ("plain", "zero", "mean"):
        changes: dict[int, list[tuple[int, int, float]]] = {}
        if name != "plain":
            for (layer, dim), positions in groups.items():
                for position in positions:
                    mean = means.get((layer, dim, rank[(layer, position, dim)]), 0.0)
                    changes.setdefault(layer, []).append((position, dim, 0.0 if name == "zero" else mean))
        loss, alpha = intervened(loaded.model, encoded.inputs, changes)
        runs[name] = {"loss": loss, "perplexity": float(np.exp(loss)) if loss is not None else None,
                      "sink_rate": float(sinks_of(alpha, bool(loaded.causal), result.epsilon).mean()),
                      "first_token": float(key_importance(alpha, bool(loaded.causal))[..., 0].mean())}
    entries = [{"layer": layer, "position": p, "token": result.tokens[p], "dim": dim, "rank": rank[(layer, p, dim)],
                "value": value[(layer, p, dim)], "mean": means.get((layer, dim, rank[(layer, p, dim)]), 0.0)}
               for (layer, dim), positions in sorted(groups.items()) for p in sorted(positions)]
    return {**runs, "entries": entries, "texts": len(reference)}
