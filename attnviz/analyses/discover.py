"""discover: the circuit behind the difference between two prompts (attnviz.discover, attnviz discover): of a run
(the clean prompt) with the corrupted prompt and the two answers as inputs; its own passes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.api.patching.methods import DISCOVERY
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.patching.discovery import Discovery

SUMMARY = ("Find the circuit behind the difference between two prompts (edge attribution patching: EAP, Syed et al. "
           "2023; EAP-IG, Hanna et al. 2024). Every edge of the residual graph — from the input, each head and each "
           "MLP to every later head's query, key and value input, MLP and the logits — is scored by (a clean − a "
           "corrupted) · ∂M/∂(the receiver's input), M the logit difference of the two answers; then the circuits "
           "of the top edges are run, every other edge fed the corrupted run's contribution, for the faithfulness "
           "curve (MIB): 0 the corrupted run, 1 the clean one. CLEAN and CORRUPT have as many tokens; or --pairs, "
           "scores summed over them. Checked: every edge kept gives the clean run, none the corrupted one (exit 3 if "
           "not). Needs a causal language model (-m smollm2, qwen2.5-coder-0.5b, gemma3, a GPT-2 or Llama-style "
           "folder, …).")


@dataclass(frozen=True)
class Options:
    method: str = option("eap-ig", DISCOVERY.help() + ".", metavar="|".join(DISCOVERY.names()))
    steps: int = option(5, "eap-ig's interpolation steps (1 to 100).", minimum=1, maximum=100, metavar="N")
    top: int = option(20, "How many edges to list (1 to 1000); --json and --csv give every edge.", minimum=1,
                      maximum=1000, metavar="K")


@register("discover", Options, SUMMARY, intervenes=True)
def compute(run: Any, options: Options, corrupt: str, answers: Sequence[str]) -> Discovery:
    from attnviz.api.patching.discovery import discover

    return run.again(discover, run.text_of("discover"), corrupt, answers=answers, **as_keywords(options))
