"""Commands that check attention against the definition: verify, scaling."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from attnviz.base.text import visible
from attnviz.cli.output import check_output, err, out, output_path, print_json, say
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.params import finite_float, FromOpt, ImageOut, JsonOpt
from attnviz.cli.inputs import CliReporter, takes, TextInput, TextSource

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

MISMATCH_EXIT = 3


@app.command(help="Recompute α = softmax(Q·Kᵀ/√d_k) from the model's own weights and compare it with what the model "
                  'reports, per layer. Exit 0 within the tolerance, 3 outside it.')
@cli_errors
@takes(inp=TextInput)
def verify(tolerance: Annotated[Optional[float], typer.Option(
               parser=finite_float(0.0), show_default=False,
               help="Largest |Δα| that passes. Default 1e-5 in float32, 5e-3 in float16, 5e-2 in bfloat16.")] = None,
           norms: Annotated[bool, typer.Option(
               "--norms", help="Check the value-weighted norms instead: Σ_h Σ_j α_ij f_h(x_j) + b_O must equal the "
                               "attention block's own output.")] = False,
           source: FromOpt = None, as_json: JsonOpt = False, *, inp: TextInput) -> None:
    from attnviz.api import verify as run_verify

    if source is not None:
        from dataclasses import replace

        from attnviz.api import load_capture

        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT or --from, not both")
        saved = load_capture(source)
        again = str(saved.meta.get("model_source") or saved.model)  # how the capture's model loads again
        if inp.model is None:
            say(f"Model: {again} (named by the capture; --model chooses another)", console=err, style="dim")
        loaded = replace(inp, model=inp.model or again).load()
        result = run_verify(capture=saved, source=str(source), model=loaded, tolerance=tolerance,
                            reporter=CliReporter())
    else:
        text = inp.require_text()
        loaded = inp.load()
        inp.check_model_kind(loaded, None)
        if norms:
            loaded.require_single("verify --norms")
        result = run_verify(text, model=loaded, norms=norms, tolerance=tolerance, truncate=inp.truncate,
                            target=inp.target, max_new_tokens=inp.max_new_tokens, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    else:
        _show(result, loaded)
    if not result.passed:
        raise typer.Exit(MISMATCH_EXIT)


def _title(capture, loaded, what: str = "") -> str:
    shape = f"{capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} tokens"
    return f"{visible(loaded.name)} ({loaded.dtype}, {loaded.device}): {what}{shape}"


def _verdicts(result, titles: dict) -> None:
    """Each comparison's table and its verdict line."""
    from attnviz.render.tables import verdict, verify_table

    tolerance = result.tolerance
    for name, diffs in result.checks.items():
        out.print(verify_table(diffs, tolerance, titles[name]))
        w = result.worst(name)
        passed = w.max_abs <= tolerance
        out.print(verdict(passed, f"max |Δα| = {w.max_abs:.2e} (layer {w.layer}, head {w.worst_head}) "
                                  f"{'≤' if passed else '>'} tolerance {tolerance:g}"))


def _show(result, loaded) -> None:
    """The verification as tables, verdicts and what PASS or FAIL means."""
    ok, tolerance = result.passed, result.tolerance
    if result.kind == "norms":
        from attnviz.render.tables import norms_check_table, verdict

        check = result.norms
        title = f"{visible(result.model)}: Σ_h Σ_j α_ij f_h(x_j) + b_O against the block's output"
        out.print(norms_check_table(check.output_diff, tolerance, title, check.output_scale))
        out.print(verdict(ok, f"max |Δ| / max(1, largest |output|) = {result.max_rel_diff:.2e} "
                              f"{'≤' if ok else '>'} tolerance {tolerance:g} (max |Δ| = {result.max_abs_diff:.2e})"))
        say("PASS means: each head's attention-weighted value vectors, through its slice of W_O, add up to what the "
            "attention block itself outputs, so the norms ‖α_ij f_h(x_j)‖ are the true sizes of the parts."
            if ok else "FAIL means: the parts do not add up to the block's output; the norms would be wrong.",
            wrap=True)
    elif result.kind == "text":
        _verdicts(result, {"model_vs_scratch": _title(result.captures["model_vs_scratch"], loaded)})
        worst = result.worst("model_vs_scratch")
        if ok:
            say(f"PASS means: computing softmax(Q·Kᵀ/√d_k) ourselves, from this model's own weights, gives the "
                f"attention weights the model reports, for every layer and head, to within {tolerance:g}.", wrap=True)
        else:
            say(f"FAIL means: the textbook formula, applied to this model's weights, does not give the weights "
                f"the model reports (off by up to {worst.max_abs:.2e}); the model does something the formula "
                f"leaves out.", wrap=True)
    elif result.kind == "capture":
        saved = result.captures["saved_vs_model"]
        made = "generated step by step with the KV cache, " if saved.generated is not None else ""
        titles = {"saved_vs_model": f"the saved α ({made}{visible(str(result.source))}) against one forward pass: ",
                  "model_vs_scratch": "that forward pass against softmax(Q·Kᵀ/√d_k) from the weights: "}
        _verdicts(result, {name: _title(saved, loaded, what) for name, what in titles.items()})
        say("PASS means: the saved attention is what this model computes for these tokens in one pass, and that "
            "is the textbook formula applied to the model's own weights." if ok else
            "FAIL means: the saved attention is not what this model computes for these tokens (another model or "
            "revision, or a changed file), or the model does something the formula leaves out.", wrap=True)
    else:
        from attnviz.panels import PART_TITLES

        titles = {}
        for name in result.checks:
            part, what = name.split(": ")
            capture = result.captures.get(name) or result.captures[part]  # a speech model: all 1,500 positions
            titles[name] = (f"{visible(loaded.name)} ({loaded.dtype}, {loaded.device}) · {PART_TITLES[part]} · "
                            f"{what}: {capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} × "
                            f"{capture.n_keys}")
        _verdicts(result, titles)
        say("PASS means: in every part — the encoder's self-attention, the decoder's, and cross-attention from "
            "the target to the source — the formula applied to the model's own weights gives the weights the model "
            "reports" + (", and the saved capture holds them." if result.source is not None else ".") if ok else
            "FAIL means: in some part the weights differ (see which above): another model or revision, a changed "
            "file, or something the formula leaves out.", wrap=True)


