"""token: one token through every layer and head (attnviz.token, attnviz token): a view of the run's α, the token
its input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.analyses.looks import Look
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.views import TokenAttention

SUMMARY = ("One token in every layer and head: what it attends to (its row of α) and which tokens attend to it (its "
           "column), with the heads that link it most strongly to another token.")


@dataclass(frozen=True)
class Options(Look):
    layer: Any = option("all", "Layers: an index (-1 is the last), a list 0,3,5, a range 0-2, or all.",
                        shared="LayerSel")
    tokens: Any = option(None, "Several tokens at once, instead of TOKEN: indices, ranges or texts, comma-separated "
                               "(2,3 · 2-4 · cat,sat#2): their rows and columns summed (--json: summed and averaged).",
                         metavar="TOKENS")
    part: str | None = option(None, "", shared="SelfPartOpt")


@register("token", Options, SUMMARY, shows_alpha=True)
def compute(run: Any, options: Options, token: str | int | None = None) -> TokenAttention:
    from attnviz.api.views import token as token_view

    return token_view(run.capture, token, **as_keywords(options))
