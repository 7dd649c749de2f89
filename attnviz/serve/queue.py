"""One request at a time per model, in arrival order, with each waiting request's place in the line known: the
model runs on one worker thread, so however many requests arrive, one forward pass runs and memory holds one
request's attention. A request past the line's length is refused (Busy) rather than queued without bound."""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class Busy(Exception):
    """The line is full: the request is refused, to be tried again later."""


class OneAtATime:
    """Run callables one at a time on one thread, first come first served. `position(ticket)`: 0 while the
    ticket's request runs, k while k requests are ahead of it, None when it is not in the line."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._line: OrderedDict[str, None] = OrderedDict()
        self._lock = asyncio.Lock()  # fair: waiters are woken in the order they came
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnviz-model")
        self._numbers = itertools.count()
        self.served = 0
        self.busy = False  # a request's work is running on the model's thread

    def position(self, ticket: str) -> int | None:
        for n, waiting in enumerate(self._line):
            if waiting == ticket:
                return n
        return None

    @property
    def waiting(self) -> int:
        return max(len(self._line) - 1, 0) if self._lock.locked() else len(self._line)

    def new_ticket(self) -> str:
        return f"t{next(self._numbers)}"

    async def run(self, ticket: str, work: Callable[[], Any]) -> Any:
        """`work()` on the model's thread once every request before this one has run. A request whose client
        goes away is dropped from the line; one already running finishes first (the thread cannot be stopped
        midway), and the next waits for it."""
        if len(self._line) > self.max_waiting:
            raise Busy(f"{len(self._line)} requests are in line, the most this server keeps; try again shortly")
        if ticket in self._line:
            ticket = f"{ticket}-{self.new_ticket()}"
        self._line[ticket] = None
        try:
            await self._lock.acquire()
            try:
                future = asyncio.get_running_loop().run_in_executor(self._worker, self._working, work)
            except BaseException:
                self._lock.release()
                raise
            # the line moves on when the thread is done, even if this request is cancelled before (its client
            # went away, or the server stops): the thread cannot be stopped midway, and no one waits for it
            future.add_done_callback(self._done)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:  # the server stops: the client hears so (503), not a bare 500
                raise Busy("the server is stopping: this request was dropped") from None
        finally:
            self._line.pop(ticket, None)
            self.served += 1

    def _done(self, future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: a cancelled request's failure is no one's to report
        self._lock.release()

    def _working(self, work: Callable[[], Any]) -> Any:
        self.busy = True
        try:
            return work()
        finally:
            self.busy = False

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
