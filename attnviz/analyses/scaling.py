"""scaling: why attention divides by √d_k, on the model's own scores (attnviz.scaling, attnviz scaling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.scratch.scaling import Scaling

SUMMARY = ("Why attention divides by √d_k: per layer of the real model, the spread of the scores Q·Kᵀ and the "
           "entropy and peak of the softmax, with and without the division; then the random-vector check at the "
           "model's own d_k and at d_k = 64.")


@dataclass(frozen=True)
class Options:
    dk: list[int] | None = option(None, "The random-vector check also at these d_k (e.g. 16,64,256; each 1 to "
                                        "4,096, at most 8), beside the model's own.", shared="DkOpt")


@register("scaling", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Scaling:
    from attnviz.api.scratch.scaling import scaling

    return run.again(scaling, run.text_of("scaling"), truncate=run.truncate, **as_keywords(options))
