"""faithfulness over a corpus: every text measured alike, then per method the mean AOPC with a 95 % bootstrap
interval over the texts, and whether each method's lead over the next is significant (a paired sign-flip test
on the texts' differences)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.result import Line, Result
from attnviz.metrics.faithfulness import MIN_INTERVAL_TEXTS, MIN_SIGNIFICANT_TEXTS, SANITY_MAX_RHO, SIGNIFICANCE



@dataclass(frozen=True)
class CorpusMethod:
    """One method over the texts: the means of its comprehensiveness and sufficiency AOPCs and of their
    difference, each with its 95 % bootstrap interval; mean τ with leave-one-out and sanity ρ (at the deepest
    randomisation); the share of texts where it beat random on both; and, in the ranking, its lead over the
    next method (the mean of the per-text differences of comprehensiveness − sufficiency) with the paired
    test's p-value."""

    name: str
    comprehensiveness: tuple[float, float, float]  # (mean, low, high)
    sufficiency: tuple[float, float, float]
    difference: tuple[float, float, float]
    kendall_tau_loo: float | None
    sanity_spearman: float | None
    beats_random: float | None
    lead: float | None = None
    p_value: float | None = None

    @property
    def significant(self) -> bool | None:
        return None if self.p_value is None else self.p_value < SIGNIFICANCE


def _plus_minus(interval: tuple[float, float, float]) -> str:
    """0.366±.02: the mean and half the interval's width (short: the table fits 80 columns); the mean alone
    where there is no interval (fewer than MIN_INTERVAL_TEXTS texts)."""
    if not np.isfinite(interval[1]):
        return f"{interval[0]:.3f}"
    half = f"{(interval[2] - interval[1]) / 2:.2f}"
    return f"{interval[0]:.3f}±{half[1:] if half.startswith('0.') else half}"


def _num(value):
    return None if value is None or not np.isfinite(value) else float(value)


