"""Whisper on sound: the sound reader (limits, hostile files, resampling checked against the signal), the
capture (rows sum to 1, tokens and frames line up with α, the silence folded exactly), verify within 1e-5,
word timings checked against faster-whisper's word_timestamps within 0.1 s (ALIGNMENT_TOLERANCE) on
espeak-ng speech, DTW and the median filter against independent computations, and every command's path."""

from __future__ import annotations

import io
import json
import os
import wave

import numpy as np
import pytest
from helpers import espeak, one_line_error, require_real, run

import attnviz
from attnviz.data.sound import MAX_SECONDS, RATE, read_sound, resample
from attnviz.engine import offline
from attnviz.errors import CaptureFormatError, InputError
from attnviz.metrics.timing import dtw, median_filter

SENTENCE = "The quick brown fox jumps over the lazy dog."


def wav(samples: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> bytes:
    """PCM WAV written with the standard library (an independent writer)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


# --- the sound reader --------------------------------------------------------------------------------------


def test_resampling_keeps_a_tone_its_frequency_and_loudness():
    """A 440 Hz tone at 44.1 kHz resampled to 16 kHz: the same tone, sample for sample (a band-limited
    resampler is exact for a tone whole periods long)."""
    rate, seconds = 44_100, 1.0
    t = np.arange(int(rate * seconds)) / rate
    out = resample(np.sin(2 * np.pi * 440 * t), rate, RATE)
    expected = np.sin(2 * np.pi * 440 * np.arange(len(out)) / RATE)
    assert len(out) == RATE and np.abs(out - expected).max() < 1e-6


def test_a_tone_above_the_new_nyquist_limit_is_removed_not_folded():
    rate = 48_000
    t = np.arange(rate) / rate
    out = resample(np.sin(2 * np.pi * 11_000 * t), rate, RATE)  # above 8 kHz: nothing may remain
    assert np.abs(out).max() < 1e-6


def test_stereo_is_mixed_and_the_file_rate_kept():
    left = np.sin(2 * np.pi * 300 * np.arange(16_000) / 16_000) * 0.5
    both = np.stack([left, -left], axis=1).reshape(-1)  # interleaved: the mix is silence
    samples, rate, channels = read_sound(wav(both, 16_000, channels=2), "stereo")
    assert (rate, channels) == (16_000, 2) and np.abs(samples).max() < 1e-4


def test_flac_reads_like_wav(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    tone = 0.3 * np.sin(2 * np.pi * 200 * np.arange(8_000) / 8_000)
    path = tmp_path / "tone.flac"
    soundfile.write(path, tone, 8_000, format="FLAC")
    heard = attnviz.sound(path)
    expected = resample(np.asarray(soundfile.read(path)[0], np.float64), 8_000, RATE)
    assert heard.file_rate == 8_000 and len(heard.samples) == 16_000
    assert np.abs(heard.samples - expected).max() < 1e-6


@pytest.mark.parametrize("subtype, channels", [("PCM_24", 1), ("PCM_16", 3), ("FLOAT", 2)])
def test_wave_format_extensible_reads_like_wav(tmp_path, subtype, channels):
    """WAVE_FORMAT_EXTENSIBLE (what ffmpeg and many recorders write for 24-bit or multichannel sound) is WAV: read
    as its samples say, on the command line's path and the app's (bytes)."""
    soundfile = pytest.importorskip("soundfile")
    tone = 0.3 * np.sin(2 * np.pi * 200 * np.arange(8_000) / 8_000)
    path = tmp_path / "tone.wav"
    soundfile.write(path, np.stack([tone] * channels, axis=1), 8_000, format="WAVEX", subtype=subtype)
    assert soundfile.info(path).format == "WAVEX"
    heard, from_bytes = attnviz.sound(path), attnviz.sound(path.read_bytes())
    expected = resample(np.asarray(soundfile.read(path, always_2d=True)[0], np.float64).mean(axis=1), 8_000, RATE)
    assert heard.channels == channels and len(heard.samples) == 16_000
    assert np.abs(heard.samples - expected).max() < 1e-6 and np.array_equal(heard.samples, from_bytes.samples)


@pytest.mark.parametrize("make, words", [
    (lambda: b"", "empty"),
    (lambda: b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk", "not a WAV or FLAC"),
    (lambda: os.urandom(4096), "not a WAV or FLAC"),
    (lambda: wav(np.zeros(121 * 8_000), 8_000), "lasts 121.0 s"),
    (lambda: wav(np.zeros(1000), 500), "500 samples a second"),
    (lambda: wav(np.zeros(100), 16_000), "give at least"),
    (lambda: wav(np.zeros(9 * 1600), 16_000, channels=9), "9 channels"),
])
def test_a_bad_or_hostile_sound_is_one_line(make, words):
    with pytest.raises(InputError, match=words) as raised:
        attnviz.sound(make())
    assert "\n" not in str(raised.value)


def test_a_float_wav_holding_nan_is_refused(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    samples = np.zeros(16_000, np.float32)
    samples[100] = np.nan
    path = tmp_path / "nan.wav"
    soundfile.write(path, samples, 16_000, subtype="FLOAT")
    with pytest.raises(InputError, match="not finite"):
        attnviz.sound(path)


def test_an_array_is_samples_at_16_khz():
    heard = attnviz.sound(np.zeros(RATE, np.float32))
    assert heard.seconds == 1.0
    with pytest.raises(InputError, match="one channel"):
        attnviz.sound(np.zeros((2, RATE), np.float32))
    assert attnviz.sound(np.zeros(int(RATE * 31), np.float32)).seconds == 31.0  # read in two windows
    with pytest.raises(InputError, match=f"at most {MAX_SECONDS:g} s of sound"):
        attnviz.sound(np.zeros(int(RATE * (MAX_SECONDS + 1)), np.float32))


# --- DTW, the median filter and folding, against independent computations -------------------------------


def test_dtw_finds_the_cheapest_monotonic_path():
    """The path's cost equals the minimum over all monotonic paths, computed by a plain dynamic programme of
    costs alone; the path starts at (0, 0), ends at the corner and moves one step at a time."""
    rng = np.random.default_rng(0)
    for R, C in ((3, 7), (6, 40), (1, 5), (5, 5)):
        cost = rng.normal(size=(R, C))
        rows, cols = dtw(cost)
        best = np.full((R, C), np.inf)
        for i in range(R):
            for j in range(C):
                before = min([best[i - 1, j - 1] if i and j else np.inf, best[i - 1, j] if i else np.inf,
                              best[i, j - 1] if j else np.inf]) if i or j else 0.0
                best[i, j] = cost[i, j] + before
        assert (rows[0], cols[0], rows[-1], cols[-1]) == (0, 0, R - 1, C - 1)
        steps = np.stack([np.diff(rows), np.diff(cols)], axis=1)
        assert set(map(tuple, steps)) <= {(1, 1), (1, 0), (0, 1)}
        assert cost[rows, cols].sum() == pytest.approx(best[-1, -1], abs=1e-12)


def test_the_median_filter_is_the_median_of_each_reflected_window():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 20))
    padded = np.concatenate([x[:, 3:0:-1], x, x[:, -2:-5:-1]], axis=1)  # reflected by hand
    expected = np.stack([[np.median(padded[r, j:j + 7]) for j in range(20)] for r in range(3)])
    np.testing.assert_allclose(median_filter(x, 7), expected)


def test_folding_the_silence_keeps_every_row_of_weight():
    from attnviz.engine.speech import fold

    rng = np.random.default_rng(2)
    alpha = rng.random((2, 3, 50, 50))
    alpha /= alpha.sum(-1, keepdims=True)
    folded = fold(alpha, 20, rows=True)
    assert folded.shape == (2, 3, 21, 21)
    np.testing.assert_allclose(folded[..., :20, :20], alpha[..., :20, :20], atol=1e-7)
    np.testing.assert_allclose(folded[..., :20, 20], alpha[..., :20, 20:].sum(-1), atol=1e-6)
    np.testing.assert_allclose(folded[..., 20, :20], alpha[..., 20:, :20].mean(-2), atol=1e-7)
    np.testing.assert_allclose(folded.sum(-1), 1.0, atol=1e-6)
    assert fold(alpha, 50, rows=True).shape == alpha.shape  # 30 s of sound: nothing to fold


# --- the real model -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spoken(tmp_path_factory):
    require_real(offline.WHISPER)
    folder = tmp_path_factory.mktemp("speech")
    path = espeak(folder, SENTENCE)
    return path, attnviz.capture_audio(path)


@pytest.mark.slow
def test_the_capture_lines_up_with_the_sound(spoken):
    path, parts = spoken
    heard = attnviz.sound(path)
    N = len(heard.samples) // 320
    encoder, decoder, cross = (parts.part(n) for n in ("encoder", "decoder", "cross"))
    assert encoder.attentions.shape[2:] == (N + 1, N + 1) and cross.n_keys == N + 1
    assert encoder.tokens[:2] == ("0.00s", "0.02s") and encoder.tokens[-1] == "(silence)"
    assert cross.frames == N and cross.mel.shape == (80, 2 * N)
    np.testing.assert_array_equal(cross.sound, heard.samples)
    assert decoder.tokens[:2] == ("<|startoftranscript|>", "<|notimestamps|>")
    assert decoder.tokens == cross.tokens and decoder.n_tokens == len(decoder.token_ids)
    text = parts.transcript
    assert "quick brown" in text and "lazy dog" in text
    np.testing.assert_array_equal(parts.sound, heard.samples)  # what python.md promises
    assert parts.mel.shape == (80, 2 * N) and parts.mel is cross.mel and parts.source_text == heard.name
    for capture in (encoder, decoder, cross):
        np.testing.assert_allclose(capture.attentions.sum(-1), 1.0, atol=1e-5)
    assert cross.generated[2:].all() and not cross.generated[:2].any()


@pytest.mark.slow
def test_verify_recomputes_every_part_within_1e_5(spoken, tmp_path):
    path, parts = spoken
    checked = attnviz.verify(attnviz.sound(path))
    assert checked.passed and set(checked.checks) == {f"{n}: model vs scratch" for n in ("encoder", "decoder", "cross")}
    assert max(r.max_abs for rows in checked.checks.values() for r in rows) <= 1e-5
    saved = parts.save(tmp_path / "speech.npz")
    again = attnviz.verify(capture=saved)
    assert again.passed and "cross: saved vs model" in again.checks


@pytest.mark.slow
def test_the_capture_file_round_trips_and_a_forged_one_is_refused(spoken, tmp_path):
    _, parts = spoken
    path = parts.save(tmp_path / "speech.npz")
    back = attnviz.load_capture(path)
    np.testing.assert_array_equal(back.part("cross").sound, parts.part("cross").sound)
    np.testing.assert_array_equal(back.part("encoder").attentions, parts.part("encoder").attentions)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    for change, words in ((lambda a: a.update(sound=a["sound"][:-400]), "samples"),
                          (lambda a: a.update(mel=a["mel"][:, :-2]), "spectrogram"),
                          (lambda a: a.pop("mel"), "both")):
        forged = dict(arrays)
        change(forged)
        bad = tmp_path / "forged.npz"
        np.savez(bad, **forged)
        with pytest.raises(CaptureFormatError, match=words) as raised:
            attnviz.load_capture(bad)
        assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_word_timings_agree_with_faster_whisper_within_0_1_s(spoken):
    """faster-whisper's word_timestamps on the same weights (the original CTranslate2 file) and the same
    16-kHz samples; its transcript is given to align as the target, so both time the same words."""
    faster_whisper = pytest.importorskip("faster_whisper")
    path, _ = spoken
    heard = attnviz.sound(path)
    model = faster_whisper.WhisperModel(str(offline.sources(offline.WHISPER)[0].parent), device="cpu",
                                        compute_type="float32")
    segments, _ = model.transcribe(heard.samples, beam_size=1, word_timestamps=True, without_timestamps=True,
                                   vad_filter=False, condition_on_previous_text=False, temperature=0.0)
    theirs = [w for s in segments for w in s.words]
    text = "".join(w.word for w in theirs)
    ours = attnviz.align(heard, target=text)
    assert [w["word"] for w in ours.records()] == [w.word.strip() for w in theirs] and len(theirs) >= 8
    worst = max(max(abs(a["start"] - b.start), abs(a["end"] - b.end)) for a, b in zip(ours.records(), theirs))
    assert worst <= attnviz.ALIGNMENT_TOLERANCE, worst


@pytest.mark.slow
def test_the_listed_alignment_heads_are_the_ones_on_the_path(spoken):
    timings = attnviz.align(spoken[1])
    assert timings.listed and timings.model_heads
    records = timings.head_records()
    listed = [r["on_path"] for r in records if r["listed"]]
    others = [r["on_path"] for r in records if not r["listed"]]
    assert np.mean(listed) > 2 * np.mean(others)
    words = timings.records()
    assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(words, words[1:]))  # in order, not overlapping
    assert words[-1]["end"] <= spoken[1].meta["audio_seconds"] + 0.02


# --- the commands -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_commands_on_a_sound(spoken, tmp_path):
    path, parts = spoken
    N = parts.part("cross").frames
    picture = tmp_path / "cross.png"
    result = run("heatmap", "--audio", path, "-o", picture)
    assert result.exit_code == 0, result.output
    assert picture.stat().st_size > 10_000
    with open(path, "rb") as handle:
        result = run("heatmap", "--audio", "-", "--part", "encoder", "-t", "--layer", "0", input=handle.read())
    assert result.exit_code == 0 and "encoder self-attention" in result.stdout
    saved = tmp_path / "speech.npz"
    result = run("capture", "--audio", path, "-o", saved)
    assert result.exit_code == 0 and f"encoder 4×6×{N + 1}×{N + 1}" in result.stdout
    T = parts.part("cross").n_tokens
    assert f"cross 4×6×{T}×{N + 1}" in result.stdout
    for command in (("heatmap", "-t"), ("heads", "--part", "cross"), ("entropy",)):
        result = run(*command, "--from", saved)
        assert result.exit_code == 0, (command, result.output)
    assert "lazy" in run("heatmap", "-t", "--from", saved).stdout
    result = run("align", "--from", saved, "--json")
    data = json.loads(result.stdout)
    assert [w["word"] for w in data["words"]][-2:] == ["lazy", "dog."]
    assert run("align", "--audio", path, "--csv").stdout.splitlines()[0] == "word,start,end"
    result = run("align", "--from", saved, "-o", tmp_path / "align.png")
    assert result.exit_code == 0 and (tmp_path / "align.png").stat().st_size > 10_000
    result = run("verify", "--audio", path)
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_the_commands_refuse_what_does_not_fit_in_one_line(spoken, tmp_path):
    path, _ = spoken
    assert run("heatmap", "hello", "--audio", path).exit_code == 2
    broken = tmp_path / "broken.wav"
    broken.write_bytes(path.read_bytes()[:30])
    assert "broken.wav" in one_line_error(run("heatmap", "--audio", broken))
    assert "speech model" in one_line_error(run("heatmap", "hello", "-m", "whisper"))
    assert "not sound" in one_line_error(run("heatmap", "--audio", path, "-m", "minilm"))
    assert one_line_error(run("align", "--audio", path, "--heads", "9.9"), 2)
    assert run("align", "--audio", path, "--heads", "x").exit_code == 2
    assert run("align").exit_code == 2
    assert run("heatmap", "--audio", path, "--target", "the cat", "-n", "3").exit_code == 2
    refused = one_line_error(run("capture", "--audio", path, "--max-memory", "100M", "-o", tmp_path / "x.npz"))
    assert "1500 encoder positions" in refused and "--max-new-tokens" in refused and "shorten the text" not in refused
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.slow
def test_a_borrowed_whisper_comes_back_as_it_was(spoken):
    """A Whisper model object handed in (SDPA, training mode, a frozen embedding) is captured and aligned, and
    given back as it was."""
    import torch
    from transformers import AutoTokenizer, WhisperForConditionalGeneration

    from attnviz.engine.offline.build import folder_for

    folder = folder_for(offline.WHISPER)
    model = WhisperForConditionalGeneration.from_pretrained(folder, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.train()
    model.model.decoder.embed_tokens.weight.requires_grad_(False)
    before = [p.detach().clone() for p in model.parameters()][:3]
    with pytest.warns(attnviz.AttnvizWarning):
        timings = attnviz.align(spoken[0], model=model, tokenizer=tokenizer)
    assert len(timings.words) >= 8
    assert model.training and model.config._attn_implementation == "sdpa"
    assert not model.model.decoder.embed_tokens.weight.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_the_page_plays_the_sound_and_highlights_the_frames_of_a_token(browser, spoken, tmp_path):
    """The Sound tab in Chromium: the sound decodes (its duration is the sound's), choosing a token gives the
    cross-attention row of the step that wrote it (against the capture, within the 16-bit step), and the
    readout names it; no request leaves the file, no console error."""
    from helpers import Page, write_page

    _, parts = spoken
    cross = parts.part("cross")
    page = Page(browser, write_page(tmp_path, parts))
    assert page.js("document.getElementById('av-tab-sound').hidden") is False
    page.page.click("#av-tab-sound")
    page.page.wait_for_function("document.getElementById('av-sound').width > 0")
    page.page.wait_for_function("isFinite(document.getElementById('av-audio').duration)")
    duration = page.js("document.getElementById('av-audio').duration")
    assert duration == pytest.approx(len(cross.sound) / 16_000, abs=0.01)
    words = page.page.locator("#av-sound-tokens button")
    assert words.count() == cross.n_tokens - 1  # from the step of <|notimestamps|> to the last
    row = int(parts.meta["prompt_tokens"]) - 1 + 3  # the fourth button: the step that wrote the token after it
    assert words.nth(3).text_content() == cross.tokens[row + 1]
    page.page.select_option("#av-layer", "3")
    words.nth(3).click()
    expected = cross.attentions[3, :, row, :cross.frames].mean(axis=0)
    np.testing.assert_allclose(page.js("window.attnvizViewer.soundRow()"), expected, atol=2e-5)
    meta = page.js("document.getElementById('av-meta').textContent")
    N = cross.frames
    assert f"{N + 1} × {N + 1} tokens" not in meta and f"{N} frames of sound and the silence" in meta
    assert f"{cross.n_tokens} tokens × {N} frames of sound" in meta
    readout = page.js("document.getElementById('av-sound-readout').textContent")
    assert f"writing {cross.tokens[row + 1]} (layer 3)" in readout
    page.close()


@pytest.mark.slow
def test_every_column_of_align_and_detect_is_explained(spoken, tmp_path):
    from helpers import explainable, header_cells

    saved = spoken[1].save(tmp_path / "speech.npz")
    tokens = set(spoken[1].part("cross").tokens)
    for command in (("align", "--from", saved), ("detect", "--audio", spoken[0])):
        cells = header_cells(run(*command).stdout)
        assert cells and all(explainable(c, tokens) for c in cells), (command, cells)
    for term in ("frame", "silence", "dtw", "alignment heads"):
        assert run("explain", term).exit_code == 0
