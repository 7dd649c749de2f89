"""lens: what each layer predicts (the logit lens, nostalgebraist 2020): every layer's residual stream read through
the final norm and the unembedding, at the chosen positions of a causal language model's text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.selection import selection
from attnviz.base.text import check_text, visible
from attnviz.base.tokens import vocabulary_label
from attnviz.errors import UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter

LENS_TOLERANCE = 1e-5  # the last row against the model's own probabilities: float32 logits, softmax in float64
MAX_TOP = 20


@dataclass(frozen=True)
class Lens(Result):
    """Each layer's prediction at `positions`: `top` (L + 1, P, k) token labels with `top_p` their
    probabilities; row 0 the embeddings, row n + 1 the stream after block n, the last row the model's own output
    (`model_diff`: its largest |p| difference from the model's distribution). `target_p` and `target_rank` (L + 1,
    P) when a target is given (rank 0: the most likely)."""

    command: ClassVar[str] = "lens"
    figure_name: ClassVar[str] = "attnviz_lens.png"
    model: str
    text: str
    tokens: tuple[str, ...]
    positions: tuple[int, ...]
    top: np.ndarray  # (L + 1, P, k) str
    top_p: np.ndarray  # (L + 1, P, k)
    target: str | None
    target_p: np.ndarray | None
    target_rank: np.ndarray | None
    model_diff: float

    @property
    def streams(self) -> list[str]:
        """Each row's name: the embeddings, then after block 0, 1, …"""
        return ["embeddings"] + [f"after block {n}" for n in range(self.top.shape[0] - 1)]

    def to_dict(self) -> dict:
        """What `attnviz lens --json` prints: one entry per layer and position."""
        layers = []
        for n, stream in enumerate(self.streams):
            for i, position in enumerate(self.positions):
                entry: dict[str, Any] = {
                    "layer": None if n == 0 else n - 1, "stream": stream, "position": position,
                    "token": self.tokens[position],
                    "top": [{"token": str(t), "p": float(p)} for t, p in zip(self.top[n, i], self.top_p[n, i])]}
                if self.target_p is not None and self.target_rank is not None:
                    entry["target_p"] = float(self.target_p[n, i])
                    entry["target_rank"] = int(self.target_rank[n, i])
                layers.append(entry)
        return {"model": self.model, "text": self.text, "tokens": list(self.tokens), "positions": list(self.positions),
                "target": self.target, "model_diff": self.model_diff, "layers": layers}

    def to_rows(self) -> list[dict]:
        """One row per layer, position and rank (CSV)."""
        rows = []
        for entry in self.to_dict()["layers"]:
            for rank, top in enumerate(entry["top"]):
                rows.append({"layer": entry["layer"], "stream": entry["stream"], "position": entry["position"],
                             "rank": rank, "token": top["token"], "p": top["p"],
                             **({"target_p": entry["target_p"], "target_rank": entry["target_rank"]}
                                if "target_p" in entry else {})})
        return rows

    def report(self, *, width: int = 100, **style: Any) -> list:
        from attnviz.render.tables import records_table

        one = len(self.positions) == 1
        fits = max(1, (width - 14) // 12)  # the columns a terminal this wide shows whole: the last positions
        rows, columns = [], [("stream", "stream", "")]
        for n in range(len(self.streams)):
            row: dict[str, Any] = {"stream": "embeddings" if n == 0 else str(n - 1)}
            if one:
                for k in range(min(3, self.top.shape[2])):
                    row[f"t{k}"] = f"'{visible(self.top[n, 0, k])}' {self.top_p[n, 0, k]:.2f}"
                if self.target_p is not None and self.target_rank is not None:
                    row["target_p"], row["target_rank"] = float(self.target_p[n, 0]), int(self.target_rank[n, 0])
            else:
                for i in range(max(0, len(self.positions) - fits), len(self.positions)):
                    row[f"p{i}"] = f"'{visible(self.top[n, i, 0])}' {self.top_p[n, i, 0]:.2f}"
            rows.append(row)
        if one:
            columns += [(f"t{k}", f"top {k + 1}", "") for k in range(min(3, self.top.shape[2]))]
            if self.target_p is not None:
                columns += [("target_p", f"p('{visible(self.target or '')}')", ".3f"), ("target_rank", "rank", "d")]
            where = f"position {self.positions[0]} ({visible(self.tokens[self.positions[0]])!r})"
        else:
            shown = list(enumerate(self.positions))[-fits:]
            columns += [(f"p{i}", f"{p}: {visible(self.tokens[p])}", "") for i, p in shown]
            where = (f"{len(self.positions)} positions, the top token of each" if len(shown) == len(self.positions)
                     else f"the last {len(shown)} of {len(self.positions)} positions (the figure and --json have "
                          f"all), the top token of each")
        title = f"{short_model(self.model)}: what each layer predicts next (the logit lens), {where}"
        return [records_table(rows, columns, title, caption="stream n: the residual stream after block n"),
                Line(f"Each row is the residual stream read through the final norm and the unembedding; the last "
                     f"is the model's own output (largest |Δp| against it: {self.model_diff:.1e}).", style="dim")]

    def figure(self, *, cmap: str = "viridis", ax=None):
        """Streams × positions, each cell its top token, coloured by its probability; with ax=, drawn there."""
        from attnviz.render.lens import lens_figure

        title = f"{short_model(self.model)}: what each layer predicts next (the logit lens)"
        return lens_figure(self.top[:, :, 0], self.top_p[:, :, 0], self.streams,
                           [f"{p}: {visible(self.tokens[p])}" for p in self.positions], title, cmap=cmap, ax=ax)


@borrows
@checked
def lens(text: str, *, model: Any = None, tokenizer: Any = None, target: str | int | None = None,
         positions: Any = -1, top: int = 5, truncate: bool = True, device: str = "auto", dtype: str = "float32",
         reporter: Reporter | None = None, run: Any = None) -> Lens:
    """The logit lens of a causal language model: at `positions` (an index, -1 the last; a list, a range, or
    "all"), each layer's residual stream read through the final norm and the unembedding: the `top` most likely
    next tokens (1 to 20) and, with `target` (a token's text, e.g. " Paris", or its id), its probability and rank
    per layer. The last row is the model's own output distribution (checked within LENS_TOLERANCE). (`run`: an
    attnviz.Run of this text, whose pass is read.)"""
    from attnviz.api.attribution.logits import check_spelling, target_id
    from attnviz.engine.attribution.lens import lens_points, logit_lens
    from attnviz.engine.forward import encode
    from attnviz.engine.memory import check_memory
    from attnviz.errors import InputError

    check_text(text)
    if not 1 <= top <= MAX_TOP:
        raise UsageError(f"{arg('top')} takes a whole number from 1 to {MAX_TOP}; got {top}", "top")
    chosen = selection(positions, "position", field="positions")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head=True)
    loaded.require_single("the logit lens")
    encoded = encode(loaded, text, truncate=truncate) if run is None else run.encoded
    T = len(encoded.tokens)
    at = chosen.indices(T)
    if not at:
        raise InputError(f"{arg('positions')} chose no position of the {T} tokens", "positions")
    target_index = target_id(loaded, target)
    check_memory(loaded, T, copies=2.0)
    from attnviz.engine.attribution.lens import CHUNK

    reporter = reporter or Reporter()
    with reporter.status("Running the model…"):
        recording = run.recording(lens_points(loaded.shape[0])) if run is not None else None
        if recording is None:
            from attnviz.engine.points import record

            recording = record(loaded.model, encoded.inputs, lens_points(loaded.shape[0]), attentions=False)
    steps = (loaded.shape[0] + 1) * -(-len(at) // CHUNK)
    with reporter.progress("Reading each layer through the unembedding", steps, "streams") as step:
        reading = logit_lens(loaded.model, encoded.inputs, list(at), target=target_index, k=top,
                             recording=recording, on_step=step)
    labels = np.vectorize(lambda i: vocabulary_label(loaded.tokenizer, int(i)), otypes=[object])(reading.top_ids)
    if target_index is not None and isinstance(target, str):
        check_spelling(loaded, target, target_index, reading.last_logits, "target")
    return Lens(model=loaded.name, text=text, tokens=tuple(encoded.tokens), positions=tuple(int(p) for p in at),
                top=labels, top_p=reading.top_p, target=None if target_index is None else
                loaded.tokenizer.decode([target_index]), target_p=reading.target_p, target_rank=reading.target_rank,
                model_diff=reading.model_diff)
