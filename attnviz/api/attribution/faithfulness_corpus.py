"""faithfulness over a corpus: every text measured alike, then per method the mean AOPC with a 95 % bootstrap
interval over the texts, and whether each method's lead over the next is significant (a paired sign-flip test
on the texts' differences)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.result import Line, Result

SIGNIFICANCE = 0.05  # a lead is significant when the paired test's p-value is below this


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
    """0.366±.02: the mean and half the interval's width (short: the table fits 80 columns)."""
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
            return {"mean": t[0], "ci95": [t[1], t[2]]}

        return {"model": self.model, "quantity": self.quantity, "texts": self.texts,
                "skipped": [{"text": n, "reason": why} for n, why in self.skipped],
                "methods": {m.name: {"comprehensiveness": triple(m.comprehensiveness),
                                     "sufficiency": triple(m.sufficiency), "difference": triple(m.difference),
                                     "kendall_tau_loo": _num(m.kendall_tau_loo),
                                     "sanity_spearman": _num(m.sanity_spearman),
                                     "beats_random_share": _num(m.beats_random),
                                     "lead_over_next": _num(m.lead), "p_value": _num(m.p_value),
                                     "significant": m.significant} for m in self.methods},
                "ranking": [m.name for m in self.methods],
                "random": None if self.random is None else {"comprehensiveness": self.random[0],
                                                            "sufficiency": self.random[1]},
                "sanity_randomised_from_layer": self.sanity_layer, "per_text": list(self.per_text)}

    def to_rows(self) -> list[dict]:
        return [{"method": m.name, "comprehensiveness": m.comprehensiveness[0],
                 "comprehensiveness_low": m.comprehensiveness[1], "comprehensiveness_high": m.comprehensiveness[2],
                 "sufficiency": m.sufficiency[0], "sufficiency_low": m.sufficiency[1],
                 "sufficiency_high": m.sufficiency[2], "kendall_tau_loo": _num(m.kendall_tau_loo),
                 "sanity_spearman": _num(m.sanity_spearman), "beats_random_share": _num(m.beats_random),
                 "lead_over_next": _num(m.lead), "p_value": _num(m.p_value)} for m in self.methods]

    def report(self, **style: Any) -> list:
        from attnviz.panels import short_model
        from attnviz.render.tables import records_table

        rows = []
        for m in self.methods:
            comp, suff = m.comprehensiveness, m.sufficiency
            rows.append({"method": m.name, "comp": _plus_minus(comp), "suff": _plus_minus(suff),
                         "tau": _num(m.kendall_tau_loo), "sanity": _num(m.sanity_spearman),
                         "beats": _num(m.beats_random),
                         "lead": "–" if m.lead is None else f"{m.lead:+.3f}{'*' if m.significant else ''}"})
        columns = [("method", "method", ""), ("comp", "compr. ↑", ""), ("suff", "suff. ↓", ""), ("tau", "τ", ".2f")]
        if self.sanity_layer is not None:
            columns.append(("sanity", f"ρ≥{self.sanity_layer}", ".2f"))
        if self.random is not None:
            columns.append(("beats", "beats", ".0%"))
        columns.append(("lead", "lead", ""))
        items: list = [Line(f"f: {self.quantity}; {self.texts:,} texts measured"
                            + (f", {len(self.skipped):,} skipped" if self.skipped else ""))]
        items.append(records_table(rows, columns, f"{short_model(self.model)}: which explanation to trust, over "
                                                  f"{self.texts:,} texts (mean AOPC, best first)",
                                   min_widths={"method": max(len(m.name) for m in self.methods)}))
        if self.random is not None:
            items.append(Line(f"random orders: comprehensiveness {self.random[0]:.3f}, sufficiency "
                              f"{self.random[1]:.3f} (means over the texts)"))
        for number, why in self.skipped[:5]:
            items.append(Line(f"skipped text {number}: {why}", style="dim", stderr=True))
        if len(self.skipped) > 5:
            items.append(Line(f"… and {len(self.skipped) - 5:,} more skipped (--json lists them)", style="dim",
                              stderr=True))
        items.append(Line("±: half the width of the 95 % percentile bootstrap interval over the texts (2,000 "
                          "resamples; --json and --csv give its ends); τ: Kendall's τ with leave-one-out"
                          + (f"; ρ≥{self.sanity_layer}: Spearman's ρ with the scores on the model randomised from "
                             f"block {self.sanity_layer} up" if self.sanity_layer is not None else "")
                          + "; beats: the share of texts where the method beat random on both; lead: the mean over "
                          "the texts of (comprehensiveness − sufficiency) minus the next method's, * significant "
                          f"(a paired sign-flip test's p below {SIGNIFICANCE}; --json gives p).", style="dim"))
        return items

    def figure(self, **style: Any):
        from attnviz.render.charts import faithfulness_corpus_figure

        return faithfulness_corpus_figure(self)


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
