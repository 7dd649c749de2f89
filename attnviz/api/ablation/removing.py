"""ablate: the model on a text with some heads removed, against the clean model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.selection import Selection, find_token, looks_like_pairs, pair_form, resolve_pairs, selection
from attnviz.base.text import check_text
from attnviz.engine.ablation import AblationRun
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import delta_layers, delta_page, short_model
from attnviz.progress import Reporter

__all__ = ["ablate", "Ablation", "MAX_MEAN_TEXTS", "ablation_model", "encoded_inputs", "head_names"]

MAX_MEAN_TEXTS = 10_000  # texts a mean ablation averages over


def ablation_model(model: Any, tokenizer: Any = None, *, device: str = "auto", dtype: str = "float32"):
    """A LoadedModel with its causal-LM head where it is a decoder, and where its heads can be removed."""
    from attnviz.engine.ablation import is_causal_lm, site

    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    if loaded.seq2seq:
        raise InputError(f"{loaded.name} is an encoder-decoder model; removing heads is shown for encoder-only "
                         f"and decoder-only models")
    if loaded.causal and not is_causal_lm(loaded.model):
        raise InputError(f"{loaded.name} is a decoder without its language-model head: load it with "
                         f"attnviz.load_model(name, lm_head=True) to see the next-token distributions")
    return loaded, site(loaded.model)


def encoded_inputs(loaded, texts: Sequence[str], truncate: bool) -> list[dict]:
    from attnviz.engine.forward import encode

    return [encode(loaded, text, truncate=truncate).inputs for text in texts]


def head_names(pairs, heads: int = 0) -> str:
    """5.11, 3.0 — or 2.all where every head of a layer is removed."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    return ", ".join(f"{layer}.all" if heads and len(set(hs)) == heads else ", ".join(f"{layer}.{h}" for h in hs)
                     for layer, hs in by_layer.items())


def removal_form(heads: Any, layer: Any):
    """`heads` and `layer` as written, their form checked before any model loads: layer.head pairs (a tuple), or
    (the head selection, the layer selection)."""
    if heads is None and layer is None:
        raise UsageError(f"name the heads to remove: {arg('heads', '5.11,3.0')} (layer.head), or {arg('layer', '5')} "
                         f"[{arg('heads', '0,3')}]", "heads")
    pairs = heads is not None and (not isinstance(heads, str) or looks_like_pairs(heads)) \
        and not (isinstance(heads, (list, tuple)) and all(isinstance(h, int) for h in heads))
    if pairs:
        if layer is not None:
            raise UsageError(f"{arg('heads')} as layer.head pairs names the layers already; leave out {arg('layer')}",
                             "layer")
        return pair_form(heads)
    if layer is None:
        raise UsageError(f"head indices need {arg('layer')} (or write layer.head pairs: 5.11,3.0)", "heads")
    return (selection("all" if heads is None else heads, "head", field="heads"),
            selection(layer, "layer", field="layer"))


def removed_heads(heads: Any, layer: Any, L: int, H: int) -> list[tuple[int, int]]:
    """`heads` as layer.head pairs ("5.11,3.0", or (layer, head) pairs), or as head indices (None: all) of the
    layers `layer`, within the model's L layers × H heads."""
    form = removal_form(heads, layer)
    if not isinstance(form[0], Selection):
        return resolve_pairs(form, L, H)
    chosen, layers = form
    return [(n, h) for n in layers.indices(L) for h in chosen.indices(H)]


