"""Strings for people. What comes from a capture, a model, a tokenizer or a file is data: it is shown
with control characters made visible, and measured in terminal cells (Hangul and most CJK characters
take two), never in code points. Pure Python: no numpy, no torch.
"""

from __future__ import annotations

import unicodedata
from typing import TypeVar

from rich.cells import cell_len

from attnviz.errors import InputError

TextInput = TypeVar("TextInput")  # a text, or a vision model's Picture (passed through as it is)

ELLIPSIS = "…"
# Characters that reorder a line (Trojan Source) or break it, besides the controls (category Cc).
_BIDI = {*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C}
_LINE_BREAKS = {"Zl", "Zp"}


def _stand_in(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Control Pictures block: ESC -> ␛, newline -> ␊
    if code == 0x7F:
        return "␡"
    if code <= 0xFF:
        return f"\\x{code:02x}"  # C1 controls (CSI is \x9b)
    return f"\\u{code:04x}"


def visible(text: str, keep: str = "") -> str:
    """`text` with everything that could act on a terminal shown as a visible stand-in: C0 controls as
    control pictures (␛, ␊, ␉), DEL as ␡, C1 controls, bidirectional overrides, line separators and lone
    surrogates as escapes (\\x9b, \\u202e, \\udc80). Other text, CJK and emoji included, is unchanged. `keep`:
    characters left as they are ("\\n\\t": a text's own lines and tabs, written to a file)."""
    if text.isprintable():  # fast path: no control, separator or format character at all
        return text
    out = []
    for char in text:
        category = unicodedata.category(char)
        if char in keep:
            out.append(char)
        elif category in ("Cc", "Cs") or category in _LINE_BREAKS or ord(char) in _BIDI:
            out.append(_stand_in(char))
        else:
            out.append(char)
    return "".join(out)


def is_valid_unicode(text: str) -> bool:
    """False for strings holding lone surrogates (undecodable bytes), which cannot be written as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def repair_unicode(text: str) -> str:
    """Lone surrogates replaced by U+FFFD, so the string can be written as UTF-8."""
    if is_valid_unicode(text):
        return text
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def cells(text: str) -> int:
    """Width of `text` in terminal cells."""
    return cell_len(text)


def fit(text: str, width: int) -> str:
    """`text` cut to at most `width` cells, ending in … when cut."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    out, used = [], 0
    for char in text:
        w = cell_len(char)
        if used + w > width - 1:
            break
        out.append(char)
        used += w
    return "".join(out) + ELLIPSIS


def pad(text: str, width: int, align: str = "left") -> str:
    """`text` fitted to `width` cells and padded with spaces to exactly `width` cells."""
    text = fit(text, width)
    gap = width - cell_len(text)
    if align == "right":
        return " " * gap + text
    if align == "center":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap


def glyphs(text: str) -> list[str]:
    """The characters of `text` that take space, each with the zero-width marks that follow it (so a
    label can be written one character per line, as the terminal heatmap's vertical key labels are)."""
    out: list[str] = []
    for char in text:
        if out and cell_len(char) == 0:
            out[-1] += char
        elif cell_len(char) > 0:
            out.append(char)
    return out


def wrap_cells(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` cells (wide characters count twice), broken between words; a word longer
    than a line is broken inside it. Every character is kept; runs of spaces at a break are dropped."""
    width = max(int(width), 2)
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if cell_len(candidate) <= width:
                line = candidate
                continue
            if line:
                lines.append(line)
            line = ""
            for char in glyphs(word):  # the word alone, broken where it must be
                if cell_len(line + char) > width and line:
                    lines.append(line)
                    line = ""
                line += char
        lines.append(line)
    return lines


def shorten(text: str, limit: int = 80) -> str:
    """One line of at most `limit` characters: whitespace runs folded, … when cut."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + ELLIPSIS


def check_text(text: TextInput) -> TextInput:
    """Raise InputError for empty, whitespace-only or undecodable text (cheap: callers use it before
    loading a model)."""
    if getattr(text, "is_picture", False) or getattr(text, "is_sound", False):  # an image or a sound
        return text
    if not isinstance(text, str):
        several = isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text)
        raise InputError(f"the text is one string, not a {type(text).__name__}"
                         + ("; for many texts, attnviz.corpus takes a list" if several else ""), "text")
    if not text.strip():
        raise InputError("the text is empty: give a sentence to look at, e.g. \"The cat sat on the mat\"")
    if not is_valid_unicode(text):
        at = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
        raise InputError(f"the text is not valid UTF-8 (undecodable bytes at character {at}); "
                         f"save or type it as UTF-8")
    return text
