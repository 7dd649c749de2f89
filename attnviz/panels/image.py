"""What attention over a picture shows: one query's row of α (the [CLS] token's, or one patch's) laid over the
picture as the patch grid it is, one panel per layer and head (DINO's figure)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import SelectionError, arg
from attnviz.panels.names import head_filename, head_label, short_model
from attnviz.panels.page import HeadChoice, Page, Panel, Scale


def query_of(capture: Capture, patch: tuple[int, int] | None) -> tuple[int | None, str]:
    """(the query row, its name): the patch (row, col) asked for, else [CLS], else None (a model without one:
    the mean over the patches' rows)."""
    grid = capture.grid
    if grid is None:
        raise SelectionError(f"this capture is of text: the picture's views need a capture of a picture "
                             f"({arg('image')})", "image")
    if patch is not None:
        r, c = patch
        if not (0 <= r < grid[0] and 0 <= c < grid[1]):
            raise SelectionError(f"{arg('patch')} {r},{c} is outside the grid of {grid[0]} × {grid[1]} patches "
                                 f"(rows 0..{grid[0] - 1}, columns 0..{grid[1] - 1})", "patch")
        return capture.grid_start + r * grid[1] + c, f"p({r},{c})"
    if capture.grid_start > 0:
        return 0, capture.tokens[0]
    return None, "the patches (mean of their rows)"


def image_page(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice],
               patch: tuple[int, int] | None = None) -> Page:
    """A panel per layer and head: where the query looks among the patches, over the picture; each panel on its
    own scale from 0 to its largest weight (heads differ by orders of magnitude)."""
    query, name = query_of(capture, patch)
    rows, cols = capture.grid or (0, 0)
    start = capture.grid_start
    panels = []
    for layer in layers:
        for head in heads:
            alpha = capture.head_matrix(layer, head)  # (T, T)
            row = alpha[query] if query is not None else alpha[start:].mean(axis=0)
            grid = np.asarray(row[start:], np.float32).reshape(rows, cols)  # (rows, cols)
            top = max(float(grid.max()), 1e-9)
            label = head_label(head, capture.n_heads)
            panels.append(Panel(
                matrix=grid, rows=tuple(str(r) for r in range(rows)), cols=tuple(str(c) for c in range(cols)),
                hidden=None, scale=Scale(0.0, top, f"α from {name}", shared=False),
                title=(f"{short_model(capture.model)} · layer {layer} · {label}: where {name} looks",),
                name=f"attnviz_image_{head_filename(layer, head)}", short=f"layer {layer}, {label}", layer=layer,
                head=head, row_axis="patch row", col_axis="patch column", picture=capture.image,
                mark=patch))
    title = (panels[0].title_text if len(panels) == 1 else
             f"{short_model(capture.model)} · where {name} looks among the {rows} × {cols} patches")
    before = ", ".join(capture.tokens[:start])
    notes = (f"a cell per patch of {capture.meta.get('image_patch')} × {capture.meta.get('image_patch')} pixels, "
             f"coloured by α from {name}, each panel to its own largest weight"
             + (f"; the rest of the row is on {before}" if start else ""),)
    return Page(panels=tuple(panels), title=title, name=panels[0].name if len(panels) == 1 else "attnviz_image",
                notes=notes, subtitle=str(capture.meta.get("image_name", "")))

