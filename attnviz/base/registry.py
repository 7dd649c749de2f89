"""Extension points, declared in one place (as simonw/llm's hookspecs.py does): the views a Capture shows.

A leaf: it imports nothing of attnviz. Lower layers look things up here, higher layers register them, so no
module below the renderers imports one above it. `attnviz/__init__.py` imports the notebook views
(`attnviz.api.notebook`), which register themselves, so a Capture anywhere in the package has its views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

VIEW_NAMES = ("html", "heatmap", "heads", "view", "from_outputs")
VIEWS: dict[str, Callable[..., Any]] = {}  # name -> function(capture, ...), registered by attnviz.api.notebook


def register_view(name: str, function: Callable[..., Any]) -> None:
    """Make `function(capture, ...)` the view `name` (one of VIEW_NAMES) of every Capture and Parts."""
    if name not in VIEW_NAMES:
        raise ValueError(f"unknown view {name!r}: one of {', '.join(VIEW_NAMES)}")
    VIEWS[name] = function


def view(name: str) -> Callable[..., Any]:
    """The registered view `name`."""
    try:
        return VIEWS[name]
    except KeyError:
        raise LookupError(f"no {name!r} view is registered: import attnviz (attnviz.api.notebook registers "
                          f"the views)") from None
