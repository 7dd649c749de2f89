"""How long work reports itself: the command line shows it, a notebook by default does not. A leaf module
(no numpy, no torch), so that the command line can subclass it before anything heavy is imported."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class Reporter:
    """What long work tells whoever called it: the command line shows it (a spinner, a progress bar, a note on
    stderr); from Python nothing is shown. Subclass and override what you want to see."""

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def progress(self, what: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
        yield lambda n: None

    def note(self, text: str) -> None:
        pass
