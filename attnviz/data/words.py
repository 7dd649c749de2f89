"""Attention between words instead of sub-word tokens, after Clark et al. 2019 ("What does BERT look at?"):
attention *to* a word is the sum over its pieces, attention *from* a word is the mean over its pieces, so
every row still sums to 1. Special tokens stay single and punctuation is a word of its own. Words are
contiguous runs of tokens, so this is pooling with word-sized blocks. numpy only.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from typing import overload

import numpy as np

from attnviz.base.blocks import pool_blocks
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.data.sides import Side
from attnviz.base.tokens import is_punctuation


def word_edges(tokens: Sequence[str], subword: Sequence[bool] | np.ndarray, special: Sequence[bool] | np.ndarray,
               generated: Sequence[bool] | np.ndarray | None = None) -> np.ndarray:
    """Where each word starts (and T at the end): a token starts a word unless it continues the token
    before it; special tokens and punctuation are words of their own, and the first generated token starts
    a word (no word spans prompt and generated text). (W + 1,)"""
    starts = []
    for i, token in enumerate(tokens):
        alone = special[i] or is_punctuation(token)
        before_alone = i > 0 and (special[i - 1] or is_punctuation(tokens[i - 1]))
        turn = generated is not None and i > 0 and bool(generated[i]) != bool(generated[i - 1])
        if i == 0 or not subword[i] or alone or before_alone or turn:
            starts.append(i)
    return np.array([*starts, len(tokens)], dtype=np.int64)


def word_labels(tokens: Sequence[str], edges: np.ndarray, offsets: np.ndarray | None, text: str | None,
                special: Sequence[bool] | np.ndarray, unknown: Sequence[bool] | np.ndarray | None = None) -> list[str]:
    """Each word as the user wrote it: its span of the text (from the token offsets) when known, else its
    pieces joined (Hangul jamo recomposed); special tokens as they are. A word with a piece the model could
    not read (`unknown`) says so as the token level does: [UNK:먹었다], or 🍕x [UNK:🍕] when only part of it."""
    labels = []
    for start, stop in zip(edges[:-1], edges[1:]):
        if unknown is not None and not special[start] and any(unknown[start:stop]):
            labels.append(_unknown_word(tokens[start:stop], unknown[start:stop],
                                        word_labels(tokens, np.array([start, stop]), offsets, text, special)[0]))
            continue
        if special[start]:
            labels.append(tokens[start])
            continue
        span = None
        if offsets is not None and text:
            spans = [tuple(offsets[i]) for i in range(start, stop) if offsets[i][1] > offsets[i][0]]
            if spans:
                span = text[min(a for a, _ in spans):max(b for _, b in spans)]
        if span and span.strip():
            labels.append(span.strip())
        else:
            joined = "".join(t.removeprefix("##") for t in tokens[start:stop])
            labels.append(unicodedata.normalize("NFC", joined))
    return labels


def _unknown_word(pieces: Sequence[str], unknown: Sequence[bool] | np.ndarray, word: str) -> str:
    """The label of a word holding unknown pieces, from the token labels ("[UNK:🍕]")."""
    marks = [p.removeprefix("##") for p, u in zip(pieces, unknown) if u]
    base = marks[0].split(":", 1)[0] if ":" in marks[0] else "[UNK"
    if all(unknown):
        return f"{base}:{word}]"
    lost = "".join(m.split(":", 1)[1][:-1] if ":" in m else "" for m in marks)
    return f"{word} {base}:{lost}]" if lost else f"{word} {base}]"


@overload
def to_words(capture: Capture) -> Capture: ...
@overload
def to_words(capture: Parts) -> Parts: ...


def to_words(capture: Capture | Parts) -> Capture | Parts:
    """The same attention between words: a capture whose tokens are words and α is (L, H, W, W) (to a word,
    the sum over its pieces; from a word, their mean: Clark et al. 2019). Of Parts, every part."""
    if isinstance(capture, Parts):
        return Parts({name: to_words(c) for name, c in capture.captures.items()})
    if capture.meta.get("level") == "word":
        return capture
    if capture.pooled:
        from attnviz.errors import InputError, arg

        raise InputError("this capture is pooled into blocks of tokens; word-level attention needs the tokens: "
                         f"run the text again with {arg('words')}")
    edges = word_edges(capture.tokens, capture.subword, capture.special, capture.generated)
    offsets = capture.offsets
    unk = capture.meta.get("unk_token_id")
    unknown = (capture.token_ids == unk) & ~capture.special if isinstance(unk, int) else None
    labels = word_labels(capture.tokens, edges, offsets, capture.meta.get("text"), capture.special, unknown)
    starts = edges[:-1]
    keys, key_edges = capture.keys, None
    if keys is not None:  # cross-attention: the source's words along the columns
        key_edges = word_edges(keys.tokens, keys.subword, keys.special)
        key_starts = key_edges[:-1]
        keys = Side(tuple(word_labels(keys.tokens, key_edges, keys.offsets, capture.meta.get("source_text"),
                                      keys.special)),
                    keys.token_ids[key_starts], keys.special[key_starts],
                    tuple(keys.special_kind[s] for s in key_starts), np.zeros(len(key_starts), bool))
    words = replace(
        capture,
        keys=keys,
        attentions=pool_blocks(capture.attentions, edges, key_edges),  # (L, H, W, W')
        tokens=tuple(labels),
        token_ids=capture.token_ids[starts],
        special=capture.special[starts],
        special_kind=tuple(capture.special_kind[s] for s in starts),
        subword=np.zeros(len(starts), bool),
        meta={**capture.meta, "level": "word", "pieces": int(capture.n_tokens)},
        offsets=None,
        generated=None if capture.generated is None else capture.generated[starts],
    )
    return words.validate()
