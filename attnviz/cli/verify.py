"""Commands that check attention against the definition: verify, scaling."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from attnviz.text import visible
from attnviz.cli.common import (FromOpt, ImageOut, JsonOpt, TextInput, TextSource, app, check_output, cli_errors,
                                err, finite_float, out, output_path, print_json, say, takes)

MISMATCH_EXIT = 3
# Default tolerance on max |Δα| by dtype. float32 is the target; in half precision the model's own α
# carries rounding that the float32 recomputation does not (measured on MiniLM: 9.6e-4 in float16,
# 9.0e-3 in bfloat16), so the defaults leave about 5x headroom.
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 5e-2}


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
    from attnviz.metrics import differences
    from attnviz.render.tables import verdict, verify_table
    from attnviz.engine.fromscratch.verify import capture_both

    if source is not None:
        _verify_capture(source, inp, tolerance, as_json)
        return
    text = inp.require_text()
    loaded = inp.load()
    inp.check_model_kind(loaded, None)
    if norms:
        loaded.require_single("verify --norms")
        _verify_norms(loaded, text, inp.truncate, tolerance, as_json)
        return
    if loaded.seq2seq:
        _verify_parts(loaded, inp.parts(loaded, text), None, tolerance, as_json)
        return
    with err.status("Running the model and the from-scratch path…"):
        reported, recomputed = capture_both(loaded, text, truncate=inp.truncate)
    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    diffs = differences(reported, recomputed)
    worst = max(diffs, key=lambda d: d.max_abs)
    ok = worst.max_abs <= tolerance
    if as_json:
        print_json({
            "model": reported.model, "dtype": loaded.dtype, "device": loaded.device, "tokens": list(reported.tokens),
            "tolerance": tolerance, "max_abs_diff": worst.max_abs, "passed": ok,
            "layers": [d.__dict__ for d in diffs]})
    else:
        out.print(verify_table(diffs, tolerance, _title(reported, loaded)))
        out.print(verdict(ok, f"max |Δα| = {worst.max_abs:.2e} (layer {worst.layer}, head {worst.worst_head}) "
                              f"{'≤' if ok else '>'} tolerance {tolerance:g}"))
        if ok:
            say(f"PASS means: computing softmax(Q·Kᵀ/√d_k) ourselves, from this model's own weights, gives the "
                f"attention weights the model reports, for every layer and head, to within {tolerance:g}.", wrap=True)
        else:
            say(f"FAIL means: the textbook formula, applied to this model's weights, does not give the weights "
                f"the model reports (off by up to {worst.max_abs:.2e}); the model does something the formula "
                f"leaves out.", wrap=True)
    if not ok:
        raise typer.Exit(MISMATCH_EXIT)


def _title(capture, loaded, what: str = "") -> str:
    shape = f"{capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} tokens"
    return f"{visible(loaded.name)} ({loaded.dtype}, {loaded.device}): {what}{shape}"


def _verify_capture(source, inp: TextInput, tolerance: float | None, as_json: bool) -> None:
    """verify --from: the saved α (e.g. assembled step by step by attnviz generate) against one forward pass
    of the model over the same token ids, and that pass against the from-scratch formula; exit 3 if either
    differs by more than the tolerance. The model is --model, else the one the capture names."""
    from dataclasses import replace

    from attnviz.capture import Parts, load_capture
    from attnviz.errors import InputError
    from attnviz.metrics import differences
    from attnviz.render.tables import verdict, verify_table
    from attnviz.engine.fromscratch.verify import capture_both_ids

    if inp.text is not None or inp.text_file is not None:
        raise typer.BadParameter("give either TEXT or --from, not both")
    saved = load_capture(source)
    if inp.model is None:
        say(f"Model: {saved.model} (named by the capture; --model chooses another)", console=err, style="dim")
    loaded = replace(inp, model=inp.model or saved.model).load()
    if isinstance(saved, Parts) or loaded.seq2seq:
        if not (isinstance(saved, Parts) and loaded.seq2seq):
            raise InputError(f"{source} and {loaded.name} do not match: one is of an encoder-decoder model and the "
                             f"other not")
        _verify_parts(loaded, saved, source, tolerance, as_json)
        return
    with err.status("Running the model and the from-scratch path over the capture's tokens…"):
        reported, recomputed = capture_both_ids(loaded, saved)
    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    checks = {"saved_vs_model": differences(saved, reported), "model_vs_scratch": differences(reported, recomputed)}
    worst = {name: max(diffs, key=lambda d: d.max_abs) for name, diffs in checks.items()}
    ok = all(w.max_abs <= tolerance for w in worst.values())
    if as_json:
        print_json({"model": loaded.name, "dtype": loaded.dtype, "device": loaded.device, "capture": str(source),
                    "tokens": list(saved.tokens), "tolerance": tolerance, "passed": ok,
                    **{name: {"max_abs_diff": worst[name].max_abs, "passed": worst[name].max_abs <= tolerance,
                              "layers": [d.__dict__ for d in diffs]} for name, diffs in checks.items()}})
    else:
        made = "generated step by step with the KV cache, " if saved.generated is not None else ""
        titles = {"saved_vs_model": f"the saved α ({made}{visible(str(source))}) against one forward pass: ",
                  "model_vs_scratch": "that forward pass against softmax(Q·Kᵀ/√d_k) from the weights: "}
        for name, diffs in checks.items():
            out.print(verify_table(diffs, tolerance, _title(saved, loaded, titles[name])))
            w = worst[name]
            passed = w.max_abs <= tolerance
            out.print(verdict(passed, f"max |Δα| = {w.max_abs:.2e} (layer {w.layer}, head {w.worst_head}) "
                                      f"{'≤' if passed else '>'} tolerance {tolerance:g}"))
        say("PASS means: the saved attention is what this model computes for these tokens in one pass, and that "
            "is the textbook formula applied to the model's own weights." if ok else
            "FAIL means: the saved attention is not what this model computes for these tokens (another model or "
            "revision, or a changed file), or the model does something the formula leaves out.", wrap=True)
    if not ok:
        raise typer.Exit(MISMATCH_EXIT)


def _verify_parts(loaded, parts, source, tolerance: float | None, as_json: bool) -> None:
    """An encoder-decoder model: each part (encoder, decoder, cross) of one forward pass over the source and
    the decoder's input, against the formula from the weights; with --from, the saved parts against that
    pass too. Exit 3 if any differs by more than the tolerance."""
    from dataclasses import replace

    import torch

    from attnviz.metrics import differences
    from attnviz.render.tables import verdict, verify_table
    from attnviz.engine.fromscratch.verify import scratch_parts

    encoder = parts.part("encoder") if "encoder" in parts.captures else None
    source_side = parts.part("cross").keys if "cross" in parts.captures else None
    source_ids = (encoder.token_ids if encoder is not None else source_side.token_ids if source_side else None)
    target = parts.part("decoder") if "decoder" in parts.captures else parts.captures.get("cross")
    if source_ids is None or target is None:
        from attnviz.errors import InputError

        raise InputError("verify needs the source and the target tokens: this capture holds only "
                         + ", ".join(parts.names))
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if max(int(source_ids.max()), int(target.token_ids.max())) >= vocab or min(int(source_ids.min()),
                                                                               int(target.token_ids.min())) < 0:
        from attnviz.errors import InputError

        raise InputError(f"the capture's token ids do not fit {loaded.name}'s vocabulary of {vocab}: give the model "
                         f"that made it (the capture names {visible(parts.model)!r})")
    device = loaded.device
    ids = torch.tensor([list(source_ids)], device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "decoder_input_ids": torch.tensor([list(target.token_ids)], device=device)}
    with err.status("Running the model and the from-scratch path over every part…"):
        results = scratch_parts(loaded, inputs)
    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    checks: dict[str, list] = {}
    for name, (scratch, model_alpha) in results.items():
        if name not in parts.captures:
            continue
        saved = parts.part(name)
        if saved.attentions.shape != model_alpha.shape:
            from attnviz.errors import InputError

            raise InputError(f"the capture's {name} part is {saved.attentions.shape}, {loaded.name} gives "
                             f"{model_alpha.shape}: give the model that made it")
        reported = replace(saved, attentions=model_alpha)
        if source is not None:
            checks[f"{name}: saved vs model"] = differences(saved, reported)
        checks[f"{name}: model vs scratch"] = differences(reported, replace(saved, attentions=scratch))
    worst = {name: max(diffs, key=lambda d: d.max_abs) for name, diffs in checks.items()}
    ok = all(w.max_abs <= tolerance for w in worst.values())
    if as_json:
        print_json({"model": loaded.name, "dtype": loaded.dtype, "device": loaded.device,
                    "capture": None if source is None else str(source), "tolerance": tolerance, "passed": ok,
                    "source_tokens": list(parts.part("encoder").tokens) if encoder is not None else None,
                    "target_tokens": list(target.tokens),
                    "checks": {name: {"max_abs_diff": worst[name].max_abs, "passed": worst[name].max_abs <= tolerance,
                                      "layers": [d.__dict__ for d in diffs]} for name, diffs in checks.items()}})
    else:
        from attnviz.panels import PART_TITLES

        for name, diffs in checks.items():
            part, what = name.split(": ")
            capture = parts.part(part)
            title = (f"{visible(loaded.name)} ({loaded.dtype}, {loaded.device}) · {PART_TITLES[part]} · {what}: "
                     f"{capture.n_layers} layers × {capture.n_heads} heads × {capture.n_tokens} × {capture.n_keys}")
            out.print(verify_table(diffs, tolerance, title))
            w = worst[name]
            passed = w.max_abs <= tolerance
            out.print(verdict(passed, f"max |Δα| = {w.max_abs:.2e} (layer {w.layer}, head {w.worst_head}) "
                                      f"{'≤' if passed else '>'} tolerance {tolerance:g}"))
        say("PASS means: in every part — the encoder's self-attention, the decoder's, and cross-attention from "
            "the target to the source — the formula applied to the model's own weights gives the weights the model "
            "reports" + (", and the saved capture holds them." if source is not None else ".") if ok else
            "FAIL means: in some part the weights differ (see which above): another model or revision, a changed "
            "file, or something the formula leaves out.", wrap=True)
    if not ok:
        raise typer.Exit(MISMATCH_EXIT)


def _verify_norms(loaded, text: str, truncate: bool, tolerance: float | None, as_json: bool) -> None:
    """The exact check of value-weighted norms: the heads' weighted, projected values add up to the block's
    output (recorded by a hook), per layer; exit 3 outside the tolerance."""
    from attnviz.render.tables import norms_check_table, verdict
    from attnviz.engine.fromscratch.norms import norms_capture

    with err.status("Running the model and recomputing each head's value vectors…"):
        capture, result = norms_capture(loaded, text, truncate=truncate)
    tolerance = TOLERANCE[loaded.dtype] if tolerance is None else tolerance
    worst = float(result.output_diff.max())
    relative = float(result.relative_diff.max())
    ok = relative <= tolerance
    if as_json:
        print_json({"model": capture.model, "dtype": loaded.dtype, "tolerance": tolerance, "max_abs_diff": worst,
                    "max_rel_diff": relative, "passed": ok,
                    "layers": [{"layer": n, "max_abs": float(d), "output_max": float(s), "max_rel": float(r)}
                               for n, (d, s, r) in enumerate(zip(result.output_diff, result.output_scale,
                                                                 result.relative_diff))]})
    else:
        title = f"{visible(capture.model)}: Σ_h Σ_j α_ij f_h(x_j) + b_O against the block's output"
        out.print(norms_check_table(result.output_diff, tolerance, title, result.output_scale))
        out.print(verdict(ok, f"max |Δ| / max(1, largest |output|) = {relative:.2e} {'≤' if ok else '>'} "
                              f"tolerance {tolerance:g} (max |Δ| = {worst:.2e})"))
        say("PASS means: each head's attention-weighted value vectors, through its slice of W_O, add up to what the "
            "attention block itself outputs, so the norms ‖α_ij f_h(x_j)‖ are the true sizes of the parts."
            if ok else "FAIL means: the parts do not add up to the block's output; the norms would be wrong.",
            wrap=True)
    if not ok:
        raise typer.Exit(MISMATCH_EXIT)


def _dk_list(value) -> list[int]:
    """--dk 16,64,256: up to 8 whole numbers from 1 to 4,096."""
    if isinstance(value, list):
        return value
    parts = [p.strip() for p in str(value).split(",")]
    if not 1 <= len(parts) <= 8 or not all(p.isascii() and p.isdigit() and 1 <= int(p) <= 4096 for p in parts):
        raise typer.BadParameter(f"{visible(str(value))[:40]!r}: give up to 8 whole numbers from 1 to 4,096, "
                                 f"comma-separated (16,64,256)")
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
    from attnviz.render.png import FORMATS, save_figure, scaling_figure
    from attnviz.render.tables import scaling_table, synthetic_table
    from attnviz.engine.fromscratch.scaling import scaling_rows, synthetic_row, synthetic_scaling
    from attnviz.engine.fromscratch.adapters import seq2seq_adapter_for

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load()
    with err.status("Recomputing Q and K…"):
        rows, T, d_k = scaling_rows(loaded, text, truncate=inp.truncate)
    folds = loaded.seq2seq and seq2seq_adapter_for(loaded.model).folds_scaling  # T5: no ÷√d_k of its own
    raw_own, scaled_own = synthetic_scaling(d_k)
    raw64, scaled64 = synthetic_scaling(64)
    chosen = [synthetic_row(d, T) for d in dict.fromkeys([d_k, *(dk or [])])] if dk else []
    if as_json:
        print_json({"model": loaded.name, "T": T, "d_k": d_k, "ln_T": math.log(T),
                    "model_divides_by_sqrt_dk": not folds,
                    "layers": [r.__dict__ for r in rows],
                    "synthetic": {"d_k": d_k, "std_raw": raw_own, "std_scaled": scaled_own},
                    "synthetic_d64": {"std_raw": raw64, "std_scaled": scaled64},
                    "synthetic_dk": [r.__dict__ for r in chosen]})
    else:
        where = " (encoder self-attention)" if loaded.seq2seq else ""
        out.print(scaling_table(rows, T, d_k, f"{visible(loaded.name)}{where}: softmax(QKᵀ) vs softmax(QKᵀ/√d_k)"))
        if folds:
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
        path = save_figure(scaling_figure(rows, T, d_k, loaded.name), output_path(output, "attnviz_scaling.png"))
        say(path, console=err if as_json else out)
