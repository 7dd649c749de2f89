"""The Typer app: every command listed in the order a newcomer needs it and loaded only when used, plain
metavars in help, every usage error one line on stderr (exit 2), --version.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any
from collections.abc import MutableMapping

import typer
from rich.text import Text
from typer._click import exceptions as click_errors  # typer ≥ 0.29 carries its own click
from typer.core import TyperCommand, TyperGroup

from attnviz._version import __version__
from attnviz.cli.output import error_line, out, say

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


# --- one-line usage errors ---------------------------------------------------------------------------


# name -> (the module of attnviz.cli that defines it, its line in `attnviz --help`), in the order a newcomer
# needs them. A command's module is imported only when that command runs (or its own --help is asked for), so
# the top-level help and every command start without importing the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "heatmap": ("views", "Draw α as a heatmap: PNG/SVG/PDF, or in the terminal (-t)."),
    "token": ("views", "One token in every layer and head: what it attends to, who attends to it."),
    "steps": ("scratch", "One head step by step: Q, K, Q·Kᵀ, ÷√d_k, mask, softmax → α, α·V."),
    "positions": ("scratch", "Shuffle the words, with and without position embeddings."),
    "compare": ("views", "Layers (or two models) side by side in the terminal."),
    "heads": ("stats", "A table of every head's statistics and pattern label."),
    "entropy": ("stats", "Mean attention entropy, layers × heads."),
    "rollout": ("stats", "Attention rollout: what reaches a token through all layers."),
    "norms": ("values", "Value-weighted norms: what each key actually moves (Kobayashi et al.)."),
    "sinks": ("values", "Attention sinks: tokens that soak up attention, and whether they move anything."),
    "contributions": ("attribution", "What each token contributes to each token's output (ALTI, value zeroing)."),
    "logit-attr": ("attribution", "Which heads write the predicted token: the logit split by head."),
    "lens": ("attribution", "What each layer predicts: the logit lens, layer by layer."),
    "why": ("attribution", "Why a head attends: its score split into query-side × key-side parts."),
    "faithfulness": ("faithfulness", "Which explanation to trust: every attribution erased, compared, randomised."),
    "ablate": ("ablation", "Remove heads: what changes in predictions, embeddings, later α."),
    "importance": ("ablation", "Every head removed alone, ranked, beside its gradient estimate."),
    "detect": ("ablation", "Induction and other heads found, then tested by removing them."),
    "patch": ("patching", "Activation patching: which heads carry the difference between two prompts."),
    "discover": ("discover", "Circuits found: every edge scored (EAP, EAP-IG), the circuit run for its faithfulness."),
    "circuits": ("mechanisms", "QK and OV circuits from the weights: copying heads and how heads compose."),
    "retrieval": ("mechanisms", "Retrieval heads: which heads copy a needle out of a haystack, and removing them."),
    "massive": ("mechanisms",
                "Massive activations: the few huge entries behind the sinks, and what removing them does."),
    "align": ("speech", "Word timings from a speech model's cross-attention (--audio), and which heads align."),
    "explain": ("stats", "What every column, label and term means."),
    "verify": ("scratch", "Recompute α from the model's weights and compare (exit 3 if not equal)."),
    "scaling": ("scratch", "Why divide by √d_k: the softmax with and without it."),
    "capture": ("capturing", "Save α and tokens as a .npz for --from."),
    "generate": ("generation", "A causal LM writes; its attention kept step by step."),
    "export": ("gallery", "Every head as an image, a grid, the data and an offline gallery."),
    "view": ("views", "An interactive page (one offline HTML file): head, model and matrix views."),
    "corpus": ("corpora", "Head statistics over many texts, batched; shards merged."),
    "cost": ("costs", "Time and memory against T: the full path beside the streamed one."),
    "serve": ("serve", "A live local app: type a sentence, every view redraws; the model loaded once."),
}


class LiteralHelpCommand(TyperCommand):
    """A command whose help is printed as it is written: Typer's Rich help would read `pip install
    "attnviz[ray]"` as markup and drop `[ray]`. The texts are escaped only while the help is drawn (the docs'
    reference reads them as they are)."""

    def format_help(self, ctx, formatter) -> None:
        from rich.markup import escape

        saved: list[tuple[Any, str | None]] = [(self, self.help)] + [(p, getattr(p, "help", None))
                                                                    for p in self.params]
        try:
            for holder, text in saved:
                if text:
                    holder.help = escape(text)
            super().format_help(ctx, formatter)
        finally:
            for holder, text in saved:
                holder.help = text


class AttnvizGroup(TyperGroup):
    """Typer's group, with commands listed in the order a newcomer needs them and loaded when used, plain
    metavars in help, and every usage error as one line on stderr (exit 2) that says what to do, like every
    other error."""

    _listing = False  # True while the top-level help lists the commands (their one line is enough)

    def list_commands(self, ctx):
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            if self._listing:
                return TyperCommand(name=name, short_help=COMMANDS[name][1], help=COMMANDS[name][1])
            self._load(COMMANDS[name][0])
        command = self.commands.get(name)
        if command is not None:  # built here, or by Typer when the module was imported before the group was made
            _plain_metavars(command)
            if type(command) is TyperCommand:
                command.__class__ = LiteralHelpCommand
            if name in COMMANDS:
                command.short_help = COMMANDS[name][1]
        return command

    def _load(self, module: str) -> None:
        """Import a command module (it registers its commands on `app`) and build the commands it added."""
        import importlib

        import typer.main

        importlib.import_module(f"attnviz.cli.{module}")
        for info in app.registered_commands:
            name = info.name or typer.main.get_command_name(info.callback.__name__)  # type: ignore[union-attr]
            if name in self.commands:
                continue
            self.commands[name] = typer.main.get_command_from_info(
                info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode)

    def load_all(self) -> MutableMapping:
        """Every command, built (for tests and tools that look at all of them)."""
        for name in self.list_commands(None):
            self.get_command(None, name)
        return self.commands

    def format_help(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx, args):
        try:
            return super().resolve_command(ctx, args)
        except click_errors.UsageError as exc:  # Typer suggests from the commands loaded so far: suggest from all
            if args and "Did you mean" not in exc.message:
                import difflib

                matches = difflib.get_close_matches(args[0], list(COMMANDS))
                if matches:
                    exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
                else:
                    exc.words = list(args)  # type: ignore[attr-defined]  # the words typed: a text, most likely
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # type: ignore[override]
        _plain_metavars(self)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:
            out.print(Text(exc.format_message()), highlight=False)
            sys.exit(0)
        except click_errors.ClickException as exc:
            error_line(_usage_message(exc))
            sys.exit(exc.exit_code)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _usage_message(exc) -> str:
    """A click usage error as one line that points the right way."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "attnviz"
    if message.startswith("Got unexpected extra argument"):
        return (f"{message.rstrip('.')}: put the text in quotes, e.g. {command} \"The cat sat on the mat\"")
    if message.startswith("No such command") and "Did you mean" not in message:
        words = list(getattr(exc, "words", None) or [message.split("'")[1] if "'" in message else ""])
        if words[0]:
            text = []
            while words and not words[0].startswith("-"):  # the text runs up to the first option
                text.append(words.pop(0))
            said = " ".join(text)
            quoted = f"'{said}'" if '"' in said else f'"{said}"'
            return (f"{message.rstrip('.')}; to look at a text, name a command first: "
                    f"attnviz heatmap {' '.join([quoted, *words])} (attnviz --help lists them)")
    return f"{message} (see '{command} --help')"


def _plain_metavars(command) -> None:
    """Help shows TEXT, N, FILE or nothing (for flags) instead of Typer's <str>, <bool>, <list[Path]>."""
    if not getattr(command, "_attnviz_help_option", False):
        make_help_option = command.get_help_option

        def get_help_option(ctx):
            option = make_help_option(ctx)
            if option is not None:
                option.metavar = ""
            return option

        command.get_help_option = get_help_option
        command._attnviz_help_option = True
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "argument":
            param.display_type_rich = lambda ctx: None  # the argument's name already says what it is
        if param.metavar is not None:
            continue
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        if getattr(param, "is_flag", False) or annotation is bool:
            param.metavar = ""
        elif annotation is int:
            param.metavar = "N"
        elif annotation is float:
            param.metavar = "NUMBER"
        elif "Path" in str(annotation):
            param.metavar = "FILE"
        else:
            param.metavar = "TEXT"


app = typer.Typer(cls=AttnvizGroup, help="See what a transformer's self-attention does: heatmaps, head statistics, "
                                          "and a from-scratch cross-check, from the command line.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["--help", "-h"]})


def version_callback(value: bool) -> None:
    if value:
        say(f"attnviz {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                       help="Show the version and exit.")] = False) -> None:
    """See what a transformer's self-attention does."""
