"""circuits: QK and OV circuits from the weights alone (Elhage et al. 2021): copying heads and how heads compose."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import visible
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter
from attnviz.render.tables import records_html

__all__ = ["circuits", "Circuits", "common_tokens", "CIRCUIT_TOKENS", "MAX_CIRCUIT_TOKENS", "COMPOSITIONS"]

CIRCUIT_TOKENS = 2000  # the vocabulary's tokens the OV and QK circuits are read on
MAX_CIRCUIT_TOKENS = 20000
COMPOSITIONS = ("q", "k", "v")


@dataclass(frozen=True)
class Circuits(Result):
    """QK and OV circuits from the weights alone (Elhage et al. 2021). `copying` (L, H): each head's OV circuit
    on the chosen tokens by its eigenvalues, Σλ / Σ|λ| (1: it copies the token it attends to into the output,
    −1: it suppresses it); `positive` (L, H): the share of the eigenvalues' size with a positive real part;
    `qk`: per layer and head, the strongest (query token, key token) pairs of its QK circuit; `composition`:
    {"q"|"k"|"v": (L, H, L, H)}, how much the receiver head (second pair of axes, a later layer) reads what
    the sender head (first pair) writes, through its queries, keys or values (0 to 1)."""

    command: ClassVar[str] = "circuits"
    model: str
    tokens: int  # how many tokens of the vocabulary the circuits are read on
    copying: np.ndarray  # (L, H)
    positive: np.ndarray  # (L, H)
    qk: tuple
    composition: dict
    listed: int = 8  # heads and head pairs the report lists

    figure_name: ClassVar[str] = "attnviz_circuits.png"

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """The heads that copy most, with their strongest QK pair; the most anti-copying; each composition's
        strongest pairs."""
        from attnviz.render.tables import records_table

        top = self.listed
        rows = []
        for n, t in enumerate(self.top_copying(top)):
            pair = self.qk[t["layer"]][t["head"]][0]
            rows.append({"rank": n + 1, "head": f"{t['layer']}.{t['head']}", "copying": t["copying"],
                         "positive": t["positive"], "pair": f"{pair['query']!r} → {pair['key']!r}"})
        items: list = [records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""),
                                            ("copying", "copying Σλ/Σ|λ|", "+.3f"), ("positive", "λ > 0", ".0%"),
                                            ("pair", "strongest QK pair (query → key)", "")],
                                     f"{short_model(self.model)}: the heads that copy most (OV circuit on "
                                     f"{self.tokens:,} tokens)")]
        least = min(self.top_copying(self.shape[0] * self.shape[1]), key=lambda r: r["copying"])
        items.append(Line(f"Most anti-copying: {least['layer']}.{least['head']} ({least['copying']:+.3f}). Mean over "
                          f"heads: {float(self.copying.mean()):+.3f}."))
        for mode, what in (("q", "queries"), ("k", "keys"), ("v", "values")):
            pairs = [{"sender": r["sender"], "receiver": r["receiver"], "score": r["score"]}
                     for r in self.top_composition(mode, top)]
            items.append(records_table(pairs, [("sender", "sender", ""), ("receiver", "receiver", ""),
                                               ("score", "score", ".4f")],
                                       f"{mode.upper()}-composition: the receiver's {what} read the sender's output"))
        items.append(Line("From the weights alone: each norm's gain folded in, its normalisation, biases and rotary "
                          "positions left out; W_U centred over the vocabulary. Composition: ‖OV_sender · R‖ / "
                          "(‖OV_sender‖ ‖R‖), R the receiver's QK (Q), QKᵀ (K) or OV (V).", style="dim"))
        return items

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

    def figure(self, *, ax=None):
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(), ncols=2, ax=ax)


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
def circuits(*, model: Any = None, tokenizer: Any = None, tokens: int = CIRCUIT_TOKENS, pairs: int = 3,
             listed: int = 8, device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None,
             top: int | None = None) -> Circuits:
    """QK and OV circuits of every head from the weights alone (Elhage et al. 2021; TransformerLens's
    FactoredMatrix, all_composition_scores): the OV copying score on the vocabulary's first `tokens` tokens that
    are words, each head's `pairs` strongest QK token pairs, and Q-, K-, V-composition between heads of different
    layers. A model with its output head (a causal LM); grouped key/value heads mapped to their query heads.
    `listed`: the heads and head pairs the report lists (the command line's --listed). `top`: the old name of
    `pairs` (a DeprecationWarning)."""
    if top is not None:
        import warnings

        warnings.warn("circuits(top=…) is now circuits(pairs=…), as the command line says it (--pairs); the old "
                      "name goes in a later release", DeprecationWarning, stacklevel=2)
        pairs = top
    if not 1 <= listed <= 50:
        raise UsageError(f"{arg('listed')} takes 1 to 50; got {listed}", "listed")
    if not 10 <= tokens <= MAX_CIRCUIT_TOKENS:
        raise UsageError(f"{arg('tokens')} takes 10 to {MAX_CIRCUIT_TOKENS:,} tokens; got {tokens}", "tokens")
    if not 1 <= pairs <= 50:
        raise UsageError(f"{arg('pairs')} takes 1 to 50 pairs; got {pairs}", "pairs")
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
        strongest = qk_pairs(weights, vocab, pairs)
    with reporter.status("Q-, K- and V-composition of every pair of heads…"):
        scores = composition(weights)
    tok = loaded.tokenizer
    named = tuple(tuple(tuple({"query": visible(tok.decode([a])), "key": visible(tok.decode([b])), "score": s}
                              for a, b, s in head) for head in layer) for layer in strongest)
    return Circuits(loaded.name, len(vocab), score, positive, named, scores, listed)
