"""heads: the head statistics table of a run (attnviz.heads, attnviz heads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.stats import HeadTable

SUMMARY = ("A table of every head: entropy, max weight, distance, positional scores, mass on special tokens and "
           "punctuation, and a pattern label (attnviz explain defines each).")


@dataclass(frozen=True)
class Options:
    layer: Any = option("all", "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    head: Any = option("all", "Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's heads.",
                       shared="HeadSel")
    label: str | None = option(None, "Only heads with this pattern label.")
    sort: str | None = option(None, "Sort by this column (its header or name: entropy, prev, norm_ent, …).")
    descending: bool | None = option(None, "Largest first, or smallest first [default: --ascending; with --top, "
                                           "--descending]", negative="--ascending", hidden=("--desc/--asc",))
    top: int | None = option(None, "Show only the N highest of the --sort column (the lowest with --ascending).",
                             minimum=1, metavar="N")
    rows: Any = option(None, "Only these query rows, exactly: 0-40, 4000:4100 (a window into a long input), or "
                             "generated / prompt (a capture from attnviz generate).", shared="RowsOpt")
    part: str | None = option(None, "", shared="PartOpt")


@register("heads", Options, SUMMARY)
def compute(run: Any, options: Options) -> HeadTable:
    from attnviz.api.stats import heads

    return heads(run.capture, **as_keywords(options))
