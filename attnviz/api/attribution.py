"""What attention contributes, beyond where it looks: direct logit attribution per head (which heads write the
predicted token), split over the source tokens each head reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.data.capture import Capture
from attnviz.base.arguments import checked
from attnviz.api.notebook import records_html
from attnviz.errors import InputError, arg
from attnviz.metrics import strongest_paths
from attnviz.panels import head_grid_panel, Page, Panel, Scale, short_model
from attnviz.progress import Reporter
from attnviz.render.png import mixed_figure
from attnviz.base.text import check_text, shorten, visible

# The engine (torch, transformers) is imported inside the function, so that `import attnviz` never loads it.

__all__ = ["logit_attribution", "LogitAttribution", "HeadEffect", "LOGIT_TOLERANCE", "contributions",
           "Contributions", "MAX_ZEROING_TOKENS", "METHODS"]

MAX_ZEROING_TOKENS = 1024  # value zeroing runs the model once per token (in batches): T runs of T tokens
JSON_MAX_CELLS = 4_000_000  # --json holds every layer's scores and the rollout up to this many numbers (L·T²)
AGREEMENT_ROWS = 256  # the agreement of α and contribution is averaged over at most this many rows a layer
MAX_GRAPH_TOKENS = 200  # the contribution graph draws a column per token: at most this many
GRAPH_THRESHOLD = 0.05  # the contribution graph's edges: contributions at least this large
METHODS = ("alti", "value-zeroing")
METHOD_NAMES = {"alti": "ALTI", "value-zeroing": "value zeroing"}

LOGIT_TOLERANCE = 1e-4  # |rebuilt − logit| over max(1, |logit|): float64 sums of float32 parts


@dataclass(frozen=True)
class HeadEffect:
    """One head's direct effect on the target logit, the tokens its output raises and lowers most (through the
    unembedding), and the source tokens it carries that effect from (α_pj · effect of f_h(x_j), largest |·|)."""

    layer: int
    head: int
    effect: float
    promotes: tuple[str, ...]
    suppresses: tuple[str, ...]
    sources: tuple[tuple[str, float], ...]
    inputs: tuple[tuple[str, float], ...] = ()  # ALTI-Logit: the input tokens its effect comes from, largest |·|

    def to_dict(self) -> dict:
        return {"layer": self.layer, "head": self.head, "effect": self.effect, "promotes": list(self.promotes),
                "suppresses": list(self.suppresses),
                "sources": [{"token": t, "effect": e} for t, e in self.sources],
                "inputs": [{"token": t, "effect": e} for t, e in self.inputs]}


@dataclass(frozen=True)
class LogitAttribution:
    """The logit of `target` after `tokens[position]`, split into what each part of the model wrote into the
    residual stream, with the final norm's scale frozen (TransformerLens's `logit_attrs`):

        logit = Σ heads + Σ attention biases + Σ MLPs + embeddings + final bias        (`rebuilt`)

    heads (L, H): each head's direct effect; by_source (L, H, T): the same split over the source tokens the
    head reads (token j's stream at that layer); by_input (L, H, T): ALTI-Logit (Ferrando et al. 2023), the same
    effects traced back to the input tokens through ALTI's contributions of the layers below,
    by_input[l, h] = by_source[l, h] · C_(l−1) ··· C_0 (each C's rows sum to 1, so each head's effect is kept
    whole), or None where ALTI does not split this family's blocks (`alti_note` says why); top: the heads
    with the largest |effect|. Checks: `rebuilt` equals the model's own `logit` (`passed`);
    `output_diff` (each output projection rebuilt from the recomputed α and values), `stream_diff` (the parts
    rebuild the stream the final norm reads, over its size), `norm_diff` (the frozen norm rebuilds its
    output)."""

    model: str
    text: str
    tokens: tuple[str, ...]
    position: int
    target: str
    target_id: int
    logit: float
    probability: float
    rank: int  # of the target among the model's predictions (0: the top one)
    heads: np.ndarray  # (L, H)
    by_source: np.ndarray  # (L, H, T)
    attention_bias: np.ndarray  # (L,)
    mlps: np.ndarray  # (L,)
    embeddings: float
    final_bias: float
    top: tuple[HeadEffect, ...]
    output_diff: float
    stream_diff: float
    norm_diff: float
    by_input: np.ndarray | None = None  # (L, H, T)
    alti_note: str = ""

    @property
    def rebuilt(self) -> float:
        return float(self.heads.sum() + self.attention_bias.sum() + self.mlps.sum() + self.embeddings
                     + self.final_bias)

    @property
    def inputs(self) -> np.ndarray | None:
        """ALTI-Logit per input token: how much each one pushes the target's logit through all the heads (T,);
        they add up to the heads' total. None where ALTI does not apply."""
        return None if self.by_input is None else self.by_input.sum(axis=(0, 1))

    @property
    def difference(self) -> float:
        """|rebuilt − logit| over max(1, |logit|)."""
        return abs(self.rebuilt - self.logit) / max(1.0, abs(self.logit))

    @property
    def passed(self) -> bool:
        return self.difference <= LOGIT_TOLERANCE

    def records(self) -> list[dict]:
        """One record per layer and head: layer, head, effect (what --csv prints)."""
        L, H = self.heads.shape
        return [{"layer": n, "head": h, "effect": float(self.heads[n, h])} for n in range(L) for h in range(H)]

    def to_dict(self) -> dict:
        """What `attnviz logit-attr --json` prints."""
        return {"model": self.model, "text": self.text, "tokens": list(self.tokens), "position": self.position,
                "target": self.target, "target_id": self.target_id, "logit": self.logit,
                "probability": self.probability, "rank": self.rank, "rebuilt": self.rebuilt,
                "difference": self.difference, "passed": self.passed,
                "parts": {"heads": float(self.heads.sum()), "attention_biases": float(self.attention_bias.sum()),
                          "mlps": float(self.mlps.sum()), "embeddings": self.embeddings,
                          "final_bias": self.final_bias},
                "checks": {"output_diff": self.output_diff, "stream_diff": self.stream_diff,
                           "norm_diff": self.norm_diff},
                "top": [effect.to_dict() for effect in self.top], "heads": self.heads.tolist(),
                "mlps": self.mlps.tolist(), "attention_biases": self.attention_bias.tolist(),
                "alti_logit": None if self.by_input is None else {
                    "by_token": self.by_input.sum(axis=(0, 1)).tolist(), "by_head": self.by_input.tolist()},
                "alti_logit_note": self.alti_note}

    def _repr_html_(self) -> str:
        rows = [{"layer": e.layer, "head": e.head, "effect": round(e.effect, 3), "promotes": " ".join(e.promotes),
                 "suppresses": " ".join(e.suppresses)} for e in self.top]
        return records_html(rows, ["layer", "head", "effect", "promotes", "suppresses"],
                            f"{self.model}: which heads write {self.target!r}")

    def page(self) -> Page:
        """Two panels: every head's effect (layers × heads, centred on 0), and the top heads' effects split over
        the source tokens (top heads × tokens)."""
        bound = max(float(np.abs(self.heads).max()), 1e-9)
        title = f"{short_model(self.model)} · direct effect on the logit of {visible(self.target)!r}"
        grid = head_grid_panel(self.heads, Scale(-bound, bound, "effect on the logit"), title, "logit_attr",
                               short="each head's direct effect")
        grid = _diverging(grid)
        chosen = self.top[:8]
        split = np.array([self.by_source[e.layer, e.head] for e in chosen], np.float32)  # (K, T)
        edge = max(float(np.abs(split).max()) if split.size else 0.0, 1e-9)
        sources = _diverging(Panel(matrix=split, rows=tuple(f"{e.layer}.{e.head}" for e in chosen),
                                   cols=tuple(visible(t) for t in self.tokens), hidden=None,
                                   scale=Scale(-edge, edge, "effect through this token"), title=(title,),
                                   name="logit_attr_sources", short="the top heads' effect, by source token",
                                   row_axis="head (layer.head)", col_axis="source token"))
        notes = [f"logit {self.logit:.3f} = heads {self.heads.sum():.3f} + MLPs {self.mlps.sum():.3f} + "
                 f"embeddings {self.embeddings:.3f} + biases {self.attention_bias.sum() + self.final_bias:.3f} "
                 f"(rebuilt within {self.difference:.1e})"]
        panels = [grid, sources]
        if self.by_input is not None:
            traced = np.concatenate([self.by_input.sum(axis=(0, 1))[None],
                                     np.array([self.by_input[e.layer, e.head] for e in chosen])])
            reach = max(float(np.abs(traced).max()) if traced.size else 0.0, 1e-9)
            panels.append(_diverging(Panel(
                matrix=traced.astype(np.float32), rows=("all heads", *(f"{e.layer}.{e.head}" for e in chosen)),
                cols=tuple(visible(t) for t in self.tokens), hidden=None,
                scale=Scale(-reach, reach, "effect from this input token"), title=(title,),
                name="logit_attr_inputs", short="ALTI-Logit: traced back to the input tokens",
                row_axis="heads", col_axis="input token")))
            notes.append("ALTI-Logit (Ferrando et al. 2023): each head's effect through the token it reads, traced "
                         "to the input tokens by ALTI's contributions of the layers below")
        elif self.alti_note:
            notes.append(f"ALTI-Logit: {self.alti_note}")
        subtitle = f"“{visible(shorten(self.text, 300))}” → {visible(self.target)!r} (p = {self.probability:.2f})"
        return Page(panels=tuple(panels), title=title, name="attnviz_logit_attr", notes=tuple(notes),
                    subtitle=subtitle)

    def figure(self):
        return mixed_figure(self.page(), ncols=2)


def _diverging(panel: Panel) -> Panel:
    from dataclasses import replace

    return replace(panel, cmap="RdBu_r")


@borrows
@checked
def logit_attribution(text: str, *, model: Any = None, tokenizer: Any = None, target: str | int | None = None,
                      position: int = -1, top: int = 10, truncate: bool = True, device: str = "auto",
                      dtype: str = "float32", reporter: Reporter | None = None) -> LogitAttribution:
    """Direct logit attribution for a causal language model: how much each head (and each MLP, the embeddings
    and the biases) writes the logit of `target` (a token's text, e.g. " Paris", or its id; default: the
    model's own prediction) at `position` (default the last token), through the final norm with its scale
    frozen. Checked: the parts add up to the model's own logit within LOGIT_TOLERANCE. Beside it, ALTI-Logit:
    the heads' effects traced back to the input tokens (`by_input`, `inputs`)."""
    check_text(text)
    if not 1 <= top <= 100:
        raise InputError(f"{arg('top')} takes a whole number from 1 to 100; got {top}", "top")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head=True)
    loaded.require_single("logit attribution")
    from attnviz.engine.forward import encode
    from attnviz.engine.attribution.alti import alti_logit
    from attnviz.engine.attribution.logits import logit_parts, raised_and_lowered
    from attnviz.engine.memory import check_memory

    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.tokens)
    if not -T <= position < T:
        raise InputError(f"{arg('position')} {position} is out of range: the text is {T} tokens (0..{T - 1}, or -1 "
                         f"for the last)", "position")
    target_id = _target_id(loaded, target)
    check_memory(loaded, T, copies=4.0)
    with (reporter or Reporter()).status("Running the model and splitting the logit into its parts…"):
        parts, logits = logit_parts(loaded.model, encoded.inputs, position=position, target=target_id)
        by_input, alti_note = alti_logit(loaded.model, encoded.inputs, parts.by_source)
        L, H = parts.heads.shape
        order = np.argsort(-np.abs(parts.heads), axis=None)[:top]
        chosen = [(int(i // H), int(i % H)) for i in order]
        raised, lowered = raised_and_lowered(loaded.model, np.stack([parts.head_directions[n, h] for n, h in chosen]))

    def names(ids) -> tuple[str, ...]:
        return tuple(visible(loaded.tokenizer.decode([int(i)])) for i in ids)

    def largest(row: np.ndarray) -> tuple[tuple[str, float], ...]:
        return tuple((visible(encoded.tokens[j]), float(row[j])) for j in np.argsort(-np.abs(row), kind="stable")[:3])

    effects = [HeadEffect(n, h, float(parts.heads[n, h]), names(raised[k]), names(lowered[k]),
                          largest(parts.by_source[n, h]), largest(by_input[n, h]) if by_input is not None else ())
               for k, (n, h) in enumerate(chosen)]
    probabilities = np.exp(logits - logits.max())
    probabilities /= probabilities.sum()
    return LogitAttribution(
        model=loaded.name, text=text, tokens=tuple(encoded.tokens), position=parts.position,
        target=loaded.tokenizer.decode([parts.target]), target_id=parts.target, logit=parts.logit,
        probability=float(probabilities[parts.target]), rank=int((logits > logits[parts.target]).sum()),
        heads=parts.heads, by_source=parts.by_source, attention_bias=parts.attention_bias, mlps=parts.mlps,
        embeddings=parts.embeddings, final_bias=parts.final_bias, top=tuple(effects),
        output_diff=parts.output_diff, stream_diff=parts.stream_diff, norm_diff=parts.norm_diff,
        by_input=by_input, alti_note=alti_note)


def _target_id(loaded, target: str | int | None, field: str = "target") -> int | None:
    """The vocabulary id of `target`: an id, or a text that is exactly one token (" Paris"). `field`: the
    argument that gave it, named in errors."""
    if target is None:
        return None
    size = len(loaded.tokenizer)
    if isinstance(target, int):
        if not 0 <= target < size:
            raise InputError(f"{arg(field)} {target} is not a token id of {loaded.name} (0..{size - 1})", field)
        return target
    if not target:
        raise InputError(f"{arg(field)} is empty: give a token of the vocabulary, e.g. ' Paris'", field)
    ids = loaded.tokenizer.encode(target, add_special_tokens=False)
    if len(ids) != 1:
        pieces = " ".join(repr(visible(loaded.tokenizer.decode([i]))) for i in ids[:8])
        raise InputError(f"{arg(field)} {visible(target)!r} is {len(ids)} tokens for {loaded.name} ({pieces}): "
                         f"give one token (a leading space is part of a word's token in most causal models)", field)
    return int(ids[0])



@dataclass(frozen=True)
class Contributions:
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

    method: str
    capture: Capture
    alpha: Capture
    records: tuple[dict, ...]
    checks: np.ndarray | None = None  # (L,) ALTI's decomposition check
    distances: np.ndarray | None = None  # (L, T, T) value zeroing's 1 − cos
    streamed: bool = False

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
        return data

    def _repr_html_(self) -> str:
        from attnviz.api.notebook import framed

        return records_html(self.records, list(self.records[0]) if self.records else [],
                            f"{self.model}: contributions ({self.method}) beside α") + framed(
            self.html(command="attnviz in a notebook"))

    def html(self, token: int | None = None, *, threshold: float = GRAPH_THRESHOLD, command: str | None = None) -> str:
        """The interactive page: the views of α (head, model, matrix) and the contributions panel (the graph;
        choose a token: its strongest incoming paths, and how much of each input token reaches it by
        contribution and by α's rollout), `token` chosen first (default: the last that is not special). One
        self-contained HTML file."""
        from attnviz.metrics import rollout
        from attnviz.render.viewer import contribution_section, viewer_data, viewer_html

        T = self.capture.n_tokens
        if T > MAX_GRAPH_TOKENS:
            raise InputError(f"the contributions page draws a column per token, at most {MAX_GRAPH_TOKENS}; this "
                             f"text is {T} tokens")
        if not 0 < threshold <= 1:
            raise InputError(f"{arg('threshold')} takes a number above 0 and at most 1; got {threshold}", "threshold")
        chosen = self.default_token() if token is None else token
        if not -T <= chosen < T:
            raise InputError(f"{arg('token')} {chosen} is out of range: there are {T} tokens", "token")
        section = contribution_section(self.scores, self.rollout(), rollout(self.alpha), METHOD_NAMES[self.method],
                                       threshold, chosen % T)
        return viewer_html(viewer_data(self.alpha, command=command, contributions=section))

    def default_token(self) -> int:
        """The last token that is not special ([SEP], </s>): whose paths are shown first."""
        special = self.capture.special
        return max((i for i in range(self.capture.n_tokens) if not special[i]), default=self.capture.n_tokens - 1)

    def page(self, layer: int = -1) -> Page:
        """A layer's attention (the mean over its heads) beside its contributions, on one scale from 0 to 1."""
        from dataclasses import replace

        from attnviz.panels import attention_panels, text_subtitle
        from attnviz.base.selection import Selection

        chosen = Selection.parse(str(layer), "layer").indices(self.capture.n_layers)[:1]
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

    def figure(self, layer: int = -1):
        return mixed_figure(self.page(layer), ncols=2)

    def paths(self, token: int = -1, top: int = 5) -> list[tuple[float, tuple[int, ...]]]:
        """The `top` strongest paths of contribution into `token` at the top: (weight, (j_0, j_1, …, j_L)), the
        input token j_0 first, the weight the product of the layers' contributions along the path."""
        T = self.capture.n_tokens
        if not -T <= token < T:
            raise InputError(f"{arg('token')} {token} is out of range: there are {T} tokens", "token")
        if not 1 <= top <= 50:
            raise InputError(f"{arg('top')} takes a whole number from 1 to 50; got {top}", "top")
        return strongest_paths(self.scores, token % T, top)

    def graph(self, token: int = -1, *, threshold: float = GRAPH_THRESHOLD, top: int = 5):
        """The contribution graph (llm-transparency-tool's picture): tokens across, layers up, an edge where a
        contribution reaches `threshold`, and the strongest paths into `token` in colour. A matplotlib Figure."""
        from attnviz.render.charts import contribution_graph_figure

        if not 0 < threshold <= 1:
            raise InputError(f"{arg('threshold')} takes a number above 0 and at most 1; got {threshold}", "threshold")
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
                  stream: bool | None = None, truncate: bool = True, device: str = "auto", dtype: str = "float32",
                  reporter: Reporter | None = None) -> Contributions:
    """How much each token contributes to each token's output, layer by layer: `method` "alti" (Ferrando et
    al. 2022; one run of the model, checked against each attention block's output) or "value-zeroing"
    (Mohebbi et al. 2023; one run per token in batches, at most MAX_ZEROING_TOKENS tokens).

    `stream` (ALTI): True never asks the model for its L·H·T² weights and keeps the mean of α over heads
    instead, holding 4·(2·L + 4·H)·T² bytes (engine.memory.alti_bytes); None (the default) does so
    when the full path would pass the memory budget; False never does. Value zeroing does not stream."""
    check_text(text)
    if method not in METHODS:
        raise InputError(f"{arg('method')} takes one of {', '.join(METHODS)}; got {visible(method)!r}", "method")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("contributions")
    from attnviz.engine.forward import encode, make_capture, model_attentions
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.attribution.alti import alti
    from attnviz.engine.models import layers_and_heads
    from attnviz.engine.memory import alti_bytes, check_alti_memory, check_memory, memory_budget
    from attnviz.engine.attribution.zeroing import value_zeroing
    from attnviz.metrics import spearman

    if stream and method != "alti":
        raise InputError(f"value zeroing does not stream (it runs the model once per token, each run holding "
                         f"its α); use {arg('method', 'alti')} for a long input", "stream")
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.tokens)
    if method == "value-zeroing" and T > MAX_ZEROING_TOKENS:
        raise InputError(f"value zeroing runs the model once per token: {T} tokens is more than "
                         f"{MAX_ZEROING_TOKENS:,}; shorten the text, or use {arg('method', 'alti')}")
    budget = loaded.memory_budget or memory_budget()
    streamed = method == "alti" and (stream is True or (stream is None and alti_bytes(loaded, T, False) > budget))
    if method == "alti":
        check_alti_memory(loaded, T, streamed)
    else:  # value zeroing: a batch of 8 copies of the model's α
        check_memory(loaded, T, copies=8.0)
    base = getattr(loaded.model, "base_model", loaded.model)
    reporter = reporter or Reporter()
    checks = distances = None
    if method == "alti":
        with reporter.progress("Splitting each attention block's output into one part per token"
                               + (" (streamed)" if streamed else ""), layers_and_heads(loaded.model.config)[0],
                               "layers") as step:
            scores, checks, seen_alpha = alti(loaded.model, encoded.inputs, streamed=streamed,
                                              on_layer=step)  # α of the same pass
    else:
        with reporter.progress("Zeroing each token's value vectors", T, "tokens") as step:
            scores, distances = value_zeroing(loaded.model, encoded.inputs, adapter_for(base).modules(base),
                                              on_done=step)
        seen_alpha = model_attentions(loaded, encoded)  # the model's own α of the same tokens
    alpha = make_capture(loaded, encoded, seen_alpha, text, source="scratch, mean over heads" if streamed else "model")
    moved = make_capture(loaded, encoded, scores[:, None].astype(np.float32, copy=False), text,
                         source=METHOD_NAMES[method])
    del scores
    from dataclasses import replace

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
    return Contributions(method, moved, alpha, tuple(records), checks, distances, streamed)
