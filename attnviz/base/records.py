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
