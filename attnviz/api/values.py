"""What attention actually moves: value-weighted norms (Kobayashi et al. 2020) and the attention sinks they
judge (Gu et al. 2024)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, overload

import numpy as np

from attnviz.base.arguments import checked
from attnviz.data.picture import Picture
from attnviz.api.models import borrows, for_input, resolve_model
from attnviz.base.blocks import row_shares
from attnviz.data.capture import Capture
from attnviz.render.tables import records_html
from attnviz.api.result import Line, Result
from attnviz.errors import InputError, UsageError, arg
from attnviz.metrics import SINK_EPSILON, sink_rate as sinks_of, sink_scores, Tokens
from attnviz.panels import attention_panels, head_grid_panel, Page, Scale, short_model, text_subtitle
from attnviz.progress import Reporter
from attnviz.base.selection import selection
from attnviz.base.text import check_text

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["norms", "Norms", "sinks", "Sinks", "sink_rate", "SinkRate", "SINK_TOKENS", "MAX_SINK_TEXTS"]


def _norms_capture(text: str | Picture, model: Any, tokenizer: Any, truncate: bool, device: str, dtype: str,
                   reporter: Reporter | None, what: str):
    """(the capture of ‖α·f(x)‖ shares, the engine's NormsResult with α and the output check)."""
    check_text(text)
    loaded = resolve_model(for_input(model, text), tokenizer, device=device, dtype=dtype)
    loaded.require_single(what)
    from attnviz.engine.scratch.norms import norms_capture

    with (reporter or Reporter()).status("Running the model and recomputing each head's value vectors…"):
        return norms_capture(loaded, text, truncate=truncate)


@dataclass(frozen=True)
class Norms(Result):
    """Value-weighted norms: how much key j actually moves query i, ‖α_ij·f_h(x_j)‖ with
    f_h(x) = (x·W_V^h + b_V^h)·W_O^h. `capture` holds each query's shares of those norms (L, H, T, T; rows sum
    to 1); `alpha` the weights α (L, H, T, T); `output_diff` per layer, the exact check that the parts add up
    to the attention block's own output. `records`: per layer, the share on special tokens and on the first
    token, by α and by norm."""

    command: ClassVar[str] = "norms"
    capture: Capture
    alpha: np.ndarray  # (L, H, T, T) float32
    output_diff: np.ndarray  # (L,)
    records: tuple[dict, ...]
    layer: int = -1  # the layer and head the figure shows
    head: int | str = 0

    @property
    def figure_name(self) -> str:
        return f"{self.page().name}.png"

    def to_rows(self) -> list[dict]:
        return self.to_dict()

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import norms_table

        return [norms_table(list(self.to_dict()), f"{short_model(self.model)}: where attention goes, by α and by "
                                                  f"‖α·f(x)‖"),
                Line(f"Check: Σ_h Σ_j α_ij f_h(x_j) + b_O equals the attention block's own output (before the "
                     f"residual) to within {self.output_diff.max():.1e} in every layer.")]

    @property
    def model(self) -> str:
        return self.capture.model

    def to_dict(self) -> list[dict]:
        """What `attnviz norms --json` prints: one record per layer."""
        return [dict(r) for r in self.records]

    def _repr_html_(self) -> str:
        return records_html(self.records, list(self.records[0]) if self.records else [], f"{self.model}: norms")

    def page(self, layer: int | None = None, head: int | str | None = None):
        """One head's α beside its value-weighted norms (default the layer and head asked for), as a Page of two
        panels."""
        capture = self.capture
        layer = self.layer if layer is None else layer
        head = self.head if head is None else head
        which_layer = selection(layer, "layer").indices(capture.n_layers)[:1]
        which_head = selection(head, "head", keywords=("mean", "max")).resolve(capture.n_heads)[:1]
        alpha_capture = replace(capture, attentions=self.alpha, meta={**capture.meta, "quantity": "alpha"}).validate()
        pair = [*attention_panels(alpha_capture, which_layer, which_head),
                *attention_panels(capture, which_layer, which_head)]
        pair = [replace(pair[0], short="α (the weights)"), replace(pair[1], short="‖α·f(x)‖ (what actually moves)")]
        title = f"{pair[0].title[0]}{pair[0].title[1]}: α beside value-weighted norms"
        return Page(panels=tuple(pair), title=title, name=f"attnviz_norms_{pair[0].name}",
                    subtitle=text_subtitle(capture),
                    notes=("Kobayashi et al. 2020: a key with a large α but a small value vector moves the query "
                           "little",))

    def figure(self, layer: int | None = None, head: int | str | None = None, *, cmap: str = "viridis", ax=None):
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(layer, head), cmap=cmap, ncols=2, ax=ax)


