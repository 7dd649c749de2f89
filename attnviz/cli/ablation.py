"""What a head does, tested by removing it: ablate, importance, detect."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from attnviz.cli.output import check_output, emit_records, err, flag, out, output_path, print_json, say, use_color
from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.params import choice_parser, CsvOpt, ImageOut, JsonOpt, ModelOptions, selection_parser, whole_number
from attnviz.cli.inputs import CliReporter, read_texts, takes, TextSource
from attnviz.base.selection import Selection

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@dataclass(frozen=True)
class HeadsChoice:
    """--heads as typed: layer.head pairs, or a head selection for the layers of --layer."""

    pairs: tuple | None
    selection: Selection | None


def _heads_parser(value: Any) -> HeadsChoice:
    if isinstance(value, HeadsChoice):
        return value
    from attnviz.errors import SelectionError
    from attnviz.base.selection import looks_like_pairs, parse_pairs

    spec = str(value)
    try:
        if looks_like_pairs(spec):
            return HeadsChoice(parse_pairs(spec), None)
        return HeadsChoice(None, Selection.parse(spec, "head", field="heads"))
    except SelectionError as exc:
        raise typer.BadParameter(exc.spelled(flag).removeprefix("--heads: ")) from None


HeadsOpt = Annotated[Optional[HeadsChoice], typer.Option(
    "--heads", "--head", "-H", parser=_heads_parser, metavar="HEADS", show_default=False,
    help="The heads to remove: layer.head pairs (5.11,3.0; 2.all), or head indices (0,3 or 0-2 or all) for "
         "the layers of --layer.")]
LayersOpt = Annotated[Optional[Selection], typer.Option(
    "--layer", "--layers", "-l", parser=selection_parser("layer"), metavar="LAYERS", show_default=False,
    help="With --heads as indices (default all): remove those heads of these layers (-1 is the last).")]
ModeOpt = Annotated[str, typer.Option(
    "--mode", parser=choice_parser(("zero", "mean"), {"zeros": "zero", "average": "mean"}), metavar="MODE",
    help="zero: the head's output α·V becomes 0; mean: its mean over the text's tokens (or over --mean-over).")]
MeanOverOpt = Annotated[Optional[Path], typer.Option(
    "--mean-over", dir_okay=False, metavar="FILE", show_default=False,
    help="With --mode mean: average each head's output over the texts of this file (one per line) instead "
         "of the text's own tokens.")]


def _removed(heads: HeadsChoice | None, layer: Selection | None, L: int, H: int) -> list[tuple[int, int]]:
    from attnviz.base.selection import resolve_pairs

    if heads is None and layer is None:
        raise typer.BadParameter("name the heads to remove: --heads 5.11,3.0 (layer.head), or --layer 5 "
                                 "[--heads 0,3]", param_hint="--heads")
    if heads is not None and heads.pairs is not None:
        if layer is not None:
            raise typer.BadParameter("--heads as layer.head pairs names the layers already; leave out --layer",
                                     param_hint="--layer")
        return resolve_pairs(heads.pairs, L, H)
    if layer is None:
        raise typer.BadParameter("head indices need --layer (or write layer.head pairs: 5.11,3.0)",
                                 param_hint="--heads")
    chosen = heads.selection if heads is not None and heads.selection is not None else Selection.everything("head")
    return [(n, h) for n in layer.indices(L) for h in chosen.indices(H)]


def _means_source(mode: str, mean_over: Path | None) -> list[str] | None:
    if mean_over is None:
        return None
    if mode != "mean":
        raise typer.BadParameter("--mean-over gives the means of --mode mean; add --mode mean",
                                 param_hint="--mean-over")
    from attnviz.api import MAX_MEAN_TEXTS

    return read_texts(mean_over, MAX_MEAN_TEXTS, "--mean-over")


def _names(pairs, heads: int = 0) -> str:
    """5.11, 3.0 — or 2.all where every head of a layer is removed."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    return ", ".join(f"{layer}.all" if heads and len(set(hs)) == heads else ", ".join(f"{layer}.{h}" for h in hs)
                     for layer, hs in by_layer.items())


@app.command(help="Remove heads and see what changes: for a causal LM (e.g. -m smollm2) the next-token "
                  "distribution at every position (KL divergence, the top token before and after, the probability "
                  "of the original top token; --at one position in full); for an encoder the sentence embedding "
                  "(cosine before/after) and each token's final hidden state; for both, how the later layers' "
                  "attention changed (Δα; -o draws it, -t in the terminal). Checked against a second mechanism: "
                  "the same heads removed by editing the output projection's weights.")
