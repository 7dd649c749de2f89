"""why: why a head attends where it does on this text — its pre-softmax score split over the query-side parts ×
key-side parts of the residual stream entering its layer (each earlier head, MLP, the embeddings, the biases),
the parts adding up to the score exactly."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.selection import find_token
from attnviz.base.text import check_text, visible
from attnviz.errors import InputError, SelectionError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter

WHY_TOLERANCE = 1e-4  # Σ terms against the score, of max(1, |score|)
MAX_TOP = 200


@dataclass(frozen=True)
class Why(Result):
    """The score s_IJ of head (`layer`, `head`) from query `query` to key `key` (minus s_IJ2 with `versus`) split:
    `terms` (A, B) over `query_names` × `key_names`; `labels`: each earlier head's pattern label where it has one;
    `alpha` α_IJ (and α_IJ2), `sum` Σ terms, `diff` |sum − score|."""

    command: ClassVar[str] = "why"
    figure_name: ClassVar[str] = "attnviz_why.png"
    model: str
    tokens: tuple[str, ...]
    layer: int
    head: int
    query: int
    key: int
    versus: int | None
    score: float
    alphas: tuple[float, ...]
    scores: tuple[float, ...]  # s_IJ, and s_IJ2 with versus (before a soft-cap)
    query_names: tuple[str, ...]
    key_names: tuple[str, ...]
    terms: np.ndarray  # (A, B)
    labels: dict[str, str]
    top: int
    default_key: str = ""  # how the key was chosen when not given
    softcap: float | None = None  # Gemma 2's cap c: `score` and the terms are before s ↦ c·tanh(s/c)

    @property
    def capped(self) -> float:
        """The score after the soft-cap, as the softmax takes it (minus the versus key's, so log α − log α');
        the score itself without a cap."""
        if self.softcap is None:
            return self.score
        c = self.softcap
        return c * (math.tanh(self.scores[0] / c) - (math.tanh(self.scores[1] / c) if self.versus is not None else 0))

    @property
    def sum(self) -> float:
        return float(self.terms.sum())

    @property
    def diff(self) -> float:
        return abs(self.sum - self.score)

    def named(self, part: str) -> str:
        label = self.labels.get(part)
        return f"{part} {label}" if label else part

    def ranked_terms(self) -> list[tuple[str, str, float]]:
        flat = np.argsort(-np.abs(self.terms), axis=None, kind="stable")[:self.top]
        B = self.terms.shape[1]
        return [(self.query_names[i // B], self.key_names[i % B], float(self.terms.flat[i])) for i in flat]

    def side(self, which: str) -> list[tuple[str, float]]:
        totals = self.terms.sum(axis=1 if which == "query" else 0)
        names = self.query_names if which == "query" else self.key_names
        return [(names[i], float(totals[i])) for i in np.argsort(-np.abs(totals), kind="stable")]

    def to_dict(self) -> dict:
        """What `attnviz why --json` prints."""
        return {"model": self.model, "layer": self.layer, "head": self.head, "query": self.query, "key": self.key,
                "versus": self.versus, "tokens": list(self.tokens), "score": self.score,
                "alpha": self.alphas[0], "alpha_versus": self.alphas[1] if self.versus is not None else None,
                "sum": self.sum, "diff": self.diff, "softcap": self.softcap, "capped": self.capped,
                "terms": [{"query_side": q, "key_side": k, "value": v} for q, k, v in self.ranked_terms()],
                "query_side": dict(self.side("query")), "key_side": dict(self.side("key")),
                "labels": dict(self.labels)}

    def to_rows(self) -> list[dict]:
        return [{"query_side": q, "key_side": k, "value": v} for q, k, v in self.ranked_terms()]

    def _what(self) -> str:
        t = self.tokens
        base = (f"head {self.layer}.{self.head}, query {self.query} {visible(t[self.query])!r} → key {self.key} "
                f"{visible(t[self.key])!r}")
        return base + (f" rather than {self.versus} {visible(t[self.versus])!r}" if self.versus is not None else "")

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import records_table

        if self.versus is None:
            said = (f"score s = {self.score:.4f} (α = {self.alphas[0]:.3f}); Σ terms = {self.sum:.4f}, difference "
                    f"{self.diff:.1e}")
        else:
            ratio = "" if self.softcap else " = log α − log α'"
            said = (f"s − s' = {self.score:.4f}{ratio} (α = {self.alphas[0]:.3f}, α' = {self.alphas[1]:.3f});"
                    f" Σ terms = {self.sum:.4f}, difference {self.diff:.1e}")
        items: list = [Line(f"{short_model(self.model)} · {self._what()}", style="bold"), Line(said)]
        if self.softcap:
            after = "log α − log α' = " if self.versus is not None else ""
            items.append(Line(f"split before the soft-cap s ↦ c·tanh(s/c), c = {self.softcap:g}: after it "
                              f"{after}{self.capped:.4f}", style="yellow"))
        if self.default_key:
            items.append(Line(self.default_key, style="dim"))
        rows = [{"query": self.named(q), "key": self.named(k), "value": v} for q, k, v in self.ranked_terms()]
        items.append(records_table(rows, [("query", "query side", ""), ("key", "key side", ""),
                                          ("value", "q(a)·k(b)·scale", "+.4f")],
                                   f"the {len(rows)} largest terms of {self.terms.size:,}"))
        for which in ("query", "key"):
            shown = [{"part": self.named(n), "total": v} for n, v in self.side(which)[:min(self.top, 10)]]
            items.append(records_table(shown, [("part", f"{which} side", ""), ("total", "Σ over the other side",
                                                                              "+.4f")],
                                       f"{which} side: each part's total"))
        items.append(Line("Parts: embed (or tokens, positions), l.h a head's output, mlp l, bias …; the norm in front "
                          "of the attention linearised at this run's scale. attnviz explain why", style="dim"))
        return items

    def figure(self, *, cmap: str = "RdBu_r", ax=None):
        """The largest query parts × key parts as a matrix, and each side's totals."""
        from attnviz.render.why import why_figure

        q = [n for n, _ in self.side("query")[:12]]
        k = [n for n, _ in self.side("key")[:12]]
        matrix = self.terms[np.ix_([self.query_names.index(n) for n in q], [self.key_names.index(n) for n in k])]
        return why_figure(matrix, [self.named(n) for n in q], [self.named(n) for n in k],
                          self.side("query")[:12], self.side("key")[:12],
                          f"{short_model(self.model)} · {self._what()}", cmap=cmap, ax=ax)


