"""scaling: why attention divides by √d_k, on the model's own weights and on random vectors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, visible
from attnviz.errors import UsageError, arg
from attnviz.progress import Reporter

__all__ = ["scaling", "Scaling", "MAX_DK", "MAX_DK_VALUES"]


@dataclass(frozen=True)
class Scaling(Result):
    """Why attention divides by √d_k: per layer of the real model, the spread of the scores and the entropy and
    peak of the softmax with and without the division (`rows`), then random q, k at the model's d_k and at 64
    (`synthetic`, `synthetic_d64`: the std of q·k raw and scaled) and at the d_k asked for (`chosen`)."""

    command: ClassVar[str] = "scaling"
    model: str
    seq2seq: bool
    T: int
    d_k: int
    divides: bool  # the model divides by √d_k itself (T5 does not)
    rows: tuple
    synthetic: tuple[float, float]
    synthetic_d64: tuple[float, float]
    chosen: tuple = ()

    def to_dict(self) -> dict:
        """What `attnviz scaling --json` prints."""
        return {"model": self.model, "T": self.T, "d_k": self.d_k, "ln_T": math.log(self.T),
                "model_divides_by_sqrt_dk": self.divides,
                "layers": [r.__dict__ for r in self.rows],
                "synthetic": {"d_k": self.d_k, "std_raw": self.synthetic[0], "std_scaled": self.synthetic[1]},
                "synthetic_d64": {"std_raw": self.synthetic_d64[0], "std_scaled": self.synthetic_d64[1]},
                "synthetic_dk": [r.__dict__ for r in self.chosen]}

    figure_name: ClassVar[str] = "attnviz_scaling.png"

    def report(self, **style: Any) -> list:
        """Per layer, raw against scaled; what the random vectors show; the d_k asked for."""
        from attnviz.render.tables import scaling_table, synthetic_table

        d_k = self.d_k
        (raw_own, scaled_own), (raw64, scaled64) = self.synthetic, self.synthetic_d64
        where = " (encoder self-attention)" if self.seq2seq else ""
        items: list = [scaling_table(list(self.rows), self.T, d_k,
                                     f"{visible(self.model)}{where}: softmax(QKᵀ) vs softmax(QKᵀ/√d_k)")]
        if not self.divides:
            items.append(Line("T5 does not divide by √d_k: its initialisation scales the query weights down instead "
                              "(Raffel et al. 2020, Mesh TensorFlow), so its own scores are the raw column (plus its "
                              "relative position bias), and the scaled column is what dividing once more would give.",
                              style="yellow"))
        else:
            items.append(Line("raw: the same trained weights and the same Q and K, only without the division by "
                              "√d_k."))
        items.append(Line(f"Random q, k with N(0, 1) entries: std of q·k is √d_k — d_k = {d_k} (this model): "
                          f"{raw_own:.2f} (√{d_k} = {math.sqrt(d_k):.2f}), after ÷√d_k {scaled_own:.2f}; d_k = 64 (the "
                          f"essays' example): {raw64:.2f} (√64 = 8), after ÷√d_k {scaled64:.2f}. Without the scaling "
                          f"the logits grow with √d_k, the softmax saturates towards one-hot, and its gradients "
                          f"vanish."))
        if self.chosen:
            items.append(synthetic_table(list(self.chosen), self.T, d_k))
        return items

    def figure(self, *, ax=None):
        """Per layer: the scores' spread and the softmax's entropy and peak, raw against scaled."""
        from attnviz.render.png import scaling_figure

        return scaling_figure(list(self.rows), self.T, self.d_k, self.model, ax=ax)


MAX_DK = 4096  # scaling's random vectors: d_k at most (a T × d_k draw per value)
MAX_DK_VALUES = 8


@borrows
@checked
def scaling(text: str, *, model: Any = None, tokenizer: Any = None, dk: list[int] | None = None,
            truncate: bool = True, device: str = "auto", dtype: str = "float32",
            reporter: Reporter | None = None) -> Scaling:
    """The √d_k experiment on real weights; `dk`: the random-vector check also at these d_k (up to
    MAX_DK_VALUES of them, each from 1 to MAX_DK)."""
    check_text(text)
    if dk is not None and (not 1 <= len(dk) <= MAX_DK_VALUES or not all(1 <= d <= MAX_DK for d in dk)):
        raise UsageError(f"{arg('dk')} takes up to {MAX_DK_VALUES} whole numbers from 1 to {MAX_DK:,}; got "
                         f"{str(list(dk))[:60]}", "dk")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    from attnviz.engine.scratch.adapters import seq2seq_adapter_for
    from attnviz.engine.scratch.scaling import scaling_rows, synthetic_row, synthetic_scaling

    with (reporter or Reporter()).status("Recomputing Q and K…"):
        rows, T, d_k = scaling_rows(loaded, text, truncate=truncate)
    folds = loaded.seq2seq and seq2seq_adapter_for(loaded.model).folds_scaling  # T5: no ÷√d_k of its own
    chosen = [synthetic_row(d, T) for d in dict.fromkeys([d_k, *(dk or [])])] if dk else []
    return Scaling(loaded.name, loaded.seq2seq, T, d_k, not folds, tuple(rows), synthetic_scaling(d_k),
                   synthetic_scaling(64), tuple(chosen))
