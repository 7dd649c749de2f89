"""Which heads carry the difference between two prompts: activation patching (attnviz.patch, `attnviz patch`).
Path patching, which follows one path from senders to receivers, is attnviz.api.patching.paths."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, overload, TYPE_CHECKING

import numpy as np

from attnviz.api.models import borrows
from attnviz.api.patching.methods import PATCHING
from attnviz.api.patching.prompts import align_tokens, identity, prepare
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.render.tables import records_html
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import head_grid_panel, Page, Panel, Scale, short_model
from attnviz.progress import Reporter
from attnviz.base.text import shorten, visible

if TYPE_CHECKING:
    from attnviz.api.patching.paths import PathPatching

__all__ = ["patch", "Patching", "Comparison", "PATCH_TOLERANCE", "MISMATCH_EXIT", "METHODS", "align_tokens"]

PATTERN_HEADS = 3  # the top heads whose α on both prompts the picture shows
PATCH_TOLERANCE = 1e-4  # |LD with every head and MLP patched − the donor's LD|, over max(1, |LD|): float32 sums
MISMATCH_EXIT = 3  # every head and MLP patched does not give the donor's run
METHODS = PATCHING.names()  # the registry's (attnviz.api.patching.methods)
METHOD_NAMES = {cls.name: cls.title for cls in PATCHING}
DISAGREE = 5  # the heads --compare lists where the two methods differ most


@dataclass(frozen=True)
class Comparison:
    """Exact activation patching against its attribution-patching estimate (AtP), head by head, on the same
    normalisation (0 the corrupted run, 1 the clean one): `exact` and `estimate` (L, H)."""

    exact: np.ndarray
    estimate: np.ndarray
    method: str = "atp"

    @property
    def r(self) -> float | None:
        """Pearson's r of the two over every head; None where either is constant."""
        a, b = self.exact.ravel().astype(np.float64), self.estimate.ravel().astype(np.float64)
        if a.size < 2 or float(a.std()) == 0.0 or float(b.std()) == 0.0:
            return None
        return float(np.corrcoef(a, b)[0, 1])

    def disagree(self, k: int = DISAGREE) -> list[dict]:
        """The k heads where the estimate is furthest from the exact value: layer, head, exact, estimate."""
        H = self.exact.shape[1]
        order = np.argsort(-np.abs(self.estimate - self.exact), axis=None, kind="stable")[:k]
        return [{"layer": int(i // H), "head": int(i % H), "exact": float(self.exact.flat[i]),
                 "estimate": float(self.estimate.flat[i])} for i in order]

    def to_dict(self) -> dict:
        return {"method": self.method, "exact": self.exact.tolist(), "estimate": self.estimate.tolist(),
                "pearson_r": self.r, "disagree": self.disagree()}


@dataclass(frozen=True)
class Patching(Result):
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
    (`passed`).

    `method` "exact": each piece patched in its own run; "atp": attribution patching's estimate of the same
    (Nanda 2023), the change of LD linearised at the receiver run, (a_donor − a_receiver) · ∂LD/∂a, from one
    forward and one backward pass, on the same normalisation. `comparison` (with compare=True): both methods'
    heads side by side."""

    command: ClassVar[str] = "patch"
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
    listed: int = 10  # heads the report lists
    method: str = "exact"  # how heads, attention, residual and head_positions were found (METHODS)
    comparison: Comparison | None = None  # --compare: exact patching against AtP, head by head
    lean: bool = False  # ran without α (a long input: the model's own SDPA attention; no patterns drawn)

    figure_name: ClassVar[str] = "attnviz_patch.png"
    page_name: ClassVar[str] = "attnviz_patch.html"

    @property
    def estimated(self) -> bool:
        """Found from gradients (AtP, AtP*) rather than one patched run per piece."""
        return PATCHING.get(self.method).estimates

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else MISMATCH_EXIT

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """The heads that restore most, the metric on both runs, the alignment, where the residual stream carries
        the difference, and the check."""
        from attnviz.render.tables import records_table, verdict

        L = self.heads.shape[0]
        rows = [{"rank": n + 1, "head": f"{r['layer']}.{r['head']}", "score": r["score"]}
                for n, r in enumerate(self.top(self.listed))]
        columns = [("rank", "rank", "d"), ("head", "layer.head", ""), ("score", "restored", "+.3f")]
        items: list = [records_table(rows, columns,
                                     f"{short_model(self.model)}: "
                                     + (f"{visible(self.answer)!r} against {visible(self.other)!r}" if self.answer
                                        else "the sentence embedding") + f", each head patched ({self.direction}"
                                     + ("" if not self.estimated else f", {METHOD_NAMES[self.method]}") + ")"),
                       Line(f"{self.metric}: clean {self.clean_diff:+.3f}, corrupted {self.corrupt_diff:+.3f}; "
                            f"restored: 0 is the corrupted run, 1 the clean one")]
        labels, pairs = self.labels(), self.pairs
        if self.alignment:
            shown = ", ".join(f"{i}:{k}" for i, k in pairs)
            items.append(Line(f"Aligned {len(pairs)} position(s) of {len(self.tokens)} and {len(self.corrupt_tokens)} "
                              f"(clean:corrupted): {shorten(shown, 300)}"))
        for n in self.differs or (len(labels) - 1,):
            moves = [m for m in range(L) if self.residual[m, -1] > 0.5]
            later = (f"; at the last aligned position from layer {moves[0] if moves else '–'} on" if self.answer
                     else "")
            items.append(Line(f"The residual stream at {labels[n]!r} (position {pairs[n][0]}) carries the difference "
                              f"up to layer {_last_above(self.residual[:, n])}{later}."))
        if self.all_patched is None and self.lean and self.estimated and self.comparison is None:
            items.append(Line("The check (every head and MLP patched gives the donor's run) takes two more passes: on "
                              "a long input it is left to exact patching (--method exact).", style="dim"))
        elif self.all_patched is None:
            items.append(Line("The check (every head and MLP patched) does not apply: the prompts' last tokens differ"
                              + (" or sit at different indices" if self.alignment else "") + ".", style="dim"))
        else:
            items.append(verdict(self.passed, f"every head and MLP patched gives the donor's run: "
                                              f"{self.all_patched:.6f} (tolerance {PATCH_TOLERANCE:.0e} of the "
                                              f"metric)"))
        if self.lean:
            items.append(Line(f"Ran without α: {len(self.tokens):,} tokens' attention weights would not fit the memory "
                              f"budget, so the model ran on its own SDPA attention"
                              + (", blocks recomputed in the backward pass as the budget needs" if self.estimated
                                 else "") + "; the heads' patterns are not drawn.", style="dim"))
        if self.comparison is not None:
            r = self.comparison.r
            items.append(Line(f"{METHOD_NAMES[self.comparison.method]} against exact patching over the "
                              f"{self.heads.size} heads: Pearson r = " + ("– (one side is constant)" if r is None
                                                                            else f"{r:.3f}")))
            far = "; ".join(f"{d['layer']}.{d['head']} exact {d['exact']:+.3f}, estimate {d['estimate']:+.3f}"
                            for d in self.comparison.disagree())
            items.append(Line(f"Where they disagree most: {far}"))
        items.append(Line("restored: (M patched − M corrupted) / (M clean − M corrupted), M the logit difference of "
                          "the two answers at the last position (an encoder: the cosine of the sentence embedding with "
                          "the clean run's); a head patched alone at every position."
                          + (" AtP estimates each patch from one forward and one backward pass of the receiver run, "
                             "(a donor − a receiver) · ∂M/∂a (Nanda 2023): an estimate, not a patch; --compare "
                             "measures it against exact patching." if "atp" in (self.method, getattr(
                                 self.comparison, "method", "")) else "")
                          + (" AtP* (Kramár et al. 2024): the residual stream's effect through the next layer's "
                             "attention patterns computed exactly (the QK fix), and the size of each estimate "
                             "GradDrop's, Σ over layers ℓ of |the estimate with block ℓ's gradient dropped| / (L − 1), "
                             "with the sign of the QK-fixed AtP." if "atp*" in (self.method, getattr(
                                 self.comparison, "method", "")) else ""), style="dim"))
        return items

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
        """One record per layer and head: layer, head, score (what --csv prints); with a comparison also the
        exact value and the estimate."""
        L, H = self.heads.shape
        rows: list[dict] = []
        for n in range(L):
            for h in range(H):
                row = {"layer": n, "head": h, "score": float(self.heads[n, h])}
                if self.comparison is not None:
                    row.update(exact=float(self.comparison.exact[n, h]), estimate=float(self.comparison.estimate[n, h]))
                rows.append(row)
        return rows

    def to_dict(self) -> dict:
        """What `attnviz patch --json` prints."""
        data = {"model": self.model, "clean": self.clean, "corrupt": self.corrupt, "tokens": list(self.tokens),
                "corrupt_tokens": list(self.corrupt_tokens), "answer": self.answer, "other": self.other,
                "direction": self.direction, "method": self.method, "metric": self.metric,
                "clean_logit_diff": self.clean_diff,
                "corrupt_logit_diff": self.corrupt_diff, "heads": self.heads.tolist(),
                "attention": self.attention.tolist(), "residual": self.residual.tolist(), "top": self.top(),
                "alignment": [list(p) for p in self.pairs], "all_patched": self.all_patched, "passed": self.passed,
                "without_alpha": self.lean}
        if self.head_positions is not None:
            data["head_positions"] = self.head_positions.tolist()
        if self.comparison is not None:
            data["compare"] = self.comparison.to_dict()
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
        title = (f"{short_model(self.model)} · activation patching ({self.direction}"
                 + ("" if not self.estimated else f", {METHOD_NAMES[self.method]}") + "): "
                 + (f"{visible(self.answer)!r} against {visible(self.other)!r}" if self.answer or self.other
                    else "the sentence embedding"))
        values = [self.heads, self.attention, self.residual]
        if self.comparison is not None:
            values += [self.comparison.exact, self.comparison.estimate]
        edge = max(1.0, max(float(np.abs(v).max()) for v in values))
        scale = Scale(-edge, edge, "restored (0 corrupted, 1 clean)")
        grid = replace(head_grid_panel(self.heads, scale, title, "patch_heads", short="each head, every position"
                                       + ("" if not self.estimated else f" ({METHOD_NAMES[self.method]})")),
                       cmap="RdBu_r")
        labels = self.labels()
        L = self.heads.shape[0]
        panels = [grid]
        if self.comparison is not None:  # the other method's heads beside
            other, name = ((self.comparison.estimate, METHOD_NAMES[self.comparison.method]) if not self.estimated
                           else (self.comparison.exact, "exact patching"))
            panels.append(replace(head_grid_panel(other, scale, title, "patch_compare",
                                                  short=f"each head, every position ({name})"), cmap="RdBu_r"))
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

    def figure(self, *, ax=None):
        """The page's panels; with a comparison, exact patching against the estimate instead: both grids and the
        scatter of every head, the heads where they disagree most named."""
        if self.comparison is not None:
            from attnviz.render.charts import comparison_figure

            page = self.page()
            return comparison_figure(self.comparison.exact, self.comparison.estimate,
                                     METHOD_NAMES[self.comparison.method], self.comparison.r,
                                     self.comparison.disagree(), page.title, page.subtitle, ax=ax)
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(), ncols=3, ax=ax)


def _last_above(column, level: float = 0.5) -> str:
    """The last layer where the value is above `level`, or –."""
    above = [n for n, v in enumerate(column) if v > level]
    return str(above[-1]) if above else "–"


@overload
def patch(clean: str, corrupt: str, *, model: Any = None, tokenizer: Any = None,
          answers: tuple[str | int, str | int] | list[str | int] | None = None, direction: str = "denoise",
          positions: bool = False, align: Any = None, top: int = 10, senders: None = None, receivers: Any = None,
          to: str = "qkv", method: str = "exact", compare: bool = False, truncate: bool = True,
          device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Patching: ...


@overload
def patch(clean: str, corrupt: str, *, model: Any = None, tokenizer: Any = None,
          answers: tuple[str | int, str | int] | list[str | int] | None = None, direction: str = "denoise",
          positions: bool = False, align: Any = None, top: int = 10, senders: Any, receivers: Any = None,
          to: str = "qkv", method: str = "exact", compare: bool = False, truncate: bool = True,
          device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> PathPatching: ...


@borrows
@checked
def patch(clean: str, corrupt: str, *, model: Any = None, tokenizer: Any = None,
          answers: tuple[str | int, str | int] | list[str | int] | None = None, direction: str = "denoise",
          positions: bool = False, align: Any = None, top: int = 10, senders: Any = None, receivers: Any = None,
          to: str = "qkv", method: str = "exact", compare: bool = False, truncate: bool = True,
          device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Any:
    """Activation patching for a causal language model: the `clean` and `corrupt` prompts (the same number of
    tokens), the metric the logit difference of `answers` (two texts of one token each, e.g. (" Paris",
    " Rome"); default: the clean run's and the corrupted run's top tokens) at the last position. Each head
    (and with `positions` each head at each position), each layer's attention output and residual stream at
    each position, patched alone from one run into the other (`direction` "denoise": clean into corrupted;
    "noise": corrupted into clean), batched. An answer may also be a token id.

    `align`, for prompts of different lengths (or to patch only some positions): "auto" (align_tokens: the
    tokens both prompts share, in order; a changed span of as many tokens position for position, else its
    last token with the other's last), or the pairs themselves, ((clean position, corrupted position), …) or
    "0:0,1:1,3-4:2-3" (each increasing); positions left out are not patched. `top`: the heads the report lists.

    `method` "exact" (one patched run per piece, batched), "atp" (attribution patching, Nanda 2023: every
    piece's effect estimated from one forward and one backward pass of the receiver run, on the same scale) or
    "atp*" (Kramár et al. 2024: AtP with the QK fix for the residual stream and GradDrop's magnitude, L + 1
    passes). `compare`: exact patching and the estimate (AtP where `method` is exact) for the heads; the
    result's `comparison` holds them with Pearson's r.

    With `senders`, path patching instead (attnviz.path_patch: `senders` to `receivers` through their `to`
    inputs), a PathPatching."""
    patcher = PATCHING.get(method)()
    if senders is not None and (patcher.estimates or compare):
        raise UsageError(f"path patching ({arg('senders')}) is exact; {arg('method')} and {arg('compare')} are for "
                         f"activation patching", "method")
    if senders is not None:
        from attnviz.api.patching.paths import path_patch

        return path_patch(clean, corrupt, senders=senders, receivers=receivers or (), to=to, model=model,
                          tokenizer=tokenizer, answers=answers, direction=direction, align=align, truncate=truncate,
                          device=device, dtype=dtype)
    if receivers:
        raise UsageError(f"{arg('receivers')} is for path patching: give the senders ({arg('senders')})", "receivers")
    if not 1 <= top <= 100:
        raise UsageError(f"{arg('top')} takes a whole number from 1 to 100; got {top}", "top")
    loaded, where, first, second, clean_run, corrupt_run, measure, clean_diff, corrupt_diff, names, pairs = prepare(
        clean, corrupt, model, tokenizer, answers, direction, truncate, device, dtype, align,
        lean=not patcher.needs_alpha, fold=patcher.estimates and not compare and not patcher.needs_alpha,
        instead=f"{arg('method')} atp or exact run without α (the model's own SDPA attention)")
    try:
        return _patched(loaded, where, first, second, clean_run, corrupt_run, measure, clean_diff, corrupt_diff,
                        names, pairs, patcher=patcher, method=method, direction=direction, positions=positions,
                        compare=compare, top=top, reporter=reporter, clean=clean, corrupt=corrupt)
    finally:
        if where.pending is not None:  # the receiver's forward pass, made ahead, not used: its context ends
            where.pending.close()
            where.pending = None


def _patched(loaded, where, first, second, clean_run, corrupt_run, measure, clean_diff, corrupt_diff, names, pairs,
             *, patcher, method, direction, positions, compare, top, reporter, clean, corrupt) -> Patching:
    """patch's work after the two runs: the patches, or the estimate, and the result."""
    from attnviz.engine.patching import aligned, every_patch, run_patches

    L, H, A = where.layers, where.heads, len(pairs)
    patcher.check(loaded, where, max(len(first.tokens), len(second.tokens)), A)
    reporter = reporter or Reporter()
    gap = clean_diff - corrupt_diff
    if direction == "denoise":  # into the corrupted run: its positions, the clean run's moved to them
        receiver, donor = second, aligned(clean_run, corrupt_run, [(k, i) for i, k in pairs])
        at = [k for _, k in pairs]
    else:
        receiver, donor = first, aligned(corrupt_run, clean_run, list(pairs))
        at = [i for i, _ in pairs]
    if where.lean:  # the receiver run's own recordings are in its donor now where they are needed: let them go
        own = corrupt_run if direction == "denoise" else clean_run
        if own is not donor:
            own.z, own.hidden = [], []

    def score(readings) -> np.ndarray:
        return (measure(readings) - corrupt_diff) / gap

    patches = {"heads": every_patch("head", L, H, at)}
    if not patcher.estimates:
        patches.update(attention=every_patch("attention", L, H, at), residual=every_patch("residual", L, H, at))
        if positions:
            patches["head_positions"] = every_patch("head", L, H, at, positions=True)
    elif not compare:
        patches = {}
    estimated = None
    results: dict = {}
    estimating = patcher.estimates or compare
    # the long path: each block, forward (unless the receiver's run was it) and backward
    blocks = (L if where.pending is not None else 2 * L) if where.lean and estimating else 0
    with reporter.progress("Patching" + (" (long: each block forward and backward)" if blocks else ""),
                           sum(len(p) for p in patches.values()) + (blocks or estimating),
                           "blocks" if blocks and not patches else "runs") as step:
        where.on_block = step if blocks else None
        for name, chosen in patches.items():
            results[name] = score(run_patches(where, receiver.inputs, donor, chosen, on_done=step))
        if estimating:
            start = corrupt_diff if direction == "denoise" else clean_diff  # the receiver run's M

            def normal(change) -> np.ndarray:
                return (start + np.asarray(change) - corrupt_diff) / gap

            estimator = patcher if patcher.estimates else PATCHING.get("atp")()  # --compare: exact against AtP
            estimated = {name: normal(value) for name, value in
                         estimator.estimate(where, receiver.inputs, donor, at, measure.tensor, L).items()}
            if not blocks:
                step(1)
    comparison = None
    if compare:
        assert estimated is not None
        comparison = Comparison(exact=results["heads"].reshape(L, H), estimate=estimated["heads"].reshape(L, H),
                                method=method if patcher.estimates else "atp")
    if patcher.estimates:
        assert estimated is not None
        results = {name: estimated[name] for name in ("heads", "attention", "residual")}
        if positions:
            results["head_positions"] = estimated["head_positions"]
    # the check runs two more passes: an estimate on the long path leaves it to exact patching
    skip_check = where.lean and patcher.estimates and not compare
    everything = None if skip_check else _all_patched(where, receiver, donor, first, second, score, direction, pairs)
    from attnviz.engine.forward import make_capture, model_attentions

    base = 0.0 if direction == "denoise" else 1.0
    heads = results["heads"].reshape(L, H)
    strongest = np.argsort(-np.abs(heads - base), axis=None, kind="stable")[:PATTERN_HEADS]
    patterns: tuple = ()
    captures: tuple = ()
    if not where.lean:  # the strongest heads' α, and every head's for the page: not on the long path
        on_clean, on_corrupt = model_attentions(loaded, first), model_attentions(loaded, second)  # (L, H, T, T)
        patterns = tuple((int(i // H), int(i % H), on_clean[i // H, i % H], on_corrupt[i // H, i % H])
                         for i in strongest)
        captures = (make_capture(loaded, first, on_clean, clean), make_capture(loaded, second, on_corrupt, corrupt))
    return Patching(
        model=loaded.name, clean=clean, corrupt=corrupt, tokens=tuple(first.tokens),
        corrupt_tokens=tuple(second.tokens), answer=names[0], other=names[1], direction=direction,
        clean_diff=clean_diff,
        corrupt_diff=corrupt_diff, heads=results["heads"].reshape(L, H), attention=results["attention"].reshape(L, A),
        residual=results["residual"].reshape(L, A),
        head_positions=results["head_positions"].reshape(L, H, A) if positions else None, all_patched=everything,
        patterns=patterns, causal=bool(loaded.causal), captures=captures,
        alignment=() if identity(pairs, len(first.tokens), len(second.tokens)) else tuple(pairs), listed=top,
        method=method, comparison=comparison, lean=where.lean)


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
