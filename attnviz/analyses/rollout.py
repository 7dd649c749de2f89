"""rollout: attention rollout of a run (attnviz.rollout, attnviz rollout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.stats import Rollout

SUMMARY = ("Attention rollout (Abnar & Zuidema 2020): how much each input token reaches a chosen position through "
           "all layers, with the residual stream counted as identity attention.")


@dataclass(frozen=True)
class Options:
    token: str | None = option(None, "Token to explain: an index, or its text. Default: [CLS]/the first start token "
                                     "for encoders, the last token for causal models.")
    part: str | None = option(None, "", shared="SelfPartOpt")


@register("rollout", Options, SUMMARY)
def compute(run: Any, options: Options) -> Rollout:
    from attnviz.api.stats import rollout

    return rollout(run.capture, **as_keywords(options))
