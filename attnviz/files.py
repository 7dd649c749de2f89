"""Opening files that someone else gave: only regular files, never a FIFO, device or socket (opening a FIFO
blocks until a writer comes; /dev/zero never ends). Pure Python."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from attnviz.errors import InputError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def kind_of(mode: int) -> str | None:
    """What a file is when it is not a regular file ("a FIFO (named pipe)"), else None."""
    return next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def open_regular(path: str | Path, what: str = "file", error: type[Exception] = InputError) -> BinaryIO:
    """`path` opened for reading in binary, after checking that it is a regular file. The file is opened
    without blocking (a FIFO would block in open() itself) and checked on the open descriptor, so it cannot
    be swapped in between. `error` is raised, with one line saying what the path is instead."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        kind = kind_of(mode)
        if kind is not None:
            hint = "; give a regular file, or - to read standard input" if what == "text" else ""
            raise error(f"{path} is {kind}, not a regular file{hint}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int, what: str = "file", error: type[Exception] = InputError) -> bytes:
    """At most limit + 1 bytes of a regular file (the caller tells "too large" from limit + 1)."""
    with open_regular(path, what, error) as handle:
        return handle.read(limit + 1)
