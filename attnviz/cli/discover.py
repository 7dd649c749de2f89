"""Circuits found, not guessed: attnviz discover CLEAN CORRUPT --answers A,B (or --pairs FILE)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.api.patching.methods import DISCOVERY
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes, two_prompts
from attnviz.cli.output import check_output, emit, figure_file, page_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, answer_pair, whole_number

# Imports inside the command (the API, numpy, matplotlib) keep `attnviz --help` light.


@app.command(help="Find the circuit behind the difference between two prompts (edge attribution patching: EAP, "
                  "Syed et al. 2023; EAP-IG, Hanna et al. 2024). Every edge of the residual graph — from the input, "
                  "each head and each MLP to every later head's query, key and value input, MLP and the logits — is "
                  "scored by (a clean − a corrupted) · ∂M/∂(the receiver's input), M the logit difference of the "
                  "two answers; then the circuits of the top edges are run, every other edge fed the corrupted "
                  "run's contribution, for the faithfulness curve (MIB): 0 the corrupted run, 1 the clean one. "
                  "CLEAN and CORRUPT have as many tokens; or --pairs, scores summed over them. Checked: every edge "
                  "kept gives the clean run, none the corrupted one (exit 3 if not). Needs a causal language model "
                  "(-m smollm2, qwen2.5-coder-0.5b, gemma3, a GPT-2 or Llama-style folder, …).")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def discover(corrupt: Annotated[Optional[str], typer.Argument(
                 metavar="CORRUPT", help="The corrupted prompt: the clean one (TEXT, -, or --text-file) with one fact "
                                         "changed, as many tokens.", show_default=False)] = None,
             answers: Annotated[Optional[str], typer.Option(
                 "--answers", metavar="A,B", show_default=False,
                 help="The answer and the other, two tokens of the vocabulary as text (a word's leading space is "
                      "part of its token): ' Paris',' Rome'.")] = None,
             pairs: Annotated[Optional[str], typer.Option(
                 "--pairs", metavar="FILE", show_default=False,
                 help="Many pairs instead: JSON lines of {\"clean\": …, \"corrupt\": …, \"answers\": [A, B]} (- reads "
                      "standard input; at most 1,000 pairs, 16 MB); the scores summed, the curve over all of them.")]
             = None,
             method: Annotated[str, typer.Option(
                 "--method", metavar="|".join(DISCOVERY.names()), help=DISCOVERY.help() + ".")] = "eap-ig",
             steps: Annotated[int, typer.Option("--steps", parser=whole_number(1, 100), metavar="N",
                                                help="eap-ig's interpolation steps (1 to 100).")] = 5,
             top: Annotated[int, typer.Option("--top", parser=whole_number(1, 1000), metavar="K",
                                              help="How many edges to list (1 to 1000); --json and --csv give "
                                                   "every edge.")] = 20,
             page: Annotated[Optional[str], typer.Option(
                 "--html", metavar="FILE", show_default=False,
                 help="Write a page (.html): the circuit and its curve, and every listed edge, searchable.")] = None,
             output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
             *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    check_output(page, (".html", ".htm"))
    model.require_causal("discover")  # said first: no other argument matters for an encoder
    if pairs is not None:
        if inp.text is not None or inp.text_file is not None or corrupt is not None or answers is not None:
            raise typer.BadParameter("give CLEAN CORRUPT --answers A,B, or --pairs FILE, not both",
                                     param_hint="--pairs")
        result = attnviz.discover(pairs=pairs, model=model.later_for(None), method=method, steps=steps, top=top,
                                  reporter=inp.options()["reporter"])
    else:
        clean, corrupt = two_prompts(inp, corrupt, "attnviz discover CLEAN CORRUPT --answers A,B (or --pairs FILE)")
        if answers is None:
            raise typer.BadParameter("give the two answers: --answers ' Paris',' Rome'", param_hint="--answers")
        result = attnviz.discover(clean, corrupt, answers=answer_pair(answers), model=model.later_for(clean),
                                  method=method, steps=steps, top=top, reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result), page_file(page, result)])
