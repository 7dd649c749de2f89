"""What attention actually moves: value-weighted norms (Kobayashi et al. 2020) and the attention sinks they
judge (Gu et al. 2024)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnviz.base.arguments import checked
from attnviz.data.picture import Picture
from attnviz.api.models import borrows, for_input, resolve_model
from attnviz.base.blocks import row_shares
from attnviz.data.capture import Capture
from attnviz.api.notebook import records_html
from attnviz.errors import UsageError
from attnviz.metrics import sink_scores, Tokens
from attnviz.panels import attention_panels, head_grid_panel, Page, Scale, short_model, text_subtitle
from attnviz.progress import Reporter
from attnviz.render.png import mixed_figure, panel_figure
from attnviz.base.selection import Selection
from attnviz.base.text import check_text

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["norms", "Norms", "sinks", "Sinks"]


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
class Norms:
    """Value-weighted norms: how much key j actually moves query i, ‖α_ij·f_h(x_j)‖ with
    f_h(x) = (x·W_V^h + b_V^h)·W_O^h. `capture` holds each query's shares of those norms (L, H, T, T; rows sum
    to 1); `alpha` the weights α (L, H, T, T); `output_diff` per layer, the exact check that the parts add up
    to the attention block's own output. `records`: per layer, the share on special tokens and on the first
    token, by α and by norm."""

    capture: Capture
    alpha: np.ndarray  # (L, H, T, T) float32
    output_diff: np.ndarray  # (L,)
    records: tuple[dict, ...]

    @property
    def model(self) -> str:
        return self.capture.model

    def to_dict(self) -> list[dict]:
        """What `attnviz norms --json` prints: one record per layer."""
        return [dict(r) for r in self.records]

    def _repr_html_(self) -> str:
        return records_html(self.records, list(self.records[0]) if self.records else [], f"{self.model}: norms")

    def page(self, layer: int = -1, head: int | str = 0):
        """One head's α beside its value-weighted norms, as a Page of two panels."""

        capture = self.capture
        which_layer = Selection.parse(str(layer), "layer").indices(capture.n_layers)[:1]
        which_head = Selection.parse(str(head), "head", keywords=("mean", "max")).resolve(capture.n_heads)[:1]
        alpha_capture = replace(capture, attentions=self.alpha, meta={**capture.meta, "quantity": "alpha"}).validate()
        pair = [*attention_panels(alpha_capture, which_layer, which_head),
                *attention_panels(capture, which_layer, which_head)]
        pair = [replace(pair[0], short="α (the weights)"), replace(pair[1], short="‖α·f(x)‖ (what actually moves)")]
        title = f"{pair[0].title[0]}{pair[0].title[1]}: α beside value-weighted norms"
        return Page(panels=tuple(pair), title=title, name=f"attnviz_norms_{pair[0].name}",
                    subtitle=text_subtitle(capture),
                    notes=("Kobayashi et al. 2020: a key with a large α but a small value vector moves the query "
                           "little",))

    def figure(self, layer: int = -1, head: int | str = 0, *, cmap: str = "viridis"):
        return mixed_figure(self.page(layer, head), cmap=cmap, ncols=2)


@borrows
@checked
def norms(text: str | Picture, *, model: Any = None, tokenizer: Any = None, truncate: bool = True, device: str = "auto",
          dtype: str = "float32", reporter: Reporter | None = None) -> Norms:
    """Value-weighted norms of every layer and head (Kobayashi et al. 2020), with the exact check."""

    capture, result = _norms_capture(text, model, tokenizer, truncate, device, dtype, reporter, "norms")
    alpha = result.alpha[:, 0].astype(np.float64)  # (L, H, T, T)
    shares = row_shares(capture.attentions.astype(np.float64))
    special = np.asarray(capture.special)
    records = tuple({"layer": n, "alpha_on_special": float(alpha[n][..., special].sum(-1).mean()),
                     "norm_on_special": float(shares[n][..., special].sum(-1).mean()),
                     "alpha_on_first": float(alpha[n][..., 0].mean()), "norm_on_first": float(shares[n][..., 0].mean()),
                     "output_check": float(result.output_diff[n])} for n in range(capture.n_layers))
    return Norms(capture, result.alpha[:, 0].astype(np.float32), np.asarray(result.output_diff), records)