def _dk_list(value) -> list[int]:
    """--dk 16,64,256: up to MAX_DK_VALUES whole numbers from 1 to MAX_DK."""
    from attnviz.api.scratch import MAX_DK, MAX_DK_VALUES  # here: --help loads no numpy

    if isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",")]
    if not 1 <= len(parts) <= MAX_DK_VALUES or not all(p.isascii() and p.isdigit() and 1 <= int(p) <= MAX_DK
                                                        for p in parts):
        raise typer.BadParameter(f"{visible(str(value))[:40]!r}: give up to {MAX_DK_VALUES} whole numbers from 1 to "
                                 f"{MAX_DK:,}, comma-separated (16,64,256)")
    return [int(p) for p in parts]


@app.command(help="Why attention divides by √d_k: per layer of the real model, the spread of the scores Q·Kᵀ "
                  "and the entropy and peak of the softmax, with and without the division; then the "
                  "random-vector check at the model's own d_k and at d_k = 64.")
@cli_errors
@takes(inp=TextSource)
def scaling(output: ImageOut = None, as_json: JsonOpt = False,
            dk: Annotated[Optional[str], typer.Option(
                "--dk", metavar="LIST", show_default=False, parser=_dk_list,
                help="The random-vector check also at these d_k (e.g. 16,64,256; each 1 to 4,096, at most 8), "
                     "beside the model's own.")] = None,
            *, inp: TextSource) -> None:
    from attnviz.api import scaling as run_scaling
    from attnviz.render.png import FORMATS, save_figure
    from attnviz.render.tables import scaling_table, synthetic_table

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load()
    result = run_scaling(text, model=loaded, dk=_dk_list(dk) if dk else None, truncate=inp.truncate,
                         reporter=CliReporter())
    rows, T, d_k = list(result.rows), result.T, result.d_k
    (raw_own, scaled_own), (raw64, scaled64), chosen = result.synthetic, result.synthetic_d64, list(result.chosen)
    if as_json:
        print_json(result.to_dict())
    else:
        where = " (encoder self-attention)" if loaded.seq2seq else ""
        out.print(scaling_table(rows, T, d_k, f"{visible(loaded.name)}{where}: softmax(QKᵀ) vs softmax(QKᵀ/√d_k)"))
        if not result.divides:
            say("T5 does not divide by √d_k: its initialisation scales the query weights down instead (Raffel et al. "
                "2020, Mesh TensorFlow), so its own scores are the raw column (plus its relative position bias), "
                "and the scaled column is what dividing once more would give.", style="yellow", wrap=True)
        else:
            say("raw: the same trained weights and the same Q and K, only without the division by √d_k.", wrap=True)
        say(f"Random q, k with N(0, 1) entries: std of q·k is √d_k — d_k = {d_k} (this model): {raw_own:.2f} "
            f"(√{d_k} = {math.sqrt(d_k):.2f}), after ÷√d_k {scaled_own:.2f}; d_k = 64 (the essays' example): "
            f"{raw64:.2f} (√64 = 8), after ÷√d_k {scaled64:.2f}. Without the scaling the logits grow with √d_k, "
            f"the softmax saturates towards one-hot, and its gradients vanish.", wrap=True)
        if chosen:
            out.print(synthetic_table(chosen, T, d_k))
    if output is not None:
        path = save_figure(result.figure(), output_path(output, "attnviz_scaling.png"))
        say(path, console=err if as_json else out)
