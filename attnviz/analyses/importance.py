"""importance: every head removed alone, ranked by its effect (attnviz.importance, attnviz importance): an
intervention, its own passes; of a run, its text (a corpus: attnviz.importance(texts))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.ablation.ranking import Importance

SUMMARY = ("Every head removed alone, ranked by its effect (a causal LM: mean KL divergence of the next-token "
           "distributions; an encoder: how far the sentence embedding moves), batched so that the L·H removals cost "
           "far less than L·H runs; beside it the gradient estimate of Michel et al. 2019 (|∂loss/∂ξ_h| for a gate "
           "ξ_h on each head) and the rank correlation of the two. On TEXT, or averaged over the texts of --corpus "
           "FILE. -o draws both as layers × heads.")


@dataclass(frozen=True)
class Options:
    mode: str = option("zero", "", shared="ModeOpt")
    top: int = option(15, "The K most important heads in the table (all with --json/--csv).", minimum=1,
                      maximum=100_000, metavar="K")
    batched: bool = option(True, "--loop: one forward pass per head instead of the batched pass (slow; the same "
                                 "numbers).", negative="--loop")


@register("importance", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Importance:
    from attnviz.api.ablation.ranking import importance

    return run.again(importance, [run.text_of("importance")], truncate=run.truncate, **as_keywords(options))
