"""contributions: what each token contributes to each token's output (attnviz.contributions, attnviz
contributions); ALTI reads the run's pass, value zeroing runs the model once per token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.api.attribution.contribution_methods import CONTRIBUTIONS
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.attribution.contributions import Contributions

SUMMARY = ("What each token contributes to each token's output, layer by layer, beside where attention looks. ALTI "
           "(Ferrando et al. 2022, the default) splits each attention block's output, residual included, into one "
           "vector per token and measures how close each is to the output (checked: the parts add up to the "
           "block's own output); value zeroing (Mohebbi et al. 2023) zeroes token j's value vectors in a layer and "
           "measures how much each output changes. Per layer, the share on special tokens and on each token itself "
           "by α and by contribution, and how well the two orders agree; per token, its largest contributors in "
           "--layer and through all layers (the rollout); -o draws that layer's α beside its contributions.")


@dataclass(frozen=True)
class Options:
    method: str = option("alti", CONTRIBUTIONS.help() + ".", metavar="METHOD", choices=CONTRIBUTIONS.names(),
                         aliases={"value_zeroing": "value-zeroing", "vz": "value-zeroing", "zeroing": "value-zeroing"})
    layer: Any = option(-1, "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    token: str | None = option(None, "The token whose strongest paths of contribution to list and draw: its index, "
                                     "its text or text#n. Default: the last token that is not special.",
                               metavar="TOKEN")
    threshold: float = option(0.05, "--graph and --html: the smallest contribution drawn as an edge (above 0, at "
                                    "most 1; the page can change it).", minimum=0.0, metavar="NUMBER")
    stream: bool | None = option(None, "ALTI for a long input: never hold the model's layers × heads × T² weights "
                                       "(keep the mean over heads of α recomputed from the weights instead), "
                                       "holding (2 × layers + 4 × heads) × T² × 4 bytes. Default: chosen by itself "
                                       "where the full path would pass the memory budget; --no-stream never.",
                                 negative="--no-stream")
    faithfulness: bool = option(False, "Also measure how faithful α, its rollout and these contributions are on "
                                       "this text (attnviz faithfulness: erasure, leave-one-out, random orders), "
                                       "shown in the report, --json and the page's contributions panel.")


@register("contributions", Options, SUMMARY)
def compute(run: Any, options: Options) -> Contributions:
    from attnviz.api.attribution.contributions import contributions

    text = run.text_of("contributions")
    with run.lent():
        return contributions(text, model=run.model, truncate=run.truncate, reporter=run.reporter, run=run,
                             **as_keywords(options))
