"""why: why a head attends where it does (attnviz.why, attnviz why): its score split into query-side × key-side parts
of the residual stream, from the run's pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.attribution.why import Why

SUMMARY = ("Why a head attends where it does: its pre-softmax score from the query to the key split over the parts "
           "of the residual stream entering its layer — the embeddings, every earlier head's output, every MLP, the "
           "biases — on the query side × the key side, the norm in front linearised at this run's scale; the terms "
           "add up to the score exactly (printed). --versus: why this key rather than another (the split of "
           "log α − log α'). Each earlier head named with its pattern label. Decoders (e.g. -m smollm2) and "
           "BERT-family encoders.")


@dataclass(frozen=True)
class Options:
    layer: int = option(0, "One layer: an index (-1 is the last).", shared="OneLayer")
    head: int = option(0, "One head: an index (-1 is the last).", shared="OneHead")
    query: str | None = option(None, "The query: a position or a token's text (text#n). Default: the last token.",
                               metavar="TOKEN")
    key: str | None = option(None, "The key: a position or a token's text. Default: the key the head attends to "
                                   "most from the query, the first token (a sink) left out.", metavar="TOKEN")
    versus: str | None = option(None, "Why --key rather than this key: the split of s − s' = log α − log α'.",
                                metavar="TOKEN")
    top: int = option(10, "How many terms to list (1 to 200).", minimum=1, maximum=200, metavar="K")


@register("why", Options, SUMMARY)
def compute(run: Any, options: Options) -> Why:
    from attnviz.api.attribution.why import why

    text = run.text_of("why")
    with run.lent():
        return why(text, model=run.model, truncate=run.truncate, reporter=run.reporter, run=run,
                   **as_keywords(options))
