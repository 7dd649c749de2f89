"""Head statistics over many texts: corpus (batched, mergeable; in this process or on Ray Data) and merge."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from attnviz.api.models import borrows, resolve_model
from attnviz.api.result import Line as ReportLine, Result
from attnviz.base.arguments import checked
from attnviz.base.text import visible
from attnviz.corpora import CorpusState, Line, corpus_format, load_state, merge_states, read_lines
from attnviz.errors import InputError, UsageError, arg
from attnviz.progress import Reporter

__all__ = ["corpus", "merge", "Corpus", "CorpusState", "ENGINES", "WEIGHTS", "SHOWN_BAD"]

ENGINES = ("local", "ray")
WEIGHTS = ("texts", "tokens")
FORMATS = ("txt", "jsonl")
SHOWN_BAD = 10  # bad lines the report names; all of them (up to 1000) are in stats.json and bad_lines.csv
MAX_BATCH = 4096


@dataclass
class Corpus(CorpusState, Result):
    """The statistics of a corpus (a CorpusState: everything a run learned, and what merging needs), as a
    command's result: the table of every head (means over texts, or token-weighted with `weight` "tokens"; the
    first `top`), each layer's mass on [CLS]/[SEP]/punctuation, and what the run read. `written`: the folder
    the statistics went to, if asked."""

    command: ClassVar[str] = "corpus"
    weight: str = "texts"
    top: int | None = None
    written: str | None = None
    stopped_by: int = 0  # on Ray: the signal that ended the run early (0: it ran to the end)

    def to_dict(self) -> dict:
        """What `attnviz corpus --json` prints."""
        return {"summary": self.summary(), "heads": self.records(), "layers": self.layer_records()}

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, *, width: int = 100, notes: bool = True, **style: Any) -> list:
        """What the run read (notes on stderr; `notes=False`: none, as when a stopped run says it in one line),
        then the heads' table and the layers' table."""
        from attnviz.corpora import summary_lines, table_records
        from attnviz.render.tables import corpus_layers_table, heads_table

        items: list = [ReportLine(line, wrap=False, stderr=True) for line in summary_lines(self, SHOWN_BAD)]
        if self.written is not None:
            items.append(ReportLine(f"{self.written}  ({self.files_written()})", wrap=False, stderr=True))
        if not notes:
            items = []
        if self.texts == 0:
            return items
        records = table_records(self, self.weight)
        records = records[:self.top] if self.top else records
        what = (f"mean over {self.texts:,} texts" if self.weight == "texts"
                else f"token-weighted mean over {self.tokens:,} query rows")
        items.append(heads_table(records, f"{self.model}: {len(records)} heads, {what}"
                                          f"{' (PARTIAL)' if self.partial else ''}", width=width,
                                 caption="label: the most frequent; standard deviations and the other weighting: "
                                         "--json, --csv or -o; definitions: attnviz explain"))
        items.append(corpus_layers_table(self.layer_records(), "attention on [CLS]/BOS, [SEP]/EOS and punctuation, "
                                                               "mean over each layer's heads (Clark et al. 2019)"))
        return items


    def files_written(self) -> str:
        """The files an -o folder holds, in words."""
        return ("stats.json, heads.csv, heads.json, layers.csv, entropy.png, special.png, prev.png, labels.png"
                + (", bad_lines.csv" if self.bad_lines else ""))

    def stopped_line(self, signum: int, shown: str) -> str:
        """One line for a run stopped by Ctrl-C or SIGTERM: how far it got and what was kept. `shown`: where the
        partial statistics were printed ("the tables above", "the JSON on standard output", "")."""
        import signal

        how = "terminated" if signum == signal.SIGTERM else "interrupted"
        unit = "words" if self.level == "word" else "tokens"
        skipped = f"; {self.bad_total:,} lines skipped" if self.bad else ""
        read = (f"{how} after {self.texts:,} texts ({self.tokens:,} {unit} from {self.lines:,} lines{skipped})")
        kept = []
        if self.written is not None:
            kept.append(f"written to {self.written} ({self.files_written()})")
        if shown and self.texts:
            kept.append(f"shown in {shown}")
        if not kept:
            return f"{read}: nothing was kept"
        return f"{read}: the partial statistics (marked \"partial\": true) were {' and '.join(kept)}"


def _result(state: CorpusState, weight: str, top: int | None, written: str | None = None,
            stopped_by: int = 0) -> Corpus:
    return Corpus(**{f.name: getattr(state, f.name) for f in fields(CorpusState)}, weight=weight, top=top,
                  written=written, stopped_by=stopped_by)


def _check(weight: str, top: int | None, batch_size: int, max_length: int | None, engine: str, workers: int) -> None:
    if weight not in WEIGHTS:
        raise UsageError(f"{arg('weight')} is one of {', '.join(WEIGHTS)}, not {visible(str(weight))[:20]!r}",
                         "weight")
    if top is not None and top < 1:
        raise UsageError(f"{arg('top')} is at least 1", "top")
    if not 1 <= batch_size <= MAX_BATCH:
        raise UsageError(f"{arg('batch_size')} takes 1 to {MAX_BATCH:,} texts; got {batch_size}", "batch_size")
    if max_length is not None and max_length < 2:
        raise UsageError(f"{arg('max_length')} is at least 2 tokens", "max_length")
    if engine not in ENGINES:
        raise UsageError(f"{arg('engine')} is one of {', '.join(ENGINES)}, not {visible(str(engine))[:20]!r}",
                         "engine")
    if not 1 <= workers <= 4096:
        raise UsageError(f"{arg('workers')} takes 1 to 4,096 replicas; got {workers}", "workers")


def open_sources(files: Sequence[Any]) -> list[tuple[str, Any]]:
    """Each file opened and checked (a regular file, not a folder), "-" standard input (once): (name, stream). A
    (name, stream) pair given (a file opened already) is kept as it is."""
    from attnviz.base.files import open_regular

    if [str(f) for f in files].count("-") > 1:
        raise UsageError("standard input can be read once", "files")
    opened: list[tuple[str, Any]] = []
    try:
        for source in files:
            if isinstance(source, tuple):
                opened.append(source)
                continue
            if str(source) == "-":
                opened.append(("standard input", sys.stdin.buffer))
                continue
            path = Path(source).expanduser()
            if path.is_dir():
                raise InputError(f"{path} is a folder; give a text file (one text per line) or JSON lines")
            opened.append((str(path), open_regular(path, "text")))
    except BaseException:
        for _, stream in opened:
            if stream is not sys.stdin.buffer:
                stream.close()
        raise
    return opened


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


@borrows
@checked
def corpus(texts: Iterable[str] | None = None, *, files: Sequence[Any] | None = None,
           format: str | None = None, field: str | None = None, model: Any = None, tokenizer: Any = None,
           batch_size: int = 32, max_length: int | None = None, words: bool = False, truncate: bool = True,
           engine: str = "local", address: str | None = None, workers: int = 2, out_dir: Any = None,
           force: bool = False, weight: str = "texts", top: int | None = None, stop: Callable[[], bool] | None = None,
           device: str = "auto", dtype: str = "float32", reporter: Reporter | None = None) -> Corpus:
    """Head statistics over `texts` (or the texts of `files`: one per line, JSON lines for .jsonl or `format`
    "jsonl" with the text in `field`; "-" standard input), in padded, length-sorted batches: every metric of
    the head table per head, as mean and standard deviation over texts and token-weighted over query rows,
    pattern-label counts and per-layer mass on [CLS]/[SEP]/punctuation. An empty text is counted, not run;
    a line that cannot be read is counted and named. The result merges with others (merge) into what one run
    over all of them gives.

    engine "ray": the files on Ray Data, `workers` model replicas (a local Ray, or the cluster at `address`);
    `model` is then how to load one (a name, or an attnviz.ModelSpec). `out_dir`: stats.json, tables and
    pictures written there (atomically; `force` replaces an earlier attnviz folder). `stop()`: asked between
    batches, True ends the run early (the result says partial). `weight` and `top`: what the report shows."""
    _check(weight, top, batch_size, max_length, engine, workers)
    if (texts is None) == (files is None):
        raise UsageError(f"give the texts, or {arg('files')} to read them from, one of them", "files")
    if format is not None and format not in FORMATS:
        raise UsageError(f"{arg('format')} is one of {', '.join(FORMATS)}, not {visible(str(format))[:20]!r}",
                         "format")
    if out_dir is not None:
        from attnviz.base.files import check_target, export_folder

        check_target(export_folder(Path(out_dir)), force, "corpus statistics")  # before any model work
    reporter = reporter or Reporter()
    opened = open_sources(files) if files is not None else []  # every file checked before the model loads
    signum = 0
    if engine == "ray":
        state, signum = _on_ray(files, opened, texts, model, format, field, batch_size, max_length, address, workers,
                                words, truncate, device, dtype, reporter)
    else:
        state = _in_process(texts, opened, model, tokenizer, format, field, batch_size, max_length, words, truncate,
                            device, dtype, stop, reporter)
    written = None
    if out_dir is not None:
        from attnviz.corpora.output import write_corpus_folder

        with reporter.status("Writing the statistics…"):
            written = str(write_corpus_folder(state, out_dir, force))
    return _result(state, weight, top, written, signum)


def _in_process(texts, opened, model, tokenizer, fmt, field, batch_size, max_length, words, truncate, device, dtype,
                stop, reporter: Reporter) -> CorpusState:
    from attnviz.engine.corpora.run import BatchRunner, run_local

    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    runner = BatchRunner(loaded, max_length=max_length, batch_size=batch_size, truncate=truncate, words=words)
    state = runner.new_state()
    if texts is not None:
        given = list(texts)
        state.sources = ["texts"]
        lines: Iterable[Line] = (Line(text=t, number=n + 1, source="texts") for n, t in enumerate(given))
        total: int | None = len(given)
    else:
        state.sources = [visible(name) for name, _ in opened]
        counted = all(s is not sys.stdin.buffer for _, s in opened)
        total = sum(_count_lines(stream) for _, stream in opened) if counted else None

        def read() -> Iterable[Line]:
            for name, stream in opened:
                with stream:
                    yield from read_lines(stream, visible(name), corpus_format(name, fmt, field), field or "text",
                                          stop=stop)

        lines = read()
    with reporter.progress("Reading texts", total or 0, "texts") as step:
        complete = run_local(runner, lines, state, lambda done, tokens: step(done), stop=stop)
    state.partial = not complete
    return state


def _on_ray(files, opened, texts, model, fmt, field, batch_size, max_length, address, workers, words, truncate,
            device, dtype, reporter: Reporter) -> tuple[CorpusState, int]:
    from attnviz.api.models import ModelSpec
    from attnviz.engine.corpora.ray import run_ray

    if texts is not None:
        raise UsageError(f"the Ray engine reads {arg('files')} (Ray Data reads them itself)", "engine")
    for _, stream in opened:  # opened only to check them: Ray Data reads the files itself
        if stream is not sys.stdin.buffer:
            stream.close()
    spec = model if isinstance(model, ModelSpec) else ModelSpec(None if model is None else str(model), None, device,
                                                                dtype)
    paths = ["-" if stream is sys.stdin.buffer else name for name, stream in opened]
    return run_ray(paths, spec, fmt=fmt, field=field, batch_size=batch_size, max_length=max_length,
                   address=address, workers=workers, words=words, truncate=truncate, reporter=reporter)


@checked
def merge(states: Sequence[CorpusState | str | os.PathLike], *, out_dir: Any = None, force: bool = False,
          weight: str = "texts", top: int | None = None) -> Corpus:
    """Runs over parts of a corpus (their states, or the folders `attnviz corpus -o` wrote) combined into what one
    run over all of it gives; `out_dir`: written there as a run is."""
    _check(weight, top, 1, None, "local", 1)
    if out_dir is not None:
        from attnviz.base.files import check_target, export_folder

        check_target(export_folder(Path(out_dir)), force, "corpus statistics")
    state = merge_states([s if isinstance(s, CorpusState) else load_state(Path(s)) for s in states])
    written = None
    if out_dir is not None:
        from attnviz.corpora.output import write_corpus_folder

        written = str(write_corpus_folder(state, out_dir, force))
    return _result(state, weight, top, written)
