"""The checks and lessons computed from the model's own weights, not from its attention: verify (α recomputed
from the formula, against what the model reports), steps (one head's formula step by step), positions (what
position embeddings do), scaling (why divide by √d_k)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attnviz.base.arguments import checked
from attnviz.data.picture import Picture, picture
from attnviz.data.sound import Sound
from attnviz.api.capturing import capture as capture_text
from attnviz.api.models import Model, borrows, for_input, resolve_model
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts, load_capture
from attnviz.api.notebook import records_html
from attnviz.errors import arg, InputError, UsageError
from attnviz.metrics import differences
from attnviz.panels import positions_page, short_model, steps_page
from attnviz.progress import Reporter
from attnviz.render.png import mixed_figure, scaling_figure
from attnviz.base.selection import Selection, find_token
from attnviz.base.text import check_text, visible

# The engine (torch, transformers) is imported inside each function, so that `import attnviz` and a saved
# capture never load it.

__all__ = ["verify", "Verification", "TOLERANCE", "steps", "Steps", "positions", "Positions", "scaling", "Scaling",
           "patch_positions", "PatchPositions", "POSITION_TOLERANCE"]

# Default tolerance on max |Δα| by dtype. float32 is the target; in half precision the model's own α
# carries rounding that the float32 recomputation does not (measured on MiniLM: 9.6e-4 in float16,
# 9.0e-3 in bfloat16), so the defaults leave about 5x headroom.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 5e-2}


def _one(index: int, n: int, what: str) -> int:
    """One layer or head index (negative counts from the end), checked against n."""
    return Selection.parse(str(int(index)), what, field=what).indices(n)[0]


# --- verify -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verification:
    """α recomputed from the model's weights against what the model reports (and, for a saved capture, the
    saved α against one forward pass), per layer: `checks` maps each comparison to its layers' differences.

    kind       "text" (a text run now), "capture" (a saved capture), "parts" (an encoder-decoder model's three
               attentions), "norms" (value-weighted norms against the attention block's own output)
    passed     every comparison within `tolerance` (for norms: the relative difference)
    """

    kind: str
    model: str
    dtype: str
    device: str
    tolerance: float
    checks: dict = field(default_factory=dict)  # name -> list[LayerDifference]
    captures: dict = field(default_factory=dict)  # name -> the Capture each comparison is about (its shape)
    source: str | None = None  # the capture file checked, as named by the caller
    norms: Any = None  # kind "norms": the engine's NormsResult (output_diff, output_scale, relative_diff)

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
                    "max_abs_diff": self.max_abs_diff, "passed": self.passed,
                    "layers": [d.__dict__ for d in self.checks["model_vs_scratch"]]}
        if self.kind == "capture":
            return {**head, "capture": self.source, "tokens": list(self.captures["saved_vs_model"].tokens),
                    "tolerance": self.tolerance, "passed": self.passed,
                    **{name: self._check(name) for name in self.checks}}
        encoder = self.captures.get("encoder")
        return {**head, "capture": self.source, "tolerance": self.tolerance, "passed": self.passed,
                "source_tokens": list(encoder.tokens) if encoder is not None else None,
                "target_tokens": list(self.captures["target"].tokens),
                "checks": {name: self._check(name) for name in self.checks}}

    def _repr_html_(self) -> str:
        records = [{"check": name, "layer": d.layer, "max |Δα|": d.max_abs, "worst head": d.worst_head}
                   for name, diffs in self.checks.items() for d in diffs]
        verdict = "PASS" if self.passed else "FAIL"
        return records_html(records, ["check", "layer", "max |Δα|", "worst head"],
                            f"{self.model}: {verdict} (tolerance {self.tolerance:g})")


@borrows
@checked
def verify(text: str | Picture | Sound | None = None, *, model: Any = None, tokenizer: Any = None,
           capture: Capture | Parts | str | os.PathLike | None = None, source: str | None = None,
           norms: bool = False, tolerance: float | None = None, truncate: bool = True, target: str | None = None,
           max_new_tokens: int | None = None, device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None) -> Verification:
    """Recompute α = softmax(Q·Kᵀ/√d_k) from the model's own weights and compare it with what the model
    reports, per layer. With `capture` (a Capture, Parts or a capture file), the saved α against one forward
    pass over its tokens too; the model is then `model`, else the one the capture names. `norms`: check the
    value-weighted norms instead (Σ_h Σ_j α_ij f_h(x_j) + b_O against the block's own output). `tolerance`:
    the largest |Δα| that passes (default by dtype: TOLERANCE)."""
    reporter = reporter or Reporter()
    if capture is not None:
        if text is not None:
            raise InputError("give either text or capture, not both", "capture")
        if isinstance(capture, (str, os.PathLike)):
            source = source or str(capture)
            capture = load_capture(capture)
        named = capture.meta.get("model_source") or capture.model  # what loads the capture's model again
        loaded = resolve_model(model if model is not None else named, tokenizer, device=device, dtype=dtype)
        return _verify_saved(loaded, capture, source, tolerance, reporter)
    if text is None:
        raise InputError("give the text to verify, or a capture", "text")
    check_text(text)
    loaded = resolve_model(for_input(model, text), tokenizer, device=device, dtype=dtype)
    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    if norms:
        loaded.require_single("verify --norms")
        return _verify_norms(loaded, text, truncate, tolerance, reporter)  # type: ignore[arg-type]
    if getattr(text, "is_sound", False) or loaded.speech:
        from attnviz.api.capturing import capture_audio

        if not getattr(text, "is_sound", False):
            raise InputError(f"{loaded.name} is a speech model: give it a sound (attnviz.sound(path))", "text")
        heard = capture_audio(text, model=loaded, target=target, max_new_tokens=max_new_tokens, reporter=reporter)
        return _verify_speech(loaded, heard, None, tolerance, reporter)
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
    return Verification("text", reported.model, loaded.dtype, loaded.device, tolerance,
                        {"model_vs_scratch": differences(reported, recomputed)}, {"model_vs_scratch": reported})


def _verify_saved(loaded: Model, saved: Capture | Parts, source: str | None, tolerance: float | None,
                  reporter: Reporter) -> Verification:
    """The saved α (e.g. assembled step by step by generate) against one forward pass of the model over the
    same token ids, and that pass against the from-scratch formula."""
    from attnviz.engine.scratch.verify import capture_both_ids

    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    if isinstance(saved, Parts) or loaded.seq2seq:
        if not (isinstance(saved, Parts) and loaded.seq2seq):
            raise InputError(f"{source or 'the capture'} and {loaded.name} do not match: one is of an "
                             f"encoder-decoder model and the other not")
        return _verify_parts(loaded, saved, source, tolerance, reporter)
    with reporter.status("Running the model and the from-scratch path over the capture's tokens…"):
        reported, recomputed = capture_both_ids(loaded, saved)
    checks = {"saved_vs_model": differences(saved, reported), "model_vs_scratch": differences(reported, recomputed)}
    return Verification("capture", loaded.name, loaded.dtype, loaded.device, tolerance, checks,
                        {"saved_vs_model": saved, "model_vs_scratch": reported}, source)


def _verify_parts(loaded: Model, parts: Parts, source: str | None, tolerance: float,
                  reporter: Reporter) -> Verification:
    """An encoder-decoder model: each part (encoder, decoder, cross) of one forward pass over the source and
    the decoder's input, against the formula from the weights; with a saved capture, its parts against that
    pass too."""
    import torch

    from attnviz.engine.scratch.verify import scratch_parts

    if loaded.speech or any(c.mel is not None for c in parts.captures.values()):
        return _verify_speech(loaded, parts, source, tolerance, reporter)
    encoder = parts.part("encoder") if "encoder" in parts.captures else None
    source_side = parts.part("cross").keys if "cross" in parts.captures else None
    source_ids = (encoder.token_ids if encoder is not None else source_side.token_ids if source_side else None)
    target = parts.part("decoder") if "decoder" in parts.captures else parts.captures.get("cross")
    if source_ids is None or target is None:
        raise InputError("verify needs the source and the target tokens: this capture holds only "
                         + ", ".join(parts.names))
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if max(int(source_ids.max()), int(target.token_ids.max())) >= vocab or min(int(source_ids.min()),
                                                                               int(target.token_ids.min())) < 0:
        raise InputError(f"the capture's token ids do not fit {loaded.name}'s vocabulary of {vocab}: give the model "
                         f"that made it (the capture names {visible(parts.model)!r})")
    device = loaded.device
    ids = torch.tensor([list(source_ids)], device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "decoder_input_ids": torch.tensor([list(target.token_ids)], device=device)}
    with reporter.status("Running the model and the from-scratch path over every part…"):
        results = scratch_parts(loaded, inputs)
    checks: dict[str, list] = {}
    captures: dict[str, Capture] = {"target": target}
    if encoder is not None:
        captures["encoder"] = encoder
    for name, (scratch, model_alpha) in results.items():
        if name not in parts.captures:
            continue
        saved = parts.part(name)
        captures[name] = saved
        if saved.attentions.shape != model_alpha.shape:
            raise InputError(f"the capture's {name} part is {saved.attentions.shape}, {loaded.name} gives "
                             f"{model_alpha.shape}: give the model that made it")
        reported = replace(saved, attentions=model_alpha)
        if source is not None:
            checks[f"{name}: saved vs model"] = differences(saved, reported)
        checks[f"{name}: model vs scratch"] = differences(reported, replace(saved, attentions=scratch))
    return Verification("parts", loaded.name, loaded.dtype, loaded.device, tolerance, checks, captures, source)


def _verify_speech(loaded: Model, parts: Parts, source: str | None, tolerance: float,
                   reporter: Reporter) -> Verification:
    """A speech model: one forward pass over the capture's sound (its spectrogram recomputed from the samples)
    and transcript; each part from the formula against the model over all the encoder's positions (the padding
    to 30 s too), and the capture's parts (the silence folded into one key) against that pass folded alike."""
    import torch

    from attnviz.data.sound import Sound
    from attnviz.engine.scratch.verify import scratch_parts
    from attnviz.engine.speech import features, fold, frame_side

    heard = next((c for c in parts.captures.values() if c.sound is not None), None)
    if not loaded.speech or heard is None:
        raise InputError(f"{source or 'the capture'} and {loaded.name} do not match: one is of a speech model and "
                         f"the other not")
    target = parts.captures.get("decoder") or parts.part("cross")
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if int(target.token_ids.max()) >= vocab or int(target.token_ids.min()) < 0:
        raise InputError(f"the capture's token ids do not fit {loaded.name}'s vocabulary of {vocab}")
    assert heard.sound is not None
    mel = features(loaded, Sound(heard.sound, str(parts.meta.get("audio_name", "the sound"))))
    inputs = {"input_features": mel,
              "decoder_input_ids": torch.tensor([list(target.token_ids)], device=loaded.device)}
    with reporter.status("Running the model and the from-scratch path over every part…"):
        results = scratch_parts(loaded, inputs)
    N = heard.frames
    checks: dict[str, list] = {}
    captures: dict[str, Capture] = {"target": target}
    for name, (scratch, model_alpha) in results.items():
        if name not in parts.captures:
            continue
        saved = parts.part(name)
        captures[name] = saved
        if name == "decoder":
            full = saved
        else:  # every position of the encoder, as the model computed them
            frames = frame_side(model_alpha.shape[-1], model_alpha.shape[-1])
            rows = frames if name == "encoder" else saved
            full = Capture(attentions=model_alpha, tokens=rows.tokens, token_ids=rows.token_ids, special=rows.special,
                           special_kind=rows.special_kind, subword=rows.subword, meta=saved.meta,
                           keys=frames if name == "cross" else None)
        checks[f"{name}: model vs scratch"] = differences(replace(full, attentions=model_alpha),
                                                          replace(full, attentions=scratch))
        if name != "decoder":
            captures[f"{name}: model vs scratch"] = full  # over every position the encoder has
        folded = model_alpha if name == "decoder" else fold(model_alpha, N, rows=name == "encoder")
        if folded.shape != saved.attentions.shape:
            raise InputError(f"the capture's {name} part is {saved.attentions.shape}, {loaded.name} gives "
                             f"{folded.shape}: give the model that made it")
        if source is not None:
            checks[f"{name}: saved vs model"] = differences(saved, replace(saved, attentions=folded))
    return Verification("parts", loaded.name, loaded.dtype, loaded.device, tolerance, checks, captures, source)


def _verify_norms(loaded: Model, text: str | Picture, truncate: bool, tolerance: float,
                  reporter: Reporter) -> Verification:
    """The exact check of value-weighted norms: the heads' weighted, projected values add up to the block's
    output (recorded by a hook), per layer."""
    from attnviz.engine.scratch.norms import norms_capture

    with reporter.status("Running the model and recomputing each head's value vectors…"):
        capture, result = norms_capture(loaded, text, truncate=truncate)
    return Verification("norms", capture.model, loaded.dtype, loaded.device, tolerance, {}, {"norms": capture},
                        norms=result)


# --- steps --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Steps:
    """One head's attention step by step from the model's own weights: Q, K, V, the scores Q·Kᵀ, the scaling
    by √d_k, the mask, softmax → α (checked against the model's own α: max_abs_diff), and α·V.
    `computed` holds the arrays: q, k, v (T, d_k); scores, scaled, alpha (T, T); allowed (T, T) bool; out."""

    model: str
    text: str
    layer: int
    head: int
    tokens: tuple[str, ...]
    token: int | None  # the query row followed, if one was asked for
    computed: Any  # attnviz.engine.scratch.steps.Steps

    @property
    def d_k(self) -> int:
        return self.computed.d_k

    @property
    def max_abs_diff(self) -> float:
        return self.computed.max_diff

    def to_dict(self) -> dict:
        """What `attnviz steps --json` prints."""
        r = self.computed
        return {"model": self.model, "layer": self.layer, "head": self.head, "tokens": list(self.tokens),
                "token": self.token, "d_k": r.d_k, "sqrt_d_k": r.d_k ** 0.5, "q": r.q, "k": r.k, "v": r.v,
                "scores": r.scores, "scaled": r.scaled, "allowed": r.allowed, "alpha": r.alpha, "out": r.out,
                "model_alpha": r.model_alpha, "max_abs_diff": r.max_diff}

    def page(self):
        """The steps as one Page of panels (Q, K, scores, scaled, α, α·V)."""

        return steps_page(self.computed, list(self.tokens), self.model, self.text)

    def figure(self, *, cmap: str = "viridis"):
        """Every step as one matplotlib Figure."""

        return mixed_figure(self.page(), cmap=cmap)


@borrows
@checked
def steps(text: str, *, model: Any = None, tokenizer: Any = None, layer: int = 0, head: int = 0,
          token: str | int | None = None, truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Steps:
    """One head's computation in order, from the model's own weights: Q, K, Q·Kᵀ, ÷√d_k, the mask, softmax → α,
    α·V; α checked against the model's. `token` (an index or a token's text) follows one query row."""
    check_text(text)
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("steps")
    from attnviz.engine.forward import encode
    from attnviz.engine.scratch.steps import head_steps

    n_layers, n_heads = loaded.shape
    which_layer, which_head = _one(layer, n_layers, "layer"), _one(head, n_heads, "head")
    with (reporter or Reporter()).status("Running the model and the from-scratch path…"):
        encoded = encode(loaded, text, truncate=truncate)
        result = head_steps(loaded, encoded, which_layer, which_head)
    row = find_token(encoded.tokens, str(token)) if token is not None else None
    return Steps(loaded.name, text, which_layer, which_head, tuple(encoded.tokens), row, result)


# --- positions ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Positions:
    """The words shuffled, the model run on both orders with and without its position embeddings: without them
    α of the shuffled text is exactly the same permutation of α (self-attention alone sees a set).
    `result`: words, shuffled, tokens, permutation, diff_without / diff_with (per layer), similarity."""

    model: str
    text: str
    result: Any  # attnviz.engine.scratch.positions.PositionsResult

    def to_dict(self) -> dict:
        """What `attnviz positions --json` prints."""
        r = self.result
        return {"model": self.model, "words": r.words, "shuffled": r.shuffled, "tokens": r.tokens,
                "permutation": r.permutation,
                "without_positions": {"max_abs_diff": float(r.diff_without.max()), "per_layer": r.diff_without},
                "with_positions": {"max_abs_diff": float(r.diff_with.max()), "per_layer": r.diff_with},
                "position_similarity": r.similarity}

    def page(self, layer: int = -1):
        return positions_page(self.result, self.model, _one(layer, len(self.result.diff_with), "layer"), self.text)

    def figure(self, layer: int = -1, *, cmap: str = "viridis"):
        """α of `layer` for both word orders, with and without positions, as one Figure."""

        return mixed_figure(self.page(layer), cmap=cmap)


POSITION_TOLERANCE = 1e-5  # of the embedding layer's output: the same float32 sum, taken apart


@dataclass(frozen=True)
class PatchPositions:
    """A vision model's position embeddings over a picture's patch grid, as the model adds them (its table
    interpolated to the grid): `similarity` (N, N) the cosine similarity of each patch position to each other,
    N = rows × cols; `check` how far they are from what the model's own embedding layer added (its output less
    the patch projection), over that output's size (`passed` within POSITION_TOLERANCE)."""

    model: str
    name: str
    grid: tuple[int, int]
    similarity: np.ndarray  # (N, N)
    check: float

    @property
    def passed(self) -> bool:
        return self.check <= POSITION_TOLERANCE

    def records(self) -> list[dict]:
        """The mean similarity of two patch positions by their distance on the grid (in patches, rounded)."""
        rows, cols = self.grid
        r, c = np.divmod(np.arange(rows * cols), cols)
        distance = np.rint(np.hypot(r[:, None] - r[None], c[:, None] - c[None])).astype(int)  # (N, N)
        return [{"distance": int(d), "similarity": float(self.similarity[distance == d].mean()),
                 "pairs": int((distance == d).sum())} for d in np.unique(distance)]

    def to_dict(self) -> dict:
        """What `attnviz positions --image --json` prints."""
        return {"model": self.model, "image": self.name, "grid": list(self.grid), "check": self.check,
                "passed": self.passed, "by_distance": self.records(), "similarity": self.similarity.tolist()}

    def figure(self):
        """For each patch, at its place in the grid, the similarity of its position embedding to every patch's."""
        from attnviz.render.charts import position_mosaic_figure

        rows, cols = self.grid
        return position_mosaic_figure(self.similarity, self.grid,
                                      f"{short_model(self.model)} · position embeddings over {rows} × {cols} "
                                      f"patches",
                                      f"{self.name}: each small map, the similarity of that patch's position to "
                                      f"every patch's")


@borrows
@checked
def patch_positions(image: Any, *, model: Any = "dinov2", size: int | None = None, device: str = "auto",
                    dtype: str = "float32") -> PatchPositions:
    """The position embeddings a vision model adds to a picture's patches (its table interpolated to the grid,
    as its forward pass does), and how similar each patch position is to each other: the 2-D structure the
    model learned. Checked against what the model's own embedding layer adds."""
    chosen = picture(image, size=size)
    loaded = resolve_model(model, None, device=device, dtype=dtype)
    from attnviz.engine.vision import patch_positions as positions_of

    table, check, grid = positions_of(loaded, chosen)
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    return PatchPositions(loaded.name, chosen.name, grid, unit @ unit.T, check)


@borrows
@checked
def positions(text: str, *, model: Any = None, tokenizer: Any = None, seed: int = 0, device: str = "auto",
              dtype: str = "float32", reporter: Reporter | None = None) -> Positions:
    """Shuffle the words (seeded) and run the model on both orders, with its position embeddings and with them
    zeroed. Encoder models (BERT-like)."""
    check_text(text)
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("positions")
    from attnviz.engine.scratch.positions import positions_experiment

    with (reporter or Reporter()).status("Running the model on both word orders, with and without positions…"):
        result = positions_experiment(loaded, text, seed=seed)
    return Positions(loaded.name, text, result)


# --- scaling ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scaling:
    """Why attention divides by √d_k: per layer of the real model, the spread of the scores and the entropy and
    peak of the softmax with and without the division (`rows`), then random q, k at the model's d_k and at 64
    (`synthetic`, `synthetic_d64`: the std of q·k raw and scaled) and at the d_k asked for (`chosen`)."""

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

    def figure(self):
        """Per layer: the scores' spread and the softmax's entropy and peak, raw against scaled."""

        return scaling_figure(list(self.rows), self.T, self.d_k, self.model)


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
