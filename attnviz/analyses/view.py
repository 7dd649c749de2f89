"""view: the interactive page of a run (attnviz.view, attnviz view): one offline HTML file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.views import View

SUMMARY = ("An interactive view in one HTML file that works offline in any browser: a head view (hover a token to see "
           "what it attends to), a model view (every layer × head) and a matrix view (exact α on hover). Script, "
           "styles and data are inside the file; nothing is fetched.")


@dataclass(frozen=True)
class Options:
    layers: Any = option(None, "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all. Default: all.",
                         shared="LayerSel")
    precision: str = option("auto", "Bits per stored weight: 16, 8, or auto (16 while the weights take at most 4 MB, "
                                    "else 8).", metavar="BITS", choices=("auto", "16", "8"))


@register("view", Options, SUMMARY, shows_alpha=True)
def compute(run: Any, options: Options) -> View:
    from attnviz.api.views import view

    return view(run.capture, **as_keywords(options))