@dataclass
class Ablation(AblationRun, Result):
    """The model on `text` with heads removed, against the clean model (the numbers: attnviz.engine's
    AblationRun): a causal LM's next-token distributions before and after at every position (`positions`), or
    an encoder's sentence embedding and each token's final hidden state (`token_states`); how every later
    layer's attention changed (`later_layers`); and the check against editing W_O's weights."""

    command: ClassVar[str] = "ablate"
    records: list[dict] = field(default_factory=list)  # per position: before and after (causal), or the states
    at: dict | None = None  # a causal LM: the position asked for, its 5 most likely next tokens before and after
    n_heads: int = 0

    @property
    def lean(self) -> bool:
        """Ran without α (a long input: the model's own SDPA attention; no Δα)."""
        return self.alpha_clean is None or self.alpha_removed is None

    @property
    def later_layers(self) -> list[dict]:
        if self.alpha_clean is None or self.alpha_removed is None:
            return []
        return delta_layers(self.alpha_removed - self.alpha_clean, self.first_layer)

    @property
    def relative_check(self) -> float:
        return self.check / max(self.scale, 1.0)

    @property
    def how(self) -> str:
        return "zero ablation" if self.mode == "zero" else f"mean ablation (means over {self.means_from})"

    def to_dict(self) -> dict:
        """What `attnviz ablate --json` prints."""
        data: dict = {"model": self.model, "text": self.text, "tokens": self.tokens, "removed": self.removed,
                      "mode": self.mode, "means_from": self.means_from or None, "kind": self.kind,
                      "positions" if self.kind == "causal" else "token_states": self.records,
                      "later_layers": self.later_layers,
                      "check": {"max_abs_diff": self.check, "relative": self.relative_check},
                      "without_alpha": self.lean}
        if self.kind == "causal":
            assert self.loss is not None
            data["loss"] = {"before": self.loss[0], "after": self.loss[1]}
            if self.at is not None:
                data["at"] = self.at
        else:
            data["sentence_cosine"] = self.cosine
        return data

    def page(self):
        """Δα of every later layer (None when no layer follows the heads removed, or it ran without α)."""
        if self.alpha_clean is None or self.alpha_removed is None:
            return None
        return delta_page(self.alpha_removed - self.alpha_clean, self.tokens, self.kind == "causal",
                          after=self.first_layer,
                          title=f"{short_model(self.model)} · Δα after removing "
                                f"{head_names(self.removed, self.n_heads)} ({self.mode})")

    @property
    def figure_name(self) -> str:
        page = self.page()
        return f"{page.name if page is not None else 'attnviz_ablate'}.png"

    def figure(self, *, ax=None):
        """Δα of every later layer, diverging around 0."""
        from attnviz.render.png import mixed_figure

        page = self.page()
        if page is None:
            raise UsageError(f"{len(self.tokens):,} tokens ran without α: there is no Δα to draw" if self.lean else
                             "no layer follows the heads removed: there is no Δα to draw", "output")
        return mixed_figure(page, cmap="RdBu_r", ax=ax)

    def report(self, *, width: int = 100, color: bool = False, terminal: bool = False, **style: Any) -> list:
        """What changed: the loss and each position's prediction (a causal LM) or each token's state (an
        encoder), how the later layers' attention changed, the check; `terminal`: Δα drawn too."""
        from attnviz.render.tables import records_table

        title = f"{short_model(self.model)} · removed {head_names(self.removed, self.n_heads)} · {self.how}"
        items: list = [Line(title, style="bold")]
        if self.kind == "causal":
            assert self.loss is not None
            before, after = self.loss
            items.append(Line(f"next-token loss over the text: {before:.3f} → {after:.3f} nats ({after - before:+.3f})",
                              wrap=False))
            items.append(records_table(self.records, [("position", "pos", "d"), ("token", "token", ""),
                                                      ("top_before", "top before", ""), ("p_before", "p", ".3f"),
                                                      ("top_after", "top after", ""), ("p_after", "p", ".3f"),
                                                      ("p_top_after", "p(top before) after", ".3f"),
                                                      ("kl", "KL", ".3f")],
                                       "what the model predicts next, before and after",
                                       "KL(p_clean ‖ p_removed) in nats; p: probability of that token"))
            if self.at is not None:
                items.append(_at_table(self.at))
        else:
            items.append(Line(f"sentence embedding (mean over tokens): cosine before/after {self.cosine:.4f}",
                              wrap=False))
            items.append(records_table(self.records, [("position", "pos", "d"), ("token", "token", ""),
                                                      ("cosine", "cosine", ".4f"), ("change", "‖Δh‖/‖h‖", ".3f")],
                                       "each token's final hidden state, before and after"))
        later = self.later_layers
        if self.lean:
            items.append(Line(f"Ran without α: {len(self.tokens):,} tokens' attention weights would not fit the memory "
                              f"budget, so the runs used the model's own SDPA attention and how the later layers' "
                              f"attention changed (Δα) is not measured; shorten the text or raise --max-memory "
                              f"for it", style="dim"))
        elif later:
            items.append(records_table(later, [("layer", "layer", "d"), ("max_abs_delta", "max |Δα|", ".3f"),
                                               ("mean_abs_delta", "mean |Δα|", ".4f"),
                                               ("most_changed_head", "most changed head", "d")],
                                       "how the later layers' attention changed (α removed − α clean)"))
        else:
            items.append(Line("no layer follows the heads removed, so no attention changed", style="dim", wrap=False))
        items.append(Line(f"Check: the same heads removed by editing W_O's weights give the same outputs to within "
                          f"{self.check:.1e} ({self.relative_check:.1e} of their largest value).", style="dim"))
        page = self.page()
        if terminal and page is not None:
            from attnviz.render.terminal import panels_side_by_side

            shown = [replace(p, values=False) for p in page.panels]  # signed values do not fit a terminal cell
            items.append(panels_side_by_side(shown, width=width, color=color, cmap="RdBu_r"))
        return items


