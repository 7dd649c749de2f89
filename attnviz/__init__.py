"""attnviz: see what a transformer's self-attention does, from the command line and from Python.

Data flows one way, and the packages show it:

    text -> engine/ (the torch side: loading, the one capture entry, streaming, generation,
                     encoder-decoders, the input-recording hooks; fromscratch/ recomputes α from the weights)
         -> Capture (capture.py) -> metrics (metrics.py) -> Panels (panels.py) -> renderers (render/)
         -> the public API (api.py) -> the command line (cli/)

Only engine/ imports torch and transformers, and only when a model is loaded. Importing attnviz imports
nothing heavy: the names below load on first use.

    import attnviz
    cap = attnviz.capture("The cat sat on the mat")     # the bundled MiniLM
    cap.heatmap(layer=0, head=2); cap.heads(); cap      # a Figure, a table, the viewer inline
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["Capture", "Parts", "AttnvizError", "HeadTable", "Reporter", "capture", "load_model", "ablate",
           "importance", "detect", "__version__"]

_HOMES = {"Capture": "attnviz.capture", "Parts": "attnviz.capture", "AttnvizError": "attnviz.errors",
          "HeadTable": "attnviz.api", "capture": "attnviz.api", "load_model": "attnviz.api",
          "Reporter": "attnviz.progress", "ablate": "attnviz.api", "importance": "attnviz.api",
          "detect": "attnviz.api"}

if TYPE_CHECKING:
    from attnviz.api import HeadTable, ablate, capture, detect, importance, load_model
    from attnviz.capture import Capture, Parts
    from attnviz.errors import AttnvizError
    from attnviz.progress import Reporter


def __getattr__(name: str):
    """The public names, imported when first used (PEP 562), so `import attnviz` and the CLI start fast."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """attnviz.capture is the function; the module of the same name (the Capture class and its file format)
    is imported as `from attnviz.capture import Capture`. Importing that module would otherwise bind it over
    the function on the package."""

    def __setattr__(self, name: str, value) -> None:
        if name == "capture" and isinstance(value, types.ModuleType):
            return  # still in sys.modules["attnviz.capture"], where `from attnviz.capture import …` finds it
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
