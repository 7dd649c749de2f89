"""The cost command: time and memory of the full and the streamed path against T, measured."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import ImageOut, JsonOpt, ModelOptions, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


def _lengths(value: str | None) -> list[int] | None:
    if value is None:
        return None
    import re

    items = [v.strip() for v in str(value).split(",")]
    if not items or any(not re.fullmatch(r"[0-9]{1,7}", v) for v in items):
        raise typer.BadParameter(f"{value[:40]!r} is not a list of lengths; write e.g. 128,256,512",
                                 param_hint="--lengths")
    lengths = sorted({int(v) for v in items})
    if lengths[0] < 2:
        raise typer.BadParameter("a length is at least 2 tokens", param_hint="--lengths")
    return lengths


@app.command(help="What attention costs as the input grows, measured: time and peak memory of the full path (α "
                  "kept, L·H·T² weights) and the streamed path (blocks of query rows, as FlashAttention tiles it) "
                  "at T = 64, 128, … up to the model's maximum positions or --max-length, beside O(T²) and O(T). "
                  "-o draws both against T. The essays' n = 8192: -m smollm2 --max-length 8192 (slow).")
@cli_errors
@takes(model=ModelOptions)
def cost(lengths: Annotated[Optional[str], typer.Option(
             "--lengths", metavar="LENGTHS", show_default=False,
             help="The lengths to measure (default: powers of two from 64).")] = None,
         max_length: Annotated[int, typer.Option(
             "--max-length", parser=whole_number(2, 1_000_000), metavar="N",
             help="The longest input of the default lengths (also capped at the model's maximum "
                  "positions).")] = 2048,
         repeats: Annotated[int, typer.Option(parser=whole_number(1, 20), metavar="R",
                                              help="Runs per length and path; the fastest counts (1 to 20).")] = 1,
         output: ImageOut = None, as_json: JsonOpt = False, *, model: ModelOptions) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    chosen = _lengths(lengths)
    result = attnviz.cost(model=model.later(), lengths=chosen, max_length=max_length, repeats=repeats,
                          reporter=CliReporter())
    emit(result, as_json=as_json, files=[figure_file(output, result)])
