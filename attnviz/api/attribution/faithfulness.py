"""faithfulness: which explanation to trust. Every attribution attnviz gives for one prediction (α, rollout,
attention flow, ALTI, ALTI-Logit, value zeroing, gradient × input, integrated gradients, leave-one-out) put to
the same tests: ERASER's comprehensiveness and sufficiency with their AOPC (DeYoung et al. 2020), agreement
with leave-one-out (Kendall's τ), a random baseline it must beat, and the sanity check of cascading
parameter randomisation (Adebayo et al. 2018)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.attribution.faithfulness_corpus import (corpus_result, FaithfulnessCorpus, MIN_INTERVAL_TEXTS,
                                                         MIN_SIGNIFICANT_TEXTS, SIGNIFICANCE, summary)
from attnviz.api.attribution.faithfulness_methods import baseline_token, distinct_f, method_scores
from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, visible
from attnviz.errors import InputError, UnsupportedArchitectureError, UsageError, arg
from attnviz.metrics.faithfulness import BINS
from attnviz.progress import Reporter

__all__ = ["faithfulness", "Faithfulness", "FaithfulnessCorpus", "MethodFaithfulness", "RandomBaseline",
           "FAITHFULNESS_METHODS", "MAX_CORPUS_TEXTS",
           "MAX_FAITHFULNESS_TOKENS", "COMPLETENESS_TOLERANCE"]

FAITHFULNESS_METHODS = ("attention", "rollout", "flow", "alti", "alti-logit", "value-zeroing", "grad-x-input",
                        "integrated-gradients", "loo", "random")
CAUSAL_ONLY = ("alti-logit",)
MAX_FAITHFULNESS_TOKENS = 256  # leave-one-out runs the text once per token, flow a max-flow per token pair
MAX_ORDERS = 10_000
MAX_CORPUS_TEXTS = 10_000  # texts measured in one call (each runs every method and every erasure)
COMPLETENESS_TOLERANCE = 0.02  # |Σ IG − (f(x) − f(baseline))| / max(|f(x) − f(baseline)|, 0.01) at 400 points
COMPLETE_WITHIN = 0.1  # the report warns when integrated gradients miss completeness by more than this share
BEATS_SD = 2.0  # a method beats random when it is this many of the random orders' sd better than their mean
SANITY_MAX_RHO = 0.3  # a method passes the sanity check when |ρ| with the randomised model's scores is at most this
TIE = 1e-12  # AOPCs this close are one result (the same tokens erased): a tie, said as one
DEFAULT_SANITY = 1  # one depth: the whole model randomised (what the verdict reads); more draw the cascade
DEFAULT_STEPS = 20  # integrated gradients' points; the completeness line says when more are needed
DESCRIBE = {"attention": "α of the last layer, mean over heads",
            "rollout": "attention rollout (Abnar & Zuidema 2020)",
            "flow": "attention flow, max-flow through the layers (Abnar & Zuidema 2020)",
            "alti": "ALTI contributions, rolled out (Ferrando et al. 2022)",
            "alti-logit": "ALTI-Logit, the heads' logit effects traced to the inputs (Ferrando et al. 2023)",
            "value-zeroing": "value zeroing, rolled out (Mohebbi et al. 2023)",
            "grad-x-input": "gradient × input on the embeddings (Captum InputXGradient)",
            "integrated-gradients": "integrated gradients on the embeddings (Captum; zero baseline)",
            "loo": "leave-one-out: the drop in f when the token is deleted",
            "random": "random orders: the baseline a method must beat"}


@dataclass(frozen=True)
class MethodFaithfulness:
    """One method's scores (T,) and how faithful they are. `comprehensiveness` / `sufficiency`: per bin
    (fraction, positions erased / kept, f); the AOPCs their means of f_full − f; `kendall_tau_loo` its τ-b with
    leave-one-out over the erasable tokens; `sanity` (randomised_from_layer, Spearman ρ of its scores on the
    model and on the model randomised from that block up)."""

    name: str
    scores: np.ndarray
    comprehensiveness: tuple[tuple[float, tuple[int, ...], float], ...]
    sufficiency: tuple[tuple[float, tuple[int, ...], float], ...]
    comprehensiveness_aopc: float
    sufficiency_aopc: float
    kendall_tau_loo: float | None
    sanity: tuple[tuple[int, float], ...]

    def to_dict(self) -> dict:
        return {"description": DESCRIBE[self.name], "scores": [float(s) for s in self.scores],
                "comprehensiveness": {"aopc": self.comprehensiveness_aopc,
                                      "bins": [{"fraction": fr, "erased": list(pos), "f": f}
                                               for fr, pos, f in self.comprehensiveness]},
                "sufficiency": {"aopc": self.sufficiency_aopc,
                                "bins": [{"fraction": fr, "kept": list(pos), "f": f}
                                         for fr, pos, f in self.sufficiency]},
                "kendall_tau_loo": _number(self.kendall_tau_loo),
                "sanity": [{"randomised_from_layer": n, "spearman": _number(rho)} for n, rho in self.sanity]}


@dataclass(frozen=True)
class RandomBaseline:
    """`orders` random orders of the erasable tokens: per bin the mean and sd of f_full − f, and of the AOPC."""

    orders: int
    comprehensiveness: tuple[tuple[float, float, float], ...]  # (fraction, mean, sd) of f_full − f
    sufficiency: tuple[tuple[float, float, float], ...]
    comprehensiveness_aopc: tuple[float, float]  # (mean, sd) over the orders
    sufficiency_aopc: tuple[float, float]

    def to_dict(self) -> dict:
        def curve(rows):
            return [{"fraction": fr, "mean": m, "sd": s} for fr, m, s in rows]

        return {"description": DESCRIBE["random"], "orders": self.orders,
                "comprehensiveness": {"aopc": self.comprehensiveness_aopc[0], "sd": self.comprehensiveness_aopc[1],
                                      "bins": curve(self.comprehensiveness)},
                "sufficiency": {"aopc": self.sufficiency_aopc[0], "sd": self.sufficiency_aopc[1],
                                "bins": curve(self.sufficiency)}}


def _number(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


@dataclass(frozen=True)
class Faithfulness(Result):
    """How faithful each attribution of one prediction is. f: for a causal LM the probability of `target` at
    the last position, for an encoder the cosine of the erased text's sentence embedding with the full text's.
    `erasable`: the positions ranked and erased (not special tokens; for a causal LM not the last position,
    whose prediction f reads). `methods` in the order asked; `random` the baseline; `completeness`
    (Σ attributions, f(x) − f(baseline)) of integrated gradients."""

    command: ClassVar[str] = "faithfulness"
    model: str
    text: str
    tokens: tuple[str, ...]
    ids: tuple[int, ...]
    causal: bool
    quantity: str
    target: str | None
    target_id: int | None
    f_full: float
    erasable: tuple[int, ...]
    bins: tuple[float, ...]
    methods: tuple[MethodFaithfulness, ...]
    random: RandomBaseline | None
    completeness: tuple[float, float] | None = None
    steps: int = DEFAULT_STEPS
    seed: int = 0
    skipped: tuple[str, ...] = ()

    figure_name: ClassVar[str] = "attnviz_faithfulness.png"

    @property
    def complete(self) -> bool | None:
        """Whether integrated gradients' attributions sum to f(x) − f(baseline) within COMPLETE_WITHIN of it
        (None: not run)."""
        if self.completeness is None:
            return None
        total, gap = self.completeness
        return abs(total - gap) <= COMPLETE_WITHIN * max(abs(gap), 0.01)

    def method(self, name: str) -> MethodFaithfulness:
        return next(m for m in self.methods if m.name == name)

    def beats_random(self, m: MethodFaithfulness) -> str:
        """"both", "comprehensiveness", "sufficiency" or "no": where the method is better than the random orders'
        mean by more than BEATS_SD of their sd ("" without a random baseline)."""
        if self.random is None:
            return ""
        comp = m.comprehensiveness_aopc > self.random.comprehensiveness_aopc[0] + \
            BEATS_SD * self.random.comprehensiveness_aopc[1]
        suff = m.sufficiency_aopc < self.random.sufficiency_aopc[0] - BEATS_SD * self.random.sufficiency_aopc[1]
        return "both" if comp and suff else "comprehensiveness" if comp else "sufficiency" if suff else "no"

    @staticmethod
    def sanity_rho(m: MethodFaithfulness) -> float | None:
        """Spearman's ρ of the method's scores with those on the model randomised deepest (every block from the
        top down to the lowest depth asked); None: not measured (--sanity 0) or undefined (constant scores)."""
        return _number(m.sanity[-1][1]) if m.sanity else None

    def passes_sanity(self, m: MethodFaithfulness) -> bool | None:
        """|ρ| ≤ SANITY_MAX_RHO: the scores change when the model is destroyed (None: the check was not run)."""
        if not m.sanity:
            return None
        rho = self.sanity_rho(m)
        return rho is not None and abs(rho) <= SANITY_MAX_RHO

    def trust(self, m: MethodFaithfulness) -> str:
        """"yes" where the method beats random on both measures and passes the sanity check; else "no: " and
        what failed ("random", "sanity"); "" where neither test was run. Without the sanity check (--sanity 0)
        beating random is all that is asked, and the verdict says the check was skipped."""
        beats = self.beats_random(m)
        sane = self.passes_sanity(m)
        if beats == "" and sane is None:
            return ""
        failed = ([] if beats in ("", "both") else ["random"]) + ([] if sane in (None, True) else ["sanity"])
        return ("no: both" if len(failed) == 2 else "no: " + failed[0]) if failed else "yes"

    def ranking(self) -> list[MethodFaithfulness]:
        """By comprehensiveness AOPC minus sufficiency AOPC (high on the one, low on the other); methods that
        erase the same tokens have the same AOPCs and keep the order asked (ties(): said as ties)."""
        return sorted(self.methods, key=lambda m: -(m.comprehensiveness_aopc - m.sufficiency_aopc))

    def ties(self) -> list[list[str]]:
        """The ranking in groups: methods whose two AOPCs are equal (within TIE) form one group."""
        groups: list[list[MethodFaithfulness]] = []
        for m in self.ranking():
            last = groups[-1][-1] if groups else None
            if last is not None and abs(last.comprehensiveness_aopc - m.comprehensiveness_aopc) <= TIE and \
                    abs(last.sufficiency_aopc - m.sufficiency_aopc) <= TIE:
                groups[-1].append(m)
            else:
                groups.append([m])
        return [[m.name for m in group] for group in groups]

    def ranks(self) -> dict[str, str]:
        """Each method's place, "1", "2=", …: tied methods share the place of the first of them, marked =."""
        places: dict[str, str] = {}
        n = 1
        for group in self.ties():
            for name in group:
                places[name] = f"{n}=" if len(group) > 1 else str(n)
            n += len(group)
        return places

    def trusted(self) -> list[str]:
        """The methods to trust on this text, in the ranking's order: trust() is "yes"."""
        return [m.name for m in self.ranking() if self.trust(m) == "yes"]

    def verdict(self) -> str:
        """One line a user can act on: which methods to trust on this text and why, ties said as ties; when none
        qualifies, that, and what would tell the methods apart (a corpus, with how many texts its test needs)."""
        if self.random is None and not any(m.sanity for m in self.methods):
            return ("no verdict: neither the random baseline nor the sanity check was run (add random to the "
                    "methods, and --sanity 1)")
        sane = any(m.sanity for m in self.methods)

        def tested(verb_s: str) -> str:  # "" for "they beat …", "s" for "none beats …"
            parts = ([f"beat{verb_s} random on both measures"] if self.random is not None else []) + \
                ([f"pass{'es' if verb_s else ''} the sanity check (|ρ| ≤ {SANITY_MAX_RHO:g})"] if sane else [])
            return " and ".join(parts)

        trusted = set(self.trusted())
        shown = []
        for group in self.ties():
            kept = [name for name in group if name in trusted]
            if kept:
                shown.append(" = ".join(kept) + (" (tied: the same tokens erased)" if len(kept) > 1 else ""))
        skipped = "" if sane else "; the sanity check was skipped (--sanity 0): run it before trusting them"
        if shown:
            return f"trust on this text: {', '.join(shown)}: {'it' if len(trusted) == 1 else 'they'} " \
                   f"{tested('s' if len(trusted) == 1 else '')}{skipped}"
        return (f"trust on this text: none: none of the {len(self.methods)} methods {tested('s')}{skipped}; one "
                f"text rarely tells them apart: measure a corpus (--corpus FILE: at least {MIN_SIGNIFICANT_TEXTS} "
                f"texts for its paired test to reach p < {SIGNIFICANCE:g}, {MIN_INTERVAL_TEXTS} for its intervals)")

    def to_dict(self) -> dict:
        data: dict = {"model": self.model, "text": self.text, "ids": list(self.ids), "tokens": list(self.tokens),
                      "quantity": self.quantity, "target": self.target, "target_id": self.target_id,
                      "f_full": self.f_full, "erasable": list(self.erasable), "bins": list(self.bins),
                      "methods": {m.name: {**m.to_dict(), "beats_random": self.beats_random(m),
                                           "passes_sanity": self.passes_sanity(m), "trust": self.trust(m),
                                           "rank": self.ranks()[m.name]}
                                  for m in self.methods},
                      "ranking": [m.name for m in self.ranking()], "ties": self.ties(),
                      "trusted": self.trusted(), "verdict": self.verdict(),
                      "sanity_max_rho": SANITY_MAX_RHO, "skipped": list(self.skipped)}
        if self.random is not None:
            data["methods"]["random"] = self.random.to_dict()
        if self.completeness is not None:
            data["integrated_gradients_completeness"] = {"sum_of_attributions": self.completeness[0],
                                                         "f_difference": self.completeness[1],
                                                         "steps": self.steps, "complete": self.complete}
        return data

    def to_rows(self) -> list[dict]:
        ranks = self.ranks()
        return [{"rank": ranks[m.name], "method": m.name, "comprehensiveness_aopc": m.comprehensiveness_aopc,
                 "sufficiency_aopc": m.sufficiency_aopc, "kendall_tau_loo": _number(m.kendall_tau_loo),
                 "sanity_spearman": self.sanity_rho(m), "beats_random": self.beats_random(m),
                 "trust": self.trust(m)} for m in self.ranking()]

    def report(self, **style: Any) -> list:
        from attnviz.panels import short_model
        from attnviz.render.tables import records_table

        rows = self.to_rows()
        deepest = self.methods[0].sanity[-1][0] if self.methods and self.methods[0].sanity else None
        columns = [("rank", "#", ""), ("method", "method", ""), ("comprehensiveness_aopc", "compr. ↑", ".3f"),
                   ("sufficiency_aopc", "suff. ↓", ".3f"), ("kendall_tau_loo", "τ loo", ".2f")]
        if deepest is not None:
            columns.append(("sanity_spearman", "sanity ρ", ".2f"))
        if deepest is not None or self.random is not None:
            columns.append(("trust", "trust", ""))
        items: list = [Line(f"f: {self.quantity} = {self.f_full:.4f}; {len(self.erasable)} of {len(self.tokens)} "
                            f"tokens ranked and erased (deleted from the input), bins "
                            + ", ".join(f"{b:.0%}" for b in self.bins))]
        items.append(records_table(rows, columns, f"{short_model(self.model)}: which explanation to trust (AOPC "
                                                  f"over the bins; ranked by compr. − suff., = a tie)",
                                   min_widths={"method": max((len(m.name) for m in self.methods), default=6)}))
        if self.random is not None:
            r = self.random
            items.append(Line(f"random ({r.orders} orders): comprehensiveness {r.comprehensiveness_aopc[0]:.3f} ± "
                              f"{r.comprehensiveness_aopc[1]:.3f}, sufficiency {r.sufficiency_aopc[0]:.3f} ± "
                              f"{r.sufficiency_aopc[1]:.3f} (mean ± sd); beating it: more than {BEATS_SD:g} sd "
                              f"better than its mean"))
        items.append(Line(self.verdict(), style="bold"))
        if self.completeness is not None:
            total, gap = self.completeness
            items.append(Line(f"integrated gradients ({self.steps} points): attributions sum to {total:.4f}, "
                              f"f(x) − f(baseline) = {gap:.4f} (completeness)"))
            if not self.complete:
                items.append(Line(f"  not complete: off by {abs(total - gap):.4f}, more than "
                                  f"{COMPLETE_WITHIN:.0%} of |f(x) − f(baseline)|: f varies along the path faster "
                                  f"than {self.steps} points see; raise --steps, and read its ranking with care",
                                  style="yellow"))
        for name in self.skipped:
            items.append(Line(f"skipped: {name}", style="dim"))
        top = "the top block" if deepest is None else "the top block down to block " + str(deepest)
        items.append(Line("compr.: comprehensiveness, f_full − f without the method's top tokens (higher: they "
                          "mattered); suff.: sufficiency, f_full − f with only them (lower: they were enough); τ loo: "
                          "Kendall's τ with leave-one-out"
                          + (f"; sanity ρ: Spearman's ρ of the scores with those of the model randomised from {top} "
                             f"(near 0: the method explains the model; passes at |ρ| ≤ {SANITY_MAX_RHO:g})"
                             if deepest is not None else "")
                          + "; trust: yes where it beats random on both measures and passes the sanity check, else "
                          "which test failed (--json: on which measure it beats random); attnviz explain "
                          "faithfulness", style="dim"))
        return items

    def figure(self, **style: Any):
        from attnviz.render.charts import faithfulness_figure

        return faithfulness_figure(self)


