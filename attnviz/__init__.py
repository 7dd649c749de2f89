"""attnviz: see what a transformer's self-attention does, from the command line and from Python.

Data flows one way, and the packages show it:

    text -> engine/ (the torch side: loading, the one capture entry, streaming, generation,
                     encoder-decoders, the input-recording hooks; scratch/ recomputes α from the weights)
         -> data/ (Capture, Parts, the .npz format) -> metrics -> panels -> render/
         -> api/ (the public API: the only door) -> cli/ (the command line, which calls only the API)

Only engine/ imports torch and transformers, and only when a model is loaded. Importing attnviz imports
nothing heavy: the public names (attnviz.api's) load on first use.

    import attnviz
    cap = attnviz.capture("The cat sat on the mat")     # the bundled MiniLM
    cap.heatmap(layer=0, head=2); cap.heads(); cap      # a Figure, a table, the viewer inline
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from attnviz.api import notebook as _display  # noqa: F401 (registers the views every Capture shows; imports no numpy)
from attnviz._version import __version__
from attnviz.api import __all__ as _PUBLIC  # the API's names (attnviz.api imports its modules lazily)

_ELSEWHERE = {"AttnvizError": "attnviz.errors", "AttnvizWarning": "attnviz.errors", "Reporter": "attnviz.progress"}

__all__ = [*_PUBLIC, *_ELSEWHERE, "__version__"]

if TYPE_CHECKING:
    from attnviz.api import *  # noqa: F403
    from attnviz.errors import AttnvizError, AttnvizWarning  # noqa: F401
    from attnviz.progress import Reporter  # noqa: F401


def __getattr__(name: str):
    """The public names, imported when first used (PEP 562), so `import attnviz` and the CLI start fast."""
    home = "attnviz.api" if name in _PUBLIC else _ELSEWHERE.get(name)
    if home is None:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
