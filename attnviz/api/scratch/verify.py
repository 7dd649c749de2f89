"""verify: α recomputed from the formula softmax(Q·Kᵀ/√d_k), from the model's own weights, against what the model
reports (and a saved capture against one forward pass); or value-weighted norms against the attention block's
own output."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attnviz.api.capturing import capture as capture_text
from attnviz.api.models import LoadedModel as Model, borrows, for_input, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, visible
from attnviz.data.capture import Capture
from attnviz.data.modality import SOUND, of_input
from attnviz.data.parts import Parts, load_capture
from attnviz.data.picture import Picture
from attnviz.data.sound import Sound, WINDOW_SECONDS
from attnviz.errors import InputError, UsageError, arg
from attnviz.metrics import differences
from attnviz.progress import Reporter
from attnviz.render.tables import records_html

__all__ = ["verify", "Verification", "TOLERANCE", "MISMATCH_EXIT", "model_of", "score_tolerance"]

# Default tolerance on max |Δα| by dtype. float32 is the target; in half precision the model's own α
# carries rounding that the float32 recomputation does not (measured on MiniLM: 9.6e-4 in float16,
# 9.0e-3 in bfloat16), so the defaults leave about 5x headroom.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 5e-2}
# A float32 score of size |z| is itself known only to |z|·2⁻²⁴, and the model and the formula sum Q·Kᵀ in their
# own orders, so where the scores are large (Qwen2.5's keys reach norms of 280: scores of ±1,470) α can differ by
# up to about |z|·2⁻²³ between two correct float32 computations (measured at 0.12–0.39 of that on MiniLM,
# SmolLM2 and Qwen2.5-Coder): the float32 default grows to that where it is larger.
SCORE_ROUNDING = 2.0 ** -23


def score_tolerance(given: float | None, dtype: str, largest: float | None) -> float:
    """The tolerance a check uses: the one given, else the dtype's default, in float32 at least the rounding of
    the largest score."""
    if given is not None:
        return given
    default = TOLERANCE[dtype]
    return max(default, SCORE_ROUNDING * largest) if dtype == "float32" and largest else default
MISMATCH_EXIT = 3  # what `attnviz verify` exits with when a check fails


@dataclass(frozen=True)
class Verification(Result):
    """α recomputed from the model's weights against what the model reports (and, for a saved capture, the
    saved α against one forward pass), per layer: `checks` maps each comparison to its layers' differences.

    kind       "text" (a text run now), "capture" (a saved capture), "parts" (an encoder-decoder model's three
               attentions), "norms" (value-weighted norms against the attention block's own output)
    passed     every comparison within `tolerance` (for norms: the relative difference)
    """

    command: ClassVar[str] = "verify"
    kind: str
    model: str
    dtype: str
    device: str
    tolerance: float
    checks: dict = field(default_factory=dict)  # name -> list[LayerDifference]
    captures: dict = field(default_factory=dict)  # name -> the Capture each comparison is about (its shape)
    source: str | None = None  # the capture file checked, as named by the caller
    norms: Any = None  # kind "norms": the engine's NormsResult (output_diff, output_scale, relative_diff)
    largest_score: float | None = None  # the largest |score| the softmax read (the float32 tolerance grows with it)

    def worst(self, name: str):
        return max(self.checks[name], key=lambda d: d.max_abs)

    @property
    def max_abs_diff(self) -> float:
        if self.kind == "norms":
            return float(self.norms.output_diff.max())
        return max(self.worst(name).max_abs for name in self.checks)

    @property
    def max_rel_diff(self) -> float:
        return float(self.norms.relative_diff.max())

    @property
    def passed(self) -> bool:
        if self.kind == "norms":
            return self.max_rel_diff <= self.tolerance
        return all(self.worst(name).max_abs <= self.tolerance for name in self.checks)

    def _check(self, name: str) -> dict:
        worst = self.worst(name).max_abs
        return {"max_abs_diff": worst, "passed": worst <= self.tolerance,
                "layers": [d.__dict__ for d in self.checks[name]]}

    def to_dict(self) -> dict:
        """What `attnviz verify --json` prints."""
        head = {"model": self.model, "dtype": self.dtype}
        if self.kind == "norms":
            result = self.norms
            return {**head, "tolerance": self.tolerance, "max_abs_diff": self.max_abs_diff,
                    "max_rel_diff": self.max_rel_diff, "passed": self.passed,
                    "layers": [{"layer": n, "max_abs": float(d), "output_max": float(s), "max_rel": float(r)}
                               for n, (d, s, r) in enumerate(zip(result.output_diff, result.output_scale,
                                                                 result.relative_diff))]}
        head["device"] = self.device
        if self.kind == "text":
            reported = self.captures["model_vs_scratch"]
            return {**head, "tokens": list(reported.tokens), "tolerance": self.tolerance,
                    "largest_score": self.largest_score, "max_abs_diff": self.max_abs_diff, "passed": self.passed,
                    "layers": [d.__dict__ for d in self.checks["model_vs_scratch"]]}
        if self.kind == "capture":
            return {**head, "capture": self.source, "tokens": list(self.captures["saved_vs_model"].tokens),
                    "tolerance": self.tolerance, "largest_score": self.largest_score, "passed": self.passed,
                    **{name: self._check(name) for name in self.checks}}
        encoder = self.captures.get("encoder")
        return {**head, "capture": self.source, "tolerance": self.tolerance, "passed": self.passed,
                "source_tokens": list(encoder.tokens) if encoder is not None else None,
                "target_tokens": list(self.captures["target"].tokens),
                "checks": {name: self._check(name) for name in self.checks}}

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else MISMATCH_EXIT

    def _scores_note(self) -> list:
        """Why the tolerance is above the dtype's default, where the scores made it so."""
        if not self.largest_score or self.tolerance <= TOLERANCE.get(self.dtype, 0.0) \
                or self.tolerance != score_tolerance(None, self.dtype, self.largest_score):
            return []
        return [Line(f"The tolerance is float32's rounding of the largest score the softmax reads (±"
                     f"{self.largest_score:,.0f} × 2⁻²³ = {self.tolerance:.1e}), not the default "
                     f"{TOLERANCE[self.dtype]:g}: two correct float32 computations of α differ by about that.")]

    def report(self, **style: Any) -> list:
        """Each comparison's table and verdict, and what PASS or FAIL means."""
        from attnviz.render.tables import norms_check_table, verdict

        ok, tolerance = self.passed, self.tolerance
        if self.kind == "norms":
            check = self.norms
            title = f"{visible(self.model)}: Σ_h Σ_j α_ij f_h(x_j) + b_O against the block's output"
            return [norms_check_table(check.output_diff, tolerance, title, check.output_scale),
                    verdict(ok, f"max |Δ| / max(1, largest |output|) = {self.max_rel_diff:.2e} "
                                f"{'≤' if ok else '>'} tolerance {tolerance:g} (max |Δ| = {self.max_abs_diff:.2e})"),
                    Line("PASS means: each head's attention-weighted value vectors, through its slice of W_O, add up "
                         "to what the attention block itself outputs, so the norms ‖α_ij f_h(x_j)‖ are the true sizes "
                         "of the parts." if ok else "FAIL means: the parts do not add up to the block's output; the "
                                                    "norms would be wrong.")]
        if self.kind == "text":
            worst = self.worst("model_vs_scratch")
            return [*self._verdicts({"model_vs_scratch": self._title(self.captures["model_vs_scratch"])}),
                    Line(f"PASS means: computing softmax(Q·Kᵀ/√d_k) ourselves, from this model's own weights, gives "
                         f"the attention weights the model reports, for every layer and head, to within {tolerance:g}."
                         if ok else f"FAIL means: the textbook formula, applied to this model's weights, does not give "
                                    f"the weights the model reports (off by up to {worst.max_abs:.2e}); the model does "
                                    f"something the formula leaves out."), *self._scores_note()]
        if self.kind == "capture":
            saved = self.captures["saved_vs_model"]
            made = "generated step by step with the KV cache, " if saved.generated is not None else ""
            titles = {"saved_vs_model": f"the saved α ({made}{visible(str(self.source))}) against one forward pass: ",
                      "model_vs_scratch": "that forward pass against softmax(Q·Kᵀ/√d_k) from the weights: "}
            return [*self._verdicts({name: self._title(saved, what) for name, what in titles.items()}),
                    Line("PASS means: the saved attention is what this model computes for these tokens in one pass, "
                         "and that is the textbook formula applied to the model's own weights." if ok else
                         "FAIL means: the saved attention is not what this model computes for these tokens (another "
                         "model or revision, or a changed file), or the model does something the formula leaves "
                         "out.")]
        from attnviz.panels import PART_TITLES

        titles = {}
        for name in self.checks:
            part, what = name.split(": ")
            capture = self.captures.get(name) or self.captures[part]  # a speech model: all 1,500 positions
            titles[name] = (f"{visible(self.model)} ({self.dtype}, {self.device}) · {PART_TITLES[part]} · "
                            f"{what}: {capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} × "
                            f"{capture.n_keys}")
        return [*self._verdicts(titles),
                Line("PASS means: in every part — the encoder's self-attention, the decoder's, and cross-attention "
                     "from the target to the source — the formula applied to the model's own weights gives the "
                     "weights the model reports" + (", and the saved capture holds them." if self.source is not None
                                                    else ".") if ok else
                     "FAIL means: in some part the weights differ (see which above): another model or revision, a "
                     "changed file, or something the formula leaves out.")]

    def _title(self, capture: Capture, what: str = "") -> str:
        shape = f"{capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} tokens"
        return f"{visible(self.model)} ({self.dtype}, {self.device}): {what}{shape}"

    def _verdicts(self, titles: dict) -> list:
        """Each comparison's table and its verdict line."""
        from attnviz.render.tables import verdict, verify_table

        items: list = []
        for name, diffs in self.checks.items():
            items.append(verify_table(diffs, self.tolerance, titles[name]))
            w = self.worst(name)
            passed = w.max_abs <= self.tolerance
            items.append(verdict(passed, f"max |Δα| = {w.max_abs:.2e} (layer {w.layer}, head {w.worst_head}) "
                                         f"{'≤' if passed else '>'} tolerance {self.tolerance:g}"))
        return items

    def _repr_html_(self) -> str:
        records = [{"check": name, "layer": d.layer, "max |Δα|": d.max_abs, "worst head": d.worst_head}
                   for name, diffs in self.checks.items() for d in diffs]
        verdict = "PASS" if self.passed else "FAIL"
        return records_html(records, ["check", "layer", "max |Δα|", "worst head"],
                            f"{self.model}: {verdict} (tolerance {self.tolerance:g})")


@borrows
@checked
def verify(text: str | Picture | Sound | Capture | Parts | None = None, *, model: Any = None, tokenizer: Any = None,
           capture: Capture | Parts | str | os.PathLike | None = None, source: str | None = None,
           norms: bool = False, tolerance: float | None = None, truncate: bool = True, target: str | None = None,
           max_new_tokens: int | None = None, device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None) -> Verification:
    """Recompute α = softmax(Q·Kᵀ/√d_k) from the model's own weights and compare it with what the model
    reports, per layer, for `text` (or a picture, or a sound). With `capture` (a Capture, Parts or a capture file;
    or one given as `text`), the saved α against one forward
    pass over its tokens too; the model is then `model`, else the one the capture names. `norms`: check the
    value-weighted norms instead (Σ_h Σ_j α_ij f_h(x_j) + b_O against the block's own output). `tolerance`:
    the largest |Δα| that passes (default by dtype: TOLERANCE)."""
    reporter = reporter or Reporter()
    if tolerance is not None and not 0 <= tolerance <= 1:
        raise UsageError(f"{arg('tolerance')} takes a number from 0 to 1 (a difference of weights that "
                         f"sum to 1); got {tolerance:g}", "tolerance")
    if isinstance(text, (Capture, Parts)):
        text, capture = None, text
    if capture is not None:
        if text is not None:
            raise InputError("give either text or capture, not both", "capture")
        if isinstance(capture, (str, os.PathLike)):
            source = source or str(capture)
            capture = load_capture(capture)
        refuse_windows(capture)
        loaded = resolve_model(model if model is not None else model_of(capture), tokenizer, device=device,
                               dtype=dtype)
        return _verify_saved(loaded, capture, source, tolerance, reporter)
    if text is None:
        raise InputError("give the text to verify, or a capture", "text")
    check_text(text)
    given = tolerance
    if of_input(text) is SOUND and getattr(text, "seconds", 0) > WINDOW_SECONDS:
        raise InputError(f"verify recomputes one window of {WINDOW_SECONDS:g} s from the weights; this sound lasts "
                         f"{text.seconds:.1f} s: cut it", "text")  # type: ignore[union-attr]
    loaded = resolve_model(for_input(model, text), tokenizer, device=device, dtype=dtype)
    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    if norms:
        loaded.require_single(f"verify with {arg('norms')}")
        return _verify_norms(loaded, text, truncate, tolerance, reporter)  # type: ignore[arg-type]
    if of_input(text) is SOUND or loaded.speech:
        from attnviz.api.capturing import capture_audio

        if of_input(text) is not SOUND:
            raise InputError(f"{loaded.name} is a speech model: give it a sound (attnviz.sound(path))", "text")
        heard = capture_audio(text, model=loaded, target=target, max_new_tokens=max_new_tokens, reporter=reporter)
        return _verify_parts(loaded, heard, None, tolerance, reporter)
    if loaded.seq2seq:
        parts = capture_text(str(text), model=loaded, target=target, max_new_tokens=max_new_tokens, truncate=truncate,
                             reporter=reporter)
        assert isinstance(parts, Parts)  # an encoder-decoder model without `part`: all three
        return _verify_parts(loaded, parts, None, tolerance, reporter)
    if target is not None or max_new_tokens is not None:
        raise InputError(f"target and max_new_tokens are for encoder-decoder models; {loaded.name} is not one",
                         "target")
    from attnviz.engine.scratch.verify import capture_both

    with reporter.status("Running the model and the from-scratch path…"):
        reported, recomputed = capture_both(loaded, text, truncate=truncate)
    largest = recomputed.meta.get("largest_score")
    return Verification("text", reported.model, loaded.dtype, loaded.device,
                        score_tolerance(given, loaded.dtype, largest),
                        {"model_vs_scratch": differences(reported, recomputed)}, {"model_vs_scratch": reported},
                        largest_score=largest)


def _verify_saved(loaded: Model, saved: Capture | Parts, source: str | None, tolerance: float | None,
                  reporter: Reporter) -> Verification:
    """The saved α (e.g. assembled step by step by generate) against one forward pass of the model over the
    same token ids, and that pass against the from-scratch formula."""
    from attnviz.engine.scratch.verify import capture_both_ids

    given, tolerance = tolerance, TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    if isinstance(saved, Parts) or loaded.seq2seq:
        if not (isinstance(saved, Parts) and loaded.seq2seq):
            raise InputError(f"{source or 'the capture'} and {loaded.name} do not match: one is of an "
                             f"encoder-decoder model and the other not")
        return _verify_parts(loaded, saved, source, tolerance, reporter)
    with reporter.status("Running the model and the from-scratch path over the capture's tokens…"):
        reported, recomputed = capture_both_ids(loaded, saved)
    checks = {"saved_vs_model": differences(saved, reported), "model_vs_scratch": differences(reported, recomputed)}
    largest = recomputed.meta.get("largest_score")
    return Verification("capture", loaded.name, loaded.dtype, loaded.device,
                        score_tolerance(given, loaded.dtype, largest), checks,
                        {"saved_vs_model": saved, "model_vs_scratch": reported}, source, largest_score=largest)


def _verify_parts(loaded: Model, parts: Parts, source: str | None, tolerance: float,
                  reporter: Reporter) -> Verification:
    """An encoder-decoder model's parts (or a speech model's), each against the formula from the weights; a
    saved capture's against one forward pass too."""
    from attnviz.engine.scratch.verify import parts_checks

    refuse_windows(parts)
    checks, captures = parts_checks(loaded, parts, source is not None, reporter, source)
    return Verification("parts", loaded.name, loaded.dtype, loaded.device, tolerance, checks, captures, source)


def refuse_windows(saved: Capture | Parts) -> None:
    """A capture of a sound over 30 s (several windows) cannot be verified: the check recomputes one window."""
    if saved.meta.get("sound_windows"):
        raise InputError(f"verify recomputes one window of {WINDOW_SECONDS:g} s from the weights; this capture holds "
                         f"{saved.meta['sound_windows']} windows of a {saved.meta.get('audio_seconds', 0):.1f}-s sound",
                         "capture")


def model_of(saved: Capture | Parts) -> str:
    """The model a capture names, as it loads again (its folder or offline name, else its name)."""
    return str(saved.meta.get("model_source") or saved.model)


def _verify_norms(loaded: Model, text: str | Picture, truncate: bool, tolerance: float,
                  reporter: Reporter) -> Verification:
    """The exact check of value-weighted norms: the heads' weighted, projected values add up to the block's
    output (recorded by a hook), per layer."""
    from attnviz.engine.scratch.norms import norms_capture

    with reporter.status("Running the model and recomputing each head's value vectors…"):
        capture, result = norms_capture(loaded, text, truncate=truncate)
    return Verification("norms", capture.model, loaded.dtype, loaded.device, tolerance, {}, {"norms": capture},
                        norms=result)