@cli_errors
@takes(inp=TextSource)
def ablate(heads: HeadsOpt = None, layer: LayersOpt = None, mode: ModeOpt = "zero", mean_over: MeanOverOpt = None,
           at: Annotated[Optional[str], typer.Option(
               "--at", metavar="TOKEN", show_default=False,
               help="A causal LM: the top 5 next tokens before and after at this position (an index, -1 the last, "
                    "or the token's text).")] = None,
           terminal: Annotated[bool, typer.Option("--terminal", "-t", help="Draw Δα in the terminal too.")] = False,
           output: ImageOut = None, as_json: JsonOpt = False, *, inp: TextSource) -> None:
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    text = inp.require_text()
    texts = _means_source(mode, mean_over)
    from attnviz.api import ablate as run

    loaded = inp.load(lm_head="auto")  # the API checks that its heads can be removed
    L, H = loaded.shape
    removed = _removed(heads, layer, L, H)
    with err.status(f"Running the model with {len(removed)} head{'s' if len(removed) != 1 else ''} removed…"):
        result = run(text, heads=removed, model=loaded, mode=mode, mean_over=texts, truncate=inp.truncate)
    position = None
    if at is not None:
        if result.kind != "causal":
            raise typer.BadParameter("--at shows a causal LM's next-token distribution; this model is an encoder",
                                     param_hint="--at")
        from attnviz.base.selection import find_token

        position = find_token(result.tokens, at, "at")
    records = _position_records(result, loaded.tokenizer)
    from attnviz.panels import delta_layers, delta_page, short_model

    delta = result.alpha_removed - result.alpha_clean
    later = delta_layers(delta, result.first_layer)
    how = "zero ablation" if mode == "zero" else f"mean ablation (means over {result.means_from})"
    check = {"max_abs_diff": result.check, "relative": result.check / max(result.scale, 1.0)}
    if as_json:
        data: dict = {"model": result.model, "text": text, "tokens": result.tokens, "removed": result.removed,
                      "mode": mode, "means_from": result.means_from or None, "kind": result.kind,
                      "positions" if result.kind == "causal" else "token_states": records,
                      "later_layers": later, "check": check}
        if result.kind == "causal":
            assert result.loss is not None
            data["loss"] = {"before": result.loss[0], "after": result.loss[1]}
            if position is not None:
                data["at"] = _at_record(result, loaded.tokenizer, position)
        else:
            data["sentence_cosine"] = result.cosine
        print_json(data)
    else:
        from attnviz.render.tables import records_table

        title = f"{short_model(result.model)} · removed {_names(result.removed, H)} · {how}"
        if result.kind == "causal":
            assert result.loss is not None
            before, after = result.loss
            say(f"{title}", style="bold")
            say(f"next-token loss over the text: {before:.3f} → {after:.3f} nats ({after - before:+.3f})")
            out.print(records_table(records, [("position", "pos", "d"), ("token", "token", ""),
                                              ("top_before", "top before", ""), ("p_before", "p", ".3f"),
                                              ("top_after", "top after", ""), ("p_after", "p", ".3f"),
                                              ("p_top_after", "p(top before) after", ".3f"), ("kl", "KL", ".3f")],
                                    "what the model predicts next, before and after",
                                    "KL(p_clean ‖ p_removed) in nats; p: probability of that token"))
            if position is not None:
                out.print(_at_table(_at_record(result, loaded.tokenizer, position)))
        else:
            say(title, style="bold")
            say(f"sentence embedding (mean over tokens): cosine before/after {result.cosine:.4f}")
            out.print(records_table(records, [("position", "pos", "d"), ("token", "token", ""),
                                              ("cosine", "cosine", ".4f"), ("change", "‖Δh‖/‖h‖", ".3f")],
                                    "each token's final hidden state, before and after"))
        if later:
            out.print(records_table(later, [("layer", "layer", "d"), ("max_abs_delta", "max |Δα|", ".3f"),
                                            ("mean_abs_delta", "mean |Δα|", ".4f"),
                                            ("most_changed_head", "most changed head", "d")],
                                    "how the later layers' attention changed (α removed − α clean)"))
        else:
            say("no layer follows the heads removed, so no attention changed", style="dim")
        say(f"Check: the same heads removed by editing W_O's weights give the same outputs to within "
            f"{result.check:.1e} ({check['relative']:.1e} of their largest value).", wrap=True, style="dim")
    names = _names(result.removed, H)
    page = delta_page(delta, result.tokens, result.kind == "causal", after=result.first_layer,
                      title=f"{short_model(result.model)} · Δα after removing {names} ({mode})")
    if terminal and page is not None and not as_json:
        from attnviz.render.terminal import panels_side_by_side

        from dataclasses import replace

        shown = [replace(p, values=False) for p in page.panels]  # signed values do not fit a terminal cell
        out.print(panels_side_by_side(shown, width=out.width, color=use_color(), cmap="RdBu_r"))
    if output is not None:
        if page is None:
            raise typer.BadParameter("no layer follows the heads removed: there is no Δα to draw", param_hint="-o")
        from attnviz.render.png import mixed_figure, save_figure

        say(save_figure(mixed_figure(page, cmap="RdBu_r"), output_path(output, f"{page.name}.png")),
            console=err if as_json else out)


