"""The arguments of every public function, checked against its annotations before it runs. Pure Python.

    @checked
    def sinks(text: str, *, threshold: float = 0.3, reporter: Reporter | None = None) -> Sinks: ...

    sinks("…", threshold="x")   ->  UsageError: threshold takes a number; got str 'x'
    sinks("…", threshold=nan)   ->  UsageError: threshold takes a finite number; got float nan

What is checked: bool, int (not a bool), float (a finite real number; an int is one), str, bytes, None,
unions of these (`X | None`), Literal values, classes (isinstance), os.PathLike, and sequences of one of
these (`Sequence[int]`, `list[int]`: a list or a tuple, never a str). `Any` and names the annotation cannot
resolve are left to the function. Ranges (a layer beyond the model, a negative count) stay the function's
own checks: they need the model or the data. Each error names the argument as the caller spells it
(errors.arg)."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from attnviz.errors import UsageError, arg

F = TypeVar("F", bound=Callable[..., Any])


def checked(function: F) -> F:
    """Check each argument given to `function` against its annotation; a UsageError naming it otherwise (a
    malformed argument: exit 2 on the command line)."""
    signature = inspect.signature(function)
    hints: dict[str, Any] | None = None

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        nonlocal hints
        if hints is None:  # resolved on the first call: the annotations' names are all defined by then
            hints = _resolved_hints(function, signature)
        bound = signature.bind(*args, **kwargs)  # a call of the wrong shape is Python's own TypeError
        for name, value in bound.arguments.items():
            expected = hints.get(name)
            if expected is None or signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                continue
            problem = _mismatch(value, expected)
            if problem is not None and problem.startswith("a string") and name == "text" \
                    and isinstance(value, (list, tuple)):
                problem = "one string, not a list; for many texts, attnviz.corpus"
            if problem is not None:
                raise UsageError(f"{arg(name)} takes {problem}; got {_shown(value)}", name)
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _resolved_hints(function: Callable, signature: inspect.Signature) -> dict[str, Any]:
    """Each parameter's annotation as a type; one that names what cannot be imported here is skipped."""
    hints: dict[str, Any] = {}
    space = {**vars(typing), **getattr(function, "__globals__", {})}
    for name, parameter in signature.parameters.items():
        annotation = parameter.annotation
        if annotation is inspect.Parameter.empty:
            continue
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, space)
            except Exception:  # a name only imported for type checkers
                continue
        hints[name] = annotation
    return hints


def _mismatch(value: Any, expected: Any) -> str | None:
    """None when `value` fits `expected`, else what `expected` takes, in words."""
    if expected is Any or expected is object:
        return None
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if any(_mismatch(value, option) is None for option in options):
            return None
        return " or ".join(dict.fromkeys(_mismatch(_NOTHING, option) or "" for option in options))
    if origin is typing.Literal:
        allowed = typing.get_args(expected)
        if any(type(value) is type(option) and value == option for option in allowed):
            return None
        return "one of " + ", ".join(repr(option) for option in allowed)
    if origin in (list, tuple, Sequence, typing.Sequence) or expected in (list, tuple):
        inner = typing.get_args(expected)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return "a list"
        if inner and inner[-1] is not Ellipsis and len(inner) == 1:
            for item in value:
                problem = _mismatch(item, inner[0])
                if problem is not None:
                    return f"a list of {_plural(problem)}"
        return None
    if origin is not None:  # another generic (dict[str, int], Iterable[str], …): its class only
        return None if isinstance(value, origin) else f"a {origin.__name__}"
    if expected is type(None):
        return None if value is None else "None"
    if expected is bool:
        return None if isinstance(value, bool) or type(value).__name__ == "bool_" else "True or False"
    if expected is int:
        return None if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and type(value).__name__ != "bool_" else "a whole number"
    if expected is float:
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or type(value).__name__ == "bool_":
            return "a number"
        return None if math.isfinite(float(value)) else "a finite number"
    if expected is str:
        return None if isinstance(value, str) else "a string"
    if expected is os.PathLike:
        return None if isinstance(value, os.PathLike) else "a path"
    if isinstance(expected, type):
        return None if isinstance(value, expected) else f"a {expected.__name__}"
    return None


class _Nothing:
    """A value that fits no annotation: asks _mismatch for what an option takes."""


_NOTHING = _Nothing()


def _plural(words: str) -> str:
    return {"a whole number": "whole numbers", "a number": "numbers", "a string": "strings",
            "a finite number": "finite numbers"}.get(words, words)


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "…"
    return f"{type(value).__name__} {text}"
