"""Which heads carry the difference between two prompts: activation patching (attnviz.patch, `attnviz patch`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.base.arguments import checked
from attnviz.render.tables import records_html
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import head_grid_panel, Page, Panel, Scale, short_model
from attnviz.progress import Reporter
from attnviz.render.png import mixed_figure
from attnviz.base.text import check_text, shorten, visible

__all__ = ["patch", "Patching", "path_patch", "PathPatching", "DIRECTIONS", "PATCH_TOLERANCE", "align_tokens"]

DIRECTIONS = ("denoise", "noise")
PATTERN_HEADS = 3  # the top heads whose α on both prompts the picture shows
PATCH_TOLERANCE = 1e-4  # |LD with every head and MLP patched − the donor's LD|, over max(1, |LD|): float32 sums


@dataclass(frozen=True)
class Patching:
    """Activation patching between a clean and a corrupted prompt of the same length, measured by the logit
    difference LD = logit(answer) − logit(other) at the last position, normalised so that 0 is the corrupted
    run and 1 the clean run: `direction` denoise puts pieces of the clean run into the corrupted one (how much
    of the answer each piece brings back), noise the corrupted run's into the clean one (how much each piece
    takes away: 1 − its value).

    Positions are patched in pairs, `alignment` ((clean position, corrupted position), …): position for
    position where the prompts have as many tokens, else as aligned (align_tokens); a position left out of
    the alignment is not patched.

    heads (L, H): each head's output (its z_h at every aligned position) patched alone; head_positions
    (L, H, A) or None: at one aligned pair at a time; attention (L, A): each layer's attention output at one
    pair (every head there); residual (L, A): the residual stream entering each layer at one pair.
    `all_patched`: the LD with every head and MLP output of every layer patched, which must be the donor's
    (`passed`)."""

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
    attention: np.ndarray  # (L, A)
    residual: np.ndarray  # (L, A)
    head_positions: np.ndarray | None
    all_patched: float | None  # the normalised LD with everything patched (1 denoising, 0 noising); None where
    # the last tokens differ (their embeddings are not patched) or are not aligned
    patterns: tuple = ()  # ((layer, head, α on the clean prompt (T, T), α on the corrupted prompt (T', T')), …)
    causal: bool = True
    alignment: tuple[tuple[int, int], ...] = ()  # ((clean position, corrupted position), …); () position for position
    captures: tuple = ()  # (the clean prompt's Capture, the corrupted prompt's): α of every head, for html()

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The aligned positions, (clean, corrupted) each: the columns of attention, residual, head_positions."""
        return self.alignment or tuple((i, i) for i in range(len(self.tokens)))

    @property
    def metric(self) -> str:
        """What is measured: a causal LM's logit difference of the answers, or an encoder's sentence embedding."""
        return ("logit difference" if self.answer or self.other
                else "cosine of the sentence embedding with the clean run's")

    @property
    def differs(self) -> tuple[int, ...]:
        """The aligned pairs (indices into `pairs`) whose two tokens differ."""
        return tuple(n for n, (i, k) in enumerate(self.pairs) if self.tokens[i] != self.corrupt_tokens[k])

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
                "direction": self.direction, "metric": self.metric, "clean_logit_diff": self.clean_diff,
                "corrupt_logit_diff": self.corrupt_diff, "heads": self.heads.tolist(),
                "attention": self.attention.tolist(), "residual": self.residual.tolist(), "top": self.top(),
                "alignment": [list(p) for p in self.pairs], "all_patched": self.all_patched, "passed": self.passed}
        if self.head_positions is not None:
            data["head_positions"] = self.head_positions.tolist()
        data["patterns"] = [{"layer": n, "head": h, "clean": a.tolist(), "corrupt": b.tolist()}
                            for n, h, a, b in self.patterns]
        return data

    def _repr_html_(self) -> str:
        from attnviz.render.viewer import framed

        table = records_html(self.top(), ["layer", "head", "score"],
                             f"{self.model}: which heads carry {self.answer!r} against {self.other!r}")
        return table + (framed(self.html(command="attnviz in a notebook")) if self.captures else "")

    def html(self, *, command: str | None = None) -> str:
        """The interactive page: the views of α on both prompts (choose the prompt as a part) and the Patching
        panel (each head's map, each layer and position's, the top heads; choose a head to see its α on the
        clean and the corrupted prompt side by side). One self-contained HTML file."""
        from attnviz.render.viewer import patch_section, viewer_data, viewer_html

        if len(self.captures) != 2:
            raise InputError("this patching result holds no α of the two prompts (attnviz.patch(...) keeps them)")
        whole = [("the clean prompt", self.captures[0]), ("the corrupted prompt", self.captures[1])]
        return viewer_html(viewer_data(whole, command=command, patching=patch_section(self)))

    def labels(self) -> tuple[str, ...]:
        """The aligned positions as the pictures name them: the clean token, and clean/corrupt where they differ."""
        pairs = [(self.tokens[i], self.corrupt_tokens[k]) for i, k in self.pairs]
        return tuple(visible(a) if a == b else f"{visible(a)}/{visible(b)}" for a, b in pairs)

    def page(self) -> Page:
        """Three panels on one diverging scale centred on 0: each head (layers × heads), each layer's attention
        output by position, and the residual stream by position (layers × positions); then a row per top head
        (`patterns`): its α on the clean prompt, on the corrupted one (one scale, 0 to 1), and clean − corrupted."""
        title = (f"{short_model(self.model)} · activation patching ({self.direction}): "
                 + (f"{visible(self.answer)!r} against {visible(self.other)!r}" if self.answer or self.other
                    else "the sentence embedding"))
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
        from attnviz.data.sides import causal_mask

        alpha_scale = Scale(0.0, 1.0, "attention weight α")
        clean_labels = tuple(visible(t) for t in self.tokens)
        corrupt_labels = tuple(visible(t) for t in self.corrupt_tokens)
        rows, cols = (np.array(p, dtype=np.intp) for p in zip(*self.pairs))
        for layer, head, on_clean, on_corrupt in self.patterns:
            change = np.asarray(on_clean)[np.ix_(rows, rows)] - np.asarray(on_corrupt)[np.ix_(cols, cols)]
            reach = max(float(np.abs(change).max()), 1e-9)
            whole = len(self.pairs) == len(self.tokens) == len(self.corrupt_tokens)
            for matrix, names, short, cmap, panel_scale in (
                    (on_clean, clean_labels, f"{layer}.{head} on the clean prompt", None, alpha_scale),
                    (on_corrupt, corrupt_labels, f"{layer}.{head} on the corrupted prompt", None, alpha_scale),
                    (change, labels, f"{layer}.{head}: clean − corrupted" + ("" if whole else " (aligned positions)"),
                     "RdBu_r", Scale(-reach, reach, "Δα"))):
                panels.append(Panel(matrix=np.asarray(matrix, np.float32), rows=names, cols=names,
                                    hidden=causal_mask(len(names)) if self.causal else None,
                                    scale=panel_scale, title=(title,), name=f"patch_{layer}_{head}", short=short,
                                    cmap=cmap))
        subtitle = f"“{visible(shorten(self.clean, 150))}” / “{visible(shorten(self.corrupt, 150))}”"
        notes = (f"{self.metric}: clean {self.clean_diff:.3f}, corrupted {self.corrupt_diff:.3f}"
                 + ("" if self.all_patched is None else f"; every head and MLP patched gives {self.all_patched:.3f} "
                    f"(the donor's run: {1.0 if self.direction == 'denoise' else 0.0:.0f})"),)
        return Page(panels=tuple(panels), title=title, name="attnviz_patch", notes=notes, subtitle=subtitle)

    def figure(self):
        return mixed_figure(self.page(), ncols=3)