def _token_text(tokenizer, token_id: int) -> str:
    return str(tokenizer.decode([int(token_id)]))


def _position_records(result, tokenizer) -> list[dict]:
    """One record per position: a causal LM's next-token prediction before and after, or an encoder's token
    states."""
    records = []
    for i, token in enumerate(result.tokens):
        if result.kind == "causal":
            records.append({"position": i, "token": token,
                            "top_before": _token_text(tokenizer, result.top_before[i]),
                            "p_before": float(result.p_top[i, 0]),
                            "top_after": _token_text(tokenizer, result.top_after[i]),
                            "p_after": float(result.probs5[i, 1, 0]),
                            "p_top_after": float(result.p_top[i, 1]), "kl": float(result.kl[i])})
        else:
            records.append({"position": i, "token": token, "cosine": float(result.token_cosine[i]),
                            "change": float(result.token_change[i])})
    return records


def _at_record(result, tokenizer, i: int) -> dict:
    def top(k: int) -> list[dict]:
        return [{"token": _token_text(tokenizer, t), "p": float(p)}
                for t, p in zip(result.top5[i, k], result.probs5[i, k])]

    return {"position": i, "token": result.tokens[i], "kl": float(result.kl[i]), "before": top(0), "after": top(1)}


def _at_table(record: dict):
    from attnviz.render.tables import records_table

    rows = [{"rank": n + 1, "before": b["token"], "p_before": b["p"], "after": a["token"], "p_after": a["p"]}
            for n, (b, a) in enumerate(zip(record["before"], record["after"]))]
    return records_table(rows, [("rank", "#", "d"), ("before", "before", ""), ("p_before", "p", ".3f"),
                                ("after", "after", ""), ("p_after", "p", ".3f")],
                         f"after token {record['position']} ({record['token']}): the 5 most likely next tokens "
                         f"(KL {record['kl']:.3f} nats)")


@app.command(help="Every head removed alone, ranked by its effect (a causal LM: mean KL divergence of the next-token "
                  "distributions; an encoder: how far the sentence embedding moves), batched so that the L·H "
                  "removals cost far less than L·H runs; beside it the gradient estimate of Michel et al. 2019 "
                  "(|∂loss/∂ξ_h| for a gate ξ_h on each head) and the rank correlation of the two. On TEXT, or "
                  "averaged over the texts of --corpus FILE. -o draws both as layers × heads.")
