"""The `attnviz` command line: one module per group of commands, all on one Typer app."""

from attnviz.cli.common import app
from attnviz.cli import corpus, export, generate, norms, stats, steps, verify, view  # noqa: F401  (registers the commands)

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="attnviz")
