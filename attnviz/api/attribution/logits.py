"""logit-attr: which heads write the predicted token. Direct logit attribution per head (the logit split into one
part per head, MLP, the embeddings and the biases, through the final norm with its scale frozen), split over the
source tokens each head reads, and traced back to the input tokens (ALTI-Logit)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, shorten, visible
from attnviz.base.tokens import vocabulary_label
from attnviz.errors import InputError, arg, warn, UsageError
from attnviz.panels import Page, Panel, Scale, head_grid_panel, short_model
from attnviz.progress import Reporter
from attnviz.render.tables import records_html

__all__ = ["logit_attr", "LogitAttribution", "HeadEffect", "LOGIT_TOLERANCE", "target_id", "MISMATCH_EXIT"]

MISMATCH_EXIT = 3  # the parts do not add up to the model's logit

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
class LogitAttribution(Result):
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

    command: ClassVar[str] = "logit-attr"
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

    figure_name: ClassVar[str] = "attnviz_logit_attr.png"

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else MISMATCH_EXIT

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """The top heads (what each raises, lowers and reads from), the input tokens that push the target
        (ALTI-Logit), the parts adding up to the logit, and the check."""
        from attnviz.render.tables import records_table, verdict

        after = visible(self.tokens[self.position])

        def shown(token: str) -> str:  # a token's spaces made visible: where one token ends is never in doubt
            return token.replace(" ", "␣") or "∅"

        rows = [{"rank": n + 1, "head": f"{e.layer}.{e.head}", "effect": e.effect,  # one token to a line
                 "promotes": tuple(shown(t) for t in e.promotes[:3]),
                 "suppresses": tuple(shown(t) for t in e.suppresses[:3]),
                 "from": tuple(f"{shown(t)} ({v:+.2f})" for t, v in e.sources[:2])}
                for n, e in enumerate(self.top)]
        items: list = [records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""),
                                            ("effect", "effect", "+.3f"), ("promotes", "raises", ""),
                                            ("suppresses", "lowers", ""), ("from", "through", "")],
                                     f"{short_model(self.model)}: after {after!r}, the logit of "
                                     f"{visible(self.target)!r} (p = {self.probability:.2f}, rank {self.rank + 1}) "
                                     f"by head")]
        if self.by_input is not None:
            items.append(Line(f"Which input tokens push {visible(self.target)!r} (ALTI-Logit, Ferrando et al. 2023: "
                              f"each head's effect through the token it reads, traced back to the input by ALTI's "
                              f"contributions of the layers below):"))
            totals = self.by_input.sum(axis=(0, 1))
            for j in np.argsort(-np.abs(totals), kind="stable")[:8]:
                heads = self.by_input[:, :, j]
                strongest = np.argsort(-np.abs(heads), axis=None, kind="stable")[:2]
                through = ", ".join(f"{int(k // heads.shape[1])}.{int(k % heads.shape[1])} "
                                    f"{heads.flat[k]:+.2f}" for k in strongest)
                items.append(Line(f"  {j:>4}  {shown(visible(self.tokens[j])):<16} {totals[j]:+.3f}   through heads "
                                  f"{through}"))
        elif self.alti_note:
            items.append(Line(f"ALTI-Logit is left out: {self.alti_note}", style="dim"))
        biases = float(self.attention_bias.sum()) + self.final_bias
        items.append(Line(f"logit {self.logit:.3f} = heads {self.heads.sum():+.3f} + MLPs {self.mlps.sum():+.3f} + "
                          f"embeddings {self.embeddings:+.3f} + biases {biases:+.3f}"))
        items.append(verdict(self.passed, f"the parts add up to the model's own logit within {self.difference:.1e} "
                                          f"(tolerance {LOGIT_TOLERANCE:.0e}, relative)"))
        items.append(Line("effect: the head's output at this position, through the final norm (its scale frozen) and "
                          "the target's unembedding row; raises / lowers: the tokens its output pushes up and down "
                          "most (␣ is a space); through: the source tokens it reads that effect from (α times each "
                          "one's share).", style="dim"))
        return items

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

    def parts(self) -> list[tuple[str, float]]:
        """The logit and the parts that add up to it: heads, MLPs, embeddings, biases."""
        return [("heads", float(self.heads.sum())), ("MLPs", float(self.mlps.sum())),
                ("embeddings", float(self.embeddings)),
                ("biases", float(self.attention_bias.sum() + self.final_bias)), ("logit", float(self.logit))]

    def figure(self, *, ax=None):
        """The heads' direct effects, by source token and traced to the input, beside the logit part by part."""
        from attnviz.render.png import bars, mixed_figure

        labels, values = zip(*self.parts())
        return mixed_figure(self.page(), ncols=2, extra=lambda ax: bars(
            ax, labels, values, title=f"the logit of {visible(self.target)!r}, part by part",
            xlabel="contribution to the logit"), ax=ax)


def _diverging(panel: Panel) -> Panel:
    return replace(panel, cmap="RdBu_r")