@dataclass(frozen=True)
class FaithfulnessCorpus(Result):
    """attnviz faithfulness over many texts. `methods` best first (by the mean of comprehensiveness −
    sufficiency); `texts` measured, `skipped` (line number, why) the others; `per_text` each text's AOPCs."""

    command: ClassVar[str] = "faithfulness"
    model: str
    quantity: str
    texts: int
    methods: tuple[CorpusMethod, ...]
    skipped: tuple[tuple[int, str], ...]
    per_text: tuple[dict, ...]
    random: tuple[float, float] | None  # mean comprehensiveness and sufficiency AOPC of the random orders
    sanity_layer: int | None

    figure_name: ClassVar[str] = "attnviz_faithfulness_corpus.png"

    def to_dict(self) -> dict:
        def triple(t):
            return {"mean": t[0], "ci95": [t[1], t[2]] if np.isfinite(t[1]) else None}

        return {"model": self.model, "quantity": self.quantity, "texts": self.texts,
                "skipped": [{"text": n, "reason": why} for n, why in self.skipped],
                "methods": {m.name: {"comprehensiveness": triple(m.comprehensiveness),
                                     "sufficiency": triple(m.sufficiency), "difference": triple(m.difference),
                                     "kendall_tau_loo": _num(m.kendall_tau_loo),
                                     "sanity_spearman": _num(m.sanity_spearman),
                                     "beats_random_share": _num(m.beats_random),
                                     "lead_over_next": _num(m.lead), "p_value": _num(m.p_value),
                                     "significant": m.significant, "trust": self.trust(m)}
                            for m in self.methods},
                "ranking": [m.name for m in self.methods],
                "random": None if self.random is None else {"comprehensiveness": self.random[0],
                                                            "sufficiency": self.random[1]},
                "sanity_randomised_from_layer": self.sanity_layer, "trusted": self.trusted(),
                "verdict": self.verdict(), "per_text": list(self.per_text)}

    def to_rows(self) -> list[dict]:
        return [{"method": m.name, "comprehensiveness": m.comprehensiveness[0],
                 "comprehensiveness_low": _num(m.comprehensiveness[1]),
                 "comprehensiveness_high": _num(m.comprehensiveness[2]),
                 "sufficiency": m.sufficiency[0], "sufficiency_low": _num(m.sufficiency[1]),
                 "sufficiency_high": _num(m.sufficiency[2]), "kendall_tau_loo": _num(m.kendall_tau_loo),
                 "sanity_spearman": _num(m.sanity_spearman), "beats_random_share": _num(m.beats_random),
                 "lead_over_next": _num(m.lead), "p_value": _num(m.p_value),
                 "trust": self.trust(m)} for m in self.methods]

    def top_group(self) -> list[CorpusMethod]:
        """The methods ranked first that the paired test cannot tell apart: from the top down to the first whose
        lead over the next is significant (all of them where no lead is)."""
        group: list[CorpusMethod] = []
        for m in self.methods:
            group.append(m)
            if m.significant:
                break
        return group

    def trust(self, m: CorpusMethod) -> str:
        """"yes" for a method of the top group whose means beat random's on both measures and whose mean sanity ρ is
        within SANITY_MAX_RHO; else "no: " and what failed (random, sanity, behind: a method leads it
        significantly); "" for a corpus too small for the paired test."""
        if self.texts < MIN_SIGNIFICANT_TEXTS:
            return ""
        failed = []
        if m not in self.top_group() or not any(x.significant for x in self.methods):
            failed.append("behind" if m not in self.top_group() else "no lead")
        if self.random is not None and not (m.comprehensiveness[0] > self.random[0] and
                                            m.sufficiency[0] < self.random[1]):
            failed.append("random")
        if self.sanity_layer is not None and (m.sanity_spearman is None or abs(m.sanity_spearman) > SANITY_MAX_RHO):
            failed.append("sanity")
        return "no: " + ", ".join(failed) if failed else "yes"

    def trusted(self) -> list[str]:
        return [m.name for m in self.methods if self.trust(m) == "yes"]

    def verdict(self) -> str:
        """One line a user can act on, from the table: the methods to trust over these texts (ranked first,
        ahead of the rest by a significant lead, better than random orders in both means, passing the sanity
        check), or why none can be named."""
        n = self.texts
        if n < MIN_SIGNIFICANT_TEXTS:
            return (f"no verdict: with {n} text{'s' if n != 1 else ''} the paired test cannot reach p < "
                    f"{SIGNIFICANCE:g} (its smallest p is 2/2^{n} = {2.0 ** (1 - n):.4g}): give at least "
                    f"{MIN_SIGNIFICANT_TEXTS} texts ({MIN_INTERVAL_TEXTS} or more for intervals)")
        if not any(m.significant for m in self.methods):
            return (f"no verdict: over {n:,} texts no method's lead over the next is significant: they cannot be "
                    f"told apart here (more texts narrow the test)")
        group = [m.name for m in self.top_group()]
        trusted = self.trusted()
        checks = "better than random orders in both means" + \
            (f", sanity |ρ| ≤ {SANITY_MAX_RHO:g}" if self.sanity_layer is not None else "")
        head = f"over {n:,} texts the first {len(group)} cannot be told apart and lead the rest significantly" \
            if len(group) > 1 else f"over {n:,} texts {group[0]} leads the rest significantly"
        if trusted:
            return f"trust: {', '.join(trusted)} ({head}; {checks})"
        return f"trust: none ({head}, but none of {', '.join(group)} is also {checks})"

    def report(self, **style: Any) -> list:
        from attnviz.panels import short_model
        from attnviz.render.tables import records_table

        rows = []
        for m in self.methods:
            comp, suff = m.comprehensiveness, m.sufficiency
            rows.append({"method": m.name, "comp": _plus_minus(comp), "suff": _plus_minus(suff),
                         "tau": _num(m.kendall_tau_loo), "sanity": _num(m.sanity_spearman),
                         "beats": _num(m.beats_random),
                         "lead": "–" if m.lead is None else f"{m.lead:+.3f}{'*' if m.significant else ''}",
                         "trust": self.trust(m).split(":")[0]})
        columns = [("method", "method", ""), ("comp", "compr. ↑", ""), ("suff", "suff. ↓", ""), ("tau", "τ", ".2f")]
        if self.sanity_layer is not None:
            columns.append(("sanity", "ρ", ".2f"))
        if self.random is not None:
            columns.append(("beats", "beats", ".0%"))
        columns.append(("lead", "lead", ""))
        items: list = [Line(f"f: {self.quantity}; {self.texts:,} texts measured"
                            + (f", {len(self.skipped):,} skipped" if self.skipped else ""))]
        items.append(records_table(rows, columns, f"{short_model(self.model)}: which explanation to trust, over "
                                                  f"{self.texts:,} texts (mean AOPC, ranked by compr. − suff.)",
                                   min_widths={"method": max(len(m.name) for m in self.methods)}))
        if self.random is not None:
            items.append(Line(f"random orders: comprehensiveness {self.random[0]:.3f}, sufficiency "
                              f"{self.random[1]:.3f} (means over the texts)"))
        for number, why in self.skipped[:5]:
            items.append(Line(f"skipped text {number}: {why}", style="dim", stderr=True))
        if len(self.skipped) > 5:
            items.append(Line(f"… and {len(self.skipped) - 5:,} more skipped (--json lists them)", style="dim",
                              stderr=True))
        items.append(Line(self.verdict(), style="bold"))
        few = self.texts < MIN_INTERVAL_TEXTS
        items.append(Line((f"no ±: fewer than {MIN_INTERVAL_TEXTS} texts give no bootstrap interval" if few
                           else "±: half the width of the 95 % percentile bootstrap interval over the texts (2,000 "
                                "resamples; --json and --csv give its ends)") + "; τ: Kendall's τ with leave-one-out"
                          + (f"; ρ: the sanity check, Spearman's ρ with the scores on the model randomised from the "
                             f"top block down to block {self.sanity_layer}" if self.sanity_layer is not None else "")
                          + "; beats: the share of texts where the method beat random on both; lead: the mean over "
                          "the texts of (comprehensiveness − sufficiency) minus the next method's, * significant "
                          f"(a paired sign-flip test's p below {SIGNIFICANCE}; --json gives p)"
                          + ("; trust (the line above; --json and --csv per method): in the first group, better than "
                             "random in both means and passing the sanity check" if self.texts >= MIN_SIGNIFICANT_TEXTS
                             else "") + ".", style="dim"))
        return items

    def figure(self, *, ax=None, **style: Any):
        from attnviz.render.charts import faithfulness_corpus_figure

        return faithfulness_corpus_figure(self, ax=ax)


