"""What attnviz faithfulness reports of one text: each method's scores and how faithful they are, the random
baseline, and the verdict read from them (which methods to trust on this text: those that beat random on both
measures and pass the sanity check), its table, JSON and figure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.result import Line, Result
from attnviz.metrics.faithfulness import (BEATS_SD, MIN_INTERVAL_TEXTS, MIN_SIGNIFICANT_TEXTS, SANITY_MAX_RHO,
                                          SIGNIFICANCE, TIE)

__all__ = ["Faithfulness", "MethodFaithfulness", "RandomBaseline", "DESCRIBE", "COMPLETE_WITHIN", "DEFAULT_STEPS"]

COMPLETE_WITHIN = 0.1  # the report warns when integrated gradients miss completeness by more than this share
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
    lean: bool = False  # ran without α (a text of more than 256 tokens: the model's own SDPA attention)

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
        which = (f"{self.methods[0].name} does not" if len(self.methods) == 1
                 else f"none of the {len(self.methods)} methods")
        verb = tested("") if len(self.methods) == 1 else tested("s")
        return (f"trust on this text: {which} {verb}{skipped}; one "
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
                      "sanity_max_rho": SANITY_MAX_RHO, "skipped": list(self.skipped),
                      "without_alpha": self.lean}
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
        if self.lean:
            items.append(Line(f"Ran without α: {len(self.tokens):,} tokens, the model's own SDPA attention forward and "
                              f"backward (blocks recomputed for the backward pass as the memory budget needs), "
                              f"attention from the explained rows of the last layer's α alone; the methods that "
                              f"read every layer's α and leave-one-out are short-text methods", style="dim"))
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

    def figure(self, *, ax=None, **style: Any):
        from attnviz.render.charts import faithfulness_figure

        return faithfulness_figure(self, ax=ax)
