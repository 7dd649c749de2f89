"""patch: activation patching between two prompts (attnviz.patch, attnviz patch): of a run (the clean prompt) with
the corrupted prompt as its input; its own passes. With senders, path patching (attnviz.path_patch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attnviz.analyses import register
from attnviz.api.patching.methods import PATCHING
from attnviz.base.options import as_keywords, option

SUMMARY = ("Which heads carry the difference between two prompts (activation patching, Meng et al. 2022, Wang et "
           "al. 2022): CLEAN and CORRUPT, of the same number of tokens (else aligned with --align), differ in one "
           "fact; each head's output, and each layer's attention output and residual stream at each position, is "
           "put from the clean run into the corrupted one alone (--noise: the other way), and the logit difference "
           "of two answers at the last position says how much comes back: 0 is the corrupted run, 1 the clean one "
           "(an encoder: the cosine of its sentence embedding with the clean run's). Batched. Checked: every head "
           "and MLP patched gives the donor's run.")


@dataclass(frozen=True)
class Options:
    answers: Any = option(None, "The answer and the other, two tokens of the vocabulary as text (a word's leading "
                                "space is part of its token): ' Paris',' Rome'. Default: the clean and corrupted "
                                "runs' top tokens.", shared="AnswersOpt")
    direction: str = option("denoise", "denoise (the default): the clean run's pieces into the corrupted run; noise: "
                                       "the corrupted run's into the clean one (what each takes away). --noise and "
                                       "--denoise say the same.", metavar="DIRECTION", choices=("denoise", "noise"),
                            switches={"--noise": "noise", "--denoise": "denoise"})
    positions: bool = option(False, "Also patch each head at each position alone (layers × heads × positions "
                                    "patches; --json holds them).")
    align: str | None = option(None, "For prompts of different lengths: which positions are patched with which. auto: "
                                     "the tokens both share, in order, and a changed span by its last token; or pairs "
                                     "CLEAN:CORRUPT (0:0,1:1,3-4:2-3). Positions left out are not patched.",
                               metavar="auto|PAIRS")
    top: int = option(10, "How many heads to list (1 to 100).", minimum=1, maximum=100, metavar="K")
    senders: str | None = option(None, "Path patching (Wang et al. 2022): these heads (layer.head, e.g. 9.6,9.9) "
                                       "patched from the donor run, reaching only the --receivers through their --to "
                                       "inputs, every other head frozen.", metavar="HEADS", hidden=("--from-heads",))
    receivers: str | None = option(None, "--senders: the receiving heads, of later layers (e.g. 10.0,10.7); each is "
                                         "also measured alone.", metavar="HEADS")
    to: str = option("qkv", "--senders: the receivers' inputs the path goes through: q, k, v or together (qk, qkv).",
                     metavar="INPUTS")
    method: str = option("exact", PATCHING.help() + ".", metavar="|".join(PATCHING.names()))
    compare: bool = option(False, "Both exact patching and the estimate (AtP, or --method's) for every head: "
                                  "Pearson's r, the heads where they disagree most, and (with -o) both grids and their "
                                  "scatter.")


@register("patch", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options, corrupt: str) -> Any:
    """A Patching (a PathPatching with senders)."""
    from attnviz.api.patching.activation import patch

    return run.again(patch, run.text_of("patch"), corrupt, truncate=run.truncate, **as_keywords(options))