def _sanity_layers(L: int, depths: int) -> list[int]:
    """The blocks from which the copy is randomised, top first: `depths` of them spread from L−1 down to 0."""
    if depths <= 0:
        return []
    if depths == 1:  # one depth: the whole model randomised
        return [0]
    if depths >= L:
        return list(range(L - 1, -1, -1))
    return sorted({int(round(x)) for x in np.linspace(L - 1, 0, depths)}, reverse=True)


@borrows
@checked
def faithfulness(text: str | Sequence[str], *, model: Any = None, tokenizer: Any = None,
                 methods: Sequence[str] | None = None, target: str | int | None = None, orders: int = 20,
                 steps: int = DEFAULT_STEPS, sanity: int = DEFAULT_SANITY, seed: int = 0, truncate: bool = True,
                 device: str = "auto", dtype: str = "float32", engine: str = "local", address: str | None = None, workers: int = 2,
                 reporter: Reporter | None = None) -> Faithfulness | FaithfulnessCorpus:
    """How faithful each attribution of one prediction is (see the module). `methods`: names from
    FAITHFULNESS_METHODS (default: all that apply; alti-logit needs a causal LM); `target` (causal LM) the token
    whose probability f is, as text (" Paris") or an id, default the model's top token; `orders` random
    orders (20 to 10,000); `steps` integrated gradients' points (1 to 1,000); `sanity` how many depths of
    cascading randomisation (0: none; at most the model's layers); `seed` for the random orders and weights.

    `text` a list of texts (a corpus, at most MAX_CORPUS_TEXTS): every text measured alike (a text that cannot
    be is skipped, with why), then per method the mean AOPC with a 95 % bootstrap interval and whether its lead
    over the next method is significant (a paired sign-flip test): a FaithfulnessCorpus. `engine` "ray" spreads
    the texts over Ray Data as attnviz corpus does (`address` a cluster to join, default a local Ray; `workers`
    actors, each loading the model named by `model`, a name or an attnviz.ModelSpec)."""
    many = not isinstance(text, str)
    if many:
        texts = [str(t) for t in text]
        if not texts:
            raise UsageError(f"{arg('text')} is an empty list: give a text, or a list of texts", "text")
        if len(texts) > MAX_CORPUS_TEXTS:
            raise UsageError(f"{arg('text')} holds {len(texts):,} texts; faithfulness measures at most "
                             f"{MAX_CORPUS_TEXTS:,} at once", "text")
    else:
        check_text(text)
        texts = [str(text)]
    asked = _methods(methods)
    if engine not in ("local", "ray"):
        raise UsageError(f"{arg('engine')} is local or ray, not {visible(str(engine))[:20]!r}", "engine")
    if engine == "ray" and not many:
        raise UsageError(f"{arg('engine', 'ray')} spreads a corpus over Ray: give a list of texts", "engine")
    if not 1 <= workers <= 4096:
        raise UsageError(f"{arg('workers')} takes 1 to 4,096 actors; got {workers}", "workers")
    if not 20 <= orders <= MAX_ORDERS:
        raise UsageError(f"{arg('orders')} takes 20 to {MAX_ORDERS:,} random orders; got {orders}", "orders")
    if not 1 <= steps <= 1000:
        raise UsageError(f"{arg('steps')} takes 1 to 1,000 points; got {steps}", "steps")
    if not 0 <= sanity <= 1000:
        raise UsageError(f"{arg('sanity')} takes 0 to 1,000 depths; got {sanity}", "sanity")
    if seed < 0:
        raise UsageError(f"{arg('seed')} is a whole number from 0; got {seed}", "seed")
    if isinstance(target, str) and not target:
        raise UsageError(f"{arg('target')} is empty: give a token of the vocabulary, e.g. ' Paris'", "target")
    if engine == "ray":
        return _on_ray(texts, model, dict(asked=asked, explicit=methods is not None, target=target, orders=orders,
                                          steps=steps, sanity=sanity, seed=seed, truncate=truncate),
                       device=device, dtype=dtype, address=address, workers=workers, reporter=reporter or Reporter())
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("faithfulness")
    from attnviz.engine.ablation.runs import is_causal_lm

    causal = is_causal_lm(loaded.model)
    if methods is None:
        asked = [m for m in asked if causal or m not in CAUSAL_ONLY]
    elif not causal and any(m in CAUSAL_ONLY for m in asked):
        raise InputError(f"alti-logit explains a causal language model's next token; {loaded.name} is an encoder",
                         "methods")
    if target is not None and not causal:
        raise InputError(f"{arg('target')} names a next token; {loaded.name} is an encoder, whose f is the cosine "
                         f"of the sentence embeddings", "target")
    reporter = reporter or Reporter()
    options: dict[str, Any] = dict(asked=asked, explicit=methods is not None, causal=causal, target=target,
                                   orders=orders, steps=steps, sanity=sanity, seed=seed, truncate=truncate)
    if not many:
        return _one(loaded, text, reporter=reporter, **options)  # type: ignore[arg-type]
    measured: list[dict] = []
    skipped: list[tuple[int, str]] = []
    per_text = work_per_text(asked, causal, sanity, loaded.shape[0])
    reporter.note(corpus_plan(texts, loaded, asked, causal, options))
    started = time.perf_counter()
    with reporter.progress(f"Measuring {len([m for m in asked if m != 'random'])} methods on each text",
                           len(texts) * per_text, "steps") as step:
        for number, one in enumerate(texts, 1):
            done = [0]

            def tick(n: int) -> None:
                done[0] += n
                step(n)

            found = measure_one(loaded, number, one, {**options, "tick": tick})
            (skipped if isinstance(found, tuple) else measured).append(found)  # type: ignore[arg-type]
            step(per_text - done[0])  # a text skipped part-way still counts whole
            if number == 1 and len(texts) > 1:
                reporter.note(corpus_estimate(texts, loaded, time.perf_counter() - started))
    if not measured:
        raise InputError(f"none of the {len(texts):,} texts could be measured (the first: "
                         f"{skipped[0][1] if skipped else 'none'})")
    return corpus_result(measured, skipped, seed=seed)


