"""lens: what each layer predicts, the logit lens (attnviz.lens, attnviz lens), from the run's pass; a decoder loaded
without its output layer gets it now, onto the same blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.attribution.lens import Lens

SUMMARY = ("What each layer predicts (the logit lens, nostalgebraist 2020): every layer's residual stream read "
           "through the final norm and the unembedding, as if it were the last, at the chosen positions: the top "
           "tokens and their probabilities per layer, and --target's probability and rank. The last row is the "
           "model's own output (checked). For causal language models (e.g. -m smollm2).")


@dataclass(frozen=True)
class Options:
    target: str | None = option(None, "A token to follow through the layers, as text (one token of the model's "
                                      "vocabulary; a word's leading space is usually part of it: ' Paris').",
                                metavar="TOKEN")
    positions: Any = option(-1, "The positions read: an index (-1 is the last token), a list 3,5, a range 2-6, or "
                                "all.", metavar="POSITIONS")
    top: int = option(5, "How many tokens each layer lists (1 to 20).", minimum=1, maximum=20, metavar="K")


@register("lens", Options, SUMMARY)
def compute(run: Any, options: Options) -> Lens:
    from attnviz.api.attribution.lens import lens

    text = run.text_of("lens")
    with run.lent():
        return lens(text, model=run.model, truncate=run.truncate, reporter=run.reporter, run=run,
                    **as_keywords(options))
