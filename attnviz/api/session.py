"""A Model loaded once (attnviz.load), and a Run: one text through it, run once, asked many questions
(TransformerLens's run_with_cache, without a string-keyed dict of everything).

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
import os
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from attnviz import analyses
from attnviz.api.models import Borrowed, Deferred, LoadedModel
from attnviz.base.arguments import checked
from attnviz.base.text import check_text
from attnviz.data.capture import Capture
from attnviz.errors import UsageError, arg
from attnviz.progress import Reporter

if TYPE_CHECKING:
    from attnviz.api.ablation.detectors import Detection
    from attnviz.api.costs import Cost
    from attnviz.api.mechanisms.circuits import Circuits
    from attnviz.api.mechanisms.retrieval import RetrievalHeads
    from attnviz.api.ablation.ranking import Importance
    from attnviz.api.ablation.removing import Ablation
    from attnviz.api.attribution.contributions import Contributions
    from attnviz.api.attribution.faithfulness import Faithfulness
    from attnviz.api.attribution.lens import Lens
    from attnviz.api.attribution.why import Why
    from attnviz.api.attribution.logits import LogitAttribution
    from attnviz.api.mechanisms.massive import MassiveActivations
    from attnviz.api.patching.discovery import Discovery
    from attnviz.api.patching.paths import PathPatching
    from attnviz.api.scratch.scaling import Scaling
    from attnviz.api.scratch.steps import Steps
    from attnviz.api.scratch.verify import Verification
    from attnviz.api.stats import Entropy, HeadTable, Rollout
    from attnviz.api.values import Norms, Sinks
    from attnviz.api.corpora import Corpus
    from attnviz.api.gallery import Gallery
    from attnviz.api.generation import Generation
    from attnviz.api.speech import WordTimings
    from attnviz.api.views import Comparison, Heatmap, TokenAttention, View

KEEPS = ("auto", "alpha")

__all__ = ["Model", "Run", "load", "load_model"]


class Model(LoadedModel):
    """A model loaded once for many questions (attnviz.load): its name, the model object (`.model`), its tokenizer,
    device and dtype. `run(text)` runs it on a text once and hands back an attnviz.Run, which every analysis
    asks; every API function also takes a Model as `model=`."""

    @classmethod
    def of(cls, loaded: LoadedModel) -> Model:
        if isinstance(loaded, cls):
            return loaded
        return cls(**{f.name: getattr(loaded, f.name) for f in fields(loaded)})

    def run(self, source: Any, *, words: bool = False, truncate: bool = True, keep: str = "auto",
            reporter: Reporter | None = None) -> Run:
        """Run the model on `source` (a text; or a picture or sound where the model reads one) once, keeping its
        tokens and α and, where they fit the memory budget beside α (`keep` "auto"), the points the analyses
        read: each block's input, its attention's output, the stream after it, its MLP's output, the final
        norm's input and output, and every layer's Q, K, V. `keep` "alpha": α alone (an analysis that needs
        more makes one more pass, counted in `run.passes`). `words`: α between words, as capture(words=True)."""
        return Run(self, source, words=words, truncate=truncate, keep=keep, reporter=reporter)

    # --- the analyses of the weights alone: no text, no run -----------------------------------------------

    def _model_analysis(self, name: str, options: dict, *inputs: Any) -> Any:
        borrowed = Borrowed(self.model)
        try:
            return analyses.get(name)(self, *inputs, **options)
        finally:
            borrowed.give_back()

    def circuits(self, **options: Any) -> Circuits:
        """attnviz.circuits of this model (tokens, pairs, listed)."""
        return self._model_analysis("circuits", options)

    def retrieval(self, **options: Any) -> RetrievalHeads:
        """attnviz.retrieval of this model (lengths, depths, remove, draws, seed, top)."""
        return self._model_analysis("retrieval", options)

    def detect(self, **options: Any) -> Detection:
        """attnviz.detect of this model (length, sequences, seed, draws, mode)."""
        return self._model_analysis("detect", options)

    def cost(self, **options: Any) -> Cost:
        """attnviz.cost of this model (lengths, max_length, repeats)."""
        return self._model_analysis("cost", options)

    # --- the analyses of other inputs than one run: a prompt to continue, a sound, a corpus; the live app ------

    def generate(self, text: str, max_new_tokens: int | None = None, **options: Any) -> Generation:
        """attnviz.generate with this model: it continues `text` (sample, temperature, top_p, seed, output, layer,
        head, top, part)."""
        return self._model_analysis("generate", options, text, max_new_tokens)

    def align(self, audio: Any, **options: Any) -> WordTimings:
        """attnviz.align of `audio` with this speech model (heads, band, top, target)."""
        return self._model_analysis("align", options, audio)

    def corpus(self, texts: Any = None, *, files: Any = None, **options: Any) -> Corpus:
        """attnviz.corpus of `texts` (or `files`) with this model (format, field, batch_size, max_length, words,
        weight, top, out_dir, force; engine "ray" loads its own copies)."""
        return self._model_analysis("corpus", options, texts, files)

    def serve(self, **options: Any) -> None:
        """attnviz serve on this model until Ctrl-C (host, port, max_chars, max_tokens, max_waiting, token): the live
        app, its address printed."""
        analyses.get("serve")(self, **options)


@checked
def load(model: Any = None, *, tokenizer: Any = None, device: str | None = None, dtype: str | None = None) -> Model:
    """Load a model once for many questions: `model` a name (minilm, multilingual, smollm2, …), a folder, a
    .gguf file, a Model, or a Hugging Face model object you hold with its `tokenizer` (borrowed: every analysis
    gives it back as it was). `device` and `dtype` for one loaded here (default "auto" and "float32"); a model
    object keeps its own. The output layer of a decoder is loaded when an analysis first needs it, onto the
    same blocks (never a second copy of the model).

        m = attnviz.load("smollm2")
        run = m.run("The cat sat on the mat")        # one forward pass
        run.heads(), run.sinks(), run.logit_attr()   # no more passes (run.passes == 1)"""
    if isinstance(model, Deferred):
        model = model.load(False)
    if isinstance(model, LoadedModel):
        return Model.of(model)
    if model is None or isinstance(model, (str, os.PathLike)):
        return load_model(model, device=device or "auto", dtype=dtype or "float32")
    from attnviz.engine.models import wrap

    borrowed = Borrowed(model) if callable(getattr(model, "parameters", None)) else None
    try:
        return Model.of(wrap(model, tokenizer))
    finally:  # the user's model as it was: each question switches it to eager attention and back
        if borrowed is not None:
            borrowed.give_back()


