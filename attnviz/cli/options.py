"""An analysis's options dataclass (attnviz.base.options) as the command's options: each field one option named
--the-field-name with the field's default and help, its old spellings hidden aliases. attnviz.cli.inputs.takes
adds them to a command, and hands the command the dataclass."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
import typing
from typing import Annotated, Any, Optional

import typer

from attnviz.base.options import Flag, flag

KEYWORD = inspect.Parameter.KEYWORD_ONLY
ONE_INDEX = ("OneLayer", "OneHead")  # shared options of one index: the field gets the index (an int)


def spelled(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shared(flag_: Flag) -> Any:
    from attnviz.cli import params

    base = getattr(params, flag_.shared)
    kind, info = base.__origin__, copy.copy(base.__metadata__[0])
    info.help = flag_.help or info.help
    return Annotated[kind, info]


def _number(flag_: Flag, kind: type) -> dict:
    from attnviz.cli.params import finite_float, whole_number

    if flag_.click_range:
        return {"min": flag_.minimum, "max": flag_.maximum}
    if kind is int:
        return {"parser": whole_number(int(flag_.minimum if flag_.minimum is not None else -(10**9)),
                                       None if flag_.maximum is None else int(flag_.maximum))}
    return {"parser": finite_float(flag_.minimum if flag_.minimum is not None else float("-inf"))}


def _made(item: dataclasses.Field, hint: Any) -> tuple[Any, list[str], dict]:
    """(the type Typer reads, the option's spellings, the rest of typer.Option's arguments) of one field."""
    flag_ = flag(item)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    extra: dict = {"help": flag_.help, "show_default": flag_.show_default and item.default is not None}
    if flag_.metavar:
        extra["metavar"] = flag_.metavar
    if flag_.envvar:
        extra["envvar"] = flag_.envvar
    if flag_.folder:
        extra["file_okay"] = False
    names = [spelled(item.name), *flag_.names]
    if kind is bool:
        if flag_.negative:
            names = [f"{spelled(item.name)}/{flag_.negative}", *flag_.names]
        return (Optional[bool] if optional else bool), names, extra
    if kind in (int, float):
        extra.update(_number(flag_, kind))
    elif flag_.choices:
        from attnviz.cli.params import choice_parser

        extra["parser"] = choice_parser(flag_.choices, dict(flag_.aliases))
    return (Optional[kind] if optional else kind), names, extra


def _separated(kind: type, spelling: str) -> Any:
    """A parser of "1,2,3" into a list of `kind` (a list given, as a default is, kept)."""
    def parse(value: Any) -> list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if kind is str:  # names: the analysis says which it takes (an empty list too)
            return [part.strip() for part in str(value).split(",") if part.strip()]
        try:
            found = [kind(part) for part in str(value).split(",") if part.strip()]
        except ValueError:
            found = []
        if not found:
            raise typer.BadParameter(f"{str(value)[:40]!r}: give numbers separated by commas", param_hint=spelling)
        return found

    return parse


def annotation(item: dataclasses.Field, hint: Any) -> Any:
    """The Annotated type Typer reads for one options field."""
    if flag(item).shared:
        return _shared(flag(item))
    if flag(item).separated:  # shown as 1,2,3; read into a list
        extra = {"help": flag(item).help, "metavar": flag(item).metavar or None,
                 "parser": _separated({"int": int, "float": float, "str": str}[flag(item).separated],
                                      spelled(item.name)),
                 "show_default": ",".join(str(v) for v in item.default)
                 if isinstance(item.default, (list, tuple)) and item.default else False}
        return Annotated[Optional[str], typer.Option(spelled(item.name), **extra)]
    kind, names, extra = _made(item, hint)
    return Annotated[kind, typer.Option(*names, **extra)]


def hidden_name(field_name: str, n: int) -> str:
    return f"{field_name}__hidden{n}"


def parameters(cls: type) -> list[inspect.Parameter]:
    """The command line's parameters of an options dataclass: each field, then its hidden old spellings."""
    hints = typing.get_type_hints(cls)
    found: list[inspect.Parameter] = []
    for item in dataclasses.fields(cls):
        made = annotation(item, hints[item.name])
        found.append(inspect.Parameter(item.name, KEYWORD, default=item.default, annotation=made))
        for n, spelling in enumerate(flag(item).hidden):
            if flag(item).shared:
                base = _shared(flag(item))
                kind, info = base.__origin__, copy.copy(base.__metadata__[0])
                alias = typer.Option(spelling, hidden=True, parser=info.parser, metavar=info.metavar)
            else:
                kind, _, extra = _made(item, hints[item.name])
                alias = typer.Option(spelling, hidden=True, **{k: v for k, v in extra.items()
                                                               if k not in ("help", "show_default")})
            found.append(inspect.Parameter(hidden_name(item.name, n), KEYWORD, default=None,
                                           annotation=Annotated[Optional[kind], alias]))
        for n, spelling in enumerate(flag(item).switches):
            found.append(inspect.Parameter(switch_name(item.name, n), KEYWORD, default=False,
                                           annotation=Annotated[bool, typer.Option(spelling, hidden=True)]))
    return found


def switch_name(field_name: str, n: int) -> str:
    return f"{field_name}__switch{n}"


def collect(cls: type, kwargs: dict) -> Any:
    """The options dataclass from the command's keyword arguments (removing them): an old spelling given wins
    over the default, and an option given two ways that disagree is a usage error; a one-layer or one-head
    selection (OneLayer, OneHead) becomes that index."""
    from typer._click import globals as click_globals  # typer ≥ 0.29 carries its own click

    from attnviz.base.selection import Selection

    context = click_globals.get_current_context(silent=True)
    values, selections = {}, []
    for item in dataclasses.fields(cls):
        value = kwargs.pop(item.name)
        given = {}  # spelling -> value, of the ways this option was given on the command line
        source = context.get_parameter_source(item.name) if context is not None else None
        if getattr(source, "name", "") == "COMMANDLINE":
            given[flag(item).negative if value is False and flag(item).negative else spelled(item.name)] = value
        if isinstance(value, Selection):
            selections.append(value)  # checked against the model's config before its weights load
            if flag(item).shared in ONE_INDEX:  # one layer or head: its index
                value = value.one()
        for n, spelling in enumerate(flag(item).hidden):
            old = kwargs.pop(hidden_name(item.name, n), None)
            if old is not None:
                named = spelling.split("/")
                value = given[named[-1] if old is False and len(named) > 1 else named[0]] = old
        for n, (spelling, meaning) in enumerate(flag(item).switches.items()):
            if kwargs.pop(switch_name(item.name, n), False):
                value = given[spelling] = meaning
        if len({repr(v) for v in given.values()}) > 1:
            raise typer.BadParameter(f"given as {' and '.join(given)}, which disagree: give it once",
                                     param_hint=spelled(item.name))
        values[item.name] = value
    made = cls(**values)
    object.__setattr__(made, "_selections", tuple(selections))
    return made