def _position(tokens: tuple[str, ...], value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise UsageError(f"{arg(name)} takes a position or a token's text; got {value!r}", name)
    return find_token(list(tokens), str(value), field=name)


@borrows
@checked
def why(text: str, *, model: Any = None, tokenizer: Any = None, layer: int = 0, head: int = 0,
        query: str | int | None = None, key: str | int | None = None, versus: str | int | None = None,
        top: int = 10, truncate: bool = True, device: str = "auto", dtype: str = "float32",
        reporter: Reporter | None = None, run: Any = None) -> Why:
    """Why head (`layer`, `head`) attends from `query` (default: the last token, special ones left out) to `key`
    (default: the key it attends to most in that row, other than the first token, a sink): its score s split over
    the parts of the residual stream entering the layer, query side × key side; with `versus`, s − s' (which
    equals log α − log α'). Positions are indices or a token's text (text#n). `top`: the terms listed (1 to
    200). Pre-norm decoders (GPT-2, Llama, Gemma 3 and the families built like them) and BERT-family encoders;
    others refused in one line. (`run`: an attnviz.Run of this text, whose pass is read.)"""
    from attnviz.engine.attribution.why import check_family, is_post_norm, split_score, why_points
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory

    check_text(text)
    if not 1 <= top <= MAX_TOP:
        raise UsageError(f"{arg('top')} takes a whole number from 1 to {MAX_TOP}; got {top}", "top")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("attnviz why")
    check_family(loaded.model)
    L, H = loaded.shape
    if not -L <= layer < L:
        raise SelectionError(f"layer {layer} is out of range: there are {L} layers (0..{L - 1}, or -{L}..-1)", "layer")
    if not -H <= head < H:
        raise SelectionError(f"head {head} is out of range: there are {H} heads (0..{H - 1}, or -{H}..-1)", "head")
    layer, head = layer % L, head % H
    encoded = encode(loaded, text, truncate=truncate) if run is None else run.encoded
    tokens = tuple(encoded.tokens)
    T = len(tokens)
    if query is None:  # the last token that is not a special one ([SEP] ends an encoder's input)
        specials = set(getattr(loaded.tokenizer, "all_special_tokens", ()) or ())
        i = next((n for n in range(T - 1, -1, -1) if tokens[n] not in specials), T - 1)
    else:
        i = _position(tokens, query, "query")
    j = None if key is None else _position(tokens, key, "key")
    j2 = None if versus is None else _position(tokens, versus, "versus")
    for name, where in (("key", j), ("versus", j2)):  # before the model runs
        if where is not None and loaded.causal and where > i:
            raise InputError(f"{arg(name)} {where} comes after {arg('query')} {i}: a causal model's query sees "
                             f"only the keys before it", name)
    check_memory(loaded, T, copies=2.0)
    with (reporter or Reporter()).status("Splitting the score into its parts…"):
        points = why_points(layer, is_post_norm(loaded.model))
        recording = run.recording(points) if run is not None else None
        if recording is None:
            from attnviz.engine.points import record

            recording = record(loaded.model, encoded.inputs, points)
        # the query's row of α, recomputed from the weights: (T,)
        row_of_alpha = recording.run.layers[layer].alpha_rows(slice(i, i + 1))[0, head, 0].double()
        said = ""
        if j is None:
            row = row_of_alpha.clone()
            if T > 1 and i > 0:
                row[0] = -1.0  # the first token: a sink in most decoders
            j = int(row.argmax())
            said = (f"key: the one head {layer}.{head} attends to most from this query, the first token (a sink) left "
                    f"out (α = {float(row_of_alpha[j]):.3f}); --key chooses another")
        split = split_score(loaded.model, encoded.inputs, layer=layer, head=head, query=i, key=j, versus=j2,
                            recording=recording)
    if split.stream_diff > WHY_TOLERANCE or split.query_diff > WHY_TOLERANCE:
        from attnviz.errors import UnsupportedArchitectureError

        raise UnsupportedArchitectureError(f"{loaded.name}'s blocks are not built as this split reads them: the parts "
                                           f"miss the stream by {max(split.stream_diff, split.query_diff):.1e}")
    labels = _labels(recording, loaded, encoded, text, layer)
    alphas = (float(row_of_alpha[j]),) + (() if j2 is None else (float(row_of_alpha[j2]),))
    return Why(model=loaded.name, tokens=tokens, layer=layer, head=head, query=i, key=j, versus=j2,
               score=split.score, alphas=alphas, scores=split.scores, query_names=split.query_names,
               key_names=split.key_names, terms=split.terms, labels=labels, top=top, default_key=said,
               softcap=split.softcap)


def _labels(recording, loaded, encoded, text: str, layer: int) -> dict[str, str]:
    """Each earlier head's pattern label (attnviz heads' on this text, from the same pass): {"3.1": "previous-token",
    …}; heads without a clear pattern ("mixed") unlabelled."""
    if layer == 0:
        return {}
    from attnviz.api.stats import heads
    from attnviz.engine.forward import attentions_of, make_capture

    reported = attentions_of(recording.run.output, loaded.model, loaded.name)
    alpha = np.stack([a[0].float().cpu().numpy() for a in reported])  # (L, H, T, T)
    table = heads(make_capture(loaded, encoded, alpha, text), layer=f"0-{layer - 1}")
    return {f"{r['layer']}.{r['head']}": str(r["label"]) for r in table.records
            if r.get("label") not in (None, "", "mixed")}
