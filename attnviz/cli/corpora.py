"""attnviz corpus: head statistics over many texts (one per line, or JSON lines), batched; shards merged."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.errors import INTERRUPTED_EXIT, TERMINATED_EXIT, cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.cli.output import emit, error_line
from attnviz.cli.params import CsvOpt, JsonOpt, ModelOptions, choice_parser, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="Head statistics over a corpus: every metric of the heads table per head, as mean and standard "
                  "deviation over texts and token-weighted over query rows, pattern-label counts and per-layer mass "
                  "on [CLS]/[SEP]/punctuation. Texts run in padded, length-sorted batches. "
                  "`attnviz corpus merge DIR DIR… -o DIR` combines runs into what one run over all of them gives.")
@cli_errors
@takes(opts=ModelOptions)
def corpus(sources: Annotated[list[str], typer.Argument(
               help="Text files (one text per line; .jsonl: JSON lines), - for standard input; or `merge` followed "
                    "by folders written with -o.", metavar="FILE… | - | merge DIR…", show_default=False)],
           field: Annotated[Optional[str], typer.Option(
               "--field", help="JSON lines: the field holding the text (default: text). Implies --format jsonl.",
               show_default=False)] = None,
           fmt: Annotated[Optional[str], typer.Option(
               "--format", parser=choice_parser(("txt", "jsonl"), {"json": "jsonl", "ndjson": "jsonl", "text": "txt"}),
               metavar="FORMAT", help="txt or jsonl: how to read the files (default: jsonl for .jsonl/.json or "
                                      "with --field, txt for .txt, else jsonl when the first line that holds "
                                      "text is a JSON object).", show_default=False)] = None,
           batch_size: Annotated[int, typer.Option("--batch-size", "-b", parser=whole_number(1, 4096),
                                                   metavar="N", help="Texts per forward pass, 1 to 4,096 (fewer for "
                                                                     "long texts when the attention would pass the "
                                                                     "memory budget).")] = 32,
           max_length: Annotated[Optional[int], typer.Option(
               "--max-length", parser=whole_number(2), metavar="TOKENS", show_default=False,
               help="Cut texts longer than this many tokens (counted in the summary). Default: the model's "
                    "maximum.")] = None,
           out_dir: Annotated[Optional[Path], typer.Option(
               "--out-dir", "--output", "-o", file_okay=False, show_default=False,
               help="Write stats.json (mergeable), heads.csv/json, layers.csv and grid PNGs to this folder.")] = None,
           force: Annotated[bool, typer.Option("--force", help="Replace an earlier attnviz folder in --out-dir "
                                                               "(never other files).")] = False,
           words: Annotated[bool, typer.Option(
               "--words", help="Statistics of attention between words instead of sub-word tokens (as --words gives "
                               "for one text: to a word, the sum over its pieces; from a word, their mean).")] = False,
           weight: Annotated[str, typer.Option(
               "--weight", parser=choice_parser(("texts", "tokens"), {"text": "texts", "token": "tokens",
                                                                      "rows": "tokens"}), metavar="WEIGHT",
               help="texts or tokens: what the table shows: means over texts, or token-weighted means over query "
                    "rows.")] = "texts",
           top: Annotated[Optional[int], typer.Option(help="Show only the first N heads in the table.",
                                                      parser=whole_number(1), metavar="N",
                                                      show_default=False)] = None,
           engine: Annotated[str, typer.Option(parser=choice_parser(("local", "ray"), {}), metavar="ENGINE",
                                               help="local: this process; ray: Ray Data (pip install "
                                                    "\"attnviz[ray]\"), a local Ray or --address.")] = "local",
           address: Annotated[Optional[str], typer.Option(
               help="Ray: the cluster to join (ray://host:10001, or auto for a `ray start` cluster on this machine). "
                    "Default: start a local Ray.", show_default=False)] = None,
           workers: Annotated[int, typer.Option(help="Ray: model replicas (actors), each loading the model once "
                                                     "(1 to 4,096).", parser=whole_number(1, 4096),
                                                metavar="N")] = 2,
           as_json: JsonOpt = False, as_csv: CsvOpt = False, *, opts: ModelOptions) -> None:
    import attnviz

    if sources and sources[0] == "merge":
        if field is not None or fmt is not None or engine != "local" or max_length is not None or words:
            raise typer.BadParameter("merge takes folders of earlier runs, and -o; no reading options",
                                     param_hint="merge")
        folders = sources[1:]
        if len(folders) < 2:
            raise typer.BadParameter("give at least two folders written by attnviz corpus -o", param_hint="merge")
        if out_dir is None:
            raise typer.BadParameter("where should the merged statistics go? give -o DIR", param_hint="--out-dir")
        emit(attnviz.merge(folders, out_dir=out_dir, force=force, weight=weight, top=top), as_json=as_json,
             as_csv=as_csv)
        return
    if not sources:
        raise typer.BadParameter("give a text file, - for standard input, or merge DIR…", param_hint="FILE")
    if sources.count("-") > 1:
        raise typer.BadParameter("standard input can be read once", param_hint="FILE")
    stopped = [0]

    def on_signal(signum, frame) -> None:
        if stopped[0]:  # asked twice: stop now, writing nothing
            raise KeyboardInterrupt
        stopped[0] = signum

    options: dict = dict(files=sources, format=fmt, field=field, batch_size=batch_size, max_length=max_length,
                         words=words, truncate=opts.truncate, engine=engine, address=address, workers=workers,
                         out_dir=out_dir, force=force, weight=weight, top=top, reporter=CliReporter())
    if engine == "ray":  # the workers load their own copies; Ray's run keeps what came back when stopped
        result = attnviz.corpus(model=opts.spec(), **options)
        stopped[0] = result.stopped_by
    else:
        from attnviz.api.corpora import open_sources

        options["files"] = open_sources(sources)  # every file checked before the model loads
        loaded = opts.load()
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            result = attnviz.corpus(model=loaded, stop=lambda: bool(stopped[0]), **options)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if not stopped[0]:
        emit(result, as_json=as_json, as_csv=as_csv)
        return
    # stopped: the data on standard output as usual, and one line on stderr saying how far it got and what was kept
    emit(result, as_json=as_json, as_csv=as_csv, style={"notes": False})
    shown = "the JSON on standard output" if as_json else "the CSV on standard output" if as_csv else "the tables above"
    error_line(result.stopped_line(stopped[0], shown))
    raise typer.Exit(TERMINATED_EXIT if stopped[0] == signal.SIGTERM else INTERRUPTED_EXIT)
