"""What happens inside a model: massive activations and the sinks they make (attnviz.massive, `attnviz massive`),
the model-level sink rate over a corpus (attnviz.sink_rate, `attnviz sinks --corpus`), and retrieval heads
(attnviz.retrieval_heads, `attnviz retrieval`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.base.arguments import checked
from attnviz.render.tables import records_html
from attnviz.errors import InputError, UsageError, arg
from attnviz.metrics import (Entry, key_importance, MASSIVE_MINIMUM, MASSIVE_RATIO, massive_entries, SINK_EPSILON,
                             sink_rate as sinks_of)
from attnviz.panels import short_model
from attnviz.progress import Reporter
from attnviz.base.text import check_text, shorten, visible

__all__ = ["circuits", "Circuits", "common_tokens", "massive", "MassiveActivations", "retrieval_heads",
           "RetrievalHeads", "REFERENCE_TEXTS"]

# Texts whose massive activations give the mean the intervention sets them to (Sun et al. 2024: "the empirical
# mean over many sentences"); varied in topic and form, none of them the texts of the examples.
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
class MassiveActivations:
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

    def _repr_html_(self) -> str:
        return records_html(self.records(), ["layer", "position", "token", "dim", "value", "ratio"],
                            f"{self.model}: massive activations (over {self.minimum:g} and {self.ratio:g}× the median)")

    def figure(self):
        """Each layer's three largest |h| and its median (log scale, Sun et al.'s Figure 1); |h| of every token on
        the massive dimensions at the layer where they stand out most; the massive tokens' value-vector norms
        over the median token's, by layer."""
        from attnviz.render.charts import massive_figure

        tops = np.array([[abs(e.value) for e in layer] + [np.nan] * (3 - len(layer)) for layer in self.top])
        return massive_figure(tops, self.medians, self.profile, self.profile_layer, self.profile_dims,
                              [visible(t) for t in self.tokens], self.value_ratio, self.minimum, self.ratio,
                              f"{short_model(self.model)} · massive activations (Sun et al. 2024)",
                              f"“{visible(shorten(self.text, 150))}”")


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
        raise InputError(f"{arg('reference')} takes texts that are not empty", "reference")
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


RETRIEVAL_LENGTHS = (300, 600, 1200)  # tokens, about: a few hundred to over a thousand
RETRIEVAL_DEPTHS = (0.1, 0.5, 0.9)
MAX_RETRIEVAL_TOKENS = 16384


