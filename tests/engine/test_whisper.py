"""Whisper tiny.en offline from CTranslate2's format: the model.bin reader on files made here (every length
checked, a damaged or forged file one line), and the conversion into transformers' Whisper checked against
CTranslate2 running the original file on speech made by espeak-ng: the same transcript, encoder states and
logits within 1e-4 of their size (both float32 on the same float16 weights, summed in other orders)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers import espeak, one_line_error, require_real, run

from attnviz.engine import offline
from attnviz.engine.offline import ct2
from attnviz.errors import ModelLoadError


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_file(variables: dict, aliases: dict | None = None, *, version: int = 6, spec: str = "WhisperSpec") -> bytes:
    """A CTranslate2 model.bin as CTranslate2 writes it."""
    codes = {np.dtype(v).name: k for k, v in ct2.DTYPES.items()}
    out = [struct.pack("<I", version), _string(spec), struct.pack("<II", 3, len(variables))]  # joined once at the end
    for name, value in variables.items():
        value = np.asarray(value)
        out += [_string(name), struct.pack("<B", value.ndim), *(struct.pack("<I", d) for d in value.shape),
                struct.pack("<BI", codes[value.dtype.name], value.nbytes), value.tobytes()]
    aliases = aliases or {}
    out += [struct.pack("<I", len(aliases)), *(_string(a) + _string(b) for a, b in aliases.items())]
    return b"".join(out)


def test_the_reader_gives_back_what_was_written(tmp_path):
    weight = np.arange(12, dtype=np.float16).reshape(3, 4)
    path = tmp_path / "model.bin"
    path.write_bytes(ct2_file({"a/weight": weight, "a/num_heads": np.array(6, np.int16),
                               "b": np.array([1.5, -2.0], np.float32)}, {"c/weight": "a/weight"}))
    model = ct2.read(path)
    assert model.spec == "WhisperSpec" and model.revision == 3 and model.scalar("a/num_heads") == 6
    np.testing.assert_array_equal(model.get("a/weight"), weight)
    np.testing.assert_array_equal(model.get("c/weight"), weight)
    assert model.get("b").dtype == np.float32


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:-7], "ends early"),
    (lambda b: b[:30], "ends early"),
    (lambda b: struct.pack("<I", 9) + b[4:], "format version 9"),
    (lambda b: b[:22] + struct.pack("<I", 10**7) + b[26:], "declares 10,000,000 variables"),  # after the revision
    (lambda b: b"", "cannot read"),
])
def test_a_damaged_or_forged_file_is_one_line(tmp_path, damage, words):
    good = ct2_file({"w": np.zeros((2, 2), np.float32)})
    path = tmp_path / "model.bin"
    path.write_bytes(damage(good))
    with pytest.raises(ModelLoadError, match=words) as raised:
        ct2.read(path)
    assert "\n" not in str(raised.value)


def test_sizes_types_and_aliases_are_checked(tmp_path):
    good = ct2_file({"w": np.zeros((2, 2), np.float32)})
    at = good.index(b"w\0") + 2  # rank, dims, dtype code, byte count
    lying = good[:at + 10] + struct.pack("<I", 12) + good[at + 14:]
    unknown = good[:at + 9] + struct.pack("<B", 9) + good[at + 10:]
    for content, words in ((lying, "declares 12"), (unknown, "code 9")):
        path = tmp_path / "model.bin"
        path.write_bytes(content)
        with pytest.raises(ModelLoadError, match=words):
            ct2.read(path)
    path = tmp_path / "alias.bin"
    path.write_bytes(ct2_file({"w": np.zeros(2, np.float32)}, {"x": "missing"}))
    with pytest.raises(ModelLoadError, match="not there"):
        ct2.read(path)


def test_a_speech_model_is_refused_in_one_line_by_the_commands(tmp_path):
    require_real(offline.WHISPER)
    assert "speech model" in one_line_error(run("heatmap", "hello", "-m", "whisper"))


def _speech(tmp_path, text: str):
    """16 kHz mono float32 of espeak-ng speaking `text` (resampled linearly from its 22,050 Hz)."""
    import soundfile

    path = espeak(tmp_path, text)
    sound, rate = soundfile.read(path, dtype="float32")
    n = int(len(sound) * 16000 / rate)
    return np.interp(np.linspace(0, len(sound), n, endpoint=False), np.arange(len(sound)), sound).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("sentence", ["The quick brown fox jumps over the lazy dog.",
                                      "Attention weights tell us where each token looks."])
def test_the_conversion_writes_what_ctranslate2_writes(tmp_path, sentence):
    """Greedy decoding from <|startoftranscript|><|notimestamps|>, no tokens suppressed, on both: the same
    transcript token for token; the encoder's states and every step's logits within 1e-4 of their size."""
    require_real(offline.WHISPER)
    ctranslate2 = pytest.importorskip("ctranslate2")
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    from attnviz.engine.offline.build import folder_for

    folder = folder_for(offline.WHISPER)
    model = WhisperForConditionalGeneration.from_pretrained(folder, attn_implementation="eager").eval()
    features = WhisperFeatureExtractor.from_pretrained(folder)(_speech(tmp_path, sentence), sampling_rate=16000,
                                                               return_tensors="np").input_features
    start = [50257, 50362]
    ours = list(start)
    with torch.inference_mode():
        encoded = model.model.encoder(torch.from_numpy(features)).last_hidden_state
        for _ in range(60):
            step = model(encoder_outputs=(encoded,), decoder_input_ids=torch.tensor([ours])).logits[0, -1]
            ours.append(int(step.argmax()))
            if ours[-1] == 50256:
                break
        logits = model(encoder_outputs=(encoded,), decoder_input_ids=torch.tensor([ours[:-1]])).logits[0, 1:]
    reference = ctranslate2.models.Whisper(str(offline.sources(offline.WHISPER)[0].parent), device="cpu",
                                           compute_type="float32")
    view = ctranslate2.StorageView.from_array(features)
    result = reference.generate(view, [start], beam_size=1, suppress_blank=False, suppress_tokens=[],
                                return_logits_vocab=True)[0]
    assert ours[2:-1] == result.sequences_ids[0] and len(ours) > 6
    theirs = np.stack([np.asarray(step) for step in result.logits[0]])  # (steps, V): the raw logits
    assert theirs.shape == tuple(logits.shape)
    assert np.abs(theirs - logits.numpy()).max() <= 1e-4 * np.abs(theirs).max()
    states = np.asarray(reference.encode(view, to_cpu=True))
    assert np.abs(states - encoded.numpy()).max() <= 1e-4 * np.abs(states).max()


# --- a CTranslate2 Whisper that lies: one line, before any model is built from it --------------------------------


@pytest.fixture(scope="module")
def whisper_files():
    """The real Whisper tiny.en's variables, config and tokenizer, to be damaged one way at a time."""
    require_real(offline.WHISPER)
    import json

    model_bin, config_json, tokenizer_json = offline.sources(offline.WHISPER)
    return (ct2.read(model_bin).variables, json.loads(config_json.read_text(encoding="utf-8")),
            tokenizer_json.read_bytes())


