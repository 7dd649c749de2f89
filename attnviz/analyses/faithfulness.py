"""faithfulness: which explanation to trust, every attribution of one prediction measured (attnviz.faithfulness,
attnviz faithfulness): erasure and leave-one-out are interventions, their own passes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.analyses import register
from attnviz.api.attribution.faithfulness_methods import FAITHFULNESS
from attnviz.base.options import as_keywords, option

SUMMARY = ("Which explanation to trust: every attribution of one prediction (α, rollout, attention flow, ALTI, "
           "ALTI-Logit, value zeroing, gradient × input, integrated gradients, leave-one-out) put to ERASER's tests: "
           "erase each method's top tokens (comprehensiveness) or keep only them (sufficiency) and run the model "
           "again, in bins of 1 to 50 % of the tokens; agreement with leave-one-out (Kendall's τ); random orders as "
           "the baseline to beat; and the sanity check of randomising the model from the top block down (Adebayo "
           "et al. 2018). f: a causal LM's probability of its next token (--target), an encoder's "
           "sentence-embedding cosine.")


@dataclass(frozen=True)
class Options:
    methods: tuple[str, ...] | None = option(None, f"Which methods, separated by commas: {FAITHFULNESS.help()}. "
                                                   f"Default: all that apply (alti-logit needs a causal LM).",
                                             metavar="NAMES", separated="str")
    target: str | None = option(None, "A causal LM's token whose probability f is, as text (' Paris'). Default: the "
                                      "model's own prediction.", metavar="TOKEN")
    orders: int | None = option(None, "Random orders for the baseline (2 to 10,000). Default: 20, or 4 on a text of "
                                      "more than 256 tokens (each order erases ten long texts).", minimum=2,
                                maximum=10_000, metavar="N")
    steps: int = option(20, "Integrated gradients' points (1 to 1,000); the completeness line says when more are "
                            "needed.", minimum=1, maximum=1000, metavar="N")
    sanity: int = option(1, "Depths of the randomisation check, spread from the top block to the first (1: the whole "
                            "model at once, what the verdict reads; more draw the cascade; 0: skip it).", minimum=0,
                         maximum=1000, metavar="N")
    seed: int = option(0, "Seed of the random orders and of the randomised weights.", minimum=0, maximum=2**32 - 1,
                       metavar="N")
    engine: str = option("local", "--corpus: local (this process) or ray (Ray Data, as attnviz corpus: pip install "
                                  "\"attnviz[ray]\").", metavar="ENGINE", choices=("local", "ray"))
    address: str | None = option(None, "Ray: the cluster to join (ray://host:10001, or auto). Default: start a "
                                       "local Ray.")
    workers: int = option(2, "Ray: model replicas (actors), each loading the model once (1 to 4,096).", minimum=1,
                          maximum=4096, metavar="N")


@register("faithfulness", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Any:
    """A Faithfulness of the run's text."""
    from attnviz.api.attribution.faithfulness import faithfulness

    return run.again(faithfulness, run.text_of("faithfulness"), truncate=run.truncate, **as_keywords(options))
