"""Retrieval heads (Wu et al. 2024): attnviz retrieval."""

from __future__ import annotations

from typing import Annotated

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


def _numbers(value: str, kind: type, name: str) -> list:
    try:
        found = [kind(part) for part in value.split(",") if part.strip()]
    except ValueError:
        found = []
    if not found:
        raise typer.BadParameter(f"{value!r}: give numbers separated by commas", param_hint=name)
    return found


@app.command(help="Retrieval heads (Wu et al. 2024): needle-in-a-haystack prompts made by attnviz (a secret number "
                  "among plain sentences, then the question), the model's answer written token by token, and each "
                  "head's share of the needle it copies (its most-attended key in the needle, holding the token "
                  "just written), over the prompts answered correctly. The causal test: the top heads removed "
                  "against as many random heads, by the answer tokens still predicted. A causal LM (-m gemma3).")
@cli_errors
@takes(inp=ModelOptions)
def retrieval(lengths: Annotated[str, typer.Option(
                  "--lengths", metavar="N,N",
                  help="Prompt lengths in tokens, about (60 to 16,384).")] = "300,600,1200",
              depths: Annotated[str, typer.Option(
                  "--depths", metavar="D,D",
                  help="Where the needle sits: 0 at the start, 1 at the end.")] = "0.1,0.5,0.9",
              remove: Annotated[int, typer.Option(
                  "--remove", parser=whole_number(0, 1000), metavar="K",
                  help="The causal test removes the K top heads (0: no test).")] = 10,
              draws: Annotated[int, typer.Option(
                  "--draws", parser=whole_number(0, 100), metavar="N",
                  help="…against N draws of K random heads.")] = 5,
              seed: Annotated[int, typer.Option(
                  "--seed", parser=whole_number(0, 2**32 - 1), metavar="N",
                  help="The random seed of the prompts and of the random heads.")] = 0,
              top: Annotated[int, typer.Option("--top", parser=whole_number(1, 100), metavar="K",
                                               help="How many heads to list.")] = 10,
              output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
              *, inp: ModelOptions) -> None:
    import numpy as np

    from attnviz.api import retrieval_heads
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table

    check_output(output, FORMATS)
    chosen_lengths = _numbers(lengths, int, "--lengths")
    chosen_depths = _numbers(depths, float, "--depths")
    loaded = inp.load(lm_head="auto")
    result = retrieval_heads(model=loaded, lengths=chosen_lengths, depths=chosen_depths, remove=remove, draws=draws,
                             seed=seed, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        prompts = [{"tokens": p["tokens"], "depth": p["depth"], "answer": p["answer"].strip(),
                    "response": p["response"].strip(), "ok": "yes" if p["retrieved"] else "no"}
                   for p in result.prompts]
        out.print(records_table(prompts, [("tokens", "tokens", "d"), ("depth", "needle at", ".0%"),
                                          ("answer", "answer", ""), ("response", "written", ""), ("ok", "right", "")],
                                f"{short_model(result.model)}: {len(result.prompts)} needles, {result.answered} found"))
        rows = [{"rank": n + 1, "head": f"{t['layer']}.{t['head']}", "score": t["score"]}
                for n, t in enumerate(result.top(top))]
        out.print(records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""),
                                       ("score", "retrieval score", ".3f")], "retrieval heads (Wu et al. 2024)"))
        say("retrieval score: per prompt answered correctly, the steps at which the head's most-attended key lies in "
            "the needle and holds the token just written, over the needle's length in tokens; averaged.",
            style="dim", wrap=True)
        causal = result.causal
        if causal is not None:
            random = [r["accuracy"] for r in causal["random"]]
            shown = (f"; {len(random)} random sets of {causal['heads']}: {np.mean(random):.0%} on average "
                     f"({min(random):.0%}–{max(random):.0%})") if random else ""
            say(f"Causal test, answer tokens still predicted over {causal['prompts']} prompts: nothing removed "
                f"{causal['none']['accuracy']:.0%}; the top {causal['heads']} heads removed "
                f"{causal['top']['accuracy']:.0%}{shown}.", wrap=True)
        elif not result.answered:
            say("The model answered no prompt correctly: no head can be scored (shorter --lengths?).", wrap=True)
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_retrieval.png")),
            console=err if as_json or as_csv else out)