@cli_errors
@takes(inp=TextSource)
def importance(corpus: Annotated[Optional[Path], typer.Option(
                   "--corpus", dir_okay=False, metavar="FILE", show_default=False,
                   help="Average over the texts of this file (one per line, at most 1,000) instead of TEXT.")] = None,
               mode: ModeOpt = "zero",
               top: Annotated[int, typer.Option(parser=whole_number(1, 100_000), metavar="K",
                                                help="The K most important heads in the table (all with "
                                                     "--json/--csv).")] = 15,
               loop: Annotated[bool, typer.Option(
                   "--loop", help="One forward pass per head instead of the batched pass (slow; the same "
                                  "numbers).")] = False,
               output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *, inp: TextSource) -> None:
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if corpus is not None:
        if inp.text is not None or inp.text_file is not None:
            raise typer.BadParameter("give either TEXT or --corpus, not both", param_hint="--corpus")
        from attnviz.api import MAX_IMPORTANCE_TEXTS

        texts = read_texts(corpus, MAX_IMPORTANCE_TEXTS, "--corpus")
    else:
        texts = [inp.require_text()]
    from attnviz.api import importance as run
    from attnviz.metrics import spearman
    from attnviz.panels import short_model

    loaded = inp.load(lm_head="auto")
    result = run(texts, model=loaded, mode=mode, truncate=inp.truncate, batched=not loop, reporter=CliReporter())
    causal = result.kind == "causal"
    rho = spearman(result.gradient, result.estimated)
    rho_effect = spearman(result.gradient, result.effect)
    records = []
    L, H = result.effect.shape
    for layer in range(L):
        for head in range(H):
            record = {"layer": layer, "head": head, "effect": float(result.effect[layer, head])}
            if causal:
                assert result.loss is not None
                record["delta_loss"] = float(result.loss[layer, head])
            record["gradient"] = float(result.gradient[layer, head])
            records.append(record)
    ranked = sorted(records, key=lambda r: -r["effect"])
    for rank, record in enumerate(ranked, 1):
        record["rank"] = rank
    what = "mean KL of the next-token distributions, nats" if causal else "‖Δê‖ of the unit sentence embedding"
    estimate = "|Δloss|" if causal else "‖Δê‖"
    summary = {"model": loaded.name, "kind": result.kind, "mode": mode, "texts": result.texts, "tokens": result.tokens,
               "effect": what, "clean_loss": result.clean_loss, "spearman_gradient_vs_estimated": rho,
               "spearman_gradient_vs_effect": rho_effect, "estimated": estimate, "batched": not loop}
    if as_json:
        print_json({**summary, "heads": ranked})
    elif as_csv:
        emit_records(ranked, False, True, ["rank", "layer", "head", "effect", *(["delta_loss"] if causal else []),
                                           "gradient"])
    else:
        from attnviz.render.tables import records_table

        columns = [("rank", "#", "d"), ("layer", "layer", "d"), ("head", "head", "d"), ("effect", "effect", ".4f")]
        if causal:
            columns.append(("delta_loss", "Δloss", "+.4f"))
        columns.append(("gradient", "gradient", ".4f"))
        on = f"{result.texts} texts" if result.texts > 1 else "the text"
        out.print(records_table(ranked[:top], columns,
                                f"{short_model(loaded.name)} · every head removed alone ({mode}) on {on}: the "
                                f"{min(top, len(ranked))} with the largest effect of {len(ranked)}"))
        say(f"effect: {what}" + ("; Δloss: the next-token loss with the head removed minus without" if causal else "")
            + f"; gradient: {'|∂loss/∂ξ_h|' if causal else '‖∂ê/∂ξ_h‖'} at ξ = 1 (Michel et al. 2019), the "
            f"first-order estimate of {estimate}.", wrap=True, style="dim")
        say(f"Spearman ρ between the gradient estimate and {estimate}: {rho:.3f}; and the effect: {rho_effect:.3f} "
            f"(over {len(ranked)} heads)", wrap=True)
    if output is not None:
        from attnviz.panels import Page, Scale, head_grid_panel
        from attnviz.render.png import mixed_figure, save_figure

        title = f"{short_model(loaded.name)} · every head removed alone ({mode})"
        panels = (head_grid_panel(result.effect, Scale(0.0, max(float(result.effect.max()), 1e-9), "effect"),
                                  title, "importance", short=f"effect: {what}"),
                  head_grid_panel(result.gradient, Scale(0.0, max(float(result.gradient.max()), 1e-9), "gradient"),
                                  title, "importance", short="gradient estimate (Michel et al. 2019)"))
        from attnviz.base.text import shorten, visible

        read = (f"“{visible(shorten(texts[0], 400))}”" if len(texts) == 1 else
                f"{len(texts)} texts of {visible(str(corpus))}: “{visible(shorten(texts[0], 200))}” …")
        page = Page(panels=panels, title=title, name="attnviz_importance", subtitle=read,
                    notes=(f"Spearman ρ (gradient vs {estimate}) = {rho:.3f}",))
        say(save_figure(mixed_figure(page, ncols=2), output_path(output, f"{page.name}.png")),
            console=err if (as_json or as_csv) else out)


@app.command(help="Find previous-token, duplicate-token and induction heads on controlled inputs: random token "
                  "sequences repeated once (Olsson et al. 2022), scored as TransformerLens's head detector does. "
                  "For a causal LM, the causal test: the loss on the repeated half with the detected induction "
                  "heads removed, against as many random heads.")
