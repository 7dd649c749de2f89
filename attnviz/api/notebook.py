"""What a Capture shows in a notebook: the interactive viewer inline, a heatmap Figure, the head table, the
page written to a file. These need the renderers and the API, which sit above the Capture, so they register
themselves in attnviz.base.registry (imported by attnviz/__init__.py) rather than being imported from below.

Everything is imported inside the functions: `import attnviz` stays light (no numpy, no matplotlib).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnviz.base import registry


def inline_html(whole: Any) -> str:
    """The interactive viewer as one sandboxed frame: its own document (scripts, styles, data and the page's
    Content-Security-Policy inside), so several views in one notebook never share an id or a script. The page
    posts its height and a few lines beside the frame fit the frame to it (where the notebook runs them:
    Jupyter and VS Code do; elsewhere the frame keeps FRAME_HEIGHT_PX)."""
    from attnviz.render.viewer import framed, viewer_data, viewer_html

    return framed(viewer_html(viewer_data(whole, command="attnviz in a notebook")))


def heatmap_figure(whole: Any, layer: int = -1, head: int | str = "mean", *, cmap: str = "viridis",
                   hide_special: bool = False, vmax: float | None = None, ax=None):
    """α of one layer and head (an index, "mean" or "max") as a matplotlib Figure, or drawn on the axes `ax`
    (returned)."""
    from attnviz.render import png

    drawn = png.heatmap_figure(whole, whole.layer_index(layer), head, hide_special=hide_special, cmap=cmap,
                               vmax=vmax, ax=ax)
    return drawn if ax is not None else drawn.figure


def head_table(whole: Any):
    """The head statistics table (attnviz.heads of the capture)."""
    from attnviz.api.stats import heads

    return heads(whole)


def write_view(whole: Any, path: str | os.PathLike) -> Path:
    """The interactive page written to `path` (attnviz.view of the capture)."""
    from attnviz.api.views import view

    return view(whole, path)


def from_outputs(*args: Any, **kwargs: Any):
    """Capture.from_outputs, the spelling before attnviz.from_outputs: the same, with a DeprecationWarning."""
    import warnings

    from attnviz.api.capturing import from_outputs as made

    warnings.warn("Capture.from_outputs(…) is now attnviz.from_outputs(…); the old spelling goes in a later release",
                  DeprecationWarning, stacklevel=3)
    return made(*args, **kwargs)


for _name, _function in (("html", inline_html), ("heatmap", heatmap_figure), ("heads", head_table),
                         ("view", write_view), ("from_outputs", from_outputs)):
    registry.register_view(_name, _function)
