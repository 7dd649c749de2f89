"""steps: one head's attention step by step from the model's own weights (attnviz.steps, attnviz steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.scratch.steps import Steps

SUMMARY = ("One head's attention step by step, from the model's own weights: Q and K, the scores Q·Kᵀ, the scaling "
           "by √d_k, the mask, the softmax → α, and α·V; α is checked against the model's own. --token follows one "
           "query row.")


@dataclass(frozen=True)
class Options:
    layer: int = option(0, "One layer: an index (-1 is the last).", shared="OneLayer")
    head: int = option(0, "One head: an index (-1 is the last).", shared="OneHead")
    token: str | None = option(None, "A token: its index, its text (case-insensitive) or text#n for the n-th "
                                     "occurrence (the#2).", shared="TokenOpt")


@register("steps", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Steps:
    from attnviz.api.scratch.steps import steps

    return run.again(steps, run.text_of("steps"), truncate=run.truncate, **as_keywords(options))
