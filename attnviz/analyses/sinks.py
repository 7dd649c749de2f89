"""sinks: attention sinks of a run (attnviz.sinks, attnviz sinks), from the run's pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import option

if TYPE_CHECKING:
    from attnviz.api.values import Sinks

SUMMARY = ("Attention sinks (Gu et al. 2024): keys that receive a large mean weight from the queries that can see "
           "them, which tokens are sinks in which layers, the share of sink heads per layer, and (by value-weighted "
           "norms) whether a sink actually moves anything.")


@dataclass(frozen=True)
class Options:
    threshold: float = option(0.3, "Sink score above which a key is a sink (Gu et al. 2024 use 0.3).", minimum=0.0,
                              maximum=1.0, metavar="NUMBER", click_range=True)
    tokens: int = option(64, "--corpus: each text's first N tokens (Gu et al.: 64).", minimum=2, maximum=4096,
                         metavar="N", click_range=True)


@register("sinks", Options, SUMMARY)
def compute(run: Any, options: Options) -> Sinks:
    from attnviz.api.values import sinks_of_run

    text = run.text_of("sinks")
    with run.lent():
        return sinks_of_run(run.model, text, run.encoded, run, threshold=options.threshold, reporter=run.reporter)