@borrows
@checked
def logit_attr(text: str, *, model: Any = None, tokenizer: Any = None, target: str | int | None = None,
               position: int = -1, top: int = 10, truncate: bool = True, device: str = "auto",
               dtype: str = "float32", reporter: Reporter | None = None, run: Any = None) -> LogitAttribution:
    """Direct logit attribution for a causal language model: how much each head (and each MLP, the embeddings
    and the biases) writes the logit of `target` (a token's text, e.g. " Paris", or its id; default: the
    model's own prediction) at `position` (default the last token), through the final norm with its scale
    frozen. Checked: the parts add up to the model's own logit within LOGIT_TOLERANCE. Beside it, ALTI-Logit:
    the heads' effects traced back to the input tokens (`by_input`, `inputs`). (`run`: an attnviz.Run of this
    text, whose pass is read: attnviz.Run.logit_attr.)"""
    check_text(text)
    if not 1 <= top <= 100:
        raise UsageError(f"{arg('top')} takes a whole number from 1 to 100; got {top}", "top")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head=True)
    loaded.require_single("logit attribution")
    from attnviz.engine.forward import encode
    from attnviz.engine.attribution.alti import alti_logit, alti_points
    from attnviz.engine.attribution.logits import logit_parts, logit_points, raised_and_lowered
    from attnviz.engine.memory import fits

    encoded = encode(loaded, text, truncate=truncate) if run is None else run.encoded
    T = len(encoded.tokens)
    if not -T <= position < T:
        raise InputError(f"{arg('position')} {position} is out of range: the text is {T} tokens (0..{T - 1}, or -1 "
                         f"for the last)", "position")
    target_index = target_id(loaded, target)
    lean = not fits(loaded, T, copies=4.0)  # α would not fit: the long path, which holds the position's row only
    if lean:
        check_lean_logits(loaded, T)
    with (reporter or Reporter()).status("Running the model and splitting the logit into its parts…"):
        L = loaded.shape[0]
        recording = None if run is None or lean else run.recording(logit_points(L))
        parts, logits = logit_parts(loaded.model, encoded.inputs, position=position, target=target_index,
                                    recording=recording, lean=lean)
        if lean:
            by_input, alti_note = None, (f"it traces the heads back through every layer's α ({L} layers × "
                                         f"{loaded.shape[1]} heads × {T}² weights), which this long input runs "
                                         f"without; the heads' effects by source token are exact")
        elif run is not None and recording is not None and all(name in recording for name in alti_points(L)):
            by_input, alti_note = _traced(run, loaded, encoded, parts.by_source)
        else:  # alone, or a family whose blocks ALTI does not follow (alti_logit says so in its note)
            by_input, alti_note = alti_logit(loaded.model, encoded.inputs, parts.by_source)
        L, H = parts.heads.shape
        order = np.argsort(-np.abs(parts.heads), axis=None)[:top]
        chosen = [(int(i // H), int(i % H)) for i in order]
        raised, lowered = raised_and_lowered(loaded.model, np.stack([parts.head_directions[n, h] for n, h in chosen]))

    def names(ids) -> tuple[str, ...]:
        return tuple(vocabulary_label(loaded.tokenizer, int(i)) for i in ids)

    def largest(row: np.ndarray) -> tuple[tuple[str, float], ...]:
        return tuple((visible(encoded.tokens[j]), float(row[j])) for j in np.argsort(-np.abs(row), kind="stable")[:3])

    effects = [HeadEffect(n, h, float(parts.heads[n, h]), names(raised[k]), names(lowered[k]),
                          largest(parts.by_source[n, h]), largest(by_input[n, h]) if by_input is not None else ())
               for k, (n, h) in enumerate(chosen)]
    check_spelling(loaded, target, parts.target, logits)
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


def check_lean_logits(loaded: Any, T: int) -> None:
    """Refuse, before running, logit attribution on the long path whose holdings would not fit the budget: each
    layer's values (L·T·D float32), one layer's head outputs in float64 (H·T·D) and one block's activations."""
    from attnviz.engine.lean import block_activation_bytes
    from attnviz.engine.memory import check_parts

    config = loaded.model.config
    L, H = loaded.shape
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    check_parts(loaded, {"each layer's values": 4 * L * T * D, "one layer's head outputs in float64": 8 * H * T * D,
                         "one block's activations": block_activation_bytes(config, T)},
                f"logit attribution of {T} tokens without α (the model's own SDPA attention)",
                "shorten the text (on this path the memory grows linearly in the tokens)")


def _traced(run: Any, loaded: Any, encoded: Any, by_source: np.ndarray) -> tuple[np.ndarray | None, str]:
    """ALTI-Logit from a Run: ALTI's scores of its pass, made once for the run (contributions reads them too)."""
    from attnviz.engine.attribution.alti import alti, alti_points, traced_back
    from attnviz.errors import UnsupportedArchitectureError

    try:
        scores = run.memo("alti", lambda: alti(loaded.model, encoded.inputs,
                                               recording=run.recording(alti_points(loaded.shape[0]))))[0]
    except UnsupportedArchitectureError as exc:
        return None, str(exc)
    return traced_back(scores, by_source), ""


def check_spelling(loaded, target: str | int | None, token_id: int, logits: Any, field: str = "target") -> None:
    """Warn when `target`, given as a text, is not how the model most likely writes that word here: the same word
    with (or without) a leading space is one token too and scores higher in `logits` (V,). "Paris" and " Paris"
    are different tokens, and a causal model mostly predicts the second."""
    if not isinstance(target, str) or not target.strip():
        return
    other = target[1:] if target.startswith(" ") else " " + target
    ids = loaded.tokenizer.encode(other, add_special_tokens=False)
    if len(ids) != 1 or int(ids[0]) == token_id:
        return
    given, better = float(logits[token_id]), float(logits[int(ids[0])])
    if better > given:
        warn(f"{arg(field)} {visible(target)!r} is not how {loaded.name} most likely writes it here: "
             f"{visible(other)!r} scores higher (logit {better:.3f} against {given:.3f}); give {visible(other)!r} to "
             f"measure that one")


def target_id(loaded, target: str | int | None, field: str = "target") -> int | None:
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
