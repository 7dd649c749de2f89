"""What activation and path patching share: two prompts checked, encoded and aligned position by position, the
model (a causal LM, or an encoder measured by its sentence embedding), both runs recorded, and the metric."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnviz.api.models import resolve_model
from attnviz.base.text import check_text, visible
from attnviz.errors import InputError, UsageError, arg

__all__ = ["prepare", "align_tokens", "identity", "DIRECTIONS"]

DIRECTIONS = ("denoise", "noise")


def identity(pairs, T: int, T2: int) -> bool:
    return T == T2 == len(pairs) and all(i == k for i, k in pairs)


def align_tokens(clean: Sequence[str], corrupt: Sequence[str], align: Any = "auto") -> tuple[tuple[int, int], ...]:
    """Which position of the corrupted prompt each position of the clean one is patched with: ((clean,
    corrupted), …), both increasing. `align` "auto": the tokens the two share, in order (difflib's longest
    matching blocks), a changed span of as many tokens on both sides position for position, and a changed span
    of different lengths by its last token (where a causal model has read the whole of it: Meng et al. 2022's
    last subject token); a token inserted on one side only is left out. Or the pairs: a sequence of (clean,
    corrupted) or a text "0:0,1:1,3-4:2-3" (a range on both sides of as many positions)."""
    T, T2 = len(clean), len(corrupt)
    if isinstance(align, str) and align.strip() == "auto":
        import difflib

        pairs: list[tuple[int, int]] = []
        for tag, a, b, c, d in difflib.SequenceMatcher(None, list(clean), list(corrupt), autojunk=False).get_opcodes():
            if tag == "equal" or (tag == "replace" and b - a == d - c):
                pairs.extend(zip(range(a, b), range(c, d)))
            elif tag == "replace":
                pairs.append((b - 1, d - 1))
    elif isinstance(align, str):
        pairs = []
        for part in align.replace(" ", "").split(","):
            sides = part.split(":")
            if len(sides) != 2:
                raise UsageError(f"{arg('align')} takes auto or pairs CLEAN:CORRUPT separated by commas (0:0,1:1,3-4:"
                                 f"2-3); got {visible(part)!r}", "align")
            spans = [_span(side, part) for side in sides]
            if spans[0][1] - spans[0][0] != spans[1][1] - spans[1][0]:
                raise UsageError(f"{arg('align')} {visible(part)!r}: the two ranges must hold as many positions",
                                 "align")
            pairs.extend(zip(range(spans[0][0], spans[0][1] + 1), range(spans[1][0], spans[1][1] + 1)))
    else:
        try:
            pairs = [(int(i), int(k)) for i, k in align]
        except (TypeError, ValueError):
            raise UsageError(f"{arg('align')} takes auto, a text of pairs (0:0,1:1) or (clean, corrupted) pairs of "
                             f"whole numbers", "align") from None
    if not pairs:
        raise UsageError(f"{arg('align')} aligns no position of the two prompts", "align")
    for i, k in pairs:
        if not (0 <= i < T and 0 <= k < T2):
            raise UsageError(f"{arg('align')} pair {i}:{k} is out of range: the clean prompt has {T} tokens (0 to "
                             f"{T - 1}), the corrupted one {T2} (0 to {T2 - 1})", "align")
    if any(b[0] <= a[0] or b[1] <= a[1] for a, b in zip(pairs, pairs[1:])):
        raise UsageError(f"{arg('align')}: each side's positions must increase from pair to pair (an alignment keeps "
                         f"the order of both prompts)", "align")
    return tuple(pairs)


def _span(side: str, part: str) -> tuple[int, int]:
    ends = side.split("-")
    if not 1 <= len(ends) <= 2 or not all(e.isdigit() and len(e) <= 9 for e in ends):
        raise UsageError(f"{arg('align')} {visible(part)!r}: a position is a whole number from 0, a range two of them "
                         f"(3-4)", "align")
    first, last = int(ends[0]), int(ends[-1])
    if last < first:
        raise UsageError(f"{arg('align')} {visible(part)!r}: a range goes up (3-4, not 4-3)", "align")
    return first, last


class Metric:
    """What patching measures of what read() reads (…, R): a causal LM's logit difference of the two answers
    (`answers`: their token ids), or an encoder's sentence embedding's dot product with the clean run's unit
    one (`reference`, D), its cosine. Called, a float64 array; tensor(), the same as a differentiable tensor
    (attribution patching takes its gradient)."""

    def __init__(self, *, answers: tuple[int, int] | None = None, reference: Any = None) -> None:
        self.answers, self.reference = answers, reference

    def tensor(self, reading):
        if self.answers is not None:
            answer, other = self.answers
            return reading[..., answer].double() - reading[..., other].double()
        D = int(self.reference.shape[0])
        return (reading[..., :D] @ self.reference).double()

    def __call__(self, reading):
        return self.tensor(reading).detach().cpu().numpy()


def prepare(clean, corrupt, model, tokenizer, answers, direction, truncate, device, dtype, align=None, lean=False,
            instead="", fold=False):
    """What patching and path patching share: the prompts checked and encoded (as many tokens, or aligned), the
    model (a causal LM), both runs recorded, the two answers (their logit difference must differ between the
    runs). (loaded, site, clean Encoded, corrupt Encoded, clean run, corrupted run, measure, clean value,
    corrupted value, answer names, aligned pairs). `lean`: where α would not fit the memory budget, run on the long
    path (the site's `lean`: the model's own SDPA, no α) instead of refusing; else the refusal says `instead`.
    `fold` (AtP alone): on the long path the receiver's run is AtP's own forward pass (where.pending), kept
    open for its backward pass."""
    check_text(clean)
    check_text(corrupt)
    if direction not in DIRECTIONS:
        raise UsageError(f"{arg('direction')} takes denoise or noise; got {visible(direction)!r}", "direction")
    if answers is not None and (len(answers) != 2 or answers[0] == answers[1]):
        raise UsageError(f"{arg('answers')} takes two different tokens, the answer and the other, e.g. "
                         f"' Paris',' Rome'", "answers")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("patch")
    from attnviz.engine.ablation import is_causal_lm, site
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory, fits
    from attnviz.engine.patching import check_lean, donor_run

    causal = is_causal_lm(loaded.model)
    if not causal and answers is not None:
        raise InputError(f"{arg('answers')} are next tokens of a causal language model; {loaded.name} is an encoder, "
                         f"measured by its sentence embedding", "answers")
    first, second = encode(loaded, clean, truncate=truncate), encode(loaded, corrupt, truncate=truncate)
    T = len(first.tokens)
    if align is None and len(second.tokens) != T:
        starts = [" ".join(visible(t) for t in e.tokens[:12]) for e in (first, second)]
        raise InputError(f"the prompts must have as many tokens to patch position by position, or an alignment "
                         f"({arg('align', 'auto')}): the clean one has {T} ({starts[0]}), the corrupted one "
                         f"{len(second.tokens)} ({starts[1]})", "corrupt")
    pairs = (tuple((i, i) for i in range(T)) if align is None
             else align_tokens(list(first.tokens), list(second.tokens), align))
    longest = max(T, len(second.tokens))
    where = site(loaded.model)
    if lean and not fits(loaded, longest, copies=4.0):  # α would not fit: the long path, which holds none
        where.lean = True
        check_lean(loaded, where, longest)
    else:
        check_memory(loaded, longest, copies=4.0, instead=instead)
    if where.lean and fold and identity(pairs, T, len(second.tokens)):  # AtP's forward pass is the receiver's run
        from attnviz.engine.patching import receiving_run

        if direction == "denoise":
            clean_run = donor_run(where, first.inputs)
            corrupt_run = receiving_run(where, second.inputs)
        else:
            clean_run, corrupt_run = receiving_run(where, first.inputs), donor_run(where, second.inputs)
        where.pending = (corrupt_run if direction == "denoise" else clean_run).pending
    else:
        clean_run, corrupt_run = donor_run(where, first.inputs), donor_run(where, second.inputs)
    try:
        return _measured(loaded, where, first, second, clean_run, corrupt_run, causal, answers, pairs, T)
    except BaseException:
        if where.pending is not None:  # the receiver's pass waits for a backward pass that will not come
            where.pending.close()
            where.pending = None
        raise


def _measured(loaded, where, first, second, clean_run, corrupt_run, causal, answers, pairs, T):
    """prepare's second half: the metric from the two runs' readings (the answers, or the sentence embedding)."""
    from attnviz.api.attribution.logits import check_spelling, target_id

    if not causal:  # an encoder: the cosine of the sentence embedding with the clean run's
        D = int(clean_run.reading.shape[0]) // (T + 1)
        if len(second.tokens) != T:
            raise InputError("an encoder's prompts must have as many tokens (its metric reads the whole sentence "
                             f"embedding); {arg('align')} is for causal language models", "align")
        measure = Metric(reference=clean_run.reading[:D])
        names = ("", "")
    else:
        if answers is None:
            answer, other = int(clean_run.reading.argmax()), int(corrupt_run.reading.argmax())
            if answer == other:
                shown = visible(loaded.tokenizer.decode([answer]))
                raise InputError(f"both prompts predict {shown!r}: give the two answers to compare with "
                                 f"{arg('answers')} (e.g. ' Paris',' Rome')", "answers")
        else:
            given = [target_id(loaded, a, "answers") for a in answers]
            answer, other = int(given[0] or 0), int(given[1] or 0)
            check_spelling(loaded, answers[0], answer, clean_run.reading, "answers")  # what the clean run predicts
            check_spelling(loaded, answers[1], other, corrupt_run.reading, "answers")  # and the corrupted one

        measure = Metric(answers=(answer, other))
        names = (loaded.tokenizer.decode([answer]), loaded.tokenizer.decode([other]))
    clean_value, corrupt_value = float(measure(clean_run.reading)), float(measure(corrupt_run.reading))
    if abs(clean_value - corrupt_value) < 1e-6:
        raise InputError("the two prompts give the same " + ("logit difference" if causal else "embedding")
                         + ": there is nothing to restore; choose prompts that differ"
                         + (f" in what they predict, or other {arg('answers')}" if causal else ""), "answers")
    return loaded, where, first, second, clean_run, corrupt_run, measure, clean_value, corrupt_value, names, pairs
