"""attnviz corpus: head statistics over many texts (one per line, or JSON lines), batched; shards merged."""

from __future__ import annotations

import signal
from typing import Annotated

import typer

import attnviz.analyses.corpus as CORPUS
from attnviz.base.options import as_keywords

from attnviz.cli.errors import INTERRUPTED_EXIT, TERMINATED_EXIT, cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.cli.output import emit, error_line
from attnviz.cli.params import CsvOpt, JsonOpt, ModelOptions

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help=CORPUS.SUMMARY)
@cli_errors
@takes(opts=ModelOptions, options=CORPUS.Options)
def corpus(sources: Annotated[list[str], typer.Argument(
               help="Text files (one text per line; .jsonl: JSON lines), - for standard input; or `merge` followed "
                    "by folders written with -o.", metavar="FILE… | - | merge DIR…", show_default=False)],
           as_json: JsonOpt = False, as_csv: CsvOpt = False, *, opts: ModelOptions, options: CORPUS.Options) -> None:
    import attnviz

    out_dir, force, weight, top, engine = options.out_dir, options.force, options.weight, options.top, options.engine
    if sources and sources[0] == "merge":
        if options.field is not None or options.format is not None or engine != "local" or \
                options.max_length is not None or options.words:
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

    keywords: dict = dict(files=sources, **as_keywords(options), truncate=opts.truncate, reporter=CliReporter())
    if engine == "ray":  # the workers load their own copies; Ray's run keeps what came back when stopped
        result = attnviz.corpus(model=opts.spec(), **keywords)
        stopped[0] = result.stopped_by
    else:
        from attnviz.api.corpora import open_sources

        keywords["files"] = open_sources(sources)  # every file checked before the model loads
        loaded = opts.load()
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            result = attnviz.corpus(model=loaded, stop=lambda: bool(stopped[0]), **keywords)
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
