"""verify: α recomputed from the formula against what the model reports (attnviz.verify, attnviz verify)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.scratch.verify import Verification

SUMMARY = ("Recompute α = softmax(Q·Kᵀ/√d_k) from the model's own weights and compare it with what the model "
           "reports, per layer. Exit 0 within the tolerance, 3 outside it.")


@dataclass(frozen=True)
class Options:
    tolerance: float | None = option(None, "Largest |Δα| that passes. Default 1e-5 in float32, 5e-3 in float16, "
                                           "5e-2 in bfloat16.", minimum=0.0)
    norms: bool = option(False, "Check the value-weighted norms instead: Σ_h Σ_j α_ij f_h(x_j) + b_O must equal the "
                                "attention block's own output.")


@register("verify", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options) -> Verification:
    from attnviz.api.scratch.verify import verify

    return run.again(verify, run.source, truncate=run.truncate, **as_keywords(options))