def work_per_text(asked: Sequence[str], causal: bool, sanity: int, layers: int) -> int:
    """The steps one text counts in a corpus's progress bar: each method scored (once on the model, once per
    sanity depth) and the erasures run as one step."""
    methods = [m for m in asked if m != "random" and (causal or m not in CAUSAL_ONLY)]
    return len(methods) * (1 + len(_sanity_layers(layers, sanity))) + 1


def _token_counts(texts: Sequence[str], loaded) -> list[int]:
    """Each text's length in tokens, as the model will read it (no special tokens counted: a cheap estimate)."""
    tokenizer = loaded.tokenizer
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def corpus_plan(texts: Sequence[str], loaded, asked: Sequence[str], causal: bool, options: dict) -> str:
    """What a corpus run will do, said before it starts: the texts, their lengths, the methods and depths."""
    counts = _token_counts(texts, loaded)
    methods = [m for m in asked if m != "random" and (causal or m not in CAUSAL_ONLY)]
    depths = len(_sanity_layers(loaded.shape[0], int(options["sanity"])))
    return (f"faithfulness over {len(texts):,} texts ({min(counts)}–{max(counts)} tokens, {sum(counts):,} in all): "
            f"{len(methods)} methods, each again at {depths} sanity depth{'s' if depths != 1 else ''}, "
            f"{options['orders']} random orders, integrated gradients at {options['steps']} points; an estimate of "
            f"the time follows the first text")


