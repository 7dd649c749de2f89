"""What attention contributes: logit-attr (direct logit attribution per head)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes, TextSource
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, whole_number

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.


@app.command(name="logit-attr",
             help="Which heads write the predicted token (direct logit attribution): the logit of the next token "
                  "(the model's own prediction, or --target) split into one part per head, MLP, the embeddings "
                  "and the biases, through the final norm with its scale frozen; per top head the tokens it "
                  "raises and lowers and the source tokens it carries its effect from. Checked: the parts add "
                  "up to the model's own logit. For causal language models (e.g. -m smollm2).")
@cli_errors
@takes(inp=TextSource)
def logit_attr(target: Annotated[Optional[str], typer.Option(
                   "--target", metavar="TOKEN", show_default=False,
                   help="The token whose logit to split, as text (one token of the model's vocabulary; a word's "
                        "leading space is usually part of it: ' Paris'). Default: the model's own prediction.")] = None,
               position: Annotated[int, typer.Option(
                   "--position", parser=whole_number(-(10**9), 10**9), metavar="N",
                   help="The position whose next token is split (an index; -1 is the last token).")] = -1,
               top: Annotated[int, typer.Option(
                   "--top", parser=whole_number(1, 100), metavar="K",
                   help="How many heads to list (1 to 100), by |effect|.")] = 10,
               output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False,
               *, inp: TextSource) -> None:
    from attnviz.api import logit_attribution
    from attnviz.panels import short_model
    from attnviz.render.png import FORMATS
    from attnviz.render.tables import records_table, verdict
    from attnviz.text import visible

    check_output(output, FORMATS)
    text = inp.require_text()
    loaded = inp.load(lm_head=True)
    result = logit_attribution(text, model=loaded, target=target, position=position, top=top,
                               truncate=inp.truncate, reporter=CliReporter())
    if as_json:
        print_json(result.to_dict())
    elif not emit_records(result.records(), False, as_csv):
        after = visible(result.tokens[result.position])
        def shown(token: str) -> str:  # a token's spaces made visible, so a list of them wraps between tokens
            return token.replace(" ", "␣") or "∅"

        rows = [{"rank": n + 1, "head": f"{e.layer}.{e.head}", "effect": e.effect,
                 "promotes": " ".join(shown(t) for t in e.promotes[:3]),
                 "suppresses": " ".join(shown(t) for t in e.suppresses[:3]),
                 "from": " ".join(f"{shown(t)}({v:+.2f})" for t, v in e.sources[:2])}
                for n, e in enumerate(result.top)]
        out.print(records_table(rows, [("rank", "rank", "d"), ("head", "layer.head", ""), ("effect", "effect", "+.3f"),
                                       ("promotes", "raises", ""), ("suppresses", "lowers", ""),
                                       ("from", "through", "")],
                                f"{short_model(result.model)}: after {after!r}, the logit of "
                                f"{visible(result.target)!r} (p = {result.probability:.2f}, rank {result.rank + 1}) "
                                f"by head"))
        biases = float(result.attention_bias.sum()) + result.final_bias
        say(f"logit {result.logit:.3f} = heads {result.heads.sum():+.3f} + MLPs {result.mlps.sum():+.3f} + "
            f"embeddings {result.embeddings:+.3f} + biases {biases:+.3f}", wrap=True)
        out.print(verdict(result.passed, f"the parts add up to the model's own logit within "
                                         f"{result.difference:.1e} (tolerance {1e-4:.0e}, relative)"))
        say("effect: the head's output at this position, through the final norm (its scale frozen) and the "
            "target's unembedding row; raises / lowers: the tokens its output pushes up and down most (␣ is a "
            "space); through: the source tokens it reads that effect from (α times each one's share).", wrap=True,
            style="dim")
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(result.figure(), output_path(output, "attnviz_logit_attr.png")),
            console=err if as_json or as_csv else out)
    if not result.passed:
        raise typer.Exit(3)
