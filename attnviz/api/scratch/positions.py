"""positions: what position embeddings do. The words shuffled and the model run on both orders, with and without
its position embeddings (self-attention alone sees a set); or a vision model's position embeddings over a
picture's grid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, overload

import numpy as np

from attnviz.api.models import borrows, for_input, resolve_model
from attnviz.api.result import Result
from attnviz.api.scratch.steps import one_index
from attnviz.base.arguments import checked
from attnviz.base.records import plain
from attnviz.base.text import check_text
from attnviz.errors import UsageError, arg
from attnviz.data.modality import PICTURE, of_input
from attnviz.data.picture import Picture, picture
from attnviz.panels import short_model
from attnviz.progress import Reporter

__all__ = ["positions", "Positions", "grid_positions", "GridPositions", "POSITION_TOLERANCE"]


@dataclass(frozen=True)
class Positions(Result):
    """The words shuffled, the model run on both orders with and without its position embeddings: without them
    α of the shuffled text is exactly the same permutation of α (self-attention alone sees a set).
    `result`: words, shuffled, tokens, permutation, diff_without / diff_with (per layer), similarity."""

    command: ClassVar[str] = "positions"
    model: str
    text: str
    result: Any  # attnviz.engine.scratch.positions.PositionsResult
    layer: int = -1  # the layer the figure shows

    @property
    def figure_name(self) -> str:
        return f"{self.page(self.layer).name}.png"

    def report(self, **style: Any) -> list:
        from attnviz.render.terminal import positions_renderable

        return [positions_renderable(self.result, self.model)]

    def to_dict(self) -> dict:
        """What `attnviz positions --json` prints."""
        r = self.result
        return plain({"model": self.model, "words": r.words, "shuffled": r.shuffled, "tokens": r.tokens,
                      "permutation": r.permutation,
                      "without_positions": {"max_abs_diff": float(r.diff_without.max()), "per_layer": r.diff_without},
                      "with_positions": {"max_abs_diff": float(r.diff_with.max()), "per_layer": r.diff_with},
                      "position_similarity": r.similarity})

    def page(self, layer: int | None = None):
        from attnviz.panels import positions_page

        chosen = self.layer if layer is None else layer
        return positions_page(self.result, self.model, one_index(chosen, len(self.result.diff_with), "layer"),
                              self.text)

    def figure(self, layer: int | None = None, *, cmap: str = "viridis", ax=None):
        """α of `layer` (default the one asked for) for both word orders, with and without positions."""
        from attnviz.render.png import mixed_figure

        return mixed_figure(self.page(layer), cmap=cmap, ax=ax)


POSITION_TOLERANCE = 1e-5  # of the embedding layer's output: the same float32 sum, taken apart


@dataclass(frozen=True)
class GridPositions(Result):
    """A vision model's position embeddings over a picture's grid of cells (ViT's patches), as the model adds
    them (its table interpolated to the grid): `similarity` (N, N) the cosine similarity of each cell's position
    to each other's, N = rows × cols; `check` how far they are from what the model's own embedding layer added
    (its output less the patch projection), over that output's size (`passed` within POSITION_TOLERANCE)."""

    command: ClassVar[str] = "positions"
    model: str
    name: str
    grid: tuple[int, int]
    similarity: np.ndarray  # (N, N)
    check: float

    figure_name: ClassVar[str] = "attnviz_grid_positions.png"

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import records_table, verdict

        rows, cols = self.grid
        return [records_table(self.records()[:12], [("distance", "distance (patches)", "d"),
                                                    ("similarity", "mean similarity", ".3f"), ("pairs", "pairs", "d")],
                              f"{short_model(self.model)}: position embeddings over {rows} × {cols} patches, by "
                              f"distance on the grid"),
                verdict(self.passed, f"they are what the model's embedding layer adds to the patches, within "
                                     f"{self.check:.1e} of its output (tolerance {POSITION_TOLERANCE:.0e})")]

    @property
    def exit_code(self) -> int:
        return 0

    @property
    def passed(self) -> bool:
        return self.check <= POSITION_TOLERANCE

    def records(self) -> list[dict]:
        """The mean similarity of two cells' positions by their distance on the grid (in cells, rounded)."""
        rows, cols = self.grid
        r, c = np.divmod(np.arange(rows * cols), cols)
        distance = np.rint(np.hypot(r[:, None] - r[None], c[:, None] - c[None])).astype(int)  # (N, N)
        return [{"distance": int(d), "similarity": float(self.similarity[distance == d].mean()),
                 "pairs": int((distance == d).sum())} for d in np.unique(distance)]

    def to_dict(self) -> dict:
        """What `attnviz positions --image --json` prints."""
        return plain({"model": self.model, "image": self.name, "grid": list(self.grid), "check": self.check,
                      "passed": self.passed, "by_distance": self.records(), "similarity": self.similarity})

    def figure(self, *, ax=None):
        """For each cell, at its place in the grid, the similarity of its position embedding to every cell's."""
        from attnviz.render.charts import position_mosaic_figure

        rows, cols = self.grid
        return position_mosaic_figure(self.similarity, self.grid,
                                      f"{short_model(self.model)} · position embeddings over {rows} × {cols} "
                                      f"patches",
                                      f"{self.name}: each small map, the similarity of that patch's position to "
                                      f"every patch's", ax=ax)


@borrows
@checked
def grid_positions(image: Any, *, model: Any = "dinov2", size: int | None = None, device: str = "auto",
                   dtype: str = "float32") -> GridPositions:
    """The position embeddings a vision model adds to the cells of a picture's grid (its table interpolated to the
    grid, as its forward pass does), and how similar each cell's position is to each other: the 2-D structure the
    model learned. Checked against what the model's own embedding layer adds."""
    chosen = picture(image, size=size)
    loaded = resolve_model(model, None, device=device, dtype=dtype)
    from attnviz.engine.vision import grid_positions as positions_of

    table, check, grid = positions_of(loaded, chosen)
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    return GridPositions(loaded.name, chosen.name, grid, unit @ unit.T, check)


@overload
def positions(text: str, *, model: Any = None, tokenizer: Any = None, seed: int = 0, layer: int = -1,
              device: str = "auto", dtype: str = "float32",
              reporter: Reporter | None = None) -> Positions: ...


@overload
def positions(text: Picture, *, model: Any = None, tokenizer: Any = None, seed: int = 0, layer: int = -1,
              device: str = "auto", dtype: str = "float32",
              reporter: Reporter | None = None) -> GridPositions: ...


@borrows
@checked
def positions(text: str | Picture, *, model: Any = None, tokenizer: Any = None, seed: int = 0, layer: int = -1,
              device: str = "auto", dtype: str = "float32",
              reporter: Reporter | None = None) -> Positions | GridPositions:
    """Shuffle the words (seeded) and run the model on both orders, with its position embeddings and with them
    zeroed (encoder models, BERT-like; `layer` the one the figure shows). Of a picture (attnviz.picture()): its
    vision model's position embeddings over the picture's grid (grid_positions)."""
    if of_input(text) is PICTURE:
        return grid_positions(text, model=for_input(model, text), device=device, dtype=dtype)
    assert isinstance(text, str)  # a picture went to grid_positions above
    check_text(text)
    if not 0 <= seed < 2**32:
        raise UsageError(f"{arg('seed')} takes a whole number from 0 to 4,294,967,295; got {seed}", "seed")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    loaded.require_single("positions")
    from attnviz.engine.scratch.positions import positions_experiment

    with (reporter or Reporter()).status("Running the model on both word orders, with and without positions…"):
        result = positions_experiment(loaded, text, seed=seed)
    one_index(layer, len(result.diff_with), "layer")
    return Positions(loaded.name, text, result, layer)
