"""positions: what position embeddings do (attnviz.positions, attnviz positions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

SUMMARY = ("Why transformers need positions: shuffle the words and run the model twice. With its position "
           "embeddings zeroed, α of the shuffled text is exactly the same permutation of α (self-attention alone "
           "sees a set); with them it is not. Encoder models (BERT-like). With --image, a vision model's position "
           "embeddings over the picture's patch grid: how similar each patch position is to each other (-o draws a "
           "small map per patch).")


@dataclass(frozen=True)
class Options:
    seed: int = option(0, "Seed of the word shuffle.", minimum=0, metavar="N")
    layer: int = option(-1, "One layer: an index (-1 is the last).", shared="OneLayer")


@register("positions", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Any:
    """A Positions (of a text) or GridPositions (of a picture)."""
    from attnviz.api.scratch.positions import positions

    return run.again(positions, run.source, **as_keywords(options))
