"""steps: one head's attention in order, from the model's own weights: Q, K, Q·Kᵀ, ÷√d_k, the mask, softmax → α,
α·V, with α checked against the model's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Result
from attnviz.base.arguments import checked
from attnviz.base.records import plain
from attnviz.base.selection import Selection, check_token, find_token
from attnviz.base.text import check_text
from attnviz.progress import Reporter

__all__ = ["steps", "Steps"]


def one_index(index: int, n: int, what: str) -> int:
    """One layer or head index (negative counts from the end), checked against n."""
    return Selection.parse(str(int(index)), what, field=what).indices(n)[0]


@dataclass(frozen=True)
class Steps(Result):
    """One head's attention step by step from the model's own weights: Q, K, V, the scores Q·Kᵀ, the scaling
    by √d_k, the mask, softmax → α (checked against the model's own α: max_abs_diff), and α·V.
    `computed` holds the arrays: q, k, v (T, d_k); scores, scaled, alpha (T, T); allowed (T, T) bool; out."""

    command: ClassVar[str] = "steps"
    model: str
    text: str
    layer: int
    head: int
    tokens: tuple[str, ...]
    token: int | None  # the query row followed, if one was asked for
    computed: Any  # attnviz.engine.scratch.steps.HeadSteps

    @property
    def figure_name(self) -> str:
        return f"{self.page().name}.png"

    @property
    def d_k(self) -> int:
        return self.computed.d_k

    @property
    def max_abs_diff(self) -> float:
        return self.computed.max_diff

    def to_dict(self) -> dict:
        """What `attnviz steps --json` prints."""
        r = self.computed
        return plain({"model": self.model, "layer": self.layer, "head": self.head, "tokens": list(self.tokens),
                      "token": self.token, "d_k": r.d_k, "sqrt_d_k": r.d_k ** 0.5, "q": r.q, "k": r.k, "v": r.v,
                      "scores": r.scores, "scaled": r.scaled, "allowed": r.allowed, "alpha": r.alpha, "out": r.out,
                      "model_alpha": r.model_alpha, "max_abs_diff": r.max_diff})

    def report(self, *, width: int = 100, color: bool = False, **style: Any) -> list:
        """Each step in the terminal, in order; with `token`, that query row's numbers."""
        from attnviz.render.terminal import steps_renderable

        return [steps_renderable(self.page(), self.computed, width=width, color=color, token=self.token)]

    def page(self):
        """The steps as one Page of panels (Q, K, scores, scaled, α, α·V)."""

        from attnviz.panels import steps_page

        return steps_page(self.computed, list(self.tokens), self.model, self.text)

    def figure(self, *, cmap: str = "viridis", ax=None):
        """Every step as one matplotlib Figure."""
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(), cmap=cmap, ax=ax)


@borrows
@checked
def steps(text: str, *, model: Any = None, tokenizer: Any = None, layer: int = 0, head: int = 0,
          token: str | int | None = None, truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Steps:
    """One head's computation in order, from the model's own weights: Q, K, Q·Kᵀ, ÷√d_k, the mask, softmax → α,
    α·V; α checked against the model's. `token` (an index or a token's text) follows one query row."""
    check_text(text)
    check_token(token)
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("steps")
    from attnviz.engine.forward import encode
    from attnviz.engine.scratch.steps import head_steps

    n_layers, n_heads = loaded.shape
    which_layer, which_head = one_index(layer, n_layers, "layer"), one_index(head, n_heads, "head")
    with (reporter or Reporter()).status("Running the model and the from-scratch path…"):
        encoded = encode(loaded, text, truncate=truncate)
        result = head_steps(loaded, encoded, which_layer, which_head)
    row = find_token(encoded.tokens, str(token)) if token is not None else None
    return Steps(loaded.name, text, which_layer, which_head, tuple(encoded.tokens), row, result)
