"""Readable tokens: markers translated, sub-words visible, specials untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_capture, run

from attnviz.data.capture import Capture
from attnviz.base.text import visible
from attnviz.base.tokens import readable_token, subword_flags


def test_wordpiece_bpe_and_sentencepiece_markers():
    assert readable_token("##ization", "##ization", "ization", special=False, subword=True) == "##ization"
    assert readable_token("Ġcat", " cat", " cat", special=False, subword=False) == "cat"
    assert readable_token("▁cat", "cat", "cat", special=False, subword=False) == "cat"
    assert readable_token("bel", "bel", "bel", special=False, subword=True) == "##bel"
    assert readable_token("[CLS]", "[CLS]", "", special=True, subword=False) == "[CLS]"


def test_partial_utf8_byte_tokens_fall_back_to_source_text():
    assert readable_token("ëĤĺ", "\ufffd", "나", special=False, subword=False) == "나"


def test_hangul_jamo_are_recomposed_and_space_tokens_visible():
    assert readable_token("ᄂ", "ᄂ" + "ᅡ", None, special=False, subword=False) == "나"
    assert readable_token("Ġ", " ", " ", special=False, subword=False) == "␣"


def test_subword_flags_from_word_ids_and_from_markers():
    raw = ["[CLS]", "un", "##bel", "works", "[SEP]"]
    special = [True, False, False, False, True]
    assert subword_flags([None, 0, 0, 1, None], raw, special) == [False, False, True, False, False]
    assert subword_flags(None, raw, special) == [False, False, True, False, False]
    bpe = ["The", "Ġun", "bel", "Ġworks"]
    assert subword_flags(None, bpe, [False] * 4) == [False, False, True, False]


@pytest.mark.parametrize("stream", [[], ["--stream"]])
def test_unknown_words_are_marked_at_word_level_too(tiny_model_dir, stream):
    data = json.loads(run("heads", "나는 사과를 🍕 먹었다", "-m", tiny_model_dir("bert"), "--words", "--json",
                          *stream).stdout)
    result = run("heatmap", "나는 사과를 🍕 먹었다", "-m", tiny_model_dir("bert"), "--words", "-t", *stream,
                 env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0 and data
    assert "[UNK:🍕]" in result.stdout and "[UNK:먹었다]" in result.stdout


def test_partly_unknown_words_say_which_part():
    from attnviz.data.words import to_words

    alpha = np.full((1, 1, 4, 4), 0.25, np.float32)
    capture = make_capture(alpha, ["[CLS]", "ab", "##[UNK:🍕]", "[SEP]"], special=[True, False, False, True],
                           kinds=["start", "", "", "end"])
    capture = Capture(**{**capture.__dict__, "subword": np.array([False, False, True, False]),
                         "token_ids": np.array([0, 5, 9, 1])}).with_meta(unk_token_id=9, text="ab🍕")
    words = to_words(capture)
    assert words.tokens[1].endswith("[UNK:🍕]") and words.tokens[1].startswith("ab")


def test_unknown_words_are_labelled_and_warned(load_tiny):
    """A word the vocabulary cannot spell becomes [UNK], labelled with what it stood for, at its place, and the
    warning says which words and which model reads them."""
    from attnviz.engine.forward import encode
    from attnviz.errors import AttnvizWarning

    loaded = load_tiny("bert")
    with pytest.warns(AttnvizWarning, match=r"1 of 3 words became \[UNK\] \(🍕\).*multilingual"):
        encoded = encode(loaded, "the 🍕 cat")
    assert list(encoded.tokens) == ["[CLS]", "the", "[UNK:🍕]", "cat", "[SEP]"]
    assert encoded.token_ids[2] == loaded.tokenizer.unk_token_id


def test_a_vocabulary_token_that_holds_part_of_a_character_shows_its_bytes():
    """Shown alone (what a head raises or lowers), a token that decodes to U+FFFD reads as its bytes, \\xEB each,
    the bytes byte-level BPE writes it as (token_bytes); a whole token reads as it decodes, controls visible."""
    import re

    from helpers import bpe_tokenizer

    from attnviz.base.tokens import token_bytes, vocabulary_label

    tok = bpe_tokenizer("bytelevel")
    stray = 0
    for i in range(len(tok)):
        decoded = tok.decode([i])
        label = vocabulary_label(tok, i)
        assert "\ufffd" not in label
        if "\ufffd" in decoded and re.fullmatch(r"(\\x[0-9A-F]{2})+", label):
            assert bytes.fromhex(label.replace("\\x", "")) == token_bytes(tok.convert_ids_to_tokens(i))
            stray += 1
        elif "\ufffd" not in decoded:
            assert label == visible(decoded)
    assert stray >= 64  # every byte from 0x80 on is a token of its own here
    newline = tok.convert_tokens_to_ids("Ċ")
    assert vocabulary_label(tok, newline) == "␊"


def test_a_token_after_a_line_break_begins_a_word():
    """SmolLM2 wrote " Paris.\\n\\nThe answer": "The" after the line breaks carries no space marker and was labelled
    ##The (a piece of the word before); a line break ends the word, byte-level ("Ċ") or byte-fallback ("<0x0A>")."""
    from attnviz.base.tokens import subword_flags

    raw = ["The", "Ġcapital", "ĠParis", ".", "Ċ", "Ċ", "The", "Ġanswer", "<0x0A>", "Hello", "ing"]
    flags = subword_flags(None, raw, [False] * len(raw))
    assert flags[6] is False and flags[9] is False  # after "Ċ" and after "<0x0A>": new words
    assert flags[3] is True and flags[10] is True  # "." and "ing" still continue the word before them
