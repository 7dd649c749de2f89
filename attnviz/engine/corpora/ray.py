"""`attnviz corpus --engine ray`: the same job on Ray Data. Files are read by Ray Data (local paths, or any
path it reads, e.g. s3://), split into numbered lines by the same reader as the local engine, and run through
`map_batches` by a pool of actors that each load the model once; every batch comes back as a partial
CorpusState (JSON), merged on the driver with the same merge code as `attnviz corpus merge`.

The same actors serve any analysis that measures a corpus text by text (`measure_each`: faithfulness --corpus
--engine ray), each text's summary coming back as JSON to be gathered on the driver as the local run gathers it.

Ray is imported only here, and only when this engine is asked for (extra: pip install "attnviz[ray]").
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit
import contextlib
import os
import signal
import socket
import sys
import warnings

from attnviz.corpora import CorpusState, Line, corpus_format, merge_states, read_lines
from attnviz.engine.corpora.run import BatchRunner, CHUNK_BATCHES
from attnviz.engine.models import load, ModelSpec
from attnviz.errors import InputError, arg
from attnviz.progress import Reporter
from attnviz.base.text import visible

RAY_HINT = 'the Ray engine needs Ray Data: pip install "attnviz[ray]"'


def _ray():
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    try:
        import ray
        import ray.data
    except ImportError:
        raise InputError(RAY_HINT) from None
    return ray


def check_address(address: str, timeout: float = 3.0) -> None:
    """InputError, in a few seconds, when nothing answers at a Ray address (host:port or ray://host:port);
    Ray itself would retry for minutes. "auto" and "local" are left to Ray."""

    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise InputError(f"{arg('address')} {address!r} is not host:port, ray://host:port or auto")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise InputError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with `ray start "
                         f"--head`, or leave out {arg('address')} for a local Ray") from None


def split_file(row: dict, fmt: str | None, field: str | None) -> list[dict]:
    """One file read by Ray Data ({"bytes", "path"}) -> its lines, numbered, bad ones marked."""
    path = str(row["path"])
    lines = read_lines(io.BytesIO(row["bytes"]), path, corpus_format(path, fmt, field), field or "text")
    return [_row(line) for line in lines]


def _row(line: Line) -> dict:
    return {"source": line.source, "number": line.number, "text": line.text, "reason": line.reason}


def batch_lines(batch: dict) -> list[Line]:
    """A batch of rows as Ray Data hands it to an actor (numpy columns) back into lines. A column whose every
    value is missing comes as floats (NaN), not None, when the whole batch is bad lines (a text file read as
    JSON lines, say): a text or reason that is not a string is none, never the text "nan"."""
    return [Line(str(s), int(n), t if isinstance(t, str) else None, r if isinstance(r, str) else "")
            for s, n, t, r in zip(batch["source"], batch["number"], batch["text"], batch["reason"])]


class CorpusWorker:
    """A Ray actor: loads the model once, then turns batches of lines into partial states (JSON)."""

    def __init__(self, model_options: dict, batch_size: int, max_length: int | None, truncate: bool, words: bool):
        self.runner = BatchRunner(load(**model_options), max_length=max_length, batch_size=batch_size,
                                  truncate=truncate, words=words)

    def __call__(self, batch: dict) -> dict:
        lines = batch_lines(batch)
        state = self.runner.new_state()
        state.runs = []  # a piece of this run, not a run of its own
        self.runner.fold(state, lines)
        return {"state": [json.dumps(state.to_json())]}


def ray_failure(exc: BaseException) -> InputError:
    """A Ray job's failure as one line: Ray wraps a worker's error in its own exception types, whose `cause` is
    the worker's; its type and the last line of its message."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip()
    return InputError(f"the Ray job failed: {type(cause).__name__}: {text.splitlines()[-1] if text else ''}")


def start_ray(ray, address: str | None, workers: int) -> None:
    """Start a local Ray (or join the one at `address`) where none runs in this process yet, quietly: its
    deprecation notes, logs and progress bars off. A Ray that cannot start is one line (InputError)."""
    warnings.filterwarnings("ignore", message=r".*ray_remote_args. is deprecated")
    warnings.filterwarnings("ignore", message=r"The minimum number of concurrent actors")
    if not ray.is_initialized():
        try:
            # a local Ray gets one CPU slot beyond the actors', for Ray Data's own reading and splitting
            cpus = None if address else max(os.cpu_count() or 1, workers) + 1
            ray.init(address=address, num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR", configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(f"could not start or join Ray{f' at {address}' if address else ''}: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    import logging

    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


class _Stopped(BaseException):
    """Ctrl-C or SIGTERM while Ray runs: raised from the signal handler to leave Ray's wait at once."""


def run_ray(paths: Sequence[str], spec: ModelSpec, *, fmt: str | None, field: str | None, batch_size: int,
            max_length: int | None, address: str | None, workers: int, words: bool = False, truncate: bool = True,
            reporter: Reporter | None = None) -> tuple[CorpusState, int]:
    """Every text of `paths` ("-": standard input, read here) through `workers` actors on Ray Data. Returns
    the state and the signal that stopped the run early (0: it ran to the end). Ctrl-C or SIGTERM keeps the
    partial states that came back, shuts Ray down (a local Ray's processes with it) and returns them."""

    if address is not None:
        check_address(address)
    ray = _ray()

    model_options = spec.as_kwargs()

    started_here = not ray.is_initialized()
    status = contextlib.ExitStack()
    status.enter_context((reporter or Reporter()).status("Starting Ray…"))
    try:
        start_ray(ray, address, workers)
        files = [p for p in paths if p != "-"]
        datasets = []
        if files:
            # reading and splitting take no CPU slot of their own, so the model actors may have every core
            raw = ray.data.read_binary_files(files, include_paths=True, num_cpus=0)
            lines = raw.flat_map(split_file, fn_kwargs={"fmt": fmt, "field": field}, num_cpus=0)
            # one file is one block: cut it into blocks of a batch of work each, so every actor gets some
            datasets.append(lines.repartition(target_num_rows_per_block=batch_size * CHUNK_BATCHES))
        if "-" in paths:
            stdin = read_lines(sys.stdin.buffer, "standard input", corpus_format("-", fmt, field), field or "text")
            datasets.append(ray.data.from_items([_row(line) for line in stdin]))
        data = datasets[0] if len(datasets) == 1 else datasets[0].union(*datasets[1:])
        gpus = 1 if spec.device == "cuda" else 0
        # one block in flight per actor: Ray Data would otherwise queue several blocks on the first actor that
        # is ready while the others still load the model (with 1,000 texts, all of them on one of two actors)
        pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
        states = data.map_batches(
            CorpusWorker, fn_constructor_kwargs=dict(model_options=model_options, batch_size=batch_size,
                                                     max_length=max_length, truncate=truncate, words=words),
            batch_size=batch_size * CHUNK_BATCHES, compute=pool, num_gpus=gpus, num_cpus=0 if gpus else 1,
            max_restarts=0, batch_format="numpy")
        stopped = 0

        def on_signal(signum, frame) -> None:
            nonlocal stopped
            stopped = signum
            raise _Stopped

        # after ray.init, which installs handlers of its own: ours end the wait and keep what came back
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        partials: list[CorpusState] = []
        try:
            for row in states.iter_rows():
                partials.append(CorpusState.from_json(json.loads(row["state"]), "a Ray worker's result"))
        except _Stopped:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    except InputError:
        raise
    except Exception as exc:  # Ray wraps a worker's error in its own exception types
        raise ray_failure(exc) from None
    finally:
        status.close()
        if started_here and ray.is_initialized():
            ray.shutdown()  # a local Ray's raylet, workers and actors end with it
    if partials:
        first = partials[0]
        state = CorpusState.empty(model=first.model, revision=first.revision, model_type=first.model_type,
                                  causal=first.causal, layers=first.layers, heads=first.heads,
                                  max_length=first.max_length, metrics=first.metrics, dtype=first.dtype,
                                  level=first.level)
        state = merge_states([state, *partials])
    else:  # nothing to run: an empty state of the model
        from attnviz.engine.corpora.run import BatchRunner

        state = BatchRunner(load(**model_options), max_length=max_length, batch_size=batch_size,
                            words=words).new_state()
    state.sources = [visible(p) for p in paths]
    state.partial = bool(stopped)
    return state, stopped


# --- any analysis, text by text: the actors load the model once and measure each text they are given -----


class TextWorker:
    """A Ray actor: loads the model once, then measures each text of a batch with `measure(loaded, number, text,
    options)` (a JSON-able summary, or (number, why not))."""

    def __init__(self, model_options: dict, options: dict, measure: Callable) -> None:
        self.loaded = load(**model_options, lm_head="auto")
        self.loaded.model.eval()
        self.options = options
        self.measure = measure  # the analysis's own (handed in: the engine imports no analysis)

    def __call__(self, batch: dict) -> dict:
        return {"result": [json.dumps({"number": int(n), "found": self.measure(self.loaded, int(n), str(t),
                                                                                 self.options)})
                           for n, t in zip(batch["number"], batch["text"])]}


def measure_each(texts: list[str], model_options: dict, options: dict, measure: Callable, *, address: str | None,
                   workers: int, reporter: Reporter) -> tuple[list[dict], list[tuple[int, str]]]:
    """Every text measured by `workers` actors that each load the model once (`model_options`, as
    attnviz.engine.models.load takes them): (the summaries in the texts' order, the skipped ones). The engine of
    every analysis that measures a corpus text by text on Ray (faithfulness --corpus --engine ray)."""
    if address is not None:
        check_address(address)
    ray = _ray()
    started_here = not ray.is_initialized()
    found: dict[int, object] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(reporter.status(f"Measuring {len(texts):,} texts on Ray ({workers} workers)…"))
        try:
            start_ray(ray, address, workers)
            data = ray.data.from_items([{"number": n, "text": t} for n, t in enumerate(texts, 1)],
                                       override_num_blocks=max(1, min(len(texts), workers * 4)))
            pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
            gpus = 1 if model_options.get("device") == "cuda" else 0
            results = data.map_batches(TextWorker, fn_constructor_kwargs=dict(model_options=model_options,
                                                                                      options=options,
                                                                                      measure=measure),
                                       batch_size=1, compute=pool, num_gpus=gpus, num_cpus=0 if gpus else 1,
                                       max_restarts=0, batch_format="numpy")
            for row in results.iter_rows():
                value = json.loads(row["result"])
                found[int(value["number"])] = value["found"]
        except InputError:
            raise
        except Exception as exc:  # Ray wraps a worker's error in its own exception types
            raise ray_failure(exc) from None
        finally:
            if started_here and ray.is_initialized():
                ray.shutdown()
    measured = [found[n] for n in sorted(found) if isinstance(found[n], dict)]
    skipped = [(n, str(found[n][1])) for n in sorted(found) if isinstance(found[n], list)]  # type: ignore[index]
    return measured, skipped  # type: ignore[return-value]