def summary(result: Any) -> dict:
    """What a corpus keeps of one text's result, an attnviz.Faithfulness (JSON-able: a Ray worker sends it back
    as it is)."""
    return {"text": result.text, "model": result.model, "causal": result.causal, "quantity": result.quantity,
            "f_full": result.f_full, "tokens": len(result.tokens),
            "random": None if result.random is None else [result.random.comprehensiveness_aopc[0],
                                                          result.random.sufficiency_aopc[0]],
            "methods": {m.name: {"comprehensiveness": m.comprehensiveness_aopc, "sufficiency": m.sufficiency_aopc,
                                 "kendall_tau_loo": _num(m.kendall_tau_loo),
                                 "sanity": [m.sanity[-1][0], _num(m.sanity[-1][1])] if m.sanity else None,
                                 "beats_random": result.beats_random(m)} for m in result.methods}}


def corpus_result(measured: list[dict], skipped: list[tuple[int, str]], *, seed: int) -> FaithfulnessCorpus:
    """The texts' summaries gathered: per method the means and intervals, ranked, each lead tested."""
    from attnviz.metrics.faithfulness import bootstrap_interval, paired_sign_flip

    names = list(measured[0]["methods"])
    per_text = [{"text": r["text"], "f_full": r["f_full"], "tokens": r["tokens"],
                 "methods": {name: {k: m[k] for k in ("comprehensiveness", "sufficiency", "beats_random")}
                             for name, m in r["methods"].items()}} for r in measured]
    built = []
    diffs: dict[str, np.ndarray] = {}

    def nan(value) -> float:
        return np.nan if value is None else float(value)

    for name in names:
        rows = [r["methods"][name] for r in measured]
        comp = np.array([m["comprehensiveness"] for m in rows])
        suff = np.array([m["sufficiency"] for m in rows])
        diffs[name] = comp - suff
        taus = np.array([nan(m["kendall_tau_loo"]) for m in rows])
        sanity = np.array([nan(m["sanity"][1]) if m["sanity"] else np.nan for m in rows])
        beats = [m["beats_random"] for m in rows]

        def interval(values: np.ndarray) -> tuple[float, float, float]:
            if len(values) < MIN_INTERVAL_TEXTS:  # too few texts for an interval: the mean alone
                return float(values.mean()), np.nan, np.nan
            return (float(values.mean()), *bootstrap_interval(values, seed=seed))

        built.append(CorpusMethod(name, interval(comp), interval(suff), interval(diffs[name]),
                                  float(np.nanmean(taus)) if np.isfinite(taus).any() else None,
                                  float(np.nanmean(sanity)) if np.isfinite(sanity).any() else None,
                                  None if beats[0] == "" else float(np.mean([b == "both" for b in beats]))))
    built.sort(key=lambda m: -m.difference[0])
    ranked = []
    for n, m in enumerate(built):
        if n + 1 < len(built):
            gaps = diffs[m.name] - diffs[built[n + 1].name]
            m = CorpusMethod(**{**m.__dict__, "lead": float(gaps.mean()),
                                "p_value": paired_sign_flip(gaps, seed=seed)})
        ranked.append(m)
    randoms = [r["random"] for r in measured if r["random"] is not None]
    random = (float(np.mean([r[0] for r in randoms])), float(np.mean([r[1] for r in randoms]))) if randoms else None
    first = measured[0]
    sanities = [m["sanity"] for m in first["methods"].values() if m["sanity"]]
    quantity = "the probability of each text's target token at its last position" if first["causal"] else \
        first["quantity"]
    return FaithfulnessCorpus(model=first["model"], quantity=quantity, texts=len(measured), methods=tuple(ranked),
                              skipped=tuple(skipped), per_text=tuple(per_text), random=random,
                              sanity_layer=sanities[0][0] if sanities else None)


