"""compare: layers side by side on one colour scale (attnviz.compare, attnviz compare): of one run, or of two runs
(two models on one text, two texts, two saved captures)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.analyses.looks import Look
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.views import Comparison

SUMMARY = ("Layers side by side in the terminal (the head mean or one head), on one colour scale, each with a stats "
           "line; or the same layers of two models (-m A,B or --models A,B) or of two captures (--from twice).")


@dataclass(frozen=True)
class Options(Look):
    layer: Any = option(None, "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all. Default: first, "
                              "middle and last.", shared="LayerSel")
    head: Any = option("mean", "Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's "
                               "heads.", shared="HeadSel")
    rows: Any = option(None, "", shared="RowsOpt")
    part: str | None = option(None, "", shared="PartOpt")


@register("compare", Options, SUMMARY, shows_alpha=True)
def compute(run: Any, options: Options, *others: Any) -> Comparison:
    """The run's layers; with another run (or capture) beside it, the same layers of both."""
    from attnviz.api.views import compare

    return compare([run.capture, *(getattr(o, "capture", o) for o in others)], **as_keywords(options))
