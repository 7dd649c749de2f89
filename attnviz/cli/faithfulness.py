"""attnviz faithfulness: which explanation of a prediction to trust, every attribution measured side by side."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import read_texts, Source, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import choice_parser, CsvOpt, ImageOut, JsonOpt, ModelOptions, whole_number

# Imports inside the command (the API, numpy, matplotlib) keep `attnviz --help` light.

from attnviz.api.attribution.faithfulness_methods import FAITHFULNESS



def methods_option(value: str) -> list[str]:
    """--methods a,b,c as a list; the names are checked by attnviz.faithfulness (a usage error naming the
    valid ones)."""
    return [m.strip() for m in value.split(",") if m.strip()]


@app.command(help="Which explanation to trust: every attribution of one prediction (α, rollout, attention flow, "
                  "ALTI, ALTI-Logit, value zeroing, gradient × input, integrated gradients, leave-one-out) put to "
                  "ERASER's tests: erase each method's top tokens (comprehensiveness) or keep only them "
                  "(sufficiency) and run the model again, in bins of 1 to 50 % of the tokens; agreement with "
                  "leave-one-out (Kendall's τ); random orders as the baseline to beat; and the sanity check of "
                  "randomising the model from the top block down (Adebayo et al. 2018). f: a causal LM's "
                  "probability of its next token (--target), an encoder's sentence-embedding cosine.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking("text"))
def faithfulness(methods: Annotated[Optional[str], typer.Option(
                     "--methods", metavar="NAMES", show_default=False,
                     help=f"Which methods, separated by commas: {FAITHFULNESS.help()}. Default: all that apply "
                          f"(alti-logit needs a causal LM).")] = None,
                 target: Annotated[Optional[str], typer.Option(
                     "--target", metavar="TOKEN", show_default=False,
                     help="A causal LM's token whose probability f is, as text (' Paris'). Default: the model's "
                          "own prediction.")] = None,
                 orders: Annotated[int, typer.Option(
                     "--orders", parser=whole_number(20, 10_000), metavar="N",
                     help="Random orders for the baseline (20 to 10,000).")] = 20,
                 steps: Annotated[int, typer.Option(
                     "--steps", parser=whole_number(1, 1000), metavar="N",
                     help="Integrated gradients' points (1 to 1,000); the completeness line says when more are "
                          "needed.")] = 20,
                 sanity: Annotated[int, typer.Option(
                     "--sanity", parser=whole_number(0, 1000), metavar="N",
                     help="Depths of the randomisation check, spread from the top block to the first (1: the "
                          "whole model at once, what the verdict reads; more draw the cascade; 0: skip it).")] = 1,
                 seed: Annotated[int, typer.Option(
                     "--seed", parser=whole_number(0, 2**32 - 1), metavar="N",
                     help="Seed of the random orders and of the randomised weights.")] = 0,
                 corpus: Annotated[Optional[str], typer.Option(
                     "--corpus", metavar="FILE", show_default=False,
                     help="Many texts instead of TEXT: a file with one per line, or JSON lines with a text field "
                          "(told apart by their first line; - reads standard input; at most 10,000 texts). Per "
                          "method the mean AOPC with a 95 % bootstrap interval (from 10 texts), whether its lead over "
                          "the next is significant (the paired test needs 6 texts or more) and which methods to "
                          "trust.")] = None,
                 engine: Annotated[str, typer.Option(parser=choice_parser(("local", "ray"), {}), metavar="ENGINE",
                                                     help="--corpus: local (this process) or ray (Ray Data, as "
                                                          "attnviz corpus: pip install \"attnviz[ray]\").")] = "local",
                 address: Annotated[Optional[str], typer.Option(
                     help="Ray: the cluster to join (ray://host:10001, or auto). Default: start a local Ray.",
                     show_default=False)] = None,
                 workers: Annotated[int, typer.Option(help="Ray: model replicas (actors), each loading the model "
                                                           "once (1 to 4,096).", parser=whole_number(1, 4096),
                                                      metavar="N")] = 2,
                 output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
                 *, model: ModelOptions, inp: Source) -> None:
    import attnviz
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    chosen = methods_option(methods) if methods is not None else None
    if (engine != "local" or address is not None) and corpus is None:
        raise typer.BadParameter("--engine and --address spread a --corpus; one text runs here",
                                 param_hint="--engine")
    if corpus is not None:
        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT (or --text-file) or --corpus, not both", param_hint="--corpus")
        from attnviz.api.attribution.faithfulness import MAX_CORPUS_TEXTS

        given = read_texts(corpus, MAX_CORPUS_TEXTS, "--corpus")
        loaded = model.spec() if engine == "ray" else model.later()
    else:
        given = inp.resolve()
        loaded = model.later_for(given)
    result = attnviz.faithfulness(given, model=loaded, methods=chosen, target=target,
                                  orders=orders, steps=steps, sanity=sanity, seed=seed, truncate=model.truncate,
                                  engine=engine, address=address, workers=workers,
                                  reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])