def corpus_estimate(texts: Sequence[str], loaded, first_seconds: float) -> str:
    """The whole corpus's time, from the first text's, each text weighed by its length (a rough guide: the
    erasures grow with the length, each run of the model too)."""
    counts = np.maximum(np.array(_token_counts(texts, loaded), np.float64), 1.0)
    total = first_seconds * float(counts.sum() / counts[0])
    return f"about {_duration(total)} for the {len(texts):,} texts (the first took {first_seconds:.1f} s)"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _on_ray(texts: list[str], model: Any, options: dict, *, device: str, dtype: str, address: str | None,
            workers: int, reporter: Reporter) -> FaithfulnessCorpus:
    """The corpus on Ray: the texts measured by actors that load their own copies of the model."""
    from attnviz.api.attribution.faithfulness_ray import measure_on_ray
    from attnviz.api.models import ModelSpec

    if model is not None and not isinstance(model, (str, ModelSpec)):
        raise UsageError(f"{arg('engine', 'ray')} loads the model in each worker: give its name (or an "
                         f"attnviz.ModelSpec), not a loaded model", "model")
    spec = model if isinstance(model, ModelSpec) else ModelSpec(model, None, device, dtype)
    measured, skipped = measure_on_ray(texts, spec.as_kwargs(), options, measure_one, address=address,
                                       workers=workers, reporter=reporter)
    if not measured:
        raise InputError(f"none of the {len(texts):,} texts could be measured (the first: "
                         f"{skipped[0][1] if skipped else 'none'})")
    return corpus_result(measured, skipped, seed=int(options["seed"]))


