"""What attention costs as T grows, measured: cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.api.models import borrows, resolve_model
from attnviz.render.tables import records_html
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["cost", "Cost"]


@dataclass(frozen=True)
class Cost(Result):
    """Time and peak memory of the full path (α kept, L·H·T² weights) and the streamed path at each T.
    `rows`: T, full_seconds, full_bytes, stream_seconds, stream_bytes, alpha_bytes, full_note."""

    command: ClassVar[str] = "cost"
    model: str
    device: str
    repeats: int
    rows: tuple  # attnviz.engine.costs.CostRow

    figure_name: ClassVar[str] = "attnviz_cost.png"

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        from attnviz.base.sizes import size_text
        from attnviz.render.tables import records_table

        def mib(value):
            return None if value is None else value / (1 << 20)

        shown = [{**r, "full_mib": mib(r["full_bytes"]), "stream_mib": mib(r["stream_bytes"]),
                  "alpha": size_text(float(r["alpha_bytes"] or 0)), "full_note": r["full_note"] or ""}
                 for r in self.records()]
        return [records_table(shown, [("T", "T", "d"), ("full_seconds", "full s", ".2f"),
                                      ("full_mib", "full MiB", ".0f"), ("stream_seconds", "streamed s", ".2f"),
                                      ("stream_mib", "streamed MiB", ".0f"), ("alpha", "α alone", ""),
                                      ("full_note", "", "")], self.title),
                Line("Peak memory above what the process held before each run (the loaded model). Measured, not "
                     "computed; the full path's α alone is L·H·T²·4 bytes.", style="dim")]

    def records(self) -> list[dict]:
        return [{"T": r.T, "full_seconds": r.full_seconds, "full_bytes": r.full_bytes,
                 "stream_seconds": r.stream_seconds, "stream_bytes": r.stream_bytes, "alpha_bytes": r.alpha_bytes,
                 "full_note": r.full_note or None} for r in self.rows]

    def to_dict(self) -> dict:
        """What `attnviz cost --json` prints."""
        return {"model": self.model, "device": self.device, "repeats": self.repeats, "rows": self.records()}

    @property
    def title(self) -> str:
        return (f"{short_model(self.model)} on {self.device}: the head statistics of a T-token input, full path "
                f"against streamed")

    def figure(self, *, ax=None):
        """Both paths' time and memory against T, beside ∝ T² and ∝ T."""
        from attnviz.render.charts import cost_figure

        return cost_figure(list(self.rows), self.title, ax=ax)

    def _repr_html_(self) -> str:
        records = self.records()
        return records_html(records, list(records[0]) if records else [], self.title)


@borrows
@checked
def cost(*, model: Any = None, tokenizer: Any = None, lengths: Sequence[int] | None = None, max_length: int = 2048,
         repeats: int = 1, device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Cost:
    """Measure both paths at each of `lengths` (default: powers of two from 64 up to `max_length` and the
    model's maximum positions); the fastest of `repeats` runs counts (1 to 20)."""
    if not 1 <= repeats <= 20:
        raise UsageError(f"{arg('repeats')} takes 1 to 20 runs; got {repeats}", "repeats")
    if not 2 <= max_length <= 1_000_000:
        raise UsageError(f"{arg('max_length')} takes 2 to 1,000,000 tokens; got {max_length}", "max_length")
    chosen = sorted(set(int(n) for n in lengths)) if lengths is not None else None
    if chosen is not None and (not chosen or chosen[0] < 2):
        raise UsageError(f"{arg('lengths')}: a length is at least 2 tokens", "lengths")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    if loaded.seq2seq:
        raise InputError(f"cost measures one self-attention; {loaded.name} is an encoder-decoder model")
    limit = loaded.max_positions or max_length
    if chosen is None:
        top = min(max_length, limit)
        chosen = [T for T in (2 ** k for k in range(6, 21)) if T <= top] or [top]
    elif chosen[-1] > limit:
        raise UsageError(f"{loaded.name} takes at most {limit} positions", "lengths")
    from attnviz.engine.costs import measure

    with (reporter or Reporter()).progress("Measuring", 2 * len(chosen), "runs") as step:
        rows = measure(loaded, chosen, repeats=repeats, on_step=step)
    return Cost(loaded.name, loaded.device, repeats, tuple(rows))


