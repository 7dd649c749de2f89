"""Tables as data for scripts: one JSON writer and one CSV writer for every command and the export.

JSON is always valid UTF-8 and strict: NaN and infinities become null, lone surrogates become U+FFFD.
CSV is for spreadsheets as much as for programs, so a text cell that a spreadsheet would run as a
formula (starting with = + - @, a tab or a carriage return) is written with a leading apostrophe, and
control characters in text are made visible; numbers are written as they are. JSON keeps every string
exactly (control characters as \\u escapes).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from typing import Any
from collections.abc import Iterable, Mapping

from attnviz.base.text import repair_unicode, visible

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def plain(value: Any) -> Any:
    """`value` made of JSON-safe pieces: numpy scalars and arrays become Python numbers and lists,
    non-finite floats None, strings valid Unicode."""
    if isinstance(value, str):
        return repair_unicode(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {repair_unicode(str(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy array or scalar
        return plain(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    return repair_unicode(str(value))


_ESCAPE_IN_JSON = re.compile("[\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def to_json(value: Any, *, indent: int | None = 2) -> str:
    """Strict JSON text (no NaN, no Infinity), UTF-8-safe, non-ASCII kept readable. C0 controls are
    escaped by JSON itself; C1 controls, bidirectional overrides and line separators are written as
    \\uXXXX escapes too, so the text is safe on a terminal and decodes to exactly the same strings."""
    text = json.dumps(plain(value), indent=indent, ensure_ascii=False, allow_nan=False)
    return _ESCAPE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def write_json(value: Any, stream: Any, *, indent: int = 2) -> None:
    """`to_json(value)` written to `stream` a piece at a time, the same text: a float array (α of 512 tokens:
    19 M numbers) goes out a row at a time from its own memory, never as Python lists nor as one string (which
    took 3.8 GB for a 75 MB α), so memory stays within a row's text and a buffer."""
    buffer: list[str] = []
    held = 0
    for piece in _pieces(value, 0, indent):
        buffer.append(piece)
        held += len(piece)
        if held >= WRITE_BUFFER:
            stream.write("".join(buffer))
            buffer, held = [], 0
    stream.write("".join(buffer))


WRITE_BUFFER = 1 << 16  # characters gathered before each write
ROW_CHUNK = 1 << 15  # a long float row is turned into text this many numbers at a time


def _pieces(value: Any, level: int, indent: int):
    pad = " " * (indent * (level + 1))
    end = "\n" + " " * (indent * level)
    if _is_float_array(value):
        yield from _float_array(value, level, indent)
    elif isinstance(value, Mapping):
        if not value:
            yield "{}"
            return
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            name = json.dumps(repair_unicode(str(key)), ensure_ascii=False)
            yield ("," if i else "") + "\n" + pad + _escaped(name) + ": "
            yield from _pieces(item, level + 1, indent)
        yield end + "}"
    elif isinstance(value, (list, tuple)) and any(_is_float_array(v) or isinstance(v, (Mapping, list, tuple))
                                                  for v in value):
        if not value:
            yield "[]"
            return
        yield "["
        for i, item in enumerate(value):
            yield ("," if i else "") + "\n" + pad
            yield from _pieces(item, level + 1, indent)
        yield end + "]"
    else:  # a scalar, a string or a flat list: as to_json writes it, indented to where it sits
        text = json.dumps(plain(value), indent=indent, ensure_ascii=False, allow_nan=False)
        yield _escaped(text.replace("\n", "\n" + " " * (indent * level)))


def _is_float_array(value: Any) -> bool:
    return getattr(value, "dtype", None) is not None and getattr(value, "ndim", 0) >= 1 and value.dtype.kind == "f" \
        and value.size > 0


def _float_array(array: Any, level: int, indent: int):
    """A float array as to_json writes it (nested lists, one number per line, non-finite as null)."""
    import numpy as np

    pad = " " * (indent * (level + 1))
    end = "\n" + " " * (indent * level)
    if array.ndim > 1:
        yield "["
        for i in range(array.shape[0]):
            yield ("," if i else "") + "\n" + pad
            yield from _float_array(array[i], level + 1, indent)
        yield end + "]"
        return
    yield "["
    separator = ",\n" + pad
    for start in range(0, array.shape[0], ROW_CHUNK):
        part = np.asarray(array[start:start + ROW_CHUNK], dtype=np.float64)
        numbers = part.tolist()
        if np.isfinite(part).all():
            text = separator.join(map(repr, numbers))
        else:
            text = separator.join(repr(x) if math.isfinite(x) else "null" for x in numbers)
        yield ("," if start else "") + "\n" + pad + text
    yield end + "]"


def _escaped(text: str) -> str:
    return _ESCAPE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def csv_cell(value: Any) -> Any:
    """A value as one CSV cell: numbers unchanged; text with control characters made visible (CSV has no
    escapes) and, when a spreadsheet would run it as a formula, behind an apostrophe."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, str):
        value = visible(value)
        if value.startswith(FORMULA_START):
            return "'" + value
    return value


def to_csv(records: Iterable[Mapping[str, Any]], columns: list[str] | None = None) -> str:
    """Records (dicts with the same keys) as CSV text with a header row."""
    records = list(records)
    columns = columns if columns is not None else (list(records[0]) if records else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([csv_cell(c) for c in columns])
    for record in records:
        writer.writerow([csv_cell(record.get(c)) for c in columns])
    return buffer.getvalue()
