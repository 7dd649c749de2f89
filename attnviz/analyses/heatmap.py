"""heatmap: α as heatmaps (attnviz.heatmap, attnviz heatmap): a view of the run's α."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.analyses.looks import Look
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.views import Heatmap

SUMMARY = ("Draw the attention weights α as a heatmap: to an image file (PNG, SVG, PDF), or in the terminal with "
           "--terminal. Several layers or heads give a panel each.")


@dataclass(frozen=True)
class Options(Look):
    layer: Any = option(-1, "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    head: Any = option("mean", "Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's "
                               "heads.", shared="HeadSel")
    rows: Any = option(None, "", shared="RowsOpt")
    cols: Any = option(None, "", shared="ColsOpt")
    cell: Any = option(None, "A picture's capture: draw where this cell of its grid looks (its row of α) instead of "
                             "[CLS].", shared="CellOpt", hidden=("--patch",))
    hide_special: bool = option(False, "Leave out [CLS], [SEP], <s> and other special tokens (rows are not "
                                       "renormalised).")
    values: bool = option(False, "Write each weight in its cell (when cells are big enough to read).")
    tokens: Any = option(None, "Select several tokens: indices, ranges or texts, comma-separated (2,3 · 2-4 · "
                               "cat,sat#2): marked ▸, with one more row, the mean of their rows, and one more "
                               "column, the sum of their columns (--json: summed and averaged).", metavar="TOKENS")
    part: str | None = option(None, "", shared="PartOpt")


@register("heatmap", Options, SUMMARY, shows_alpha=True)
def compute(run: Any, options: Options) -> Heatmap:
    from attnviz.api.views import heatmap

    return heatmap(run.capture, **as_keywords(options))