def _at_table(record: dict):
    from attnviz.render.tables import records_table

    rows = [{"rank": n + 1, "before": b["token"], "p_before": b["p"], "after": a["token"], "p_after": a["p"]}
            for n, (b, a) in enumerate(zip(record["before"], record["after"]))]
    return records_table(rows, [("rank", "#", "d"), ("before", "before", ""), ("p_before", "p", ".3f"),
                                ("after", "after", ""), ("p_after", "p", ".3f")],
                         f"after token {record['position']} ({record['token']}): the 5 most likely next tokens "
                         f"(KL {record['kl']:.3f} nats)")


def _position_records(run: AblationRun, decode) -> list[dict]:
    """One record per position: a causal LM's next-token prediction before and after, or an encoder's token
    states."""
    records = []
    for i, token in enumerate(run.tokens):
        if run.kind == "causal":
            assert run.top_before is not None and run.top_after is not None and run.p_top is not None
            assert run.probs5 is not None and run.kl is not None
            records.append({"position": i, "token": token, "top_before": decode(run.top_before[i]),
                            "p_before": float(run.p_top[i, 0]), "top_after": decode(run.top_after[i]),
                            "p_after": float(run.probs5[i, 1, 0]), "p_top_after": float(run.p_top[i, 1]),
                            "kl": float(run.kl[i])})
        else:
            assert run.token_cosine is not None and run.token_change is not None
            records.append({"position": i, "token": token, "cosine": float(run.token_cosine[i]),
                            "change": float(run.token_change[i])})
    return records


def _at_record(run: AblationRun, decode, i: int) -> dict:
    assert run.top5 is not None and run.probs5 is not None and run.kl is not None
    top5, probs5 = run.top5, run.probs5

    def top(k: int) -> list[dict]:
        return [{"token": decode(t), "p": float(p)} for t, p in zip(top5[i, k], probs5[i, k])]

    return {"position": i, "token": run.tokens[i], "kl": float(run.kl[i]), "before": top(0), "after": top(1)}