def work_per_text(methods: Sequence[str], depths: int) -> int:
    """The steps one text counts in a corpus's progress bar: each method scored (once on the model, once per
    sanity depth) and the erasures run as one step. `methods` those that score (not random)."""
    return len(methods) * (1 + depths) + 1


ESTIMATE_AFTER = 4  # a corpus's time is estimated once this many texts are measured (the first pays the warm-up)


def token_counts(texts: Sequence[str], loaded) -> list[int]:
    """Each text's length in tokens, as the model will read it (no special tokens counted: a cheap estimate)."""
    tokenizer = loaded.tokenizer
    return [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def corpus_plan(counts: Sequence[int], methods: Sequence[str], depths: int, options: dict) -> str:
    """What a corpus run will do, said before it starts: the texts, their lengths, the methods and depths."""
    return (f"faithfulness over {len(counts):,} texts ({min(counts)}–{max(counts)} tokens, {sum(counts):,} in all): "
            f"{len(methods)} methods, each again at {depths} sanity depth{'s' if depths != 1 else ''}, "
            f"{options['orders'] or 20} random orders, integrated gradients at {options['steps']} points; an estimate "
            f"of the time follows the first {ESTIMATE_AFTER} texts")


def corpus_estimate(counts: Sequence[int], done: int, elapsed: float, since_first: float) -> str:
    """The whole corpus's time once `done` texts are measured: the seconds per token of the texts after the first
    (which pays the warm-up: its first runs of each method are slower), times the tokens still to come, each text
    weighed by its length (a guide: the erasures grow with the length, each run of the model too)."""
    tokens = np.maximum(np.asarray(counts, np.float64), 1.0)
    rate = since_first / float(tokens[1:done].sum())
    total = elapsed + rate * float(tokens[done:].sum())
    return f"about {_duration(total)} in all for the {len(counts):,} texts (from the {done} measured so far)"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