def forged(variables, config, tokenizer, tmp_path, *, changes=None, config_changes=None, tokenizer_bytes=None):
    import json

    from attnviz.engine.offline.build import build_ct2_whisper

    values = dict(variables)
    values.update(changes or {})
    (tmp_path / "model.bin").write_bytes(ct2_file(values))
    (tmp_path / "config.json").write_text(json.dumps({**config, **(config_changes or {})}), encoding="utf-8")
    (tmp_path / "tokenizer.json").write_bytes(tokenizer if tokenizer_bytes is None else tokenizer_bytes)
    out = tmp_path / "out"
    out.mkdir()
    return lambda: build_ct2_whisper(out, tmp_path / "model.bin", tmp_path / "config.json", tmp_path / "tokenizer.json")


@pytest.mark.parametrize("changes, config_changes, tokenizer_bytes, words", [
    ({"decoder/embeddings/weight": np.zeros((0, 12288), np.float16)}, None, None, "vocab 0"),
    ({"decoder/embeddings/weight": np.zeros((4, 384), np.float16)}, {"suppress_ids": [], "suppress_ids_begin": []},
     None, "vocabulary of 4 tokens"),
    ({"encoder/conv1/weight": np.zeros((384, 80, 5), np.float16)}, None, None, "make it (384, 80, 3)"),
    ({"encoder/layer_0/ffn/linear_0/weight": np.zeros((40000, 0), np.float16)}, None, None, "ffn 40,000"),
    ({"encoder/num_heads": np.array(0, np.int16)}, None, None, "0 encoder heads"),
    ({"decoder/num_heads": np.array(7, np.int16)}, None, None, "7 decoder heads"),
    ({"encoder/position_encodings/encodings": np.zeros((0, 384), np.float16)}, None, None, "positions 0"),
    (None, {"alignment_heads": [[1.5, 2]]}, None, "alignment_heads is not a list of [layer, head] pairs"),
    (None, {"alignment_heads": [[99, 0]]}, None, "within the decoder's 4 layers"),
    (None, {"suppress_ids": [-1, "x"]}, None, "suppress_ids is not a list of token ids"),
    (None, None, b'{"model": {"type": "BPE", "vocab": 5}}', "not a tokenizer attnviz can read"),
])
@pytest.mark.slow
def test_a_whisper_file_that_lies_is_one_line_before_a_model_is_built(whisper_files, tmp_path, monkeypatch, changes,
                                                                      config_changes, tokenizer_bytes, words):
    """Zero-size tensors that declare a d_model of 12,288 or an FFN of 40,000, 0 or 7 heads, alignment heads that
    are not whole numbers or not in the model, a tokenizer.json that is not one: each a ModelLoadError of one
    line; a forged size is refused before any model is built from it (building one here fails the test)."""
    import transformers

    build = forged(*whisper_files, tmp_path, changes=changes, config_changes=config_changes,
                   tokenizer_bytes=tokenizer_bytes)
    real = transformers.WhisperForConditionalGeneration
    if tokenizer_bytes is None and "alignment_heads" not in (config_changes or {}):  # a forged size: no model
        # of it may be allocated
        class Refused(real):
            def __init__(self, *args, **kwargs):
                import torch

                assert torch.get_default_device().type == "meta", "a model was built from forged sizes"
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(transformers, "WhisperForConditionalGeneration", Refused)
    with pytest.raises(ModelLoadError) as caught:
        build()
    assert words in str(caught.value) and "\n" not in str(caught.value)