@borrows
@checked
def ablate(text: str, *args: Any, heads: Any = None, layer: Any = None, model: Any = None, tokenizer: Any = None,
           mode: str = "zero", mean_over: Sequence[str] | None = None, at: str | int | None = None,
           truncate: bool = True, device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None) -> Ablation:
    """The model on `text` with `heads` removed ("5.11,3.0", or (layer, head) pairs; or head indices, None for
    all, of the layers `layer`) against the clean model: next-token distributions (a causal LM) or the sentence
    embedding and each token's hidden state (an encoder), and every later layer's Δα. `mode`: "zero", or "mean"
    (each head's mean output over the text's tokens, or over the texts `mean_over`). `at` (a causal LM): the
    position (an index, -1 the last, or a token's text) whose 5 most likely next tokens are listed."""
    from attnviz.engine.ablation import MODES, ablate as run_ablation, head_means
    from attnviz.engine.ablation.removing import ablate_lean
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory, fits

    if args:  # ablate(text, heads): the spelling before heads became keyword-only
        if len(args) > 1 or heads is not None:
            raise UsageError("ablate takes the text, then everything else by keyword: ablate(text, heads=…)", "heads")
        import warnings

        warnings.warn("attnviz.ablate(text, heads) is now attnviz.ablate(text, heads=heads); the positional "
                      "spelling goes in a later release", DeprecationWarning, stacklevel=3)
        heads = args[0]
    check_text(text)
    if mode not in MODES:
        raise UsageError(f"{arg('mode')} is one of {', '.join(MODES)}, not {str(mode)[:20]!r}", "mode")
    if mean_over is not None and mode != "mean":
        raise UsageError(f"{arg('mean_over')} gives the means of {arg('mode', 'mean')}; add {arg('mode', 'mean')}",
                         "mean_over")
    reporter = reporter or Reporter()
    removal_form(heads, layer)  # their form, before the model loads (their range needs it)
    loaded, where = ablation_model(model, tokenizer, device=device, dtype=dtype)
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.tokens)
    lean = not fits(loaded, T, copies=2.0)  # α would not fit: the long path, without Δα
    if lean:
        check_lean_ablation(loaded, T, where)
    else:
        check_memory(loaded, T, copies=2.0)
    removed = removed_heads(heads, layer, where.layers, where.heads)
    fills, source = None, "the text"
    if mode == "mean" and mean_over is not None:
        texts = [t for t in mean_over if t.strip()][:MAX_MEAN_TEXTS]
        if not texts:
            raise InputError("the texts to average each head's output over are all empty")
        fills, source = head_means(where, encoded_inputs(loaded, texts, truncate)), f"{len(texts)} texts"
    with reporter.status(f"Running the model with {len(removed)} head{'s' if len(removed) != 1 else ''} removed…"):
        run = (ablate_lean if lean else run_ablation)(where, encoded.inputs, removed, mode=mode, fills=fills,
                                                      means_from=source)
    run.tokens, run.token_ids = list(encoded.tokens), list(encoded.token_ids)
    run.model, run.text = loaded.name, text
    position = None
    if at is not None:
        if run.kind != "causal":
            raise UsageError(f"{arg('at')} shows a causal LM's next-token distribution; this model is an encoder",
                             "at")
        position = find_token(run.tokens, str(at), "at")

    def decode(token_id) -> str:
        return str(loaded.tokenizer.decode([int(token_id)]))

    return Ablation(**{f.name: getattr(run, f.name) for f in fields(run)}, records=_position_records(run, decode),
                    at=None if position is None else _at_record(run, decode, position), n_heads=where.heads)


def check_lean_ablation(loaded: Any, T: int, where: Any) -> None:
    """Refuse, before running, an ablation on the long path whose holdings would not fit the budget: the three
    runs' final states (3·T·D float32), a causal LM's next-token distributions of a block of positions (eight
    (positions, V) float64 tensors at once), one block's activations."""
    from attnviz.engine.ablation.removing import distribution_positions
    from attnviz.engine.ablation.runs import is_causal_lm
    from attnviz.engine.lean import block_activation_bytes
    from attnviz.engine.memory import check_parts

    config = loaded.model.config
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or getattr(config, "dim", 0) or 1024)
    parts = {"the three runs' final states": 3 * 4 * T * D}
    if is_causal_lm(where.model):
        V = int(loaded.model.get_output_embeddings().weight.shape[0])
        parts["a block of positions' next-token distributions"] = 8 * 8 * V * min(T, distribution_positions(V))
    parts["one block's activations"] = block_activation_bytes(config, T)
    check_parts(loaded, parts,
                f"removing heads on {T:,} tokens without α (the model's own SDPA attention)",
                "shorten the text (on this path the memory grows linearly in the tokens)")
