"""generate: a causal language model writes, its attention kept step by step (attnviz.generate, attnviz generate):
an analysis of a model and a prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.generation import Generation

SUMMARY = ("A causal language model (e.g. -m smollm2, offline) continues the text with the KV cache; every layer's "
           "and head's attention row of every new token is kept as it is produced. Prints the generated text; -o "
           "saves the capture for heatmap, heads, export … --from (--rows generated shows only the new tokens' "
           "rows); --terminal shows, per new token, the earlier tokens it attends to most.")


@dataclass(frozen=True)
class Options:
    sample: bool = option(False, "Sample the next token instead of taking the most likely (greedy).")
    temperature: float | None = option(None, "With --sample: divide the logits by T (below 1 sharper, above 1 "
                                             "flatter). Default 1.", minimum=0.0, metavar="T")
    top_p: float | None = option(None, "With --sample: draw only from the most likely tokens that together hold P "
                                       "of the probability (nucleus sampling). Default 1.", minimum=0.0, metavar="P")
    seed: int = option(0, "With --sample: the random seed, 0 to 2⁶⁴−1 (same seed, same text).", minimum=0,
                       maximum=2**64 - 1, metavar="N")
    output: str | None = option(None, "Save the capture of prompt + generated tokens (.npz; a folder gets "
                                      "generation.npz).", names=("-o",), metavar="FILE")
    layer: Any = option(-1, "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    head: Any = option("mean", "Heads: an index, a list 0,5, a range 0-3, all, or mean / max over the layer's "
                               "heads.", shared="HeadSel")
    top: int = option(3, "--terminal and --json: the K earlier tokens shown per step (1 to 20).", minimum=1,
                      maximum=20, metavar="K")
    part: str | None = option(None, "", shared="PartOpt")


@register("generate", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options, text: str, max_new_tokens: int | None = None) -> Generation:
    from attnviz.api.generation import generate

    return generate(text, model=model, max_new_tokens=max_new_tokens, **as_keywords(options))
