"""capture: a run's α, tokens and metadata as a Capture (attnviz.capture, attnviz capture), or its value-weighted
norms (norms=True)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.analyses import register
from attnviz.base.options import option

SUMMARY = ("Run the model once and save α, the tokens and the metadata as a .npz capture, for any command's --from "
           "later (which then needs neither torch nor transformers). An encoder-decoder model's capture holds all "
           "three parts (encoder, decoder, cross).")


@dataclass(frozen=True)
class Options:
    norms: bool = option(False, "Save value-weighted norms ‖α·f(x)‖ instead of α (meta quantity: norm).")


@register("capture", Options, SUMMARY, shows_alpha=True)
def compute(run: Any, options: Options) -> Any:
    """The run's Capture (of an encoder-decoder model, its Parts); with norms, the capture of ‖α·f(x)‖ shares."""
    if options.norms:
        return run.norms().capture
    return run.capture
