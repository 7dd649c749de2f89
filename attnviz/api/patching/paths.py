"""Path patching (Wang et al. 2022): the senders' outputs from the donor run reach only the receivers, through
their queries, keys or values (attnviz.path_patch, `attnviz patch --from-heads`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnviz.api.models import borrows
from attnviz.api.patching.prompts import identity, prepare
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import visible
from attnviz.errors import arg, UsageError
from attnviz.panels import short_model
from attnviz.render.tables import records_html

__all__ = ["path_patch", "PathPatching"]


@dataclass(frozen=True)
class PathPatching(Result):
    """Path patching (Wang et al. 2022): the senders' outputs from the donor run reach the receivers only through
    their inputs `to` (of q, k, v), everything else frozen at the receiver run, measured like `Patching` (0
    the corrupted run, 1 the clean one). `score`: through every receiver at once; `by_receiver`: through each
    alone."""

    command: ClassVar[str] = "patch"
    model: str
    clean: str
    corrupt: str
    answer: str
    other: str
    direction: str
    senders: tuple[tuple[int, int], ...]
    receivers: tuple[tuple[int, int], ...]
    to: str
    clean_diff: float
    corrupt_diff: float
    score: float
    by_receiver: tuple[float, ...]
    alignment: tuple[tuple[int, int], ...] = ()  # as Patching's: () position for position

    def to_dict(self) -> dict:
        """What `attnviz patch --from-heads … --json` prints."""
        return {"model": self.model, "clean": self.clean, "corrupt": self.corrupt, "answer": self.answer,
                "other": self.other, "direction": self.direction, "senders": [list(p) for p in self.senders],
                "receivers": [list(p) for p in self.receivers], "to": self.to, "clean_logit_diff": self.clean_diff,
                "corrupt_logit_diff": self.corrupt_diff, "score": self.score,
                "by_receiver": [{"layer": n, "head": h, "score": s}
                                for (n, h), s in zip(self.receivers, self.by_receiver)],
                "alignment": [list(p) for p in self.alignment] or None}

    def records(self) -> list[dict]:
        return [{"layer": n, "head": h, "score": s} for (n, h), s in zip(self.receivers, self.by_receiver)]

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """The score through every receiver, and a row per receiver alone."""
        from attnviz.render.tables import records_table

        sent = ",".join(f"{n}.{h}" for n, h in self.senders)
        items: list = [Line(f"{short_model(self.model)}: path patching ({self.direction}) from {sent} into "
                            f"{len(self.receivers)} receiver(s) through {', '.join(self.to)}: restored "
                            f"{self.score:+.3f} of {visible(self.answer)!r} against {visible(self.other)!r} (0 is the "
                            f"corrupted run, 1 the clean one)")]
        if self.receivers:
            rows = [{"head": f"{n}.{h}", "score": s} for (n, h), s in zip(self.receivers, self.by_receiver)]
            items.append(records_table(rows, [("head", "receiver", ""), ("score", "restored through it alone",
                                                                          "+.3f")], "each receiver alone"))
        return items

    def _repr_html_(self) -> str:
        return records_html(self.records(), ["layer", "head", "score"],
                            f"{self.model}: path patching into {len(self.receivers)} receivers ({self.to})")


@borrows
@checked
def path_patch(clean: str, corrupt: str, *, senders: Any, receivers: Any = (), to: str = "qkv", model: Any = None,
               tokenizer: Any = None, answers: tuple[str | int, str | int] | list[str | int] | None = None,
               direction: str = "denoise", align: Any = None, truncate: bool = True, device: str = "auto",
               dtype: str = "float32") -> PathPatching:
    """Path patching (Wang et al. 2022) for a causal language model: the `senders` ("9.6,9.9" or (layer, head)
    pairs) patched from the donor run (the clean one, denoising) into the receiver run, reaching only the
    `receivers` (heads of later layers) through their `to` inputs (any of "q", "k", "v"), every other head
    frozen at the receiver run; the metric as `patch` measures it. With no receivers it changes nothing.
    `align` as `patch` takes it: the senders' outputs move at the aligned positions only."""
    from attnviz.base.selection import head_pairs, pair_form
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.patching import aligned
    from attnviz.engine.paths import INPUTS, path_patched_logits, path_recording

    if not to or any(c not in INPUTS for c in to) or len(set(to)) != len(to):
        raise UsageError(f"{arg('to')} takes q, k and v, alone or together (qk, qkv, …); got {visible(to)!r}", "to")
    pair_form(senders, "senders")  # the heads' form, before the model loads (their range needs it)
    if receivers:
        pair_form(receivers, "receivers")
    loaded, where, first, second, clean_run, corrupt_run, measure, clean_diff, corrupt_diff, names, pairs = prepare(
        clean, corrupt, model, tokenizer, answers, direction, truncate, device, dtype, align)
    L, H = where.layers, where.heads
    sent = head_pairs(senders, L, H)
    received = head_pairs(receivers, L, H) if receivers else []
    if received and min(n for n, _ in received) <= max(n for n, _ in sent):
        raise UsageError(f"{arg('receivers')} must be heads of layers after the senders' (the last sender is in "
                         f"layer {max(n for n, _ in sent)})", "receivers")
    base = getattr(loaded.model, "base_model", loaded.model)
    attention = adapter_for(base).modules(base)
    gap = clean_diff - corrupt_diff
    receiver_inputs, receiver, donor = ((second.inputs, corrupt_run, aligned(clean_run, corrupt_run,
                                                                             [(k, i) for i, k in pairs]))
                                        if direction == "denoise"
                                        else (first.inputs, clean_run, aligned(corrupt_run, clean_run, list(pairs))))

    recorded = path_recording(where, attention, receiver_inputs, receiver, donor, sent, received, to)

    def score(group) -> float:
        return float((measure(path_patched_logits(where, receiver_inputs, recorded, group)) - corrupt_diff) / gap)

    return PathPatching(
        model=loaded.name, clean=clean, corrupt=corrupt, answer=names[0], other=names[1], direction=direction,
        senders=tuple(sent), receivers=tuple(received),
        to=to, clean_diff=clean_diff, corrupt_diff=corrupt_diff, score=score(received),
        by_receiver=tuple(score([r]) for r in received),
        alignment=() if identity(pairs, len(first.tokens), len(second.tokens)) else tuple(pairs))
