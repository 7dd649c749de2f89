"""detect: previous-token, duplicate-token and induction heads on random token sequences repeated once, then the
causal test; of a speech model, the cross-attention heads that align with the sound."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, overload, TYPE_CHECKING

import numpy as np

from attnviz.api.ablation.removing import ablation_model
from attnviz.api.models import borrows
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.records import plain
from attnviz.engine.ablation import DetectionRun
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter

if TYPE_CHECKING:
    from attnviz.api.speech import AlignmentHeads

__all__ = ["detect", "Detection"]


@dataclass
class Detection(DetectionRun, Result):
    """Previous-token, duplicate-token and induction heads of a model (the numbers: attnviz.engine's
    DetectionRun), and for a causal LM the causal test."""

    command: ClassVar[str] = "detect"
    model: str = ""
    mode: str = "zero"

    figure_name: ClassVar[str] = "attnviz_detect.png"

    def to_dict(self) -> dict:
        """What `attnviz detect --json` prints."""
        data: dict = {"model": self.model, "length": self.length, "sequences": self.sequences, "seed": self.seed,
                      "thresholds": self.thresholds,
                      "detected": {k: [list(p) for p in v] for k, v in self.detected.items()},
                      "scores": dict(self.scores), "shares": self.shares}
        causal = self.causal
        if causal is not None:
            data["causal_test"] = {"heads": [list(p) for p in causal.heads], "clean_loss": causal.clean,
                                   "removed_loss": causal.removed, "random_losses": causal.random,
                                   "random_mean": float(np.mean(causal.random)) if causal.random else None,
                                   "random_heads": [[list(p) for p in heads] for heads in causal.random_heads],
                                   "mode": self.mode}
        return plain(data)

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import records_table

        items: list = [Line(f"{short_model(self.model)} · {self.sequences} random sequence"
                            f"{'s' if self.sequences > 1 else ''} of {self.length} tokens, each repeated once",
                            style="bold")]
        for name in self.scores:
            heads = self.detected[name]
            rows = [{"layer": a, "head": b, "share": float(self.shares[name][a, b]),
                     "score": float(self.scores[name][a, b])} for a, b in heads[:12]]
            title = (f"{name}: {len(heads)} head{'s' if len(heads) != 1 else ''} with a share ≥ "
                     f"{self.thresholds[name]}" + (" (the 12 strongest)" if len(heads) > 12 else ""))
            if rows:
                items.append(records_table(rows, [("layer", "layer", "d"), ("head", "head", "d"),
                                                  ("share", "share", ".3f"), ("score", "TL score", ".3f")], title))
            else:
                items.append(Line(title, style="dim"))
        items.append(Line("share: the weight on the pattern's targets averaged over the rows that have one; TL score: "
                          "TransformerLens's detector, Σ α⊙P / Σ α over the whole matrix.", style="dim"))
        causal = self.causal
        if causal is not None:
            random = (f"{np.mean(causal.random):.3f} (from {min(causal.random):.3f} to {max(causal.random):.3f} over "
                      f"{len(causal.random)} draws)" if causal.random else "–")
            items.append(Line(f"Causal test, the next-token loss on the repeated half ({self.mode} ablation): clean "
                              f"{causal.clean:.3f} nats; without the {len(causal.heads)} induction heads "
                              f"{causal.removed:.3f}; without {len(causal.heads)} random heads {random}."))
        elif self.detected["induction"]:
            items.append(Line("The causal test needs next-token predictions: a causal LM (e.g. -m smollm2).",
                              style="dim"))
        return items

    def figure(self, *, ax=None):
        """Each detector's share, layers × heads."""
        from attnviz.panels import Page, Scale, head_grid_panel
        from attnviz.render.png import mixed_figure

        title = f"{short_model(self.model)} · head detectors on repeated random tokens (share of the rows' weight)"
        panels = tuple(head_grid_panel(self.shares[name], Scale(0.0, 1.0, "share"), title, f"detect_{name}",
                                       short=name) for name in self.shares)
        return mixed_figure(Page(panels=panels, title=title, name="attnviz_detect"), ncols=3, ax=ax)


@overload
def detect(audio: None = None, *, model: Any = None, tokenizer: Any = None, length: int = 50, sequences: int = 4,
           seed: int = 0, draws: int = 10, mode: str = "zero", device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None) -> Detection: ...


@overload
def detect(audio: Any, *, model: Any = None, tokenizer: Any = None, length: int = 50, sequences: int = 4,
           seed: int = 0, draws: int = 10, mode: str = "zero", device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None) -> AlignmentHeads: ...


@borrows
@checked
def detect(audio: Any = None, *, model: Any = None, tokenizer: Any = None, length: int = 50, sequences: int = 4,
           seed: int = 0, draws: int = 10, mode: str = "zero", device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None) -> Any:
    """Previous-token, duplicate-token and induction heads on random token sequences (`sequences` of them,
    `length` tokens each) repeated once, scored as TransformerLens's head detector does; for a causal LM, the
    loss on the repeats with the detected induction heads removed against `draws` sets of as many random heads.
    Of a sound (`audio`: a file, an attnviz.sound() or a speech model's capture): which cross-attention heads
    align with it (attnviz.AlignmentHeads)."""
    if audio is not None:
        from attnviz.api.speech import alignment_heads

        return alignment_heads(audio, model=model, tokenizer=tokenizer, device=device, dtype=dtype, reporter=reporter)
    from attnviz.engine.ablation import MODES, detection

    if mode not in MODES:
        raise UsageError(f"{arg('mode')} is one of {', '.join(MODES)}, not {str(mode)[:20]!r}", "mode")
    for name, value, low, high in (("length", length, 2, 2048), ("sequences", sequences, 1, 100),
                                   ("draws", draws, 0, 100), ("seed", seed, 0, 2**32 - 1)):
        if not low <= value <= high:
            raise UsageError(f"{arg(name)} takes a whole number from {low:,} to {high:,}; got {value}", name)
    loaded, where = ablation_model(model, tokenizer, device=device, dtype=dtype)
    if loaded.max_positions and 2 * length + 1 > loaded.max_positions:
        raise InputError(f"{loaded.name} takes at most {loaded.max_positions} positions: give a length of at most "
                         f"{(loaded.max_positions - 1) // 2}")
    run = detection(loaded, where, length=length, sequences=sequences, seed=seed, draws=draws, mode=mode,
                    reporter=reporter or Reporter())
    return Detection(**{f.name: getattr(run, f.name) for f in fields(run)}, model=loaded.name, mode=mode)