@borrows
@checked
def norms(text: str | Picture, *, model: Any = None, tokenizer: Any = None, layer: Any = -1, head: Any = 0,
          truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Norms:
    """Value-weighted norms of every layer and head (Kobayashi et al. 2020), with the exact check; the figure
    shows `layer`'s `head` (the first of a selection; or "mean", "max")."""
    layer_sel = selection(layer, "layer", field="layer")
    head_sel = selection(head, "head", keywords=("mean", "max"), field="head")

    capture, result = _norms_capture(text, model, tokenizer, truncate, device, dtype, reporter, "norms")
    return _norms_result(capture, result, layer_sel, head_sel)


def _norms_result(capture: Capture, result: Any, layer_sel: Any, head_sel: Any) -> Norms:
    alpha = result.alpha[:, 0].astype(np.float64)  # (L, H, T, T)
    shares = row_shares(capture.attentions.astype(np.float64))
    special = np.asarray(capture.special)
    records = tuple({"layer": n, "alpha_on_special": float(alpha[n][..., special].sum(-1).mean()),
                     "norm_on_special": float(shares[n][..., special].sum(-1).mean()),
                     "alpha_on_first": float(alpha[n][..., 0].mean()), "norm_on_first": float(shares[n][..., 0].mean()),
                     "output_check": float(result.output_diff[n])} for n in range(capture.n_layers))
    return Norms(capture, result.alpha[:, 0].astype(np.float32), np.asarray(result.output_diff), records,
                 layer_sel.indices(capture.n_layers)[0], head_sel.resolve(capture.n_heads)[0])


def _run_norms(loaded: Any, text: str, encoded: Any, run: Any, what: str):
    """(capture of ‖α·f(x)‖ shares, NormsResult) from a Run's pass (attnviz.Run.norms, .sinks)."""
    loaded.require_single(what)
    from attnviz.engine.scratch.norms import norms_capture, norms_points

    return run.memo("norms", lambda: norms_capture(loaded, text, encoded=encoded,
                                                   recording=run.recording(norms_points(loaded.shape[0]))))


def norms_of_run(loaded: Any, text: str, encoded: Any, run: Any, *, layer: Any = -1, head: Any = 0) -> Norms:
    """attnviz.Run.norms: what norms() returns, from the run's pass."""
    layer_sel = selection(layer, "layer", field="layer")
    head_sel = selection(head, "head", keywords=("mean", "max"), field="head")
    capture, result = _run_norms(loaded, text, encoded, run, "norms")
    return _norms_result(capture, result, layer_sel, head_sel)


@dataclass(frozen=True)
class Sinks(Result):
    """Attention sinks (Gu et al. 2024): keys that receive a large mean weight from the queries that can see
    them. `sinks`: one record per sink head (layer, head, key, token, sink_score, norm_score); `layers`: per
    layer, the sink heads, their share and tokens, and the mean scores; `best` (L, H): each head's largest
    sink score."""

    command: ClassVar[str] = "sinks"
    model: str
    threshold: float
    tokens: tuple[str, ...]
    layers: tuple[dict, ...]
    sinks: tuple[dict, ...]
    best: np.ndarray  # (L, H)
    streamed: bool = False  # a long input: α computed a block of query rows at a time (engine/stream.stream_sinks)

    figure_name: ClassVar[str] = "attnviz_sinks.png"

    def to_rows(self) -> list[dict]:
        return [dict(r) for r in self.sinks]

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import sinks_table

        return [sinks_table([dict(r) for r in self.layers], self.n_heads,
                            f"{short_model(self.model)}: attention sinks (score > {self.threshold:g})"),
                Line("sink score: the mean weight a key receives from the queries that can see it; by norm: the same "
                     "for each query's share of ‖α·f(x)‖. A sink whose norm score is far below its score takes "
                     "attention but moves little (the \"no-op\" reading)."),
                *([Line(f"Streamed: {len(self.tokens):,} tokens, attention computed a block of query rows at a "
                        f"time; only each key's mean α and mean norm share kept (L·H·T numbers, not L·H·T²).",
                        style="dim")] if self.streamed else [])]

    @property
    def n_heads(self) -> int:
        return self.best.shape[1]

    def to_dict(self) -> dict:
        """What `attnviz sinks --json` prints."""
        return {"model": self.model, "threshold": self.threshold, "tokens": list(self.tokens),
                "layers": [dict(r) for r in self.layers], "sinks": [dict(r) for r in self.sinks],
                "streamed": self.streamed}

    def _repr_html_(self) -> str:
        return records_html(self.sinks, ["layer", "head", "key", "token", "sink_score", "norm_score"],
                            f"{self.model}: attention sinks (score > {self.threshold:g})")

    def panel(self):
        return head_grid_panel(self.best, Scale(0.0, 1.0, f"largest sink score (a sink above {self.threshold:g})"),
                               f"{short_model(self.model)} · attention sinks: each head's largest sink score",
                               "attnviz_sinks")

    def figure(self, *, cmap: str = "viridis", ax=None):
        """Each head's largest sink score, layers × heads."""
        from attnviz.render.png import panel_figure

        return panel_figure(self.panel(), cmap=cmap, ax=ax)


@overload
def sinks(text: str | Picture, *, model: Any = None, tokenizer: Any = None, threshold: float = 0.3,
          tokens: int = 64, truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Sinks: ...


@overload
def sinks(text: list[str] | tuple[str, ...], *, model: Any = None, tokenizer: Any = None, threshold: float = 0.3,
          tokens: int = 64, truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> SinkRate: ...


@borrows
@checked
def sinks(text: str | Picture | Sequence[str], *, model: Any = None, tokenizer: Any = None, threshold: float = 0.3,
          tokens: int = 64, truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Sinks | SinkRate:
    """Which tokens are sinks in which layers (a sink score above `threshold`, 0 to 1), and by value-weighted
    norms whether a sink actually moves anything. Of several texts (a list): Gu et al.'s model-level sink rate
    Sink₁^ε over them, ε = `threshold`, each text's first `tokens` tokens (sink_rate)."""
    if isinstance(text, (list, tuple)):
        return sink_rate(list(text), model=model, tokenizer=tokenizer, epsilon=threshold, tokens=tokens,
                         device=device, dtype=dtype, reporter=reporter)
    if not 0.0 <= threshold <= 1.0:
        raise UsageError(f"threshold must be from 0 to 1, not {threshold}", "threshold")

    assert isinstance(text, str) or getattr(text, "is_picture", False)
    if isinstance(text, str):  # a long text streams
        from attnviz.engine.forward import encode

        check_text(text)
        loaded = resolve_model(for_input(model, text), tokenizer, device=device, dtype=dtype)
        encoded = encode(loaded, text, truncate=truncate)
        if _streams(loaded, encoded):
            return _streamed_sinks(loaded, encoded, threshold, reporter)
        model = loaded
    capture, result = _norms_capture(text, model, tokenizer, truncate, device, dtype, reporter, "sinks")  # type: ignore[arg-type]
    return _sinks_result(capture, result, threshold)


def sinks_of_run(loaded: Any, text: str, encoded: Any, run: Any, *, threshold: float = 0.3,
                 reporter: Reporter | None = None) -> Sinks:
    """attnviz.Run.sinks: what sinks() returns for one text, from the run's pass (streamed where the text's α
    and norms would not fit the memory budget)."""
    if not 0.0 <= threshold <= 1.0:
        raise UsageError(f"threshold must be from 0 to 1, not {threshold}", "threshold")
    if _streams(loaded, encoded):
        return _streamed_sinks(loaded, encoded, threshold, reporter)
    capture, result = _run_norms(loaded, text, encoded, run, "sinks")
    return _sinks_result(capture, result, threshold)


def _streams(loaded: Any, encoded: Any) -> bool:
    """Whether the sinks of this input take the streamed path: its α and norms (4 copies of L·H·T²) would not fit
    the budget, and it is a text (one attention per layer)."""
    from attnviz.engine.memory import fits

    return not getattr(loaded, "vision", False) and not fits(loaded, len(encoded.token_ids), copies=4.0)


def _streamed_sinks(loaded: Any, encoded: Any, threshold: float, reporter: Reporter | None) -> Sinks:
    """The sinks of a long input, streamed (engine/stream.stream_sinks): each key's mean α and mean share of the
    value-weighted norms, L·H·T numbers."""
    from attnviz.engine.families import layer_windows, require
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.stream import stream_sinks

    loaded.require_single("sinks")
    require(loaded, "stream")
    base = getattr(loaded.model, "base_model", loaded.model)
    projections = adapter_for(base).out_projections(base)
    T = len(encoded.token_ids)
    L, _ = loaded.shape
    with (reporter or Reporter()).progress("Streaming", L * T, "query rows") as step:  # every layer's rows
        by_alpha, by_norm = stream_sinks(loaded.model, encoded.inputs, projections, on_rows=step)
    tokens = Tokens(tuple(encoded.tokens), np.asarray(encoded.special, bool), np.array(encoded.special_kind),
                    bool(loaded.causal), ids=tuple(int(i) for i in encoded.token_ids))
    return _sinks_of(loaded.name, tokens, layer_windows(loaded.model.config, L), by_alpha / T, by_norm / T,
                     threshold, streamed=True)


def _sinks_result(capture: Capture, result: Any, threshold: float) -> Sinks:
    alpha = result.alpha[:, 0].astype(np.float64)  # (L, H, T, T)
    shares = row_shares(capture.attentions.astype(np.float64))
    return _sinks_of(capture.model, Tokens.of(capture), capture.windows, alpha.mean(axis=-2), shares.mean(axis=-2),
                     threshold)


def _sinks_of(model: str, seen_tokens: Tokens, windows: Any, by_alpha_mean: np.ndarray, by_norm_mean: np.ndarray,
              threshold: float, streamed: bool = False) -> Sinks:
    """Sinks from each key's mean α and mean norm share over all query rows, (L, H, T) each."""
    L, H = by_alpha_mean.shape[:2]
    tokens = seen_tokens.tokens
    records: list[dict] = []
    per_layer = []
    best = np.zeros((L, H))  # each head's largest sink score
    for n in range(L):
        seen = seen_tokens.at_layer(windows, n)  # with the layer's sliding window, if it has one
        by_alpha = sink_scores(by_alpha_mean[n], seen)  # (H, T)
        by_norm = sink_scores(by_norm_mean[n], seen)
        best[n] = by_alpha.max(axis=-1)
        heads = []
        for h in range(H):
            key = int(by_alpha[h].argmax())
            if by_alpha[h, key] > threshold:
                heads.append(h)
                records.append({"layer": n, "head": h, "key": key, "token": tokens[key],
                                "sink_score": float(by_alpha[h, key]), "norm_score": float(by_norm[h, key])})
        mine = [r for r in records if r["layer"] == n]
        counts: dict[str, int] = {}
        for r in mine:
            counts[f"{r['key']}:{r['token']}"] = counts.get(f"{r['key']}:{r['token']}", 0) + 1
        per_layer.append({"layer": n, "sink_heads": len(heads), "share": len(heads) / H,
                          "tokens": counts,
                          "alpha": float(np.mean([r["sink_score"] for r in mine])) if mine else 0.0,
                          "norm": float(np.mean([r["norm_score"] for r in mine])) if mine else 0.0})
    return Sinks(model, threshold, tuple(tokens), tuple(per_layer), tuple(records), best, streamed=streamed)


# --- the model-level sink rate over texts (Gu et al. 2024) -------------------------------------------------

SINK_TOKENS = 64  # Gu et al. 2024 measure each text's first 64 tokens
MAX_SINK_TEXTS = 10_000


@dataclass(frozen=True)
class SinkRate(Result):
    """Gu et al. 2024's model-level sink rate Sink₁^ε over a corpus: the share of (text, layer, head) whose first
    token's importance (the mean weight it receives from the queries that can see it) is above ε, each text's
    first `tokens` tokens. `by_head` (L, H): the share of texts in which each head is a sink."""

    command: ClassVar[str] = "sinks"
    model: str
    epsilon: float
    tokens: int
    texts: int
    rate: float
    by_head: np.ndarray  # (L, H)

    def to_dict(self) -> dict:
        return {"model": self.model, "epsilon": self.epsilon, "tokens": self.tokens, "texts": self.texts,
                "sink_rate": self.rate, "by_layer": self.by_head.mean(axis=1).tolist(),
                "by_head": self.by_head.tolist()}

    def records(self) -> list[dict]:
        L, H = self.by_head.shape
        return [{"layer": n, "head": h, "sink_share": float(self.by_head[n, h])} for n in range(L) for h in range(H)]

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import records_table

        rows = [{"layer": n, "share": float(v)} for n, v in enumerate(self.by_head.mean(axis=1))]
        return [records_table(rows, [("layer", "layer", "d"), ("share", "sink heads (first token)", ".1%")],
                              f"{short_model(self.model)}: the first token as a sink, {self.texts} texts"),
                Line(f"Sink₁^{self.epsilon:g} (Gu et al. 2024) = {self.rate:.1%}: the share of heads, over "
                     f"{self.texts} texts (each its first {self.tokens} tokens), whose first token receives a mean "
                     f"weight above {self.epsilon:g} from the queries that can see it.")]

    def _repr_html_(self) -> str:
        return records_html([{"model": self.model, "texts": self.texts, "epsilon": self.epsilon,
                              "sink_rate": self.rate}], ["model", "texts", "epsilon", "sink_rate"],
                            f"{self.model}: Sink₁^ε (Gu et al. 2024)")


@borrows
@checked
def sink_rate(texts: Sequence[str], *, model: Any = None, tokenizer: Any = None, epsilon: float = SINK_EPSILON,
              tokens: int = SINK_TOKENS, device: str = "auto", dtype: str = "float32",
              reporter: Reporter | None = None) -> SinkRate:
    """Sink₁^ε (Gu et al. 2024, sail-sg/Attention-Sink compute_attention_sink) over `texts`: each text's first
    `tokens` tokens, the first token's importance per head, the share of heads above `epsilon`."""
    if not 0 < epsilon < 1:
        raise UsageError(f"{arg('epsilon')} must be above 0 and below 1; got {epsilon:g}", "epsilon")
    if not 2 <= tokens <= 4096:
        raise UsageError(f"{arg('tokens')} takes a whole number from 2 to 4096; got {tokens}", "tokens")
    if not texts:
        raise InputError("give at least one text", "texts")
    if len(texts) > MAX_SINK_TEXTS:
        raise InputError(f"{len(texts):,} texts: the sink rate takes at most {MAX_SINK_TEXTS:,}", "texts")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("sinks")
    from attnviz.engine.forward import encode, model_attentions
    from attnviz.engine.models import layers_and_heads

    L, H = layers_and_heads(loaded.model.config)
    counts = np.zeros((L, H))
    reporter = reporter or Reporter()
    with reporter.progress("Texts", len(texts), "texts") as step:
        for text in texts:
            check_text(text)
            encoded = encode(loaded, text, truncate=True)
            if len(encoded.tokens) > tokens:
                encoded = _first_tokens(encoded, tokens)
            alpha = model_attentions(loaded, encoded)  # (L, H, T, T)
            counts += sinks_of(alpha, bool(loaded.causal), epsilon)
            step(1)
    by_head = counts / len(texts)
    return SinkRate(loaded.name, epsilon, tokens, len(texts), float(by_head.mean()), by_head)


def _first_tokens(encoded, n: int):
    """An encoded text cut to its first n tokens (every input tensor along its token axis)."""
    from dataclasses import replace

    inputs = {k: (v[:, :n] if hasattr(v, "dim") and v.dim() == 2 else v) for k, v in encoded.inputs.items()}
    return replace(encoded, inputs=inputs, tokens=list(encoded.tokens)[:n], token_ids=list(encoded.token_ids)[:n],
                   special=list(encoded.special)[:n], special_kind=list(encoded.special_kind)[:n],
                   subword=list(encoded.subword)[:n], offsets=list(encoded.offsets)[:n] if encoded.offsets else None)
