"""entropy: each head's mean attention entropy of a run (attnviz.entropy, attnviz entropy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.stats import Entropy

SUMMARY = "Mean attention entropy of every head, layers × heads, beside the uniform baseline ln T."


@dataclass(frozen=True)
class Options:
    layer: Any = option("all", "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    normalised: bool = option(False, "Divide each row by ln(keys it may attend to): 0 one-hot, 1 uniform.",
                              names=("--normalized",))
    rows: Any = option(None, "Only these query rows, exactly: 0-40, 4000:4100 (a window into a long input), or "
                             "generated / prompt (a capture from attnviz generate).", shared="RowsOpt")
    part: str | None = option(None, "", shared="PartOpt")


@register("entropy", Options, SUMMARY)
def compute(run: Any, options: Options) -> Entropy:
    from attnviz.api.stats import entropy

    return entropy(run.capture, **as_keywords(options))
