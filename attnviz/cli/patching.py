"""Activation patching: attnviz patch CLEAN CORRUPT."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes, TextSource
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, whole_number

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
@takes(inp=TextSource)
def patch(corrupt: Annotated[Optional[str], typer.Argument(
              metavar="CORRUPT", help="The corrupted prompt: the clean one (TEXT, -, or --text-file) with one fact "
                                      "changed, as many tokens (or --align).", show_default=False)] = None,
          answers: Annotated[Optional[str], typer.Option(
              "--answers", metavar="A,B", show_default=False,
              help="The answer and the other, two tokens of the vocabulary as text (a word's leading space is "
                   "part of its token): ' Paris',' Rome'. Default: the clean and corrupted runs' top tokens.")]
          = None,
          noise: Annotated[bool, typer.Option(
              "--noise", help="Put the corrupted run's pieces into the clean run (what each takes away) instead of "
                              "the clean run's into the corrupted one (--denoise, the default).")] = False,
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
          page: Annotated[Optional[str], typer.Option(
              "--html", metavar="FILE", show_default=False,
              help="Write the interactive page to FILE (.html): the views of α on both prompts and the patching "
                   "panel (each head's map, each layer and position's; choose a head to see its α on both "
                   "prompts).")] = None,
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
          *, inp: TextSource) -> None:
    from attnviz.api import PATCH_TOLERANCE, patch as run_patch
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table, verdict
    from attnviz.base.text import shorten, visible

    check_output(output, FORMATS)
    check_output(page, (".html", ".htm"))
    pair = None
    if answers is not None:
        pair = _answers(answers)
    if inp.text_file is not None and corrupt is None:  # --text-file CLEAN: the one argument is CORRUPT
        inp, corrupt = dataclasses.replace(inp, text=None), inp.text
    if corrupt is None:
        raise typer.BadParameter("give the clean prompt and the corrupted one: attnviz patch CLEAN CORRUPT")
    if corrupt == "-":
        raise typer.BadParameter("CORRUPT is the prompt itself (standard input is for CLEAN, as -)")
    text = inp.require_text()
    loaded = inp.load(lm_head="auto")
    if senders is not None:
        if page is not None:
            raise typer.BadParameter("the page shows activation patching; path patching (--from-heads) prints "
                                     "its scores", param_hint="--html")
        _path(text, corrupt, loaded, senders, receivers, to, pair, noise, align, as_json, as_csv)
        return
    if receivers is not None:
        raise typer.BadParameter("--receivers is for path patching: give the senders with --from-heads",
                                 param_hint="--receivers")
    result = run_patch(text, corrupt, model=loaded, answers=pair, direction="noise" if noise else "denoise",
                       positions=positions, align=align, truncate=inp.truncate, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        L = result.heads.shape[0]
        rows = [{"rank": n + 1, "head": f"{r['layer']}.{r['head']}", "score": r["score"]}
                for n, r in enumerate(result.top(top))]
        columns = [("rank", "rank", "d"), ("head", "layer.head", ""), ("score", "restored", "+.3f")]
        out.print(records_table(rows, columns,
                                f"{short_model(result.model)}: "
                                + (f"{visible(result.answer)!r} against {visible(result.other)!r}" if result.answer
                                   else "the sentence embedding") + f", each head patched ({result.direction})"))
        say(f"{result.metric}: clean {result.clean_diff:+.3f}, corrupted {result.corrupt_diff:+.3f}; restored: "
            f"0 is the corrupted run, 1 the clean one", wrap=True)
        labels, pairs = result.labels(), result.pairs
        if result.alignment:
            shown = ", ".join(f"{i}:{k}" for i, k in pairs)
            say(f"Aligned {len(pairs)} position(s) of {len(result.tokens)} and {len(result.corrupt_tokens)} "
                f"(clean:corrupted): {shorten(shown, 300)}", wrap=True)
        for n in result.differs or (len(labels) - 1,):
            moves = [m for m in range(L) if result.residual[m, -1] > 0.5]
            later = (f"; at the last aligned position from layer {moves[0] if moves else '–'} on" if result.answer
                     else "")
            say(f"The residual stream at {labels[n]!r} (position {pairs[n][0]}) carries the difference up to "
                f"layer {_last_above(result.residual[:, n])}{later}.", wrap=True)
        if result.all_patched is None:
            say("The check (every head and MLP patched) does not apply: the prompts' last tokens differ"
                + (" or sit at different indices" if result.alignment else "") + ".", style="dim", wrap=True)
        else:
            out.print(verdict(result.passed, f"every head and MLP patched gives the donor's run: "
                                             f"{result.all_patched:.6f} (tolerance {PATCH_TOLERANCE:.0e} of the "
                                             f"metric)"))
        say("restored: (M patched − M corrupted) / (M clean − M corrupted), M the logit difference of the two "
            "answers at the last position (an encoder: the cosine of the sentence embedding with the clean run's); "
            "a head patched alone at every position.", wrap=True, style="dim")
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_patch.png")),
            console=err if as_json or as_csv else out)
    if page is not None:
        from attnviz.base.files import atomic_output, check_suffix

        written = result.html()
        where = check_suffix(output_path(page, "attnviz_patch.html"), (".html", ".htm"))
        with atomic_output(where) as tmp:
            tmp.write_text(written, encoding="utf-8")
        say(where, console=err if as_json or as_csv else out)
    if not result.passed:
        raise typer.Exit(3)


def _answers(value: str) -> tuple[str, str]:
    """--answers A,B: two texts, split at the comma that is not inside quotes; quotes keep a leading space."""
    import csv

    try:
        fields = next(csv.reader([value], quotechar="'", skipinitialspace=False))
    except (csv.Error, StopIteration):
        fields = []
    if len(fields) != 2 or not all(fields):
        raise typer.BadParameter(f"{value!r}: give two tokens, e.g. ' Paris',' Rome'", param_hint="--answers")
    return fields[0], fields[1]


def _last_above(column, level: float = 0.5) -> str:
    """The last layer where the value is above `level`, or –."""
    above = [n for n, v in enumerate(column) if v > level]
    return str(above[-1]) if above else "–"


def _path(text, corrupt, loaded, senders, receivers, to, pair, noise, align, as_json: bool, as_csv: bool) -> None:
    """patch --from-heads: path patching, a line for the path through every receiver and one per receiver."""
    from attnviz.api import path_patch
    from attnviz.panels import short_model
    from attnviz.render.tables import records_table
    from attnviz.base.text import visible

    result = path_patch(text, corrupt, senders=senders, receivers=receivers or (), to=to, model=loaded,
                        answers=pair, direction="noise" if noise else "denoise", align=align)
    if as_json:
        print_json(result.to_dict())
        return
    if emit_records(result.records(), False, as_csv):
        return
    sent = ",".join(f"{n}.{h}" for n, h in result.senders)
    say(f"{short_model(result.model)}: path patching ({result.direction}) from {sent} into "
        f"{len(result.receivers)} receiver(s) through {', '.join(result.to)}: restored {result.score:+.3f} of "
        f"{visible(result.answer)!r} against {visible(result.other)!r} (0 is the corrupted run, 1 the clean one)",
        wrap=True)
    if result.receivers:
        rows = [{"head": f"{n}.{h}", "score": s} for (n, h), s in zip(result.receivers, result.by_receiver)]
        out.print(records_table(rows, [("head", "receiver", ""), ("score", "restored through it alone", "+.3f")],
                                "each receiver alone"))