@cli_errors
@takes(inp=ModelOptions)
def detect(length: Annotated[int, typer.Option(parser=whole_number(2, 2048), metavar="N",
                                               help="Random tokens per sequence before it repeats (2 to 2,048).")] = 50,
           sequences: Annotated[int, typer.Option(parser=whole_number(1, 100), metavar="K",
                                                  help="Random sequences to average over (1 to 100).")] = 4,
           seed: Annotated[int, typer.Option(parser=whole_number(0, 2**32 - 1), metavar="N",
                                             help="The random seed of the sequences and of the random heads.")] = 0,
           draws: Annotated[int, typer.Option(parser=whole_number(0, 100), metavar="N",
                                              help="Random head sets to remove in the causal test (0 to 100).")] = 10,
           mode: ModeOpt = "zero", output: ImageOut = None, as_json: JsonOpt = False,
           audio: Annotated[Optional[str], typer.Option(
               "--audio", metavar="FILE", show_default=False,
               help="A speech model (-m whisper, the default here): which cross-attention heads align with the sound "
                    "(each head's share of weight on the word-timing path; attnviz align), and whether the model "
                    "lists them as its alignment heads.")] = None,
           *, inp: ModelOptions) -> None:
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if audio is not None:
        from attnviz.cli.speech import aligned_heads
        from attnviz.cli.inputs import SoundInput

        sound_input = SoundInput(**{f.name: getattr(inp, f.name) for f in fields(ModelOptions)
                                    if f.name != "_checked_first"}, audio=audio)
        aligned_heads(sound_input, output, as_json)
        return
    from attnviz.api import detect as run
    from attnviz.panels import short_model

    loaded = inp.load(lm_head="auto")
    result = run(model=loaded, length=length, sequences=sequences, seed=seed, draws=draws, mode=mode,
                 reporter=CliReporter())
    causal = result.causal
    summary: dict = {"model": loaded.name, "length": length, "sequences": sequences, "seed": seed,
                     "thresholds": result.thresholds,
                     "detected": {k: [list(p) for p in v] for k, v in result.detected.items()},
                     "scores": {k: v for k, v in result.scores.items()}, "shares": result.shares}
    if causal is not None:
        import numpy as np

        summary["causal_test"] = {"heads": [list(p) for p in causal.heads], "clean_loss": causal.clean,
                                  "removed_loss": causal.removed, "random_losses": causal.random,
                                  "random_mean": float(np.mean(causal.random)) if causal.random else None,
                                  "random_heads": [[list(p) for p in heads] for heads in causal.random_heads],
                                  "mode": mode}
    if as_json:
        print_json(summary)
    else:
        from attnviz.render.tables import records_table

        say(f"{short_model(loaded.name)} · {sequences} random sequence{'s' if sequences > 1 else ''} of {length} "
            f"tokens, each repeated once", style="bold")
        for name in result.scores:
            heads = result.detected[name]
            rows = [{"layer": a, "head": b, "share": float(result.shares[name][a, b]),
                     "score": float(result.scores[name][a, b])} for a, b in heads[:12]]
            title = (f"{name}: {len(heads)} head{'s' if len(heads) != 1 else ''} with a share ≥ "
                     f"{result.thresholds[name]}" + (" (the 12 strongest)" if len(heads) > 12 else ""))
            if rows:
                out.print(records_table(rows, [("layer", "layer", "d"), ("head", "head", "d"),
                                               ("share", "share", ".3f"), ("score", "TL score", ".3f")], title))
            else:
                say(title, style="dim")
        say("share: the weight on the pattern's targets averaged over the rows that have one; TL score: "
            "TransformerLens's detector, Σ α⊙P / Σ α over the whole matrix.", wrap=True, style="dim")
        if causal is not None:
            import numpy as np

            random = (f"{np.mean(causal.random):.3f} (from {min(causal.random):.3f} to {max(causal.random):.3f} over "
                      f"{len(causal.random)} draws)" if causal.random else "–")
            say(f"Causal test, the next-token loss on the repeated half ({mode} ablation): clean {causal.clean:.3f} "
                f"nats; without the {len(causal.heads)} induction heads {causal.removed:.3f}; without "
                f"{len(causal.heads)} random heads {random}.", wrap=True)
        elif result.detected["induction"]:
            say("The causal test needs next-token predictions: a causal LM (e.g. -m smollm2).", style="dim")
    if output is not None:
        from attnviz.panels import Page, Scale, head_grid_panel
        from attnviz.render.png import mixed_figure, save_figure

        title = f"{short_model(loaded.name)} · head detectors on repeated random tokens (share of the rows' weight)"
        panels = tuple(head_grid_panel(result.shares[name], Scale(0.0, 1.0, "share"), title, f"detect_{name}",
                                       short=name) for name in result.shares)
        page = Page(panels=panels, title=title, name="attnviz_detect")
        say(save_figure(mixed_figure(page, ncols=3), output_path(output, f"{page.name}.png")),
            console=err if as_json else out)
