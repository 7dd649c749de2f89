"""The command-line reference as Markdown, made from the Typer app itself (the docs site builds its page
from this, so it is never copied by hand): every command in the order `attnviz --help` lists them, its
help, its usage line and a table of its arguments and options."""

from __future__ import annotations

import html

from typer._click.core import Context  # typer ≥ 0.29 carries its own click

from attnviz.cli import command_group
from attnviz.cli.group import COMMANDS


def _cell(text: object) -> str:
    """Plain text made safe for one Markdown table cell."""
    return html.escape(" ".join(str(text).split()), quote=False).replace("|", "\\|")


def _takes(param) -> str:
    if param.param_type_name == "argument":
        return ""
    return "" if getattr(param, "is_flag", False) else f"`{param.metavar or 'TEXT'}`"


def _default(param) -> str:
    if param.param_type_name == "argument" or not getattr(param, "show_default", False):
        return ""
    if getattr(param, "is_flag", False) or param.default in (None, ""):
        return ""
    default = param.default
    if isinstance(default, (list, tuple)):
        default = ",".join(map(str, default))
    return f"`{_cell(default)}`"


def command_markdown(root: Context, name: str) -> str:
    command = root.command.get_command(root, name)  # type: ignore[attr-defined]
    ctx = Context(command, info_name=name, parent=root)
    usage = command.get_usage(ctx).removeprefix("Usage: ")
    lines = [f"## `attnviz {name}`", "", _cell(COMMANDS[name][1]) if name in COMMANDS else "", "",
             f"```\n{usage}\n```", "", html.escape(command.help or "", quote=False), "",
             "| argument or option | takes | what it does | default |", "|---|---|---|---|"]
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            names = f"`{param.metavar or param.name.upper()}`"
        else:
            names = ", ".join(f"`{o}`" for o in (*param.opts, *param.secondary_opts))
        lines.append(f"| {names} | {_takes(param)} | {_cell(param.help or '')} | {_default(param)} |")
    lines.append("| `--help`, `-h` |  | Show this message and exit. |  |")
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """The whole reference: one section per command."""
    group = command_group()
    root = Context(group, info_name="attnviz")
    intro = ["# Command-line reference", "",
             "Made from the command line itself when the docs are built; `attnviz COMMAND --help` says the same.",
             "Every command also takes `--help`; `attnviz --version` prints the version.", ""]
    return "\n".join(intro) + "\n" + "\n".join(command_markdown(root, name) for name in group.list_commands(root))


def _python(name: str) -> str:
    """How Python asks the analysis `name`, from the registry: a run's method, a model's, or a function."""
    from attnviz import analyses

    analysis = analyses.get(name)
    method = name.replace("-", "_")
    inputs = analysis.inputs
    if name == "capture":  # the run's capture itself, a property
        return "`run.capture`"
    called = f"{method}({', '.join(inputs)})"
    return {"run": f"`run.{called}`", "model": f"`model.{called}`"}.get(analysis.reads, f"`attnviz.{called}`")


def command_table() -> str:
    """The docs' table of commands (docs/commands.md, between its markers): each registered analysis in the order
    `attnviz --help` lists them, its line there, and how Python asks it (`run = attnviz.load(…).run(text)`)."""
    from attnviz import analyses

    rows = ["| command | what it does | in Python |", "|---|---|---|"]
    rows += [f"| `{name}` | {_cell(COMMANDS[name][1])} | {_python(name)} |" for name in analyses.available()]
    return "\n".join(rows) + "\n"
