"""Readable tokens: markers translated, sub-words visible, specials untouched."""

from attnviz.tokens import readable_token, subword_flags


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
