"""align: word timings from a speech model's cross-attention (attnviz.align, attnviz align): an analysis of a model
and a sound."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.speech import WordTimings

SUMMARY = ("Word timings from a speech model's cross-attention: the median-filtered weights of its alignment heads, "
           "a monotonic path through them (whisper's timing.py, as faster-whisper's word_timestamps). Prints each "
           "word's start and end, and every cross-attention head's share of weight on the path (which heads align, "
           "and whether the model lists them); -o draws the path over the spectrogram.")


@dataclass(frozen=True)
class Options:
    heads: str | None = option(None, "The cross-attention heads to align with (default: the model's own alignment "
                                     "heads, else every head of the decoder's second half).", metavar="L.H,L.H")
    band: int = option(1, "A head's weight counts as on the path within this many frames (20 ms each) of it.",
                       minimum=0, maximum=50, metavar="FRAMES")
    top: int = option(8, "How many heads to list, by their share on the path.", minimum=0, maximum=10_000,
                      metavar="K")
    target: str | None = option(None, "The transcript to time (forced alignment); without it, the one the model "
                                      "writes.", metavar="TEXT")


@register("align", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options, audio: Any) -> WordTimings:
    from attnviz.api.speech import align

    return align(audio, model=model, **as_keywords(options))
