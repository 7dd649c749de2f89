"""massive: massive activations and the sinks they make (attnviz.massive, attnviz massive)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.mechanisms.massive import MassiveActivations

SUMMARY = ("Massive activations (Sun et al. 2024): entries of the residual stream over 100 and about 1000× the "
           "layer's median, on a few fixed dimensions and tokens; the attention sinks they make (Gu et al. 2024: "
           "which sink heads' keys hold them) and how small those tokens' value vectors are. --intervene sets them "
           "to 0 and to their mean over other texts where they first appear, and measures the next-token loss and "
           "the sinks (a causal LM, e.g. -m gemma3).")


@dataclass(frozen=True)
class Options:
    ratio: float = option(1000.0, "Massive: over this many times the layer's median |h| (Sun et al.: about 1000).",
                          minimum=1.0, metavar="NUMBER", click_range=True)
    minimum: float = option(100.0, "…and over this magnitude (Sun et al.: 100).", minimum=0.0, metavar="NUMBER",
                            click_range=True)
    epsilon: float = option(0.3, "A sink head: a key's importance (its mean weight from the queries that can see "
                                 "it) above this (Gu et al.: 0.3).", minimum=0.0, maximum=1.0, metavar="NUMBER",
                            click_range=True)
    intervene: bool = option(False, "Run again with the massive entries set to 0, and to their mean over other "
                                    "texts, where each first appears: the next-token loss and the sink rate of each "
                                    "run.")


@register("massive", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> MassiveActivations:
    from attnviz.api.mechanisms.massive import massive

    return run.again(massive, run.text_of("massive"), truncate=run.truncate, **as_keywords(options))
