"""Which heads carry the difference between two prompts: activation patching (attnviz.patch, `attnviz patch`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.arguments import checked
from attnviz.display import records_html
from attnviz.errors import InputError, arg
from attnviz.panels import head_grid_panel, Page, Panel, Scale, short_model
from attnviz.progress import Reporter
from attnviz.render.png import mixed_figure
from attnviz.text import check_text, shorten, visible

__all__ = ["patch", "Patching", "DIRECTIONS", "PATCH_TOLERANCE"]

DIRECTIONS = ("denoise", "noise")
PATCH_TOLERANCE = 1e-4  # |LD with every head and MLP patched − the donor's LD|, over max(1, |LD|): float32 sums


@dataclass(frozen=True)
class Patching:
    """Activation patching between a clean and a corrupted prompt of the same length, measured by the logit
    difference LD = logit(answer) − logit(other) at the last position, normalised so that 0 is the corrupted
    run and 1 the clean run: `direction` denoise puts pieces of the clean run into the corrupted one (how much
    of the answer each piece brings back), noise the corrupted run's into the clean one (how much each piece
    takes away: 1 − its value).

    heads (L, H): each head's output (its z_h at every position) patched alone; head_positions (L, H, T) or
    None: at one position at a time; attention (L, T): each layer's attention output at one position (every
    head there); residual (L, T): the residual stream entering each layer at one position. `all_patched`:
    the LD with every head and MLP output of every layer patched, which must be the donor's (`passed`)."""

    model: str
    clean: str
    corrupt: str
    tokens: tuple[str, ...]  # the clean prompt's
    corrupt_tokens: tuple[str, ...]
    answer: str
    other: str
    direction: str
    clean_diff: float  # LD of the clean run
    corrupt_diff: float
    heads: np.ndarray  # (L, H)
    attention: np.ndarray  # (L, T)
    residual: np.ndarray  # (L, T)
    head_positions: np.ndarray | None
    all_patched: float | None  # the normalised LD with everything patched (1 denoising, 0 noising); None where
    # the last tokens differ (their embeddings are not patched)

    @property
    def differs(self) -> tuple[int, ...]:
        """The positions where the two prompts' tokens differ."""
        return tuple(i for i, (a, b) in enumerate(zip(self.tokens, self.corrupt_tokens)) if a != b)

    @property
    def passed(self) -> bool:
        """Every head and MLP patched gives the donor's run at the last position (True where the check does not
        apply: the prompts' last tokens differ)."""
        if self.all_patched is None:
            return True
        target = 1.0 if self.direction == "denoise" else 0.0
        return abs(self.all_patched - target) * abs(self.clean_diff - self.corrupt_diff) <= PATCH_TOLERANCE * max(
            1.0, abs(self.clean_diff), abs(self.corrupt_diff))

    def top(self, k: int = 10) -> list[dict]:
        """The heads that move the metric most from where the receiver run is: (layer, head, score), by |change|."""
        base = 0.0 if self.direction == "denoise" else 1.0
        L, H = self.heads.shape
        order = np.argsort(-np.abs(self.heads - base), axis=None, kind="stable")[:k]
        return [{"layer": int(i // H), "head": int(i % H), "score": float(self.heads.flat[i])} for i in order]

    def records(self) -> list[dict]:
        """One record per layer and head: layer, head, score (what --csv prints)."""
        L, H = self.heads.shape
        return [{"layer": n, "head": h, "score": float(self.heads[n, h])} for n in range(L) for h in range(H)]

    def to_dict(self) -> dict:
        """What `attnviz patch --json` prints."""
        data = {"model": self.model, "clean": self.clean, "corrupt": self.corrupt, "tokens": list(self.tokens),
                "corrupt_tokens": list(self.corrupt_tokens), "answer": self.answer, "other": self.other,
                "direction": self.direction, "clean_logit_diff": self.clean_diff,
                "corrupt_logit_diff": self.corrupt_diff, "heads": self.heads.tolist(),
                "attention": self.attention.tolist(), "residual": self.residual.tolist(), "top": self.top(),
                "all_patched": self.all_patched, "passed": self.passed}
        if self.head_positions is not None:
            data["head_positions"] = self.head_positions.tolist()
        return data

    def _repr_html_(self) -> str:
        return records_html(self.top(), ["layer", "head", "score"],
                            f"{self.model}: which heads carry {self.answer!r} against {self.other!r}")

    def labels(self) -> tuple[str, ...]:
        """The positions as the pictures name them: the clean token, and clean/corrupt where they differ."""
        return tuple(visible(a) if a == b else f"{visible(a)}/{visible(b)}"
                     for a, b in zip(self.tokens, self.corrupt_tokens))

    def page(self) -> Page:
        """Three panels on one diverging scale centred on 0: each head (layers × heads), each layer's attention
        output by position, and the residual stream by position (layers × positions)."""
        title = (f"{short_model(self.model)} · activation patching ({self.direction}): "
                 f"{visible(self.answer)!r} against {visible(self.other)!r}")
        values = [self.heads, self.attention, self.residual]
        edge = max(1.0, max(float(np.abs(v).max()) for v in values))
        scale = Scale(-edge, edge, "restored (0 corrupted, 1 clean)")
        grid = replace(head_grid_panel(self.heads, scale, title, "patch_heads", short="each head, every position"),
                       cmap="RdBu_r")
        labels = self.labels()
        L = self.heads.shape[0]
        panels = [grid]
        for name, values_, short in (("patch_attention", self.attention, "each layer's attention output"),
                                     ("patch_residual", self.residual, "the residual stream entering each layer")):
            panels.append(Panel(matrix=values_.astype(np.float32), rows=tuple(str(n) for n in range(L)), cols=labels,
                                hidden=None, scale=scale, title=(title,), name=name, short=f"{short}, by position",
                                row_axis="layer", col_axis="position", cmap="RdBu_r"))
        subtitle = f"“{visible(shorten(self.clean, 150))}” / “{visible(shorten(self.corrupt, 150))}”"
        notes = (f"logit difference: clean {self.clean_diff:.3f}, corrupted {self.corrupt_diff:.3f}"
                 + ("" if self.all_patched is None else f"; every head and MLP patched gives {self.all_patched:.3f} "
                    f"(the donor's run: {1.0 if self.direction == 'denoise' else 0.0:.0f})"),)
        return Page(panels=tuple(panels), title=title, name="attnviz_patch", notes=notes, subtitle=subtitle)

    def figure(self):
        return mixed_figure(self.page(), ncols=3)


@borrows
@checked
def patch(clean: str, corrupt: str, *, model: Any = None, tokenizer: Any = None,
          answers: tuple[str | int, str | int] | list[str | int] | None = None, direction: str = "denoise",
          positions: bool = False,
          truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Patching:
    """Activation patching for a causal language model: the `clean` and `corrupt` prompts (the same number of
    tokens), the metric the logit difference of `answers` (two texts of one token each, e.g. (" Paris",
    " Rome"); default: the clean run's and the corrupted run's top tokens) at the last position. Each head
    (and with `positions` each head at each position), each layer's attention output and residual stream at
    each position, patched alone from one run into the other (`direction` "denoise": clean into corrupted;
    "noise": corrupted into clean), batched. An answer may also be a token id."""
    check_text(clean)
    check_text(corrupt)
    if direction not in DIRECTIONS:
        raise InputError(f"{arg('direction')} takes denoise or noise; got {visible(direction)!r}", "direction")
    if answers is not None and (len(answers) != 2 or answers[0] == answers[1]):
        raise InputError(f"{arg('answers')} takes two different tokens, the answer and the other, e.g. "
                         f"' Paris',' Rome'", "answers")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head=True)
    loaded.require_single("patch")
    from attnviz.api.attribution import _target_id
    from attnviz.engine.ablation import is_causal_lm, site
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory
    from attnviz.engine.patching import (all_patched_logits, donor_run, every_patch, logit_difference, run_patches)

    if not is_causal_lm(loaded.model):
        raise InputError(f"patch measures a causal language model's next token; {loaded.name} is not one (for "
                         f"an encoder, ablate and importance measure the embedding)", "model")
    first, second = encode(loaded, clean, truncate=truncate), encode(loaded, corrupt, truncate=truncate)
    T = len(first.tokens)
    if len(second.tokens) != T:
        raise InputError(f"the prompts must have as many tokens, to patch position by position: the clean one has "
                         f"{T} ({' '.join(visible(t) for t in first.tokens[:12])}), the corrupted one "
                         f"{len(second.tokens)} ({' '.join(visible(t) for t in second.tokens[:12])})", "corrupt")
    check_memory(loaded, T, copies=4.0)
    where = site(loaded.model)
    L, H = where.layers, where.heads
    reporter = reporter or Reporter()
    with reporter.status("Running both prompts…"):
        clean_run, corrupt_run = donor_run(where, first.inputs), donor_run(where, second.inputs)
    if answers is None:
        answer, other = int(clean_run.logits.argmax()), int(corrupt_run.logits.argmax())
        if answer == other:
            shown = visible(loaded.tokenizer.decode([answer]))
            raise InputError(f"both prompts predict {shown!r}: give the two answers to compare with "
                             f"{arg('answers')} (e.g. ' Paris',' Rome')", "answers")
    else:
        given = [_target_id(loaded, a, "answers") for a in answers]
        answer, other = int(given[0] or 0), int(given[1] or 0)
    clean_diff = float(logit_difference(clean_run.logits, answer, other))
    corrupt_diff = float(logit_difference(corrupt_run.logits, answer, other))
    gap = clean_diff - corrupt_diff
    if abs(gap) < 1e-6:
        raise InputError("the two prompts give the same logit difference: there is nothing to restore; choose "
                         f"prompts that differ in what they predict, or other {arg('answers')}", "answers")
    receiver, donor = (second, clean_run) if direction == "denoise" else (first, corrupt_run)

    def score(logits) -> np.ndarray:
        return (logit_difference(logits, answer, other) - corrupt_diff) / gap

    patches = {"heads": every_patch("head", L, H, T), "attention": every_patch("attention", L, H, T),
               "residual": every_patch("residual", L, H, T)}
    if positions:
        patches["head_positions"] = every_patch("head", L, H, T, positions=True)
    total = sum(len(p) for p in patches.values())
    results = {}
    with reporter.progress("Patching", total, "patches") as step:
        for name, chosen in patches.items():
            results[name] = score(run_patches(where, receiver.inputs, donor, chosen, on_done=step))
    everything = (float(score(all_patched_logits(where, receiver.inputs, donor)))
                  if first.tokens[-1] == second.tokens[-1] else None)
    return Patching(
        model=loaded.name, clean=clean, corrupt=corrupt, tokens=tuple(first.tokens),
        corrupt_tokens=tuple(second.tokens), answer=loaded.tokenizer.decode([answer]),
        other=loaded.tokenizer.decode([other]), direction=direction, clean_diff=clean_diff,
        corrupt_diff=corrupt_diff, heads=results["heads"].reshape(L, H), attention=results["attention"].reshape(L, T),
        residual=results["residual"].reshape(L, T),
        head_positions=results["head_positions"].reshape(L, H, T) if positions else None, all_patched=everything)
