"""Reading a corpus: one text per line, or JSON lines with a text field; a bad line is counted and named
(by number, up to MAX_BAD_LISTED), never fatal; a line over MAX_LINE_BYTES is skipped unread.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO




MAX_LINE_BYTES = 1 << 20  # a longer line is counted as bad ("longer than 1 MiB") and skipped, unread
MAX_BAD_LISTED = 1000  # bad lines listed by number; beyond, only counted
# --- reading a corpus: one text per line, or JSON lines ------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One text of the corpus, or (text None) a line that is not one, with why."""

    source: str
    number: int  # 1-based
    text: str | None
    reason: str = ""


TEXT_SUFFIXES = (".txt", ".text")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def corpus_format(path: str, fmt: str | None, field_name: str | None) -> str:
    """txt, jsonl or auto: as asked, else jsonl for .jsonl/.json files or when --field is given, txt for .txt,
    else auto (standard input, any other name): read_lines decides by the first line that holds text."""
    if fmt is not None:
        return fmt
    if field_name is not None or path.lower().endswith(JSON_SUFFIXES):
        return "jsonl"
    if path.lower().endswith(TEXT_SUFFIXES):
        return "txt"
    return "auto"


def sniff(text: str) -> str:
    """The format of a corpus whose first line that holds text is `text`: jsonl when it is a JSON object
    (`{"text": …}`), else txt — a plain text that is one JSON object by chance is written in a .txt file."""
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return "txt"
    try:
        return "jsonl" if isinstance(json.loads(stripped), dict) else "txt"
    except (ValueError, RecursionError):
        return "txt"


def read_lines(stream: IO[bytes], source: str, fmt: str = "txt", field_name: str = "text",
               stop: Callable[[], bool] | None = None) -> Iterator[Line]:
    """The texts of a corpus, one per line, as Line records; bad lines (empty, not UTF-8, not JSON, no such
    field, longer than MAX_LINE_BYTES) come as Line(text=None, reason=...) and never stop the reading.
    `stop()` is asked before every read, so Ctrl-C or SIGTERM ends even an endless line (`cat /dev/zero`).
    fmt "auto": JSON lines when the first line that holds text is a JSON object, else one text per line."""
    number = 0
    while not (stop and stop()):
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line a block at a time
                if stop and stop():
                    return
                raw = stream.readline(MAX_LINE_BYTES)
            yield Line(source, number, None, "longer than 1 MiB")
            continue
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
        raw = raw.rstrip(b"\r\n")
        if fmt == "auto":
            text = raw.decode("utf-8", "replace")
            if not text.strip():
                yield Line(source, number, None, "empty")
                continue
            fmt = sniff(text)
        yield _parse(raw, source, number, fmt, field_name)


def _parse(raw: bytes, source: str, number: int, fmt: str, field_name: str) -> Line:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Line(source, number, None, "not UTF-8")
    if fmt == "jsonl":
        if not text.strip():
            return Line(source, number, None, "empty")
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            return Line(source, number, None, "not JSON")
        value = record.get(field_name) if isinstance(record, dict) else None
        if not isinstance(value, str):
            what = "not a JSON object" if not isinstance(record, dict) else (
                f"no field {field_name!r}" if field_name not in record else f"field {field_name!r} is not a string")
            return Line(source, number, None, what[:120])
        text = value
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            return Line(source, number, None, "not valid Unicode (a lone surrogate escape)")
    if not text.strip():
        return Line(source, number, None, "empty")
    return Line(source, number, text)


