"""Work split over the machine's cores. numpy releases the GIL inside its loops, so a fold cut into independent
tasks (the texts of a corpus batch, the heads of a long input's block of rows) runs on every core while the
model waits. OMP_NUM_THREADS, where set (Ray sets it for its workers), caps the threads, as it caps torch's."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def threads() -> int:
    """How many threads a fold may use: the cores this process may run on, at most OMP_NUM_THREADS."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    cap = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cores, int(cap))) if cap.isdigit() and int(cap) > 0 else max(1, cores)


class Started:
    """Tasks handed to the pool by start_all; wait() returns once every one has finished and raises the first
    task's exception (in order), if any."""

    def __init__(self, futures: list, errors: list[BaseException]):
        self.futures, self.errors = futures, errors

    def wait(self) -> None:
        errors = list(self.errors)
        for future in self.futures:
            try:
                future.result()
            except BaseException as exc:  # every task finishes before one error is raised
                errors.append(exc)
        self.futures, self.errors = [], []
        if errors:
            raise errors[0]


def start_all(tasks: Sequence[Callable[[], object]]) -> Started:
    """Start every task on up to threads() threads and return at once, so that the caller computes the next
    piece of work while these run; each task must write only what no other task touches. Run in this thread
    (done when this returns) with one task, one thread, or outside the main thread."""
    n = threads()
    if len(tasks) <= 1 or n == 1 or threading.current_thread() is not threading.main_thread():
        errors = []
        for task in tasks:
            try:
                task()
            except BaseException as exc:
                errors.append(exc)
        return Started([], errors)
    global _pool
    with _lock:
        if _pool is None or getattr(_pool, "_max_workers", 0) != n:
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="attnviz")
    return Started([_pool.submit(task) for task in tasks], [])


def run_all(tasks: Sequence[Callable[[], object]]) -> None:
    """Run every task, on up to threads() threads; each task must write only what no other task touches.
    The first task's exception (in order) is raised once all have finished."""
    start_all(tasks).wait()


def runs(n: int, parts: int) -> list[tuple[int, int]]:
    """0..n cut into at most `parts` consecutive runs of near-equal length, none empty."""
    k = max(1, min(parts, n))
    edges = [round(i * n / k) for i in range(k + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
