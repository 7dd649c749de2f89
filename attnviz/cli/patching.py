"""Activation patching: attnviz patch CLEAN CORRUPT (and path patching, --from-heads)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.api.patching.methods import PATCHING
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes, two_prompts
from attnviz.cli.output import check_output, emit, figure_file, page_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, answer_pair, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="Which heads carry the difference between two prompts (activation patching, Meng et al. 2022, "
                  "Wang et al. 2022): CLEAN and CORRUPT, of the same number of tokens (else aligned with --align), "
                  "differ in one fact; each "
                  "head's output, and each layer's attention output and residual stream at each position, is "
                  "put from the clean run into the corrupted one alone (--noise: the other way), and the logit "
                  "difference of two answers at the last position says how much comes back: 0 is the "
                  "corrupted run, 1 the clean one (an encoder: the cosine of its sentence embedding with the "
                  "clean run's). Batched. Checked: every head and MLP patched gives the donor's run.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def patch(corrupt: Annotated[Optional[str], typer.Argument(
              metavar="CORRUPT", help="The corrupted prompt: the clean one (TEXT, -, or --text-file) with one fact "
                                      "changed, as many tokens (or --align).", show_default=False)] = None,
          answers: Annotated[Optional[str], typer.Option(
              "--answers", metavar="A,B", show_default=False,
              help="The answer and the other, two tokens of the vocabulary as text (a word's leading space is "
                   "part of its token): ' Paris',' Rome'. Default: the clean and corrupted runs' top tokens.")]
          = None,
          noise: Annotated[bool, typer.Option(
              "--noise/--denoise", help="--noise: put the corrupted run's pieces into the clean run (what each takes "
                                        "away); --denoise (the default): the clean run's into the corrupted one.")]
          = False,
          positions: Annotated[bool, typer.Option(
              "--positions", help="Also patch each head at each position alone (layers × heads × positions "
                                  "patches; --json holds them).")] = False,
          align: Annotated[Optional[str], typer.Option(
              "--align", metavar="auto|PAIRS", show_default=False,
              help="For prompts of different lengths: which positions are patched with which. auto: the tokens "
                   "both share, in order, and a changed span by its last token; or pairs CLEAN:CORRUPT (0:0,1:1,"
                   "3-4:2-3). Positions left out are not patched.")] = None,
          top: Annotated[int, typer.Option("--top", parser=whole_number(1, 100), metavar="K",
                                           help="How many heads to list (1 to 100).")] = 10,
          senders: Annotated[Optional[str], typer.Option(
              "--from-heads", metavar="HEADS", show_default=False,
              help="Path patching (Wang et al. 2022): these heads (layer.head, e.g. 9.6,9.9) patched from the donor "
                   "run, reaching only the --receivers through their --to inputs, every other head frozen.")] = None,
          receivers: Annotated[Optional[str], typer.Option(
              "--receivers", metavar="HEADS", show_default=False,
              help="--from-heads: the receiving heads, of later layers (e.g. 10.0,10.7); each is also measured "
                   "alone.")] = None,
          to: Annotated[str, typer.Option(
              "--to", metavar="INPUTS", help="--from-heads: the receivers' inputs the path goes through: q, k, v or "
                                             "together (qk, qkv).")] = "qkv",
          method: Annotated[str, typer.Option(
              "--method", metavar="|".join(PATCHING.names()), help=PATCHING.help() + ".")] = "exact",
          compare: Annotated[bool, typer.Option(
              "--compare", help="Both exact patching and the estimate (AtP, or --method's) for every head: Pearson's "
                                "r, the heads where they disagree most, and (with -o) both grids and their "
                                "scatter.")] = False,
          page: Annotated[Optional[str], typer.Option(
              "--html", metavar="FILE", show_default=False,
              help="Write the interactive page to FILE (.html): the views of α on both prompts and the patching "
                   "panel (each head's map, each layer and position's; choose a head to see its α on both "
                   "prompts).")] = None,
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
          *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    check_output(page, (".html", ".htm"))
    pair = None if answers is None else answer_pair(answers)
    if senders is not None and page is not None:
        raise typer.BadParameter("the page shows activation patching; path patching (--from-heads) prints its "
                                 "scores", param_hint="--html")
    clean, corrupt = two_prompts(inp, corrupt, "attnviz patch CLEAN CORRUPT")
    result = attnviz.patch(clean, corrupt, model=model.later_for(clean), answers=pair,
                           direction="noise" if noise else "denoise", positions=positions, align=align, top=top,
                           senders=senders, receivers=receivers or (), to=to, method=method, compare=compare,
                           truncate=model.truncate,
                           reporter=inp.options()["reporter"])
    files = [] if senders is not None else [figure_file(output, result), page_file(page, result)]
    emit(result, as_json=as_json, as_csv=as_csv, files=files)
