"""The `attnviz` command line: one module per group of commands, all on one Typer app."""

from attnviz.cli.common import app
from attnviz.cli import beyond, check, corpus, export, generate, learn, stats, view  # noqa: F401  (registers the commands)

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="attnviz")
