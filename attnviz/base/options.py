"""An analysis's options as one dataclass, each field with its help: what the command line's options are made from
(attnviz.cli.options), so that a flag and its Python keyword are the same word with the same default.

    @dataclass(frozen=True)
    class Options:
        top: int = option(10, "How many heads to list (1 to 100), by |effect|.", minimum=1, maximum=100,
                          metavar="K")

`flag(field)` gives a field's Flag. Nothing here imports the command line: how a Flag becomes an option there
(a whole number in range, a choice, a layer selection) is the command line's business.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    """How one option reads on the command line, beside its help.

    shared     one of the command line's shared options by name ("LayerSel", "HeadSel", "RowsOpt", "PartOpt",
               "SelfPartOpt"): its spellings and parsing, with this help
    names      more spellings beside --the-field-name (shown), e.g. ("--normalized",)
    hidden     old spellings that still work, not shown in --help: ("--desc",), or for a yes/no flag with a
               negative ("--desc/--asc",)
    negative   a yes/no option's "no" spelling ("--ascending"): the field is True, False or None (not given)
    minimum, maximum   a number's range (a whole number where the field is an int); `clamp` False: refused
               outside it naming the range (click's own check where `click_range`)
    choices, aliases   the words a text option takes, and other spellings of them
    """

    help: str
    shared: str = ""
    names: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    negative: str = ""
    metavar: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    show_default: bool = True
    click_range: bool = False
    separated: str = ""  # "int", "float" or "str": a comma-separated list (of numbers, or names)
    envvar: str = ""  # an environment variable that gives the value when the flag is not given
    folder: bool = False  # a path that must not be a file (a folder to write into)
    switches: dict[str, Any] = field(default_factory=dict)  # old yes-flags, hidden, each setting a value:
    # {"--noise": "noise"} for direction="noise"


def option(default: Any, help: str, **how: Any) -> Any:
    """A field of an analysis's options: its default (the Python keyword's and the flag's) and its help."""
    return field(default=default, metadata={"flag": Flag(help, **how)})


def flag(item: dataclasses.Field) -> Flag:
    found = item.metadata.get("flag")
    if not isinstance(found, Flag):
        raise TypeError(f"option field {item.name!r} has no Flag (made with attnviz.base.options.option)")
    return found


def is_options(cls: type) -> bool:
    """A dataclass whose every field is an option()."""
    return dataclasses.is_dataclass(cls) and all(isinstance(f.metadata.get("flag"), Flag)
                                                 for f in dataclasses.fields(cls))


def as_keywords(options: Any) -> dict[str, Any]:
    """The options as the keyword arguments of the analysis's function (a shallow dict, values as they are)."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def renamed(**old_to_new: str) -> Any:
    """Decorator of an API function whose keywords took the command line's word: each old keyword still works, with a
    DeprecationWarning naming the new one; both given is a TypeError, as Python's own for a keyword given twice."""
    import functools
    import warnings

    def decorate(function: Any) -> Any:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = [(old, new) for old, new in old_to_new.items() if old in kwargs]
            for old, new in given:
                if new in kwargs:
                    raise TypeError(f"{function.__name__}() got {old}= and {new}=; {old} is the old name of {new}")
                kwargs[new] = kwargs.pop(old)
            if given:
                name = function.__name__
                warnings.warn(f"{name}({', '.join(f'{old}=…' for old, _ in given)}) is now "
                              f"{name}({', '.join(f'{new}=…' for _, new in given)}), as the command line says it; "
                              "the old names go in a later release", DeprecationWarning, stacklevel=2)
            return function(*args, **kwargs)

        return wrapper

    return decorate
