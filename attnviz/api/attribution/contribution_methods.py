"""contributions' methods as a registry (attnviz.base.methods): how much each token contributes to each token's
output, layer by layer. Each method checks its memory and returns (scores (L, T, T), decomposition checks or None,
cosine distances or None, α of the same tokens). Light to import (the engine inside the methods)."""

from __future__ import annotations

from typing import Any, ClassVar

from attnviz.base.methods import Family, Method
from attnviz.errors import InputError, arg

__all__ = ["CONTRIBUTIONS", "Contributor", "MAX_ZEROING_TOKENS"]

MAX_ZEROING_TOKENS = 1024  # value zeroing runs the model once per token (in batches): T runs of T tokens


class Contributor(Method):
    """A way to split what each token contributes. `streams`: it can work a block of rows at a time (a long
    input) and never hold the model's L·H·T² weights."""

    streams: ClassVar[bool] = False

    def streamed(self, loaded: Any, T: int, stream: bool | None) -> bool:
        """Whether this input is worked through streamed (`stream` as the caller gave it)."""
        if stream and not self.streams:
            raise InputError(f"{self.title} does not stream (it runs the model once per token, each run holding "
                             f"its α); use {arg('method', 'alti')} for a long input", "stream")
        return False

    def compute(self, loaded: Any, encoded: Any, streamed: bool, reporter: Any, run: Any) -> tuple:
        raise NotImplementedError


CONTRIBUTIONS: Family[type[Contributor]] = Family("method")


@CONTRIBUTIONS.register
class Alti(Contributor):
    name, title, help = "alti", "ALTI", "Ferrando et al. 2022; one run"
    streams = True

    def streamed(self, loaded, T, stream):
        from attnviz.engine.memory import alti_bytes, check_alti_memory, memory_budget

        budget = loaded.memory_budget or memory_budget()
        streamed = stream is True or (stream is None and alti_bytes(loaded, T, False) > budget)
        check_alti_memory(loaded, T, streamed)
        return streamed

    def compute(self, loaded, encoded, streamed, reporter, run):
        from attnviz.engine.attribution.alti import alti, alti_points
        from attnviz.engine.models import layers_and_heads

        with reporter.progress("Splitting each attention block's output into one part per token"
                               + (" (streamed)" if streamed else ""), layers_and_heads(loaded.model.config)[0],
                               "layers") as step:
            if run is None or streamed:
                scores, checks, seen_alpha = alti(loaded.model, encoded.inputs, streamed=streamed, on_layer=step)
            else:  # the run's pass, ALTI's scores made once for the run (logit_attr reads them too)
                scores, checks, seen_alpha = run.memo("alti", lambda: alti(
                    loaded.model, encoded.inputs, on_layer=step,
                    recording=run.recording(alti_points(loaded.shape[0]))))
        return scores, checks, None, seen_alpha


@CONTRIBUTIONS.register
class ValueZeroing(Contributor):
    name, title, help = "value-zeroing", "value zeroing", "Mohebbi et al. 2023; one run per token"

    def streamed(self, loaded, T, stream):
        super().streamed(loaded, T, stream)
        if T > MAX_ZEROING_TOKENS:
            raise InputError(f"value zeroing runs the model once per token: {T} tokens is more than "
                             f"{MAX_ZEROING_TOKENS:,}; shorten the text, or use {arg('method', 'alti')}")
        from attnviz.engine.memory import check_memory

        check_memory(loaded, T, copies=8.0)  # a batch of 8 copies of the model's α
        return False

    def compute(self, loaded, encoded, streamed, reporter, run):
        from attnviz.engine.attribution.zeroing import value_zeroing
        from attnviz.engine.forward import model_attentions
        from attnviz.engine.scratch.adapters import adapter_for

        base = getattr(loaded.model, "base_model", loaded.model)
        with reporter.progress("Zeroing each token's value vectors", len(encoded.tokens), "tokens") as step:
            scores, distances = value_zeroing(loaded.model, encoded.inputs, adapter_for(base).modules(base),
                                              on_done=step)
        seen_alpha = model_attentions(loaded, encoded) if run is None else run.capture.attentions  # the same tokens'
        return scores, None, distances, seen_alpha
