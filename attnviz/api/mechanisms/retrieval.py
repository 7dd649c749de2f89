"""retrieval: retrieval heads (Wu et al. 2024), which heads copy a needle out of a haystack, and removing them."""

from __future__ import annotations

from collections.abc import Sequence
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

__all__ = ["retrieval", "RetrievalHeads", "RETRIEVAL_LENGTHS", "RETRIEVAL_DEPTHS", "MAX_RETRIEVAL_TOKENS"]

RETRIEVAL_LENGTHS = (300, 600, 1200)  # tokens, about: a few hundred to over a thousand
RETRIEVAL_DEPTHS = (0.1, 0.5, 0.9)
MAX_RETRIEVAL_TOKENS = 16384


@dataclass(frozen=True)
class RetrievalHeads(Result):
    """Retrieval heads (Wu et al. 2024): on needle-in-a-haystack prompts, each head's share of the needle it
    copies while the model writes the answer — a step counts when the head's most-attended key lies in the
    needle and holds the token just written — averaged over the prompts answered correctly. `scores` (L, H);
    `prompts`: one record per prompt; `causal`: the share of answer tokens the model still predicts
    (teacher-forced) with nothing removed, with the `removed` top heads removed, and with as many random
    heads removed (`random`, one value per draw)."""

    command: ClassVar[str] = "retrieval"
    model: str
    scores: np.ndarray  # (L, H)
    prompts: tuple[dict, ...]
    removed: tuple[tuple[int, int], ...]
    causal: dict | None
    seed: int
    listed: int = 10  # heads the report lists

    figure_name: ClassVar[str] = "attnviz_retrieval.png"

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """The prompts and what the model wrote, the top heads by retrieval score, and the causal test."""
        from attnviz.render.tables import records_table

        prompts = [{"tokens": p["tokens"], "depth": p["depth"], "answer": p["answer"].strip(),
                    "response": p["response"].strip(), "ok": "yes" if p["retrieved"] else "no"}
                   for p in self.prompts]
        rows = [{"rank": n + 1, "head": f"{t['layer']}.{t['head']}", "score": t["score"]}
                for n, t in enumerate(self.top(self.listed))]
        items: list = [records_table(prompts, [("tokens", "tokens", "d"), ("depth", "needle at", ".0%"),
                                               ("answer", "answer", ""), ("response", "written", ""),
                                               ("ok", "right", "")],
                                     f"{short_model(self.model)}: {len(self.prompts)} needles, {self.answered} found"),
                       records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""),
                                            ("score", "retrieval score", ".3f")], "retrieval heads (Wu et al. 2024)"),
                       Line("retrieval score: per prompt answered correctly, the steps at which the head's "
                            "most-attended key lies in the needle and holds the token just written, over the "
                            "needle's length in tokens; averaged.", style="dim")]
        causal = self.causal
        if causal is not None:
            random = [r["accuracy"] for r in causal["random"]]
            shown = (f"; {len(random)} random sets of {causal['heads']}: {np.mean(random):.0%} on average "
                     f"({min(random):.0%}–{max(random):.0%})") if random else ""
            items.append(Line(f"Causal test, answer tokens still predicted over {causal['prompts']} prompts: nothing "
                              f"removed {causal['none']['accuracy']:.0%}; the top {causal['heads']} heads removed "
                              f"{causal['top']['accuracy']:.0%}{shown}."))
        elif not self.answered:
            items.append(Line("The model answered no prompt correctly: no head can be scored (shorter --lengths?)."))
        return items

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

    def figure(self, *, ax=None):
        """Each head's retrieval score, layers × heads."""
        from attnviz.panels import head_grid_panel, Scale
        from attnviz.render.png import panel_figure

        top = max(float(self.scores.max()), 1e-9)
        return panel_figure(head_grid_panel(self.scores, Scale(0.0, top, "retrieval score (share of the needle "
                                                                          "copied)"),
                                            f"{short_model(self.model)} · retrieval heads (Wu et al. 2024), "
                                            f"{self.answered} of {len(self.prompts)} prompts answered",
                                            "attnviz_retrieval"), ax=ax)


