"""Method families as registries (inseq's FeatureAttribution registry is the model): faithfulness's attributions,
patching's methods, discovery's, contributions'. Each method is a class registered in its family under its name,
with a title (what the reports call it) and one line of help; the command line's choices and help, the API's
errors and the docs read the family, never a tuple of names kept beside an if/elif chain.

    FAITHFULNESS = Family("methods")

    @FAITHFULNESS.register
    class Attention(Method):
        name, title, help = "attention", "attention", "α of the last layer, the mean over heads"

Light: importing it (and a family's module) imports no numpy, so that --help can list the choices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Generic, TypeVar

from attnviz.base.text import visible
from attnviz.errors import UsageError, arg


class Method:
    """One method of a family: `name` (what --method takes), `title` (what reports call it), `help` (one line)."""

    name: ClassVar[str]
    title: ClassVar[str] = ""
    help: ClassVar[str] = ""


M = TypeVar("M", bound=type[Method])


class Family(Generic[M]):
    """The methods of one family, in the order registered. `field`: the argument that names them (for errors)."""

    def __init__(self, field: str = "method"):
        self.field = field
        self._methods: dict[str, M] = {}

    def register(self, cls: M) -> M:
        if cls.name in self._methods:
            raise ValueError(f"{cls.name!r} is registered twice")
        self._methods[cls.name] = cls
        return cls

    def names(self) -> tuple[str, ...]:
        return tuple(self._methods)

    def __iter__(self) -> Iterator[M]:
        return iter(self._methods.values())

    def __contains__(self, name: object) -> bool:
        return name in self._methods

    def get(self, name: str) -> M:
        """The method named `name`; a UsageError naming the argument and every choice otherwise."""
        found = self._methods.get(name) if isinstance(name, str) else None
        if found is None:
            raise UsageError(f"{arg(self.field)} takes one of {self.choices()}; got {visible(str(name))[:40]!r}",
                             self.field)
        return found

    def title(self, name: str) -> str:
        cls = self.get(name)
        return cls.title or cls.name

    def choices(self, separator: str = ", ") -> str:
        return separator.join(self._methods)

    def help(self) -> str:
        """Every method with its line of help: "exact: …; atp: …"."""
        return "; ".join(f"{cls.name}: {cls.help}" if cls.help else cls.name for cls in self._methods.values())
