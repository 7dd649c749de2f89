"""A Run: one text through one model, run once, asked many questions (TransformerLens's run_with_cache, without a
string-keyed dict of everything).

    m = attnviz.load("smollm2")
    run = m.run("The capital of France is")
    run.heads(); run.entropy(); run.rollout(); run.sinks(); run.norms(); run.contributions(); run.logit_attr()
    run.passes                                    # 1: the seven read one forward pass

Each method returns what the top-level function of the same name returns for the same text and model
(attnviz.heads(text, model=m) is m.run(text).heads()). Interventions (faithfulness, ablate, patch, value
zeroing, …) change the model's computation and make their own passes, counted in `passes` too. A model object
handed to attnviz.load is borrowed: after each method it is as it was (mode, hooks, gradients, attention
implementation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from attnviz.api.models import LoadedModel, Model, Borrowed
from attnviz.base.text import check_text
from attnviz.data.capture import Capture
from attnviz.errors import UsageError, arg
from attnviz.progress import Reporter

if TYPE_CHECKING:
    from attnviz.api.ablation.removing import Ablation
    from attnviz.api.attribution.contributions import Contributions
    from attnviz.api.attribution.faithfulness import Faithfulness
    from attnviz.api.attribution.logits import LogitAttribution
    from attnviz.api.mechanisms.massive import MassiveActivations
    from attnviz.api.patching.activation import Patching
    from attnviz.api.patching.paths import PathPatching
    from attnviz.api.scratch.scaling import Scaling
    from attnviz.api.scratch.steps import Steps
    from attnviz.api.scratch.verify import Verification
    from attnviz.api.stats import Entropy, HeadTable, Rollout
    from attnviz.api.values import Norms, Sinks
    from attnviz.api.views import Heatmap, TokenAttention

KEEPS = ("auto", "alpha")

__all__ = ["Run"]


class Run:
    """One input run through one model. `capture`: its tokens and α (L, H, T, T), an attnviz.Capture; `passes`:
    how many forward passes the model has made for it so far; `kept`: the named points held beside α
    (blocks.N.resid.pre, blocks.N.attn.out, blocks.N.resid.mid, blocks.N.mlp.out, ln_final.in/out), empty
    where only α is kept. Nothing runs until the first question."""

    def __init__(self, model: LoadedModel, source: Any, *, words: bool = False, truncate: bool = True,
                 keep: str = "auto", reporter: Reporter | None = None):
        if keep not in KEEPS:
            raise UsageError(f"{arg('keep')} takes one of {', '.join(KEEPS)}; got {keep!r:.40}", "keep")
        if isinstance(source, str):
            check_text(source)
        self.model = Model.of(model)
        self.source = source
        self.words = words
        self.truncate = truncate
        self.keep = keep
        self.reporter = reporter or Reporter()
        self.passes = 0
        self._capture: Any = None
        self._encoded: Any = None
        self._recording: Any = None

    def __repr__(self) -> str:
        shown = self.source if isinstance(self.source, str) else type(self.source).__name__
        return f"<attnviz.Run of {self.model.name} on {shown!r:.60}, {self.passes} pass(es)>"

    # --- the passes -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lent(self) -> Iterator[None]:
        """The model for one question: in eval mode with eager attention, its forward passes counted, and given
        back as it was (a model object handed in is the user's)."""
        from attnviz.engine.hooks import counting_calls, hooked
        from attnviz.engine.models import use_eager

        module = self.model.model
        borrowed = Borrowed(module)
        hook, counter = counting_calls(module)
        try:
            use_eager(module)
            module.eval()
            with hooked([hook]):
                yield
        finally:
            self.passes += counter[0]
            borrowed.give_back()

    @property
    def _text(self) -> bool:
        return isinstance(self.source, str) and not self.model.seq2seq

    def _first(self) -> None:
        if self._capture is not None:
            return
        if self._text and not self.words:
            from attnviz.engine.session import first_pass

            with self._lent(), self.reporter.status("Running the model…"):
                self._encoded, self._capture, self._recording = first_pass(
                    self.model, self.source, truncate=self.truncate, parts=self.keep == "auto")
        if self._capture is None:  # α alone, as attnviz.capture makes it (streamed where it does not fit)
            from attnviz.api.capturing import capture

            with self._lent():
                self._capture = capture(self.source, model=self.model, words=self.words, truncate=self.truncate,
                                        reporter=self.reporter)

    @property
    def capture(self) -> Capture:
        """The run's tokens and α (L, H, T, T) float32 (rows sum to 1)."""
        self._first()
        assert isinstance(self._capture, Capture)
        return self._capture

    @property
    def kept(self) -> tuple[str, ...]:
        return tuple(self._recording.points) if self._recording is not None else ()

    def recording(self, names: Sequence[str]):
        """The run's recorded pass when it kept `names`; else one more pass that records them (kept, with what
        the run held, unless the run keeps α alone)."""
        self._first()
        if self._recording is not None and all(name in self._recording for name in names):
            return self._recording
        from attnviz.engine.forward import encode
        from attnviz.engine.session import more_points

        with self._lent():
            if self._encoded is None:
                self._encoded = encode(self.model, self.source, truncate=self.truncate)
            recorded = more_points(self.model, self._encoded, list(names))
        if self.keep == "auto":
            self._recording = recorded
        return recorded

    @property
    def encoded(self):
        self._first()
        if self._encoded is None:
            from attnviz.engine.forward import encode

            self._encoded = encode(self.model, self.source, truncate=self.truncate)
        return self._encoded

    def _needs_text(self, what: str) -> str:
        if not isinstance(self.source, str) or self.words:
            raise UsageError(f"{what} reads a text's tokens; this run is of "
                             f"{'words' if self.words else type(self.source).__name__}")
        return self.source

    # --- the analyses that read the run -----------------------------------------------------------------

    def heads(self, **options: Any) -> HeadTable:
        """attnviz.heads of this run (layer, head, label, sort, descending, rows, part)."""
        from attnviz.api.stats import heads

        return heads(self.capture, **options)

    def entropy(self, **options: Any) -> Entropy:
        """attnviz.entropy of this run (layer, normalised, rows, part)."""
        from attnviz.api.stats import entropy

        return entropy(self.capture, **options)

    def rollout(self, **options: Any) -> Rollout:
        """attnviz.rollout of this run (token, part)."""
        from attnviz.api.stats import rollout

        return rollout(self.capture, **options)

    def heatmap(self, **options: Any) -> Heatmap:
        from attnviz.api.views import heatmap

        return heatmap(self.capture, **options)

    def token(self, token: str | int, **options: Any) -> TokenAttention:
        from attnviz.api.views import token as token_view

        return token_view(self.capture, token, **options)

    def norms(self, *, layer: Any = -1, head: Any = 0) -> Norms:
        """attnviz.norms of this run: value-weighted norms from the run's pass."""
        from attnviz.api.values import norms_of_run

        text = self._needs_text("norms")
        with self._lent():
            return norms_of_run(self.model, text, self.encoded, self, layer=layer, head=head)

    def sinks(self, *, threshold: float = 0.3) -> Sinks:
        """attnviz.sinks of this run."""
        from attnviz.api.values import sinks_of_run

        text = self._needs_text("sinks")
        with self._lent():
            return sinks_of_run(self.model, text, self.encoded, self, threshold=threshold)

    def contributions(self, **options: Any) -> Contributions:
        """attnviz.contributions of this run (method, layer, token, threshold, stream, faithfulness): ALTI reads
        the run's pass; value zeroing runs the model once per token."""
        from attnviz.api.attribution.contributions import contributions

        text = self._needs_text("contributions")
        with self._lent():
            return contributions(text, model=self.model, truncate=self.truncate, reporter=self.reporter,
                                 run=self, **options)

    def logit_attr(self, **options: Any) -> LogitAttribution:
        """attnviz.logit_attr of this run (target, position, top): the parts from the run's pass; a decoder loaded
        without its output layer gets it now, onto the same blocks."""
        from attnviz.api.attribution.logits import logit_attr

        text = self._needs_text("logit_attr")
        with self._lent():
            return logit_attr(text, model=self.model, truncate=self.truncate, reporter=self.reporter, run=self,
                              **options)

    # --- the analyses that run the model again (interventions, other inputs) -----------------------------

    def _again(self, function, *args: Any, **options: Any) -> Any:
        with self._lent():
            return function(*args, model=self.model, reporter=self.reporter, **options)

    def verify(self, **options: Any) -> Verification:
        from attnviz.api.scratch.verify import verify

        return self._again(verify, self.source, truncate=self.truncate, **options)

    def steps(self, **options: Any) -> Steps:
        from attnviz.api.scratch.steps import steps

        return self._again(steps, self._needs_text("steps"), truncate=self.truncate, **options)

    def scaling(self, **options: Any) -> Scaling:
        from attnviz.api.scratch.scaling import scaling

        return self._again(scaling, self._needs_text("scaling"), truncate=self.truncate, **options)

    def faithfulness(self, **options: Any) -> Faithfulness:
        """attnviz.faithfulness of this run's text: erasure and leave-one-out are interventions (their own
        passes)."""
        from attnviz.api.attribution.faithfulness import faithfulness

        return self._again(faithfulness, self._needs_text("faithfulness"), truncate=self.truncate, **options)

    def ablate(self, *args: Any, **options: Any) -> Ablation:
        from attnviz.api.ablation.removing import ablate

        return self._again(ablate, self._needs_text("ablate"), *args, truncate=self.truncate, **options)

    def massive(self, **options: Any) -> MassiveActivations:
        from attnviz.api.mechanisms.massive import massive

        return self._again(massive, self._needs_text("massive"), truncate=self.truncate, **options)

    def patch(self, corrupt: str, **options: Any) -> Patching:
        """attnviz.patch with this run's text as the clean prompt."""
        from attnviz.api.patching.activation import patch

        return self._again(patch, self._needs_text("patch"), corrupt, truncate=self.truncate, **options)

    def path_patch(self, corrupt: str, **options: Any) -> PathPatching:
        """attnviz.path_patch with this run's text as the clean prompt."""
        from attnviz.api.patching.paths import path_patch

        return self._again(path_patch, self._needs_text("path_patch"), corrupt, truncate=self.truncate, **options)