@checked
def load_model(name: str | os.PathLike | None = None, *, device: str = "auto", dtype: str = "float32",
               revision: str | None = None, trust_remote_code: bool = False, memory_budget: int | None = None,
               lm_head: bool | str = False, reporter: Reporter | None = None) -> Model:
    """Load a model once for many captures: an offline name (minilm, multilingual, smollm2, gemma3,
    qwen2.5-coder-0.5b, …), a Hugging Face id, a local folder or a .gguf file, with eager attention, in eval mode,
    on `device`. `lm_head`: with its language-model head (True), or where it is a decoder ("auto"). `reporter`:
    the phases of a first conversion into the cache (joining, dequantizing, writing) shown as it goes."""
    from attnviz.engine.models import load

    return Model.of(load(None if name is None else os.fspath(name), revision=revision, device=device, dtype=dtype,
                         trust_remote_code=trust_remote_code, memory_budget=memory_budget, lm_head=lm_head,
                         reporter=reporter))


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
        self._lending = False
        self._memo: dict[str, Any] = {}

    def __repr__(self) -> str:
        shown = self.source if isinstance(self.source, str) else type(self.source).__name__
        return f"<attnviz.Run of {self.model.name} on {shown!r:.60}, {self.passes} pass(es)>"

    # --- the passes -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def lent(self) -> Iterator[None]:
        """The model for one question: in eval mode with eager attention, its forward passes counted, and given
        back as it was (a model object handed in is the user's)."""
        if self._lending:  # a question inside a question: lent and counted once
            yield
            return
        from attnviz.engine.hooks import counting_calls, hooked
        from attnviz.engine.models import use_eager

        module = self.model.model
        borrowed = Borrowed(module)
        hook, counter = counting_calls(module)
        self._lending = True
        try:
            use_eager(module)
            module.eval()
            with hooked([hook]):
                yield
        finally:
            self._lending = False
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

            with self.lent(), self.reporter.status("Running the model…"):
                self._encoded, self._capture, self._recording = first_pass(
                    self.model, self.source, truncate=self.truncate, parts=self.keep == "auto")
        if self._capture is None:  # α alone, as attnviz.capture makes it (streamed where it does not fit)
            from attnviz.api.capturing import capture

            with self.lent():
                self._capture = capture(self.source, model=self.model, words=self.words, truncate=self.truncate,
                                        reporter=self.reporter)

    @property
    def capture(self) -> Capture:
        """The run's tokens and α (L, H, T, T) float32 (rows sum to 1)."""
        self._first()
        assert isinstance(self._capture, Capture)
        return self._capture

    def memo(self, key: str, make: Any) -> Any:
        """What `make()` gives, made once for the run: a quantity two analyses read (value norms for norms and
        sinks; ALTI's scores for contributions and logit_attr). Never changed by them: each builds its result
        from it."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def kept(self) -> tuple[str, ...]:
        return tuple(self._recording.points) if self._recording is not None else ()

    def recording(self, names: Sequence[str]):
        """The run's recorded pass when it kept `names`; else one more pass that records them, and every point
        where they fit the memory budget (kept in place of what the run held)."""
        self._first()
        if self._recording is not None and all(name in self._recording for name in names):
            return self._recording
        from attnviz.engine.forward import encode
        from attnviz.engine.session import more_points

        with self.lent():
            if self._encoded is None:
                self._encoded = encode(self.model, self.source, truncate=self.truncate)
            recorded = more_points(self.model, self._encoded, list(names))
        self._recording = recorded
        return recorded

    @property
    def encoded(self):
        self._first()
        if self._encoded is None:
            from attnviz.engine.forward import encode

            self._encoded = encode(self.model, self.source, truncate=self.truncate)
        return self._encoded

    def text_of(self, what: str) -> str:
        if not isinstance(self.source, str) or self.words:
            raise UsageError(f"{what} reads a text's tokens; this run is of "
                             f"{'words' if self.words else type(self.source).__name__}")
        return self.source

    # --- the analyses that read the run -----------------------------------------------------------------

    def heads(self, **options: Any) -> HeadTable:
        """attnviz.heads of this run (layer, head, label, sort, descending, top, rows, part)."""
        return analyses.get("heads")(self, **options)

    def entropy(self, **options: Any) -> Entropy:
        """attnviz.entropy of this run (layer, normalised, rows, part)."""
        return analyses.get("entropy")(self, **options)

    def rollout(self, **options: Any) -> Rollout:
        """attnviz.rollout of this run (token, part)."""
        return analyses.get("rollout")(self, **options)

    def norms(self, **options: Any) -> Norms:
        """attnviz.norms of this run (layer, head): value-weighted norms from the run's pass."""
        return analyses.get("norms")(self, **options)

    def sinks(self, **options: Any) -> Sinks:
        """attnviz.sinks of this run (threshold)."""
        return analyses.get("sinks")(self, **options)

    def contributions(self, **options: Any) -> Contributions:
        """attnviz.contributions of this run (method, layer, token, threshold, stream, faithfulness): ALTI reads the
        run's pass; value zeroing runs the model once per token."""
        return analyses.get("contributions")(self, **options)

    def logit_attr(self, **options: Any) -> LogitAttribution:
        """attnviz.logit_attr of this run (target, position, top): the parts from the run's pass; a decoder loaded
        without its output layer gets it now, onto the same blocks."""
        return analyses.get("logit-attr")(self, **options)

    def lens(self, **options: Any) -> Lens:
        """attnviz.lens of this run (target, positions, top): every layer's stream from the run's pass, read
        through the final norm and the unembedding."""
        return analyses.get("lens")(self, **options)

    def why(self, **options: Any) -> Why:
        """attnviz.why of this run (layer, head, query, key, versus, top): the score split, from the run's pass."""
        return analyses.get("why")(self, **options)

    def heatmap(self, **options: Any) -> Heatmap:
        """attnviz.heatmap of this run's α (layer, head, rows, cols, cell, hide_special, values, scale, norm, vmax,
        part)."""
        return analyses.get("heatmap")(self, **options)

    def token(self, token: str | int | None = None, **options: Any) -> TokenAttention:
        """attnviz.token of this run's α (layer, tokens, part, scale, norm, vmax)."""
        return analyses.get("token")(self, token, **options)

    def view(self, **options: Any) -> View:
        """attnviz.view of this run's α (layers, precision): the interactive page; .html() is its text."""
        return analyses.get("view")(self, **options)

    def compare(self, *others: Any, **options: Any) -> Comparison:
        """attnviz.compare of this run's α (layer, head, rows, part, scale, norm, vmax); with another run of the same
        tokens (another model's) or a capture, the same layers of both side by side."""
        return analyses.get("compare")(self, *others, **options)

    def export(self, out_dir: Any = None, **options: Any) -> Gallery:
        """attnviz.export of this run's α into `out_dir` (layer, head, format, dpi, workers, force, cmap, part,
        scale, norm, vmax)."""
        return analyses.get("export")(self, **options, **({} if out_dir is None else {"out_dir": out_dir}))

    # --- the analyses that run the model again (interventions, other inputs) -----------------------------

    def again(self, function: Any, *args: Any, **options: Any) -> Any:
        """`function(*args, model=the run's model, reporter=…, **options)` with the model lent: an analysis that
        runs the model itself (an intervention, another input), its passes counted."""
        with self.lent():
            return function(*args, model=self.model, reporter=self.reporter, **options)

    def verify(self, **options: Any) -> Verification:
        """attnviz.verify of this run's input (tolerance, norms): its own pass."""
        return analyses.get("verify")(self, **options)

    def steps(self, **options: Any) -> Steps:
        """attnviz.steps of this run's text (layer, head, token)."""
        return analyses.get("steps")(self, **options)

    def scaling(self, **options: Any) -> Scaling:
        """attnviz.scaling of this run's text (dk)."""
        return analyses.get("scaling")(self, **options)

    def positions(self, **options: Any) -> Any:
        """attnviz.positions of this run's input (seed, layer): a Positions, or a picture's GridPositions."""
        return analyses.get("positions")(self, **options)

    def faithfulness(self, **options: Any) -> Faithfulness:
        """attnviz.faithfulness of this run's text (methods, target, orders, steps, sanity, seed): erasure and
        leave-one-out are interventions (their own passes)."""
        return analyses.get("faithfulness")(self, **options)

    def ablate(self, *args: Any, **options: Any) -> Ablation:
        """attnviz.ablate of this run's text (heads, layer, mode, at; mean_over's texts too): its own passes."""
        if args or options.get("mean_over") is not None:  # an input beside the options (or the old positional heads)
            from attnviz.api.ablation.removing import ablate

            return self.again(ablate, self.text_of("ablate"), *args, truncate=self.truncate, **options)
        options.pop("mean_over", None)
        return analyses.get("ablate")(self, **options)

    def importance(self, **options: Any) -> Importance:
        """attnviz.importance of this run's text (mode, top, batched): every head removed alone."""
        return analyses.get("importance")(self, **options)

    def massive(self, **options: Any) -> MassiveActivations:
        """attnviz.massive of this run's text (ratio, minimum, epsilon, intervene; reference texts too)."""
        reference = options.pop("reference", None)
        if reference is not None:  # texts, not an option of the command line (there: --reference FILE)
            from attnviz.api.mechanisms.massive import massive

            return self.again(massive, self.text_of("massive"), truncate=self.truncate, reference=reference,
                              **options)
        return analyses.get("massive")(self, **options)

    def discover(self, corrupt: str, answers: Sequence[str], **options: Any) -> Discovery:
        """attnviz.discover with this run's text as the clean prompt (method, steps, top): its own passes."""
        return analyses.get("discover")(self, corrupt, answers, **options)

    def patch(self, corrupt: str, **options: Any) -> Any:
        """attnviz.patch with this run's text as the clean prompt (answers, direction, positions, align, top,
        method, compare; senders, receivers, to: path patching): a Patching, or a PathPatching with senders."""
        return analyses.get("patch")(self, corrupt, **options)

    def path_patch(self, corrupt: str, **options: Any) -> PathPatching:
        """attnviz.path_patch with this run's text as the clean prompt."""
        from attnviz.api.patching.paths import path_patch

        return self.again(path_patch, self.text_of("path_patch"), corrupt, truncate=self.truncate, **options)
