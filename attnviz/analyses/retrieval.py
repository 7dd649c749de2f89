"""retrieval: retrieval heads on needle-in-a-haystack prompts attnviz makes (attnviz.retrieval, attnviz retrieval):
an analysis of a model, not of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.mechanisms.retrieval import RetrievalHeads

SUMMARY = ("Retrieval heads (Wu et al. 2024): needle-in-a-haystack prompts made by attnviz (a secret number among "
           "plain sentences, then the question), the model's answer written token by token, and each head's share "
           "of the needle it copies (its most-attended key in the needle, holding the token just written), over the "
           "prompts answered correctly. The causal test: the top heads removed against as many random heads, by the "
           "answer tokens still predicted. A causal LM (-m gemma3).")


@dataclass(frozen=True)
class Options:
    lengths: tuple[int, ...] = option((300, 600, 1200), "Prompt lengths in tokens, about (60 to 16,384).",
                                      metavar="N,N", separated="int")
    depths: tuple[float, ...] = option((0.1, 0.5, 0.9), "Where the needle sits: 0 at the start, 1 at the end.",
                                       metavar="D,D", separated="float")
    remove: int = option(10, "The causal test removes the K top heads (0: no test).", minimum=0, maximum=1000,
                         metavar="K")
    draws: int = option(5, "…against N draws of K random heads.", minimum=0, maximum=100, metavar="N")
    seed: int = option(0, "The random seed of the prompts and of the random heads.", minimum=0, maximum=2**32 - 1,
                       metavar="N")
    top: int = option(10, "How many heads to list.", minimum=1, maximum=100, metavar="K")


@register("retrieval", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options) -> RetrievalHeads:
    from attnviz.api.mechanisms.retrieval import retrieval

    return retrieval(model=model, **as_keywords(options))
