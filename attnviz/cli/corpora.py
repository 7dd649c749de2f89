"""attnviz corpus: head statistics over many texts (one per line, or JSON lines), batched; shards merged."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from attnviz.cli.params import choice_parser, CsvOpt, JsonOpt, ModelOptions, whole_number
from attnviz.cli.output import emit_records, err, error_line, out, print_json, say
from attnviz.cli.errors import cli_errors, INTERRUPTED_EXIT, TERMINATED_EXIT
from attnviz.cli.group import app
from attnviz.cli.inputs import CliReporter, takes
from attnviz.base.text import visible

# Imports inside the commands (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` and
# each command's --help light: a command module loads only what its own command needs, when it runs.

ENGINES = ("local", "ray")
FORMATS = ("txt", "jsonl")
SHOWN_BAD = 10  # bad lines named on stderr; all of them (up to 1000) are in stats.json and bad_lines.csv


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
               "--format", parser=choice_parser(FORMATS, {"json": "jsonl", "ndjson": "jsonl", "text": "txt"}),
               metavar="FORMAT", help="txt or jsonl: how to read the files (default: jsonl for .jsonl/.json or "
                                      "with --field, else txt).", show_default=False)] = None,
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
           engine: Annotated[str, typer.Option(parser=choice_parser(ENGINES, {}), metavar="ENGINE",
                                               help="local: this process; ray: Ray Data (pip install "
                                                    "\"attnviz[ray]\"), a local Ray or --address.")] = "local",
           address: Annotated[Optional[str], typer.Option(
               help="Ray: the cluster to join (ray://host:10001, or auto for a `ray start` cluster on this machine). "
                    "Default: start a local Ray.", show_default=False)] = None,
           workers: Annotated[int, typer.Option(help="Ray: model replicas (actors), each loading the model once "
                                                     "(1 to 4,096).", parser=whole_number(1, 4096),
                                                metavar="N")] = 2,
           as_json: JsonOpt = False, as_csv: CsvOpt = False, *, opts: ModelOptions) -> None:
    from attnviz.corpora import merge_states

    if sources and sources[0] == "merge":
        if field is not None or fmt is not None or engine != "local" or max_length is not None or words:
            raise typer.BadParameter("merge takes folders of earlier runs, and -o; no reading options",
                                     param_hint="merge")
        folders = sources[1:]
        if len(folders) < 2:
            raise typer.BadParameter("give at least two folders written by attnviz corpus -o", param_hint="merge")
        if out_dir is None:
            raise typer.BadParameter("where should the merged statistics go? give -o DIR", param_hint="--out-dir")
        _check_out(out_dir, force)
        from attnviz.corpora import load_state

        state = merge_states(load_state(folder) for folder in folders)
        _write(state, out_dir, force)
        _report(state, weight, top, as_json, as_csv, out_dir)
        return
    if not sources:
        raise typer.BadParameter("give a text file, - for standard input, or merge DIR…", param_hint="FILE")
    if sources.count("-") > 1:
        raise typer.BadParameter("standard input can be read once", param_hint="FILE")
    opened = [_open(source) for source in sources]  # every file checked before the model loads
    if out_dir is not None:
        _check_out(out_dir, force)
    if engine == "ray":
        from attnviz.engine.corpora.ray import run_ray

        for _, stream in opened:  # opened only to check them: Ray Data reads the files itself
            if stream is not sys.stdin.buffer:
                stream.close()
        state, signum = run_ray(list(sources), opts.spec(), fmt=fmt, field=field, batch_size=batch_size,
                                max_length=max_length, address=address, workers=workers, words=words,
                                truncate=opts.truncate, reporter=CliReporter())
        _stopped[0], complete = signum, not signum
    else:
        state, complete = _run_local(opened, opts, fmt, field, batch_size, max_length, words)
    if out_dir is not None:
        _write(state, out_dir, force)
    _report(state, weight, top, as_json, as_csv, out_dir)
    if not complete:
        stopped = _stopped[0]
        error_line(f"{'terminated' if stopped == signal.SIGTERM else 'interrupted'} after {state.texts} texts: "
                   f"the statistics are partial (marked \"partial\": true)"
                   + (f" and were written to {out_dir}" if out_dir is not None else ""))
        raise typer.Exit(TERMINATED_EXIT if stopped == signal.SIGTERM else INTERRUPTED_EXIT)


_stopped: list[int] = [0]


def _open(source: str):
    from attnviz.errors import InputError

    if source == "-":
        return "standard input", sys.stdin.buffer
    from attnviz.base.files import open_regular

    path = Path(source).expanduser()
    if path.is_dir():
        raise InputError(f"{path} is a folder; give a text file (one text per line) or JSON lines")
    return str(path), open_regular(path, "text")


def _check_out(out_dir: Path, force: bool) -> None:
    from attnviz.base.files import check_target, export_folder

    check_target(export_folder(out_dir), force, "corpus statistics")  # before any model work


def _run_local(opened, opts: ModelOptions, fmt, field, batch_size, max_length, words):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from attnviz.corpora import corpus_format, read_lines
    from attnviz.engine.corpora.run import BatchRunner, run_local

    loaded = opts.load()
    runner = BatchRunner(loaded, max_length=max_length, batch_size=batch_size, truncate=opts.truncate, words=words)
    state = runner.new_state()
    state.sources = [visible(name) for name, _ in opened]
    counted_files = err.is_terminal and all(s is not sys.stdin.buffer for _, s in opened)  # only for the bar
    total = sum(_count_lines(stream) for _, stream in opened) if counted_files else None

    def lines():
        for name, stream in opened:
            with stream:
                yield from read_lines(stream, visible(name), corpus_format(name, fmt, field), field or "text",
                                      stop=lambda: bool(_stopped[0]))

    progress = Progress(TextColumn("Reading texts"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    task = progress.add_task("texts", total=total, rate="")
    import time

    started = time.perf_counter()
    counted = {"tokens": 0, "texts": 0}

    def on_batch(texts: int, tokens: int) -> None:
        counted["texts"] += texts
        counted["tokens"] += tokens
        elapsed = max(time.perf_counter() - started, 1e-9)
        progress.update(task, advance=texts, rate=f"{counted['texts'] / elapsed:,.0f} texts/s · "
                                                  f"{counted['tokens'] / elapsed:,.0f} tokens/s")

    _stopped[0] = 0

    def on_signal(signum, frame) -> None:
        if _stopped[0]:  # asked twice: stop now, writing nothing
            raise KeyboardInterrupt
        _stopped[0] = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with progress:
            complete = run_local(runner, lines(), state, on_batch, stop=lambda: bool(_stopped[0]))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    state.partial = not complete
    return state, complete


def _count_lines(stream) -> int:
    """Lines in a regular file (for the progress bar's total), then back to its start."""
    try:
        if not os.path.isfile(stream.name):
            return 0
        n, last = 0, b"\n"
        for block in iter(lambda: stream.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
        stream.seek(0)
        return n + (last != b"\n")
    except (OSError, AttributeError, ValueError):
        return 0


def _write(state, out_dir: Path, force: bool) -> None:
    from attnviz.corpora.output import write_corpus_folder

    with err.status("Writing the statistics…"):
        target = write_corpus_folder(state, out_dir, force)
    say(f"{target}  (stats.json, heads.csv, heads.json, layers.csv, entropy.png, special.png, prev.png, "
        f"labels.png{', bad_lines.csv' if state.bad_lines else ''})", console=err)


def _report(state, weight: str, top: int | None, as_json: bool, as_csv: bool, out_dir: Path | None) -> None:
    from attnviz.corpora import summary_lines, table_records
    from attnviz.render.tables import corpus_layers_table, heads_table

    for line in summary_lines(state, SHOWN_BAD):
        say(line, console=err)
    if as_json:
        print_json({"summary": state.summary(), "heads": state.records(), "layers": state.layer_records()})
        return
    if emit_records(state.records(), False, as_csv):
        return
    if state.texts == 0:
        return
    records = table_records(state, weight)[:top] if top else table_records(state, weight)
    what = (f"mean over {state.texts:,} texts" if weight == "texts"
            else f"token-weighted mean over {state.tokens:,} query rows")
    out.print(heads_table(records, f"{state.model}: {len(records)} heads, {what}"
                                   f"{' (PARTIAL)' if state.partial else ''}", width=out.width,
                          caption="label: the most frequent; standard deviations and the other weighting: --json, "
                                  "--csv or -o; definitions: attnviz explain"))
    out.print(corpus_layers_table(state.layer_records(), "attention on [CLS]/BOS, [SEP]/EOS and punctuation, mean "
                                                         "over each layer's heads (Clark et al. 2019)"))
