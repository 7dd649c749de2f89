"""What every command shares: the Typer app, option types, error handling, getting a Capture.
Library errors (AttnvizError) become one line on stderr and exit code 1; usage errors keep exit 2.
Heavy imports (torch, transformers, matplotlib) happen inside commands so `--help` stays quick."""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from attnviz import __version__
from attnviz.errors import AttnvizError, AttnvizWarning

app = typer.Typer(help="See what a transformer's self-attention does: heatmaps, head statistics, and a "
                       "from-scratch cross-check, from the command line.",
                  no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)

# --- shared options -----------------------------------------------------------------------------
TextArg = Annotated[Optional[str], typer.Argument(help="The text to look at.", show_default=False)]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Hugging Face id or local folder. Default: $ATTNVIZ_MODEL, else the bundled "
                          "'minilm' (sentence-transformers/all-MiniLM-L6-v2, works offline).")]
RevisionOpt = Annotated[Optional[str], typer.Option(help="Model revision (branch, tag or commit).")]
DeviceOpt = Annotated[str, typer.Option(help="auto (CUDA, then MPS, then CPU), cpu, cuda or mps.")]
DtypeOpt = Annotated[str, typer.Option(help="float32, float16 or bfloat16.")]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run the model repository's own code "
                                                                      "(only for repositories you trust).")]
TruncateOpt = Annotated[bool, typer.Option("--truncate/--no-truncate",
                                           help="Cut text longer than the model's maximum (with a warning), "
                                                "or refuse it.")]
FromOpt = Annotated[Optional[Path], typer.Option("--from", help="Read a saved capture (.npz) instead of running "
                                                                "a model.", dir_okay=False)]
LayerOpt = Annotated[str, typer.Option("--layer", "-l", help="Layer index (negative counts from the end) or "
                                                             "'all'. Default: the last layer.")]
HeadOpt = Annotated[str, typer.Option("--head", "-H", help="Head index, 'mean' or 'max' over the layer's heads.")]
HideOpt = Annotated[bool, typer.Option("--hide-special", help="Leave out [CLS], [SEP], <s> and other special "
                                                             "tokens (rows are not renormalised).")]
CmapOpt = Annotated[str, typer.Option(help="Matplotlib colormap name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the data as JSON on stdout instead of a table.")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="Print the data as CSV on stdout instead of a table.")]


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    label = "Warning" if issubclass(category, AttnvizWarning) else category.__name__
    err.print(f"[yellow]{label}:[/] {message}", highlight=False, soft_wrap=True)


def cli_errors(func):
    """Turn library errors into one line on stderr and exit 1; show warnings as one line each."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        previous = warnings.showwarning
        warnings.showwarning = _print_warning
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", AttnvizWarning)
                return func(*args, **kwargs)
        except AttnvizError as exc:
            err.print(f"[red]Error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err.print("[red]Interrupted.[/]")
            raise typer.Exit(130) from None
        finally:
            warnings.showwarning = previous

    return wrapper


def parse_layer(value: str) -> int | str:
    if value.strip().lower() == "all":
        return "all"
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a layer index or 'all'", param_hint="--layer") from None


def parse_head(value: str) -> int | str:
    if value.strip().lower() in ("mean", "max"):
        return value.strip().lower()
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a head index, 'mean' or 'max'", param_hint="--head") from None


def parse_indices(spec: str | None, n: int, what: str) -> list[int]:
    """"0,3,5", "0-2", "-1" or "all" -> sorted unique indices in range(n); SelectionError if out of range."""
    from attnviz.errors import SelectionError

    if spec is None or spec.strip().lower() == "all":
        return list(range(n))
    chosen: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else part[1:].split("-", 1)
                lo = -int(lo) if part.startswith("-") else int(lo)
                values = list(range(int(lo), int(hi) + 1))
            else:
                values = [int(part)]
        except ValueError:
            raise typer.BadParameter(f"{spec!r}: use indices and ranges like 0,3,5 or 0-2", param_hint=what) from None
        for v in values:
            if not -n <= v < n:
                raise SelectionError(f"{what} {v} is out of range: there are {n} ({what} 0..{n - 1})")
            chosen.append(v % n)
    return sorted(set(chosen))


def emit_records(records: list[dict], as_json: bool, as_csv: bool) -> bool:
    """Print records as JSON or CSV on stdout if asked; return whether it did."""
    if as_json:
        import json

        print(json.dumps(records, indent=2, ensure_ascii=False))
        return True
    if as_csv:
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(records[0]) if records else [], lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return True
    return False


def get_capture(text: str | None, source: Path | None, model: str | None, revision: str | None, device: str,
                dtype: str, trust_remote_code: bool, truncate: bool = True):
    """A Capture from --from, or by running the model on TEXT (with a spinner while it loads)."""
    from attnviz.capture import Capture

    if source is not None:
        if text:
            raise typer.BadParameter("give either TEXT or --from, not both")
        return Capture.load(source)
    if text is None:
        raise typer.BadParameter("give the TEXT to look at, or --from CAPTURE.npz")
    text = require_text(text)
    loaded = load_model(model, revision, device, dtype, trust_remote_code)
    from attnviz.model import capture_text

    with err.status("Running the model…"):
        return capture_text(text, loaded, truncate=truncate)


def require_text(text: str | None) -> str:
    """TEXT is required (usage error if missing) and must not be blank (InputError)."""
    if text is None:
        raise typer.BadParameter("give the TEXT to look at")
    from attnviz.model import check_text  # model.py imports torch only inside its functions

    return check_text(text)


def load_model(model, revision, device, dtype, trust_remote_code):
    with err.status("Loading the model…"):
        from attnviz.model import load

        return load(model, revision=revision, device=device, dtype=dtype, trust_remote_code=trust_remote_code)


def version_callback(value: bool) -> None:
    if value:
        out.print(f"attnviz {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                       help="Show the version and exit.")] = False) -> None:
    """See what a transformer's self-attention does."""


