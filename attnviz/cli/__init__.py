"""The `attnviz` command line: one module per group of commands, all on one Typer app."""

from attnviz.cli.group import app, AttnvizGroup, COMMANDS

__all__ = ["COMMANDS", "app", "command_group", "main"]


def command_group() -> AttnvizGroup:
    """The click group of every command, all of them loaded (each command module registers its commands on
    `app` when imported; the command line imports only the one it runs)."""
    import typer.main

    group = typer.main.get_command(app)
    assert isinstance(group, AttnvizGroup)
    group.load_all()
    return group


def main() -> None:
    """The `attnviz` program: the command, then the end of the process (attnviz.cli.ending: without Python's
    teardown of torch and transformers where that is safe)."""
    from attnviz.cli.ending import finish

    try:
        app(prog_name="attnviz")
    except SystemExit as done:
        finish(done.code)
    else:
        finish(0)