@borrows
@checked
def patch(clean: str, corrupt: str, *, model: Any = None, tokenizer: Any = None,
          answers: tuple[str | int, str | int] | list[str | int] | None = None, direction: str = "denoise",
          positions: bool = False, align: Any = None,
          truncate: bool = True, device: str = "auto", dtype: str = "float32",
          reporter: Reporter | None = None) -> Patching:
    """Activation patching for a causal language model: the `clean` and `corrupt` prompts (the same number of
    tokens), the metric the logit difference of `answers` (two texts of one token each, e.g. (" Paris",
    " Rome"); default: the clean run's and the corrupted run's top tokens) at the last position. Each head
    (and with `positions` each head at each position), each layer's attention output and residual stream at
    each position, patched alone from one run into the other (`direction` "denoise": clean into corrupted;
    "noise": corrupted into clean), batched. An answer may also be a token id.

    `align`, for prompts of different lengths (or to patch only some positions): "auto" (align_tokens: the
    tokens both prompts share, in order; a changed span of as many tokens position for position, else its
    last token with the other's last), or the pairs themselves, ((clean position, corrupted position), …) or
    "0:0,1:1,3-4:2-3" (each increasing); positions left out are not patched."""
    loaded, where, first, second, clean_run, corrupt_run, measure, clean_diff, corrupt_diff, names, pairs = _prepare(
        clean, corrupt, model, tokenizer, answers, direction, truncate, device, dtype, align)
    from attnviz.engine.patching import aligned, every_patch, run_patches

    L, H, A = where.layers, where.heads, len(pairs)
    reporter = reporter or Reporter()
    gap = clean_diff - corrupt_diff
    if direction == "denoise":  # into the corrupted run: its positions, the clean run's moved to them
        receiver, donor = second, aligned(clean_run, corrupt_run, [(k, i) for i, k in pairs])
        at = [k for _, k in pairs]
    else:
        receiver, donor = first, aligned(corrupt_run, clean_run, list(pairs))
        at = [i for i, _ in pairs]

    def score(readings) -> np.ndarray:
        return (measure(readings) - corrupt_diff) / gap

    patches = {"heads": every_patch("head", L, H, at), "attention": every_patch("attention", L, H, at),
               "residual": every_patch("residual", L, H, at)}
    if positions:
        patches["head_positions"] = every_patch("head", L, H, at, positions=True)
    total = sum(len(p) for p in patches.values())
    results = {}
    with reporter.progress("Patching", total, "patches") as step:
        for name, chosen in patches.items():
            results[name] = score(run_patches(where, receiver.inputs, donor, chosen, on_done=step))
    everything = _all_patched(where, receiver, donor, first, second, score, direction, pairs)
    from attnviz.engine.forward import make_capture, model_attentions

    base = 0.0 if direction == "denoise" else 1.0
    heads = results["heads"].reshape(L, H)
    strongest = np.argsort(-np.abs(heads - base), axis=None, kind="stable")[:PATTERN_HEADS]
    on_clean, on_corrupt = model_attentions(loaded, first), model_attentions(loaded, second)  # (L, H, T, T)
    patterns = tuple((int(i // H), int(i % H), on_clean[i // H, i % H], on_corrupt[i // H, i % H]) for i in strongest)
    captures = (make_capture(loaded, first, on_clean, clean), make_capture(loaded, second, on_corrupt, corrupt))
    return Patching(
        model=loaded.name, clean=clean, corrupt=corrupt, tokens=tuple(first.tokens),
        corrupt_tokens=tuple(second.tokens), answer=names[0], other=names[1], direction=direction,
        clean_diff=clean_diff,
        corrupt_diff=corrupt_diff, heads=results["heads"].reshape(L, H), attention=results["attention"].reshape(L, A),
        residual=results["residual"].reshape(L, A),
        head_positions=results["head_positions"].reshape(L, H, A) if positions else None, all_patched=everything,
        patterns=patterns, causal=bool(loaded.causal), captures=captures,
        alignment=() if _identity(pairs, len(first.tokens), len(second.tokens)) else tuple(pairs))


def _identity(pairs, T: int, T2: int) -> bool:
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


def _prepare(clean, corrupt, model, tokenizer, answers, direction, truncate, device, dtype, align=None):
    """What patching and path patching share: the prompts checked and encoded (as many tokens, or aligned), the
    model (a causal LM), both runs recorded, the two answers (their logit difference must differ between the
    runs). (loaded, site, clean Encoded, corrupt Encoded, clean run, corrupted run, measure, clean value,
    corrupted value, answer names, aligned pairs)"""
    check_text(clean)
    check_text(corrupt)
    if direction not in DIRECTIONS:
        raise InputError(f"{arg('direction')} takes denoise or noise; got {visible(direction)!r}", "direction")
    if answers is not None and (len(answers) != 2 or answers[0] == answers[1]):
        raise InputError(f"{arg('answers')} takes two different tokens, the answer and the other, e.g. "
                         f"' Paris',' Rome'", "answers")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head="auto")
    loaded.require_single("patch")
    from attnviz.api.attribution.logits import target_id
    from attnviz.engine.ablation import is_causal_lm, site
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory
    from attnviz.engine.patching import donor_run, logit_difference

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
    check_memory(loaded, max(T, len(second.tokens)), copies=4.0)
    where = site(loaded.model)
    clean_run, corrupt_run = donor_run(where, first.inputs), donor_run(where, second.inputs)
    if not causal:  # an encoder: the cosine of the sentence embedding with the clean run's
        D = int(clean_run.reading.shape[0]) // (T + 1)
        if len(second.tokens) != T:
            raise InputError("an encoder's prompts must have as many tokens (its metric reads the whole sentence "
                             f"embedding); {arg('align')} is for causal language models", "align")
        reference = clean_run.reading[:D]

        def measure(reading):
            return (reading[..., :D] @ reference).double().cpu().numpy()

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

        def measure(reading):
            return logit_difference(reading, answer, other)

        names = (loaded.tokenizer.decode([answer]), loaded.tokenizer.decode([other]))
    clean_value, corrupt_value = float(measure(clean_run.reading)), float(measure(corrupt_run.reading))
    if abs(clean_value - corrupt_value) < 1e-6:
        raise InputError("the two prompts give the same " + ("logit difference" if causal else "embedding")
                         + ": there is nothing to restore; choose prompts that differ"
                         + (f" in what they predict, or other {arg('answers')}" if causal else ""), "answers")
    return loaded, where, first, second, clean_run, corrupt_run, measure, clean_value, corrupt_value, names, pairs


def _all_patched(where, receiver, donor, first, second, score, direction, pairs) -> float | None:
    """The check: every head and MLP patched. A causal LM: the metric at the last position (the last tokens
    must be aligned, the same, and, with absolute position embeddings, at the same index), as restored. An
    encoder: the final hidden state of every position whose token both prompts share must be the donor's;
    restored 1 (denoising) or 0 where it is, else the largest difference over the state's size moved past.
    None where no position qualifies."""
    from attnviz.engine.ablation import is_causal_lm
    from attnviz.engine.patching import all_patched_logits, positions_inside_attention

    T, T2 = len(first.tokens), len(second.tokens)
    reading = all_patched_logits(where, receiver.inputs, donor)
    if is_causal_lm(where.model):
        last = (T - 1, T2 - 1)
        same_place = T == T2 or positions_inside_attention(where.model)
        return (float(score(reading)) if last in pairs and first.tokens[-1] == second.tokens[-1] and same_place
                else None)
    shared = [i for i, k in pairs if i == k and first.tokens[i] == second.tokens[k]]
    if not shared:
        return None
    T = len(first.tokens)
    D = int(reading.shape[0]) // (T + 1)
    states, wanted = reading[D:].view(T, D)[shared], donor.reading[D:].view(T, D)[shared]
    miss = float((states - wanted).abs().max()) / max(1.0, float(wanted.abs().max()))
    target = 1.0 if direction == "denoise" else 0.0
    return target if miss <= PATCH_TOLERANCE else target + (miss if direction == "denoise" else -miss)


@dataclass(frozen=True)
class PathPatching:
    """Path patching (Wang et al. 2022): the senders' outputs from the donor run reach the receivers only through
    their inputs `to` (of q, k, v), everything else frozen at the receiver run, measured like `Patching` (0
    the corrupted run, 1 the clean one). `score`: through every receiver at once; `by_receiver`: through each
    alone."""

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
    from attnviz.base.selection import head_pairs
    from attnviz.engine.scratch.adapters import adapter_for
    from attnviz.engine.patching import aligned, INPUTS, path_patched_logits, path_recording

    if not to or any(c not in INPUTS for c in to) or len(set(to)) != len(to):
        raise InputError(f"{arg('to')} takes q, k and v, alone or together (qk, qkv, …); got {visible(to)!r}", "to")
    loaded, where, first, second, clean_run, corrupt_run, measure, clean_diff, corrupt_diff, names, pairs = _prepare(
        clean, corrupt, model, tokenizer, answers, direction, truncate, device, dtype, align)
    L, H = where.layers, where.heads
    sent = head_pairs(senders, L, H)
    received = head_pairs(receivers, L, H) if receivers else []
    if received and min(n for n, _ in received) <= max(n for n, _ in sent):
        raise InputError(f"{arg('receivers')} must be heads of layers after the senders' (the last sender is in "
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
        alignment=() if _identity(pairs, len(first.tokens), len(second.tokens)) else tuple(pairs))

