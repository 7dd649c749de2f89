"""Readable token strings, from what a tokenizer gives. Pure Python: no torch, no transformers."""

from __future__ import annotations

import functools
import unicodedata

SUBWORD_PREFIX = "##"
_MARKERS = ("Ġ", "▁", "Ċ")  # byte-level BPE space, SentencePiece space, byte-level newline


def readable_token(raw: str, decoded: str | None, source_text: str | None, *, special: bool,
                   subword: bool) -> str:
    """One token as a user should read it.

    raw         the vocabulary string ("##at", "Ġcat", "▁cat", "ëĤĺ")
    decoded     tokenizer.decode([id]) — undoes byte-level encoding ("Ġcat" -> " cat")
    source_text the span of the input this token came from (offsets), if known
    Special tokens stay as they are. Word-initial pieces lose their space markers; continuation
    pieces are shown as "##piece" whatever the tokenizer's own convention, so `subword` is visible.
    """
    if special:
        return raw
    text = decoded if decoded is not None else raw
    if "\ufffd" in text and source_text:  # a byte-level piece of a multi-byte character
        text = source_text
    text = text.strip()
    for marker in _MARKERS:
        text = text.replace(marker, "" if marker != "Ċ" else "\\n")
    if text.startswith(SUBWORD_PREFIX) and len(text) > len(SUBWORD_PREFIX):
        text = text[len(SUBWORD_PREFIX):]
    text = unicodedata.normalize("NFC", text)  # uncased BERT splits Hangul into jamo; recompose
    text = standalone_jamo(text)
    if not text:
        text = "␣" if raw.strip(" Ġ▁") == "" else raw
    return SUBWORD_PREFIX + text if subword else text


def is_punctuation(token: str) -> bool:
    """A token made only of punctuation (a "##" continuation marker aside): "." "," "?!" "。"."""
    text = token.removeprefix(SUBWORD_PREFIX)
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def subword_flags(word_ids: list[int | None] | None, raw_tokens: list[str], special: list[bool]) -> list[bool]:
    """True where a token continues the word of the token before it.

    Uses the fast tokenizer's word_ids() when available, else the vocabulary markers."""
    flags = []
    for i, raw in enumerate(raw_tokens):
        if special[i] or i == 0:
            flags.append(False)
        elif word_ids is not None:
            flags.append(word_ids[i] is not None and word_ids[i] == word_ids[i - 1])
        elif raw.startswith(SUBWORD_PREFIX):
            flags.append(True)
        else:
            marked = any(m in "".join(raw_tokens) for m in _MARKERS)
            flags.append(not raw.startswith(_MARKERS) and not special[i - 1] and marked)
    return flags


@functools.lru_cache(maxsize=1)
def _jamo_table() -> dict[int, str]:
    """Conjoining Hangul jamo (U+1100–U+11FF, which only render inside a syllable) -> the compatibility
    jamo that stand alone (ㄴ, ㅏ), matched by their Unicode names."""
    table = {}
    for code in range(0x1100, 0x1200):
        name = unicodedata.name(chr(code), "")
        for kind in ("HANGUL CHOSEONG ", "HANGUL JUNGSEONG ", "HANGUL JONGSEONG "):
            if name.startswith(kind):
                try:
                    table[code] = unicodedata.lookup("HANGUL LETTER " + name[len(kind):])
                except KeyError:
                    pass
    return table


def standalone_jamo(text: str) -> str:
    """Jamo that did not recompose into a syllable (an uncased tokenizer split the word), shown as the
    letters a reader knows: "ᄂ" -> "ㄴ", "ᅡ" -> "ㅏ"."""
    if not any(0x1100 <= ord(c) < 0x1200 for c in text):
        return text
    return text.translate(_jamo_table())
