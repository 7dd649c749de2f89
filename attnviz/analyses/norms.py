"""norms: value-weighted norms of a run (attnviz.norms, attnviz norms), from the run's pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import option

if TYPE_CHECKING:
    from attnviz.api.values import Norms

SUMMARY = ("Value-weighted norms (Kobayashi et al. 2020): how much key j actually moves query i, ‖α_ij·f_h(x_j)‖ "
           "with f_h(x) = (x·W_V^h + b_V^h)·W_O^h. Per layer, the share of attention on special tokens by α and by "
           "norm; the exact check that the parts add up to the block's output; -o draws one head's α beside its "
           "norms.")


@dataclass(frozen=True)
class Options:
    layer: Any = option(-1, "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    head: Any = option(0, "Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's heads.",
                       shared="HeadSel")


@register("norms", Options, SUMMARY)
def compute(run: Any, options: Options) -> Norms:
    from attnviz.api.values import norms_of_run

    text = run.text_of("norms")
    with run.lent():
        return norms_of_run(run.model, text, run.encoded, run, layer=options.layer, head=options.head)
