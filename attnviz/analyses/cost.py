"""cost: what attention costs as the input grows, measured (attnviz.cost, attnviz cost): an analysis of a model,
not of a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.costs import Cost

SUMMARY = ("What attention costs as the input grows, measured: time and peak memory of the full path (α kept, "
           "L·H·T² weights) and the streamed path (blocks of query rows, as FlashAttention tiles it) at T = 64, 128, "
           "… up to the model's maximum positions or --max-length, beside O(T²) and O(T). -o draws both against T. "
           "The essays' n = 8192: -m smollm2 --max-length 8192 (slow).")


@dataclass(frozen=True)
class Options:
    lengths: tuple[int, ...] | None = option(None, "The lengths to measure (default: powers of two from 64).",
                                             metavar="LENGTHS", shared="LengthsOpt")
    max_length: int = option(2048, "The longest input of the default lengths (also capped at the model's maximum "
                                   "positions).", minimum=2, maximum=1_000_000, metavar="N")
    repeats: int = option(1, "Runs per length and path; the fastest counts (1 to 20).", minimum=1, maximum=20,
                          metavar="R")


@register("cost", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options) -> Cost:
    from attnviz.api.costs import cost

    return cost(model=model, **as_keywords(options))