def check_lean_retrieval(loaded: Any, T: int) -> None:
    """Refuse, before running, a needle prompt whose long path would not fit the budget: the KV cache (at most
    2·L·T·D float32) and one block's activations while the prompt fills it, linear in T."""
    from attnviz.engine.lean import block_activation_bytes
    from attnviz.engine.memory import check_parts

    config = loaded.model.config
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    check_parts(loaded, {"the KV cache": 8 * loaded.shape[0] * T * D,
                         "one block's activations": block_activation_bytes(config, T)},
                f"a needle prompt of {T} tokens without α (the model's own SDPA attention)",
                "shorten the haystacks (--lengths)")


@borrows
@checked
def retrieval(*, model: Any = None, tokenizer: Any = None, lengths: Sequence[int] = RETRIEVAL_LENGTHS,
              depths: Sequence[float] = RETRIEVAL_DEPTHS, remove: int = 10, draws: int = 5, seed: int = 0,
              top: int = 10, device: str = "auto", dtype: str = "float32",
              reporter: Reporter | None = None) -> RetrievalHeads:
    """Retrieval heads of a causal LM (Wu et al. 2024): a needle-in-a-haystack prompt for each of `lengths`
    (tokens, about) × `depths` (where the needle sits, 0 first to 1 last), made from `seed`; each head's
    retrieval score; and the causal test: the `remove` top heads removed against as many random heads
    (`draws` draws), measured by the answer tokens the model still predicts. remove=0 skips the test. `top`: the
    heads the report lists."""
    if not 1 <= top <= 100:
        raise UsageError(f"{arg('top')} takes 1 to 100 heads; got {top}", "top")
    if not lengths or any(not 60 <= n <= MAX_RETRIEVAL_TOKENS for n in lengths):
        raise UsageError(f"{arg('lengths')} takes lengths from 60 to {MAX_RETRIEVAL_TOKENS:,} tokens", "lengths")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise UsageError(f"{arg('depths')} takes depths from 0 (the needle first) to 1 (last)", "depths")
    if remove < 0 or draws < 0 or draws > 100:
        raise UsageError(f"{arg('remove')} takes 0 or more heads and {arg('draws')} 0 to 100 draws", "remove")
    if not 0 <= seed <= 2**32 - 1:  # the command line's range
        raise UsageError(f"{arg('seed')} takes a whole number from 0 to 4,294,967,295; got {seed}", "seed")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("retrieval")
    from attnviz.engine.ablation import is_causal_lm
    from attnviz.engine.ablation.seam import every_head, site
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import fits
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
            if not fits(loaded, T, copies=0.0):  # the prompt's attention would not fit: it runs without α
                where.lean = True
                check_lean_retrieval(loaded, T)
            ids = encoded.inputs["input_ids"]
            full = encode(loaded, stack.prompt + stack.answer, truncate=False).token_ids
            answer = list(full[T:]) if list(full[:T]) == list(encoded.token_ids) else []
            if not answer:
                raise InputError("the tokenizer splits the prompt differently once the answer follows it")
            span = needle_span(encoded.offsets or [], stack.needle_at, stack.needle_at + len(stack.needle))
            written, hits, _ = retrieval_hits(loaded.model, ids, span, max_new=len(answer) + 2,
                                              lean=not fits(loaded, T, copies=0.0))
            response = tok.decode(written)
            retrieved = stack.answer.strip() in response
            runs.append((ids, answer, hits / (span[1] - span[0]), retrieved))
            records.append({"tokens": T, "length": stack.length, "depth": stack.depth, "needle": stack.needle,
                            "needle_tokens": [span[0], span[1]], "answer": stack.answer,
                            "response": visible(response), "retrieved": retrieved})
            step(1)
    kept = [r[2] for r in runs if r[3]]
    scores = np.mean(kept, axis=0) if kept else np.zeros((L, H))
    result = RetrievalHeads(loaded.name, scores, tuple(records), (), None, seed, top)
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