@dataclass(frozen=True)
class Sinks:
    """Attention sinks (Gu et al. 2024): keys that receive a large mean weight from the queries that can see
    them. `sinks`: one record per sink head (layer, head, key, token, sink_score, norm_score); `layers`: per
    layer, the sink heads, their share and tokens, and the mean scores; `best` (L, H): each head's largest
    sink score."""

    model: str
    threshold: float
    tokens: tuple[str, ...]
    layers: tuple[dict, ...]
    sinks: tuple[dict, ...]
    best: np.ndarray  # (L, H)

    @property
    def n_heads(self) -> int:
        return self.best.shape[1]

    def to_dict(self) -> dict:
        """What `attnviz sinks --json` prints."""
        return {"model": self.model, "threshold": self.threshold, "tokens": list(self.tokens),
                "layers": [dict(r) for r in self.layers], "sinks": [dict(r) for r in self.sinks]}

    def _repr_html_(self) -> str:
        return records_html(self.sinks, ["layer", "head", "key", "token", "sink_score", "norm_score"],
                            f"{self.model}: attention sinks (score > {self.threshold:g})")

    def panel(self):
        return head_grid_panel(self.best, Scale(0.0, 1.0, f"largest sink score (a sink above {self.threshold:g})"),
                               f"{short_model(self.model)} · attention sinks: each head's largest sink score",
                               "attnviz_sinks")

    def figure(self, *, cmap: str = "viridis"):
        """Each head's largest sink score, layers × heads."""

        return panel_figure(self.panel(), cmap=cmap)


@borrows
@checked
def sinks(text: str | Picture, *, model: Any = None, tokenizer: Any = None, threshold: float = 0.3,
          truncate: bool = True,
          device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Sinks:
    """Which tokens are sinks in which layers (a sink score above `threshold`, 0 to 1), and by value-weighted
    norms whether a sink actually moves anything."""
    if not 0.0 <= threshold <= 1.0:
        raise UsageError(f"threshold must be from 0 to 1, not {threshold}", "threshold")

    capture, result = _norms_capture(text, model, tokenizer, truncate, device, dtype, reporter, "sinks")
    alpha = result.alpha[:, 0].astype(np.float64)  # (L, H, T, T)
    shares = row_shares(capture.attentions.astype(np.float64))
    tokens = Tokens.of(capture)
    records: list[dict] = []
    per_layer = []
    best = np.zeros((capture.n_layers, capture.n_heads))  # each head's largest sink score
    for n in range(capture.n_layers):
        seen = tokens.at_layer(capture.windows, n)  # with the layer's sliding window, if it has one
        by_alpha = sink_scores(alpha[n].mean(axis=-2), seen)  # (H, T)
        by_norm = sink_scores(shares[n].mean(axis=-2), seen)
        best[n] = by_alpha.max(axis=-1)
        heads = []
        for h in range(capture.n_heads):
            key = int(by_alpha[h].argmax())
            if by_alpha[h, key] > threshold:
                heads.append(h)
                records.append({"layer": n, "head": h, "key": key, "token": capture.tokens[key],
                                "sink_score": float(by_alpha[h, key]), "norm_score": float(by_norm[h, key])})
        mine = [r for r in records if r["layer"] == n]
        counts: dict[str, int] = {}
        for r in mine:
            counts[f"{r['key']}:{r['token']}"] = counts.get(f"{r['key']}:{r['token']}", 0) + 1
        per_layer.append({"layer": n, "sink_heads": len(heads), "share": len(heads) / capture.n_heads,
                          "tokens": counts,
                          "alpha": float(np.mean([r["sink_score"] for r in mine])) if mine else 0.0,
                          "norm": float(np.mean([r["norm_score"] for r in mine])) if mine else 0.0})
    return Sinks(capture.model, threshold, tuple(capture.tokens), tuple(per_layer), tuple(records), best)
