"""ablate: heads removed and what changes (attnviz.ablate, attnviz ablate): an intervention, its own passes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.ablation.removing import Ablation

SUMMARY = ("Remove heads and see what changes: for a causal LM (e.g. -m smollm2) the next-token distribution at "
           "every position (KL divergence, the top token before and after, the probability of the original top "
           "token; --at one position in full); for an encoder the sentence embedding (cosine before/after) and each "
           "token's final hidden state; for both, how the later layers' attention changed (Δα; -o draws it, -t in "
           "the terminal). Checked against a second mechanism: the same heads removed by editing the output "
           "projection's weights.")


@dataclass(frozen=True)
class Options:
    heads: str | None = option(None, "", shared="HeadsOpt")
    layer: Any = option(None, "", shared="LayersOpt")
    mode: str = option("zero", "", shared="ModeOpt")
    at: str | None = option(None, "A causal LM: the top 5 next tokens before and after at this position (an index, "
                                  "-1 the last, or the token's text).", metavar="TOKEN")


@register("ablate", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Ablation:
    """(mean_over, the texts of mode "mean"'s average, is an input: Run.ablate takes it beside the options.)"""
    from attnviz.api.ablation.removing import ablate

    return run.again(ablate, run.text_of("ablate"), truncate=run.truncate, **as_keywords(options))