@dataclass(frozen=True)
class RetrievalHeads:
    """Retrieval heads (Wu et al. 2024): on needle-in-a-haystack prompts, each head's share of the needle it
    copies while the model writes the answer — a step counts when the head's most-attended key lies in the
    needle and holds the token just written — averaged over the prompts answered correctly. `scores` (L, H);
    `prompts`: one record per prompt; `causal`: the share of answer tokens the model still predicts
    (teacher-forced) with nothing removed, with the `removed` top heads removed, and with as many random
    heads removed (`random`, one value per draw)."""

    model: str
    scores: np.ndarray  # (L, H)
    prompts: tuple[dict, ...]
    removed: tuple[tuple[int, int], ...]
    causal: dict | None
    seed: int

    @property
    def answered(self) -> int:
        return sum(bool(p["retrieved"]) for p in self.prompts)

    def top(self, k: int = 10) -> list[dict]:
        """The k heads of highest score: layer, head, score."""
        L, H = self.scores.shape
        order = np.argsort(-self.scores, axis=None, kind="stable")[:k]
        return [{"layer": int(i // H), "head": int(i % H), "score": float(self.scores.flat[i])} for i in order]

    def records(self) -> list[dict]:
        L, H = self.scores.shape
        return [{"layer": n, "head": h, "score": float(self.scores[n, h])} for n in range(L) for h in range(H)]

    def to_dict(self) -> dict:
        return {"model": self.model, "seed": self.seed, "scores": self.scores.tolist(), "top": self.top(),
                "prompts": [dict(p) for p in self.prompts], "answered": self.answered,
                "removed": [list(p) for p in self.removed], "causal": self.causal}

    def _repr_html_(self) -> str:
        return records_html(self.top(), ["layer", "head", "score"], f"{self.model}: retrieval heads (Wu et al. 2024)")

    def figure(self):
        """Each head's retrieval score, layers × heads."""
        from attnviz.panels import head_grid_panel, Scale
        from attnviz.render.png import panel_figure

        top = max(float(self.scores.max()), 1e-9)
        return panel_figure(head_grid_panel(self.scores, Scale(0.0, top, "retrieval score (share of the needle "
                                                                          "copied)"),
                                            f"{short_model(self.model)} · retrieval heads (Wu et al. 2024), "
                                            f"{self.answered} of {len(self.prompts)} prompts answered",
                                            "attnviz_retrieval"))


@borrows
@checked
def retrieval_heads(*, model: Any = None, tokenizer: Any = None, lengths: Sequence[int] = RETRIEVAL_LENGTHS,
                    depths: Sequence[float] = RETRIEVAL_DEPTHS, remove: int = 10, draws: int = 5, seed: int = 0,
                    device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> RetrievalHeads:
    """Retrieval heads of a causal LM (Wu et al. 2024): a needle-in-a-haystack prompt for each of `lengths`
    (tokens, about) × `depths` (where the needle sits, 0 first to 1 last), made from `seed`; each head's
    retrieval score; and the causal test: the `remove` top heads removed against as many random heads
    (`draws` draws), measured by the answer tokens the model still predicts. remove=0 skips the test."""
    if not lengths or any(not 60 <= n <= MAX_RETRIEVAL_TOKENS for n in lengths):
        raise UsageError(f"{arg('lengths')} takes lengths from 60 to {MAX_RETRIEVAL_TOKENS:,} tokens", "lengths")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise UsageError(f"{arg('depths')} takes depths from 0 (the needle first) to 1 (last)", "depths")
    if remove < 0 or draws < 0 or draws > 100:
        raise UsageError(f"{arg('remove')} takes 0 or more heads and {arg('draws')} 0 to 100 draws", "remove")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("retrieval")
    from attnviz.engine.ablation import is_causal_lm
    from attnviz.engine.ablation.seam import every_head, site
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory
    from attnviz.engine.mechanisms.retrieval import answer_accuracy, haystacks, needle_span, retrieval_hits

    if not is_causal_lm(loaded.model):
        raise InputError(f"retrieval heads are found while a causal language model writes (e.g. "
                         f"{arg('model', 'gemma3')}); {loaded.name} is not one", "model")
    where = site(loaded.model)
    L, H = where.layers, where.heads
    tok = loaded.tokenizer
    made = haystacks(tok, list(lengths), list(depths), seed)
    reporter = reporter or Reporter()
    runs, records = [], []
    with reporter.progress("Needles", len(made), "prompts") as step:
        for stack in made:
            encoded = encode(loaded, stack.prompt, truncate=False)
            T = len(encoded.tokens)
            check_memory(loaded, T, copies=0.0)  # no α kept: each layer's weights for as long as the layer runs
            ids = encoded.inputs["input_ids"]
            full = encode(loaded, stack.prompt + stack.answer, truncate=False).token_ids
            answer = list(full[T:]) if list(full[:T]) == list(encoded.token_ids) else []
            if not answer:
                raise InputError("the tokenizer splits the prompt differently once the answer follows it")
            span = needle_span(encoded.offsets or [], stack.needle_at, stack.needle_at + len(stack.needle))
            written, hits, _ = retrieval_hits(loaded.model, ids, span, max_new=len(answer) + 2)
            response = tok.decode(written)
            retrieved = stack.answer.strip() in response
            runs.append((ids, answer, hits / (span[1] - span[0]), retrieved))
            records.append({"tokens": T, "length": stack.length, "depth": stack.depth, "needle": stack.needle,
                            "needle_tokens": [span[0], span[1]], "answer": stack.answer,
                            "response": visible(response), "retrieved": retrieved})
            step(1)
    kept = [r[2] for r in runs if r[3]]
    scores = np.mean(kept, axis=0) if kept else np.zeros((L, H))
    result = RetrievalHeads(loaded.name, scores, tuple(records), (), None, seed)
    k = min(remove, L * H)
    if not k or not kept:
        return result
    chosen = [(t["layer"], t["head"]) for t in result.top(k)]
    others = [p for p in every_head(L, H) if p not in set(chosen)]
    rng = np.random.default_rng(seed)
    draws_made = [[others[i] for i in sorted(rng.choice(len(others), size=min(k, len(others)), replace=False))]
                  for _ in range(draws if others else 0)]
    answered = [r for r in runs if r[3]]
    conditions = [("none", []), ("top", chosen)] + [(f"random{n}", heads) for n, heads in enumerate(draws_made)]
    measured: dict[str, tuple[float, float]] = {}
    with reporter.progress("Removing heads", len(conditions) * len(answered), "runs") as step:
        for name, heads in conditions:
            values = []
            for ids, answer, _, _ in answered:
                values.append(answer_accuracy(where, ids, answer, heads))
                step(1)
            measured[name] = (float(np.mean([v[0] for v in values])), float(np.mean([v[1] for v in values])))
    causal = {"prompts": len(answered), "heads": len(chosen),
              "none": {"accuracy": measured["none"][0], "log_prob": measured["none"][1]},
              "top": {"accuracy": measured["top"][0], "log_prob": measured["top"][1]},
              "random": [{"accuracy": measured[f"random{n}"][0], "log_prob": measured[f"random{n}"][1],
                          "heads": [list(p) for p in heads]} for n, heads in enumerate(draws_made)]}
    from dataclasses import replace

    return replace(result, removed=tuple(chosen), causal=causal)


CIRCUIT_TOKENS = 2000  # the vocabulary's tokens the OV and QK circuits are read on
MAX_CIRCUIT_TOKENS = 20000
COMPOSITIONS = ("q", "k", "v")


@dataclass(frozen=True)
class Circuits:
    """QK and OV circuits from the weights alone (Elhage et al. 2021). `copying` (L, H): each head's OV circuit
    on the chosen tokens by its eigenvalues, Σλ / Σ|λ| (1: it copies the token it attends to into the output,
    −1: it suppresses it); `positive` (L, H): the share of the eigenvalues' size with a positive real part;
    `qk`: per layer and head, the strongest (query token, key token) pairs of its QK circuit; `composition`:
    {"q"|"k"|"v": (L, H, L, H)}, how much the receiver head (second pair of axes, a later layer) reads what
    the sender head (first pair) writes, through its queries, keys or values (0 to 1)."""

    model: str
    tokens: int  # how many tokens of the vocabulary the circuits are read on
    copying: np.ndarray  # (L, H)
    positive: np.ndarray  # (L, H)
    qk: tuple
    composition: dict

    @property
    def shape(self) -> tuple[int, int]:
        L, H = self.copying.shape
        return int(L), int(H)

    def top_copying(self, k: int = 10) -> list[dict]:
        L, H = self.shape
        order = np.argsort(-self.copying, axis=None, kind="stable")[:k]
        return [{"layer": int(i // H), "head": int(i % H), "copying": float(self.copying.flat[i]),
                 "positive": float(self.positive.flat[i])} for i in order]

    def top_composition(self, mode: str, k: int = 10) -> list[dict]:
        """The k strongest sender → receiver pairs of one kind of composition."""
        scores = self.composition[mode]
        L, H = self.shape
        order = np.argsort(-scores, axis=None, kind="stable")[:k]
        found = []
        for i in order:
            a, b, c, d = np.unravel_index(i, scores.shape)
            found.append({"sender": f"{a}.{b}", "receiver": f"{c}.{d}", "score": float(scores[a, b, c, d])})
        return found

    def records(self) -> list[dict]:
        L, H = self.shape
        rows = []
        for n in range(L):
            for h in range(H):
                first = self.qk[n][h][0] if self.qk[n][h] else {"query": "", "key": "", "score": 0.0}
                rows.append({"layer": n, "head": h, "copying": float(self.copying[n, h]),
                             "positive": float(self.positive[n, h]), "qk_query": first["query"],
                             "qk_key": first["key"], "qk_score": first["score"]})
        return rows

    def to_dict(self) -> dict:
        return {"model": self.model, "tokens": self.tokens, "copying": self.copying.tolist(),
                "positive": self.positive.tolist(), "qk": [[list(h) for h in layer] for layer in self.qk],
                "composition": {m: self.composition[m].tolist() for m in COMPOSITIONS},
                "top_copying": self.top_copying(), "top_composition": {m: self.top_composition(m)
                                                                       for m in COMPOSITIONS}}

    def _repr_html_(self) -> str:
        return records_html(self.top_copying(), ["layer", "head", "copying", "positive"],
                            f"{self.model}: OV copying scores (Elhage et al. 2021)")

    def page(self):
        """Each head's copying score (−1 to 1, centred on 0) and the three compositions, senders down and
        receivers across (every head by layer.head)."""
        from dataclasses import replace as changed

        from attnviz.panels import head_grid_panel, Page, Panel, Scale

        title = f"{short_model(self.model)} · circuits from the weights (Elhage et al. 2021)"
        grid = changed(head_grid_panel(self.copying, Scale(-1.0, 1.0, "OV copying score Σλ/Σ|λ|"), title,
                                       "circuits_copying", short=f"OV copying score on {self.tokens:,} tokens"),
                       cmap="RdBu_r")
        L, H = self.shape
        names = tuple(f"{n}.{h}" for n in range(L) for h in range(H))
        top = max(max(float(self.composition[m].max()) for m in COMPOSITIONS), 1e-9)
        panels = [grid]
        for mode, what in (("q", "queries"), ("k", "keys"), ("v", "values")):
            panels.append(Panel(matrix=self.composition[mode].reshape(L * H, L * H).astype(np.float32), rows=names,
                                cols=names, hidden=None, scale=Scale(0.0, top, "composition score"),
                                title=(title,), name=f"circuits_{mode}", short=f"{mode.upper()}-composition: the "
                                f"receiver's {what} read the sender's output", row_axis="sender (layer.head)",
                                col_axis="receiver (layer.head)"))
        return Page(panels=tuple(panels), title=title, name="attnviz_circuits",
                    notes=("weights alone: norm gains folded in, normalisations, biases and rotary positions left "
                           "out",))

    def figure(self):
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(), ncols=2)


def common_tokens(tokenizer, n: int) -> list[int]:
    """The first n token ids (lowest first: BPE and SentencePiece vocabularies put frequent pieces first) that
    are not special and read as letters, a word's leading space or marker aside."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    found = []
    for i in range(len(tokenizer)):
        if i in special:
            continue
        text = tokenizer.decode([i]).strip()
        if text.isalpha():
            found.append(i)
            if len(found) == n:
                break
    return found


@borrows
@checked
def circuits(*, model: Any = None, tokenizer: Any = None, tokens: int = CIRCUIT_TOKENS, top: int = 5,
             device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Circuits:
    """QK and OV circuits of every head from the weights alone (Elhage et al. 2021; TransformerLens's
    FactoredMatrix, all_composition_scores): the OV copying score on the vocabulary's first `tokens` tokens that
    are words, each head's `top` QK token pairs, and Q-, K-, V-composition between heads of different layers.
    A model with its output head (a causal LM); grouped key/value heads mapped to their query heads."""
    if not 10 <= tokens <= MAX_CIRCUIT_TOKENS:
        raise UsageError(f"{arg('tokens')} takes 10 to {MAX_CIRCUIT_TOKENS:,} tokens; got {tokens}", "tokens")
    if not 1 <= top <= 50:
        raise UsageError(f"{arg('top')} takes 1 to 50 pairs; got {top}", "top")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("circuits")
    from attnviz.engine.mechanisms.circuits import composition, copying, head_weights, qk_pairs

    head = getattr(loaded.model, "get_output_embeddings", lambda: None)()
    if head is None or getattr(head, "weight", None) is None:
        raise InputError(f"the OV circuit reads through the model's output head: {loaded.name} has none (a causal "
                         f"language model, e.g. {arg('model', 'gemma3')})", "model")
    reporter = reporter or Reporter()
    with reporter.status("Reading every head's weights…"):
        weights = head_weights(loaded.model)
    vocab = common_tokens(loaded.tokenizer, tokens)
    if len(vocab) < 10:
        raise InputError(f"{loaded.name}'s vocabulary has fewer than 10 tokens that are words", "tokens")
    with reporter.status(f"OV and QK circuits on {len(vocab):,} tokens…"):
        score, positive = copying(weights, vocab)
        pairs = qk_pairs(weights, vocab, top)
    with reporter.status("Q-, K- and V-composition of every pair of heads…"):
        scores = composition(weights)
    tok = loaded.tokenizer
    named = tuple(tuple(tuple({"query": visible(tok.decode([a])), "key": visible(tok.decode([b])), "score": s}
                              for a, b, s in head) for head in layer) for layer in pairs)
    return Circuits(loaded.name, len(vocab), score, positive, named, scores)