def measure_one(loaded, number: int, text: str, options: dict) -> dict | tuple[int, str]:
    """One text of a corpus: its summary, or (its number, why it cannot be measured). `options` as
    faithfulness() takes them; what the model is (causal or not) is read from it here."""
    from attnviz.engine.ablation.runs import is_causal_lm

    causal = is_causal_lm(loaded.model)
    asked = options["asked"] if options["explicit"] else [m for m in options["asked"]
                                                          if causal or m not in CAUSAL_ONLY]
    try:
        if options["explicit"] and not causal and any(m in CAUSAL_ONLY for m in asked):
            raise InputError(f"alti-logit explains a causal language model's next token; {loaded.name} is an "
                             f"encoder", "methods")
        check_text(text)
        return summary(_one(loaded, text, reporter=Reporter(), **{**options, "asked": asked, "causal": causal}))
    except InputError as exc:
        return number, str(exc)


def _one(loaded, text: str, *, asked: list[str], explicit: bool, causal: bool, target: str | int | None,
         orders: int, steps: int, sanity: int, seed: int, truncate: bool, reporter: Reporter,
         tick: Callable[[int], None] | None = None) -> Faithfulness:
    """One text through every method asked, measured. `tick(n)`: n more steps of work_per_text done (a corpus's
    progress bar)."""
    tick = tick or (lambda n: None)
    from attnviz.api.attribution.logits import check_spelling, target_id
    from attnviz.engine.attribution.faithfulness import Explained, Randomised
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory

    methods = asked if explicit else None
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.tokens)
    if T > MAX_FAITHFULNESS_TOKENS:
        raise InputError(f"faithfulness runs the text once per token and erasure: {T} tokens is more than "
                         f"{MAX_FAITHFULNESS_TOKENS}; shorten the text")
    ranked_ok = ~np.asarray(encoded.special, bool)
    if causal:
        ranked_ok[T - 1] = False
    erasable = np.flatnonzero(ranked_ok)
    if len(erasable) < 2:
        raise InputError(f"faithfulness ranks and erases tokens: this text has {len(erasable)} that can be erased "
                         f"(not special{', not the last' if causal else ''}); give a longer text")
    check_memory(loaded, T, copies=4.0)
    wanted = target_id(loaded, target)
    reporter = reporter or Reporter()
    skipped: list[str] = []
    with reporter.status("Running the model…"):
        explained = Explained(loaded.model, encoded.inputs, causal=causal, target=wanted)
    explained.baseline_id = baseline_token(loaded.tokenizer)
    if causal and target is not None and explained.target is not None:
        check_spelling(loaded, target, explained.target, explained.logits)
    scores: dict[str, np.ndarray] = {}
    completeness = None
    scored = [name for name in asked if name != "random"]
    with reporter.progress("Scoring the tokens with each method", len(scored), "methods") as step:
        for name in scored:
            try:
                scores[name], found = method_scores(name, explained, encoded.inputs, erasable, steps)
            except UnsupportedArchitectureError as exc:
                if methods is not None:
                    raise InputError(f"{name}: {exc}", "methods") from None
                skipped.append(f"{name} ({exc})")
                continue
            finally:
                step(1)
                tick(1)
            if found is not None:
                completeness = found
    from attnviz.metrics import spearman
    from attnviz.metrics.faithfulness import bin_sizes, kendall_tau, only, ranked, without

    sizes = bin_sizes(len(erasable))
    subsets: list[np.ndarray] = []
    plans: dict[str, list[np.ndarray]] = {}  # each method's top tokens, one set per bin
    for name, values in scores.items():
        order = ranked(values, erasable)
        plans[name] = [order[:k] for k in sizes]
    rng = np.random.default_rng(seed)
    random_orders = [rng.permutation(erasable) for _ in range(orders)] if "random" in asked else []
    loo_needed = bool(scores)  # τ with leave-one-out: every method is compared to it
    for tops in plans.values():
        subsets += [without(T, top) for top in tops] + [only(T, erasable, top) for top in tops]
    for order in random_orders:
        subsets += [without(T, order[:k]) for k in sizes] + [only(T, erasable, order[:k]) for k in sizes]
    if loo_needed and "loo" not in scores:
        subsets += [without(T, np.array([i])) for i in erasable]
    values = distinct_f(explained, subsets, reporter)
    tick(1)
    f_of = iter(values)
    n = len(sizes)
    results: dict[str, tuple] = {}
    for name, tops in plans.items():
        comp = [float(next(f_of)) for _ in range(n)]
        suff = [float(next(f_of)) for _ in range(n)]
        results[name] = (tops, comp, suff)
    random = None
    if random_orders:
        comp_r = np.array([[next(f_of) for _ in range(n)] + [next(f_of) for _ in range(n)]
                           for _ in random_orders])  # (orders, 2n)
        drops = explained.f_full - comp_r
        c, s = drops[:, :n], drops[:, n:]
        random = RandomBaseline(orders, tuple((b, float(m), float(d)) for b, m, d in zip(BINS, c.mean(0), c.std(0))),
                                tuple((b, float(m), float(d)) for b, m, d in zip(BINS, s.mean(0), s.std(0))),
                                (float(c.mean(1).mean()), float(c.mean(1).std())),
                                (float(s.mean(1).mean()), float(s.mean(1).std())))
    loo = scores.get("loo")
    if loo is None and loo_needed:
        loo = np.zeros(T)
        loo[erasable] = explained.f_full - np.array([next(f_of) for _ in erasable])
    depths = _sanity_layers(loaded.shape[0], sanity)
    sane: dict[str, list[tuple[int, float]]] = {name: [] for name in scores}
    if depths:
        copy = Randomised(loaded.model, seed=seed)
        with reporter.progress("Randomising the model from the top block down: every method again",
                               len(depths) * len(scores), "methods") as step:
            for layer in depths:
                copy.down_to(layer)
                shaken = Explained(copy.model, encoded.inputs, causal=causal, target=explained.target)
                shaken.baseline_id = explained.baseline_id
                for name in scores:
                    try:
                        again, _ = method_scores(name, shaken, encoded.inputs, erasable, steps)
                    except UnsupportedArchitectureError:
                        again = np.full(T, np.nan)
                    sane[name].append((layer, spearman(scores[name][erasable], again[erasable])))
                    step(1)
                    tick(1)
        del copy
    built = []
    for name in asked:
        if name == "random" or name not in scores:
            continue
        tops, comp, suff = results[name]
        tau = kendall_tau(scores[name][erasable], loo[erasable]) if loo is not None else None
        built.append(MethodFaithfulness(
            name, scores[name],
            tuple((b, tuple(int(p) for p in sorted(top)), f) for b, top, f in zip(BINS, tops, comp)),
            tuple((b, tuple(int(p) for p in sorted(top)), f) for b, top, f in zip(BINS, tops, suff)),
            float(np.mean(explained.f_full - np.array(comp))), float(np.mean(explained.f_full - np.array(suff))),
            tau, tuple(sane[name])))
    if causal:
        target_text = loaded.tokenizer.decode([explained.target])
        quantity = f"p({visible(target_text)!r}) at the last position"
    else:
        target_text = None
        quantity = "cosine of the sentence embedding with the full text's"
    return Faithfulness(model=loaded.name, text=str(text), tokens=tuple(encoded.tokens),
                        ids=tuple(int(i) for i in encoded.inputs["input_ids"][0].tolist()), causal=causal,
                        quantity=quantity, target=target_text, target_id=explained.target, f_full=explained.f_full,
                        erasable=tuple(int(p) for p in erasable), bins=BINS, methods=tuple(built), random=random,
                        completeness=completeness, steps=steps, seed=seed, skipped=tuple(skipped))


def _methods(methods: Sequence[str] | None) -> list[str]:
    if methods is None:
        return list(FAITHFULNESS_METHODS)
    names = [str(m) for m in methods]
    unknown = [m for m in names if m not in FAITHFULNESS_METHODS]
    if unknown or not names:
        raise UsageError(f"{arg('methods')} takes names from {', '.join(FAITHFULNESS_METHODS)}; "
                         + (f"not {visible(unknown[0])[:40]!r}" if unknown else "none given"), "methods")
    return list(dict.fromkeys(names))
