"""logit-attr: direct logit attribution of a run (attnviz.logit_attr, attnviz logit-attr), from the run's pass; a
decoder loaded without its output layer gets it now, onto the same blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.attribution.logits import LogitAttribution

SUMMARY = ("Which heads write the predicted token (direct logit attribution): the logit of the next token (the "
           "model's own prediction, or --target) split into one part per head, MLP, the embeddings and the biases, "
           "through the final norm with its scale frozen; per top head the tokens it raises and lowers and the "
           "source tokens it carries its effect from; and which input tokens push the prediction, through which "
           "heads (ALTI-Logit, Ferrando et al. 2023). Checked: the parts add up to the model's own logit. For "
           "causal language models (e.g. -m smollm2).")


@dataclass(frozen=True)
class Options:
    target: str | None = option(None, "The token whose logit to split, as text (one token of the model's vocabulary; "
                                      "a word's leading space is usually part of it: ' Paris'). Default: the "
                                      "model's own prediction.", metavar="TOKEN")
    position: int = option(-1, "The position whose next token is split (an index; -1 is the last token).",
                           minimum=-(10**9), maximum=10**9, metavar="N")
    top: int = option(10, "How many heads to list (1 to 100), by |effect|.", minimum=1, maximum=100, metavar="K")


@register("logit-attr", Options, SUMMARY)
def compute(run: Any, options: Options) -> LogitAttribution:
    from attnviz.api.attribution.logits import logit_attr

    text = run.text_of("logit_attr")
    with run.lent():
        return logit_attr(text, model=run.model, truncate=run.truncate, reporter=run.reporter, run=run,
                          **as_keywords(options))
