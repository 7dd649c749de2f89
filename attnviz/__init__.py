"""attnviz: see what a transformer's self-attention does, from the command line and from Python.

Data flows one way, and the packages show it:

    cli/, serve/   parse what was asked, call ONE api function, hand its result to one emitter
    api/           attnviz.<command>(...) -> a typed result that owns its output (to_dict, rows, report, figure)
    engine/        the torch side, the only one that imports torch and transformers
    metrics/, panels/, render/, data/, corpora/   numpy: statistics, what a picture shows, how it is drawn, the
                   Capture and its file format
    base/          what every layer uses: argument checks, files, records, selections, plain text

Importing attnviz imports nothing heavy: the public names (attnviz.api.PUBLIC, one table) load on first use.

    import attnviz
    cap = attnviz.capture("The cat sat on the mat")     # the bundled MiniLM
    attnviz.heatmap(cap, layer=0, head=2).figure()      # a matplotlib figure
    cap                                                  # in a notebook: the interactive viewer
"""

from __future__ import annotations

from attnviz._version import __version__
from attnviz.api import RENAMED as _RENAMED, __all__ as _PUBLIC, __getattr__ as _public
from attnviz.api import notebook as _notebook  # noqa: F401 (registers the views every Capture shows; no numpy)

__all__ = [*_PUBLIC, "__version__"]


def __getattr__(name: str):
    """The public names, imported when first used (PEP 562), so `import attnviz` and the CLI start fast; an old
    name works with a DeprecationWarning."""
    if name in _RENAMED:
        import warnings

        new, why = _RENAMED[name]
        warnings.warn(f"attnviz.{name} is now attnviz.{new} ({why}); the old name goes in a later release",
                      DeprecationWarning, stacklevel=2)
        return _public(new)
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    value = _public(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
