"""detect: previous-token, duplicate-token and induction heads on random repeated tokens (attnviz.detect, attnviz
detect): an analysis of a model, not of a run (of a sound: attnviz.detect(audio), the alignment heads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.ablation.detectors import Detection

SUMMARY = ("Find previous-token, duplicate-token and induction heads on controlled inputs: random token sequences "
           "repeated once (Olsson et al. 2022), scored as TransformerLens's head detector does. For a causal LM, the "
           "causal test: the loss on the repeated half with the detected induction heads removed, against as many "
           "random heads.")


@dataclass(frozen=True)
class Options:
    length: int = option(50, "Random tokens per sequence before it repeats (2 to 2,048).", minimum=2, maximum=2048,
                         metavar="N")
    sequences: int = option(4, "Random sequences to average over (1 to 100).", minimum=1, maximum=100, metavar="K")
    seed: int = option(0, "The random seed of the sequences and of the random heads.", minimum=0,
                       maximum=2**32 - 1, metavar="N")
    draws: int = option(10, "Random head sets to remove in the causal test (0 to 100).", minimum=0, maximum=100,
                        metavar="N")
    mode: str = option("zero", "", shared="ModeOpt")


@register("detect", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options) -> Detection:
    from attnviz.api.ablation.detectors import detect

    return detect(model=model, **as_keywords(options))
