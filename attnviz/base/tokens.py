"""Readable token strings, from what a tokenizer gives. Pure Python: no torch, no transformers."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnviz.base.text import visible
from attnviz.errors import InputError

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
        text = _whitespace_label(decoded if decoded is not None else raw)
    return SUBWORD_PREFIX + text if subword else text


def _whitespace_label(text: str) -> str:
    """A token that is only white space, made visible: "\\n" for a newline, "\\t" for a tab, ␣ for a space."""
    text = text.replace("Ġ", " ").replace("▁", " ").replace("Ċ", "\n").replace("ĉ", "\t")
    shown = "".join("\\n" if c == "\n" else "\\t" if c == "\t" else "\\r" if c == "\r" else "␣" if c.isspace() else c
                    for c in text)
    return shown.strip() or "␣"


def readable_tokens(raw: Sequence[str], decoded: Sequence[str | None], sources: Sequence[str | None],
                    special: Sequence[bool], subword: Sequence[bool]) -> list[str]:
    """readable_token for each token of one text, then the pieces of a character split across tokens (a
    byte-level BPE splits a Hangul syllable's three UTF-8 bytes) labelled by that character and which piece
    each is: 나(1/3) ##나(2/3) ##나(3/3), never as mojibake (ë, Ĥ)."""
    tokens = [readable_token(r, d, t, special=s, subword=w)
              for r, d, t, s, w in zip(raw, decoded, sources, special, subword)]
    for n, label in split_character_labels(raw, special, decoded).items():
        tokens[n] = SUBWORD_PREFIX + label if subword[n] else label
    return tokens


@functools.lru_cache(maxsize=1)
def _byte_table() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's bytes_to_unicode), inverted: "Ġ" -> 0x20."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


def fallback_byte(raw: str) -> bytes | None:
    """A SentencePiece byte-fallback piece ("<0xEB>") as its byte, else None."""
    if len(raw) == 6 and raw.startswith("<0x") and raw.endswith(">"):
        try:
            return bytes([int(raw[3:5], 16)])
        except ValueError:
            return None
    return None


def token_bytes(raw: str) -> bytes | None:
    """The bytes a vocabulary string stands for, read as byte-level BPE writes them ("ëĤĺ" -> b"\xeb\x82\x98")
    or as a byte-fallback piece ("<0xEB>"); None when it is neither. Only for byte-level tokenizers: a
    WordPiece or SentencePiece piece "é" is the character é, not the byte 0xE9."""
    fallback = fallback_byte(raw)
    if fallback is not None:
        return fallback
    table = _byte_table()
    if not raw or any(c not in table for c in raw):
        return None
    return bytes(table[c] for c in raw)


def _utf8_length(lead: int) -> int:
    return 1 if lead < 0x80 else 2 if lead >> 5 == 0x6 else 3 if lead >> 4 == 0xE else 4 if lead >> 3 == 0x1E else 0


def split_character_labels(raw: Sequence[str], special: Sequence[bool],
                           decoded: Sequence[str | None] | None = None) -> dict[int, str]:
    """{token index: label} for the tokens that hold part of a character whose bytes are spread over several
    tokens. Whole characters inside such a token stay as they are; a split one reads char(k/n), the k-th of
    the n tokens it is spread over; a stray byte that is no character reads \\xEB.

    Tokens are read as bytes only where the tokenizer is byte-level — some token decodes to U+FFFD (part of a
    character) and is no byte-fallback piece — or where they are byte-fallback pieces ("<0xEB>"); the pieces
    of other tokenizers are text. Without `decoded` the vocabulary strings alone decide."""
    byte_level = decoded is None or any(
        d is not None and "\ufffd" in d and fallback_byte(r) is None and token_bytes(r) is not None
        for r, d, s in zip(raw, decoded, special) if not s)
    pieces = [None if s else (token_bytes(r) if byte_level else fallback_byte(r)) for r, s in zip(raw, special)]
    labels: dict[int, str] = {}
    n = 0
    while n < len(pieces):
        if pieces[n] is None:
            n += 1
            continue
        run_end = n
        while run_end < len(pieces) and pieces[run_end] is not None:
            run_end += 1
        owner: list[int] = []  # byte -> token of the run
        stream = b""
        for t in range(n, run_end):
            stream += pieces[t] or b""
            owner += [t] * len(pieces[t] or b"")
        chars: list[tuple[str, list[int]]] = []  # (character, the tokens it spans)
        i = 0
        while i < len(stream):
            size = _utf8_length(stream[i])
            chunk = stream[i:i + size]
            try:
                char = chunk.decode("utf-8") if size else None
            except UnicodeDecodeError:
                char = None
            if char is None:
                char, size = f"\\x{stream[i]:02X}", 1
            chars.append((char, sorted(set(owner[i:i + size]))))
            i += size
        split_tokens = {t for _, owners in chars if len(owners) > 1 for t in owners}
        split_tokens |= {owners[0] for char, owners in chars if char.startswith("\\x")}
        for t in sorted(split_tokens):
            text = ""
            for char, owners in chars:
                if t not in owners:
                    continue
                if len(owners) > 1:
                    text += f"{char}({owners.index(t) + 1}/{len(owners)})"
                else:
                    text += "\\n" if char == "\n" else char
            labels[t] = text.strip() or "␣"
        n = run_end
    return labels


def vocabulary_label(tok, token_id: int) -> str:
    """One token of the vocabulary shown alone (the tokens a head raises, a model's prediction): what it decodes
    to, control characters made visible; a token that holds part of a character shows its bytes as the token
    labels do, \\xEB for each byte that makes no character alone (decoding gives only U+FFFD)."""
    decoded = tok.decode([token_id])
    if "\ufffd" in decoded:
        raw = tok.convert_ids_to_tokens(token_id)
        label = split_character_labels([raw], [False], [decoded]).get(0) if isinstance(raw, str) else None
        if label:
            return label
    return visible(decoded)


def is_punctuation(token: str) -> bool:
    """A token made only of punctuation (a "##" continuation marker aside): "." "," "?!" "。"."""
    text = token.removeprefix(SUBWORD_PREFIX)
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def _ends_in_space(raw: str) -> bool:
    """A vocabulary string that ends in white space: a line break or tab ("Ċ", "ĊĊ", "<0x0A>", "▁"), so that the
    token after it begins a word though it carries no space marker of its own."""
    if raw.endswith(("Ċ", "ĉ", "Ġ", "▁", "\n", "\t", " ")):
        return True
    found = fallback_byte(raw)
    return found is not None and found.isspace()


def subword_flags(word_ids: list[int | None] | None, raw_tokens: list[str], special: list[bool]) -> list[bool]:
    """True where a token continues the word of the token before it.

    Uses the fast tokenizer's word_ids() when available, else the vocabulary markers; a token that begins with
    a space marker (Ġ, ▁) begins a word either way (a tokenizer without a pre-tokenizer that splits words, as
    Gemma's read from a GGUF file, gives every token the same word id)."""
    flags = []
    for i, raw in enumerate(raw_tokens):
        if special[i] or i == 0:
            flags.append(False)
        elif raw.startswith(_MARKERS[:2]) or _ends_in_space(raw_tokens[i - 1]):  # after a line break: a new word
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


# --- what a tokenizer says of each token (duck-typed: any Hugging Face tokenizer; no transformers import) ---


def special_ids(tok) -> set[int]:
    """The ids that are special tokens ([CLS], [SEP], <s>, [PAD], [MASK], ...), whatever the text: typed
    "[SEP]" is as special as the one the tokenizer adds. The unknown-word token is content (it stands for
    a word), unless it doubles as a structural token (GPT-2's <|endoftext|>)."""
    ids = {int(i) for i in getattr(tok, "all_special_ids", []) or []}
    unk = getattr(tok, "unk_token_id", None)
    structural = {getattr(tok, f"{name}_token_id", None) for name in ("bos", "eos", "cls", "sep", "pad")}
    if unk is not None and unk not in structural:
        ids.discard(int(unk))
    return ids


def special_kind(tok, token_id: int, position: int, special: bool) -> str:
    """"start" ([CLS]/BOS), "end" ([SEP]/EOS), "other" for the other special tokens, "" for content."""
    if not special:
        return ""
    start = {getattr(tok, "cls_token_id", None), getattr(tok, "bos_token_id", None)} - {None}
    end = {getattr(tok, "sep_token_id", None), getattr(tok, "eos_token_id", None)} - {None}
    if token_id in start and (position == 0 or token_id not in end):
        return "start"
    if token_id in end:
        return "end"
    return "other"


@dataclass
class Described:
    """What attnviz knows of each token of one tokenised text besides its id."""

    tokens: list[str]  # readable
    special: list[bool]
    kinds: list[str]  # "" | "start" | "end" | "other"
    subword: list[bool]


def describe_tokens(tok, text: str, ids: list[int], added: list[int], offsets: list, word_ids: list | None,
                    decode: Callable[[int], str] | None = None) -> Described:
    """Readable tokens, special flags and kinds, subword flags of one tokenised text, the same for a text run
    alone (encode) and in a batch (attnviz corpus). `added`: the tokenizer's special-tokens mask; `decode`:
    id -> tokenizer.decode([id]) (a cache, for many texts). InputError when every token is special."""
    decode = decode or (lambda i: tok.decode([i]))
    marked = special_ids(tok)
    special = [bool(a) or i in marked for i, a in zip(ids, added)]
    if all(special):
        raise InputError("the text has no tokens besides special ones: give a sentence to look at")
    raw = tok.convert_ids_to_tokens(ids)
    subword = subword_flags(word_ids, raw, special)
    tokens = readable_tokens(raw, [decode(i) for i in ids], [text[o[0]:o[1]] if o else None for o in offsets],
                             special, subword)
    kinds = [special_kind(tok, i, pos, s) for pos, (i, s) in enumerate(zip(ids, special))]
    return Described(tokens, special, kinds, subword)
