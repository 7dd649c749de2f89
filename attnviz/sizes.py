"""Sizes in bytes as people write and read them. Pure Python."""

from __future__ import annotations


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
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(text)
    return int(value)
