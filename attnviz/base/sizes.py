"""Sizes in bytes as people write and read them. Pure Python."""

from __future__ import annotations

import os

from attnviz.errors import InputError

MAX_SIZE = 1 << 50  # 1 PiB: no size attnviz is told can be larger
MAX_NEW_TOKENS = 4096  # tokens one generation writes, at most


def size_text(n: float) -> str:
    """Bytes as people read them: 1.5 GiB, 12.0 MiB, 3.0 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift or unit == "KiB":
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """"512M", "2G", "1.5G", "4096" (bytes) -> bytes; ValueError for anything else."""
    raw = str(text).strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    value = float(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else float(raw)
    if not 0 < value < MAX_SIZE:  # NaN, inf, 0, negative, 1e99
        raise ValueError(text)
    return max(int(value), 1)


def size_from_env(name: str, default: int) -> int:
    """A size from the environment variable `name` (bytes, or 512M, 8G), else `default`; a value that is not a
    size from 1 byte to 1 PiB is an InputError naming the variable (never silently ignored)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_size(raw)
    except (ValueError, IndexError, OverflowError):
        raise InputError(f"{name}={raw!r} is not a size: give bytes or a number with K, M, G or T "
                         f"(e.g. 512M, 8G), from 1 byte to 1 PiB") from None
