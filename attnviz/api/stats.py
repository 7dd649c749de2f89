"""Statistics read from a capture: the head table and attention rollout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.base.arguments import checked
from attnviz.api.capturing import Keep, capture as capture_text
from attnviz.base.blocks import sum_blocks
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.api.notebook import head_table, HeadTable, records_html
from attnviz.errors import SelectionError, arg
from attnviz.panels import Panel, rollout_panel, Scale, short_model, text_subtitle
from attnviz.render.png import panel_figure
from attnviz.base.selection import find_token
from attnviz.base.text import visible

__all__ = ["heads", "HeadTable", "rollout", "Rollout"]


@checked
def heads(source: Capture | str, **capture_options: Any) -> HeadTable:
    """The head statistics of a capture (or of a text, captured with `capture_options`): one record per layer
    and head, every registered metric and the pattern label."""
    whole = source if isinstance(source, Capture) else capture_text(source, **capture_options)
    return head_table(whole)


@dataclass(frozen=True)
class Rollout:
    """Attention rollout (Abnar & Zuidema 2020): how much each input token reaches token `token` through all
    layers, the residual stream counted as identity attention. `row` (T,) sums to 1; `matrix` (T, T) every
    token's row, or None for a streamed long input (only the rows its pass computed are kept)."""

    model: str
    tokens: tuple[str, ...]
    token: int
    row: np.ndarray
    matrix: np.ndarray | None
    capture: Capture

    def records(self) -> list[dict]:
        return [{"index": j, "token": t, "rollout": float(self.row[j])} for j, t in enumerate(self.tokens)]

    def to_dict(self) -> dict:
        """What `attnviz rollout --json` prints."""
        return {"model": self.model, "tokens": list(self.tokens), "token": self.token, "rollout": self.row,
                "matrix": self.matrix}

    def panel(self):
        """The rollout matrix as a panel; of a long input, the row summed over the capture's blocks; of a
        picture, the token's row over the patch grid, laid on the picture."""
        grid = self.capture.grid
        if grid is not None:
            start = self.capture.patch_start
            over = np.asarray(self.row[start:], np.float32).reshape(grid)  # (rows, cols)
            name = visible(self.tokens[self.token])
            return Panel(over, tuple(str(r) for r in range(grid[0])), tuple(str(c) for c in range(grid[1])), None,
                         Scale(0.0, max(float(over.max()), 1e-9), f"rolled-out attention into {name}"),
                         (f"{short_model(self.model)} · attention rollout into {name} over the patches",),
                         "attnviz_rollout", row_axis="patch row", col_axis="patch column",
                         picture=self.capture.image,
                         mark=divmod(self.token - start, grid[1]) if self.token >= start else None)
        if self.matrix is not None:
            return rollout_panel(self.capture, self.matrix)
        long = self.capture.long
        assert long is not None  # no matrix: a streamed long input
        pooled = sum_blocks(self.row, long.edges)[None, :].astype(np.float32)  # (1, P)
        return Panel(pooled, (visible(long.tokens[self.token]),), self.capture.tokens, None,
                     Scale(0.0, max(float(pooled.max()), 1e-9), "rolled-out attention (sum over the block)"),
                     (f"{short_model(self.model)} · rollout of token {self.token}, summed over "
                      f"{long.block}-token blocks",), "attnviz_rollout", row_axis="token", col_axis="input block")

    def figure(self, *, cmap: str = "viridis"):
        """The rollout as a picture, the input text under its title."""
        return panel_figure(self.panel(), cmap=cmap, subtitle=text_subtitle(self.capture))

    def _repr_html_(self) -> str:
        return records_html(self.records(), ["index", "token", "rollout"],
                            f"{self.model}: rollout for token {self.token}")


def _default_token(kinds, n: int, causal: bool) -> int:
    """[CLS]/the first start token for encoders, the last token for causal models."""
    starts = [i for i, kind in enumerate(kinds) if kind == "start"]
    return n - 1 if causal or not starts else starts[0]


@checked
def rollout(source: Capture | str, *, token: str | int | None = None, **capture_options: Any) -> Rollout:
    """Attention rollout of a capture (or of a text, captured with `capture_options`) for `token` (an index or
    a token's text; default [CLS]/the first start token for encoders, the last token for causal models)."""
    spec = None if token is None else str(token)
    if isinstance(source, Capture):
        capture = source
    else:
        keep = capture_options.pop("keep", None) or Keep()
        whole = capture_text(source, keep=Keep(keep.pool, keep.rows, keep.cols, keep.layers, spec, keep.pictures),
                             **capture_options)
        capture = whole.part("encoder") if isinstance(whole, Parts) else whole  # rollout follows self-attention
    long = capture.long
    if long is None:
        from attnviz.metrics import rollout as compute_rollout

        matrix = compute_rollout(capture)  # (T, T)
        i = (_default_token(capture.special_kind, capture.n_tokens, capture.causal) if spec is None
             else find_token(capture.tokens, spec))
        return Rollout(capture.model, tuple(capture.tokens), i, matrix[i], matrix, capture)
    i = (_default_token(long.special_kind, long.n_tokens, capture.causal) if spec is None
         else find_token(long.tokens, spec))
    if i not in long.rollout:
        stored = ", ".join(f"{t} {visible(long.tokens[t])}" for t in sorted(long.rollout))
        raise SelectionError(f"this long input was streamed with the rollout of token(s) {stored} only; run "
                             f"attnviz rollout TEXT {arg('token')} {i} to compute token {i}'s", "token")
    return Rollout(capture.model, tuple(long.tokens), i, long.rollout[i], None, capture)
