"""circuits: QK and OV circuits from the weights alone (attnviz.circuits, attnviz circuits): an analysis of a model,
not of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.mechanisms.circuits import Circuits

SUMMARY = ("QK and OV circuits from the weights alone, no text (Elhage et al. 2021; TransformerLens's FactoredMatrix "
           "and all_composition_scores): each head's OV copying score Σλ/Σ|λ| on the vocabulary's common words (1: "
           "it copies what it attends to), its strongest QK token pairs, and Q-, K-, V-composition between heads of "
           "different layers. A causal LM (-m gemma3).")


@dataclass(frozen=True)
class Options:
    tokens: int = option(2000, "The circuits are read on the vocabulary's first N tokens that are words.",
                         minimum=10, maximum=20000, metavar="N")
    pairs: int = option(3, "Each head's strongest QK token pairs kept (1 to 50).", minimum=1, maximum=50,
                        metavar="K")
    listed: int = option(8, "How many heads and head pairs to list.", minimum=1, maximum=50, metavar="K",
                         hidden=("--top",))


@register("circuits", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options) -> Circuits:
    from attnviz.api.mechanisms.circuits import circuits

    return circuits(model=model, **as_keywords(options))
