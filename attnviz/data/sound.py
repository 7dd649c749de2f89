"""Sound as a speech model's input, read as untrusted: a WAV or FLAC file (or its bytes, or standard input),
its header checked before anything is decoded, mixed to one channel and resampled to the 16 kHz Whisper hears.
No torch here (soundfile and numpy).

    read_sound   bytes -> (samples at 16 kHz float32 in [-1, 1], the file's rate, its channels)
    resample     band-limited, by the discrete Fourier transform (exact for what lies under both Nyquist limits)

Whisper hears 30 s at a time; a longer sound (up to MAX_SECONDS) is read in 30-s windows, as faster-whisper reads
it; a sound over MAX_SECONDS is refused in one line (cut it first) rather than cut silently.
"""

from __future__ import annotations

import dataclasses
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.base.text import visible
from attnviz.data.languages import LANGUAGES, TASKS
from attnviz.errors import InputError, UsageError, arg

RATE = 16_000  # what Whisper hears
WINDOW_SECONDS = 30.0  # Whisper's window: a longer sound is read 30 s at a time
MAX_SECONDS = 120.0  # a sound, at most: four windows (their cross-attention is held on the sound's clock)
MAX_SOUND_BYTES = 64 << 20  # a sound file, at most (30 s of 8 channels at 96 kHz in 32-bit is 92 MB: refused)
MIN_RATE, MAX_RATE = 1_000, 384_000  # the file's own sampling rate
MAX_CHANNELS = 8
MIN_SECONDS = 0.1  # under five encoder frames there is nothing to look at
FORMATS = ("WAV", "WAVEX", "FLAC")  # WAVEX: WAVE_FORMAT_EXTENSIBLE, what ffmpeg writes for 24-bit or multichannel
INSTALL = "pip install soundfile"


@dataclass(frozen=True, eq=False)
class Sound:
    """A sound as a speech model's input, decoded and checked: samples (n,) float32 at 16 kHz, one channel."""

    samples: np.ndarray
    name: str
    file_rate: int = RATE  # the file's own rate, before resampling
    channels: int = 1  # the file's channels, before mixing
    language: str | None = None  # the spoken language (a Whisper code); None: a multilingual model detects it
    task: str = "transcribe"  # or "translate": the decoder writes English

    is_sound = True  # what check_text looks for (attnviz.base.text imports nothing of this module)

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE

    def __repr__(self) -> str:
        return f"Sound({self.name!r}, {self.seconds:.2f} s at {RATE:,} Hz)"




def checked_language(language: str | None) -> str | None:
    """A Whisper language code (case-insensitive), or None (detect it); anything else one line listing them."""
    if language is None:
        return None
    code = str(language).strip().lower()
    if code not in LANGUAGES:
        raise UsageError(f"{arg('language')} takes a Whisper language code: {' '.join(LANGUAGES)}; got "
                         f"{visible(str(language))[:20]!r}", "language")
    return code


def checked_task(task: str) -> str:
    if task not in TASKS:
        raise UsageError(f"{arg('task')} takes transcribe or translate; got {visible(str(task))[:20]!r}", "task")
    return task


def sound(source, name: str | None = None, *, language: str | None = None, task: str = "transcribe") -> Sound:
    """A Sound of `source`: a path, "-" (standard input), the file's bytes, or a Sound. A numpy array is taken
    as samples at 16 kHz (one channel, float in [-1, 1]). `language`: what is spoken (a Whisper code: en, ko,
    ja, …; None: a multilingual model detects it); `task`: "transcribe" or "translate" (into English)."""
    language, task = checked_language(language), checked_task(task)
    if isinstance(source, Sound):
        if language is None and task == "transcribe":
            return source
        return dataclasses.replace(source, language=language or source.language, task=task)
    return dataclasses.replace(_sound(source, name), language=language, task=task)


def _sound(source, name: str | None) -> Sound:
    if isinstance(source, np.ndarray):
        samples = np.asarray(source)
        if samples.ndim != 1 or samples.dtype.kind != "f":
            raise InputError("a sound array must be one channel of float samples at 16 kHz", "audio")
        return Sound(_checked(samples.astype(np.float32), name or "a sound array"), name or "a sound array")
    if isinstance(source, (bytes, bytearray)):
        shown = name or "the sound bytes"
        return _decoded(bytes(source), shown)
    if not isinstance(source, (str, Path)):
        raise InputError(f"a sound is a path, bytes or an array; got {type(source).__name__}", "audio")
    data, shown = read_bytes(None if str(source) == "-" else source)
    return _decoded(data, name or (shown if shown == "standard input" else Path(shown).name))


def _decoded(data: bytes, shown: str) -> Sound:
    if not data:
        raise InputError(f"{shown} is empty: give a WAV or FLAC file", "audio")
    if len(data) > MAX_SOUND_BYTES:
        raise InputError(f"{shown} is over {MAX_SOUND_BYTES >> 20} MB: give at most {MAX_SECONDS:g} s of sound",
                         "audio")
    samples, rate, channels = read_sound(data, shown)
    return Sound(samples, shown, rate, channels)


def read_bytes(source: str | Path | None) -> tuple[bytes, str]:
    """(the file's bytes, its name for messages); None reads standard input. At most MAX_SOUND_BYTES."""
    from attnviz.base.files import read_input

    data, name = read_input(source, MAX_SOUND_BYTES, "audio")
    if not data:
        raise InputError(f"{name} is empty: give a WAV or FLAC file", "audio")
    return data, name


def read_sound(data: bytes, name: str) -> tuple[np.ndarray, int, int]:
    """(samples at 16 kHz, one channel, float32; the file's rate; its channels). The header's rate, channels
    and length are checked before the samples are decoded."""
    try:
        import soundfile
    except ImportError:
        raise InputError(f"reading sound needs the soundfile package: {INSTALL}", "audio") from None
    try:
        info = soundfile.info(io.BytesIO(data))
    except Exception:  # libsndfile says only that it cannot: one line, whatever the file held
        raise InputError(f"{name} is not a WAV or FLAC file attnviz can read", "audio") from None
    if info.format not in FORMATS:
        raise InputError(f"{name} is {info.format}; attnviz reads WAV (WAVE_FORMAT_EXTENSIBLE too) and FLAC", "audio")
    rate, channels, frames = int(info.samplerate), int(info.channels), int(info.frames)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise InputError(f"{name} declares {rate:,} samples a second; attnviz reads {MIN_RATE:,} to {MAX_RATE:,}",
                         "audio")
    if not 1 <= channels <= MAX_CHANNELS:
        raise InputError(f"{name} declares {channels} channels; attnviz reads 1 to {MAX_CHANNELS}", "audio")
    if frames > MAX_SECONDS * rate:
        raise InputError(f"{name} lasts {frames / rate:.1f} s; attnviz reads at most {MAX_SECONDS:g} s of sound "
                         f"({MAX_SECONDS / WINDOW_SECONDS:g} windows of 30 s): cut it", "audio")
    try:
        raw, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True, frames=frames)
    except Exception:
        raise InputError(f"{name}: its samples cannot be decoded (a damaged file?)", "audio") from None
    mono = raw.mean(axis=1, dtype=np.float64) if channels > 1 else raw[:, 0].astype(np.float64)
    return _checked(resample(mono, rate, RATE).astype(np.float32), name), rate, channels


def _checked(samples: np.ndarray, name: str) -> np.ndarray:
    if not np.isfinite(samples).all():
        raise InputError(f"{name} holds samples that are not finite numbers", "audio")
    seconds = len(samples) / RATE
    if seconds < MIN_SECONDS:
        raise InputError(f"{name} lasts {seconds:.3f} s; give at least {MIN_SECONDS:g} s of sound", "audio")
    if seconds > MAX_SECONDS:
        raise InputError(f"{name} lasts {seconds:.1f} s; attnviz reads at most {MAX_SECONDS:g} s of sound "
                         f"({MAX_SECONDS / WINDOW_SECONDS:g} windows of 30 s): cut it", "audio")
    return np.clip(samples, -1.0, 1.0)


def resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """Band-limited resampling by the discrete Fourier transform: the spectrum cut (or padded) to the new
    length, so nothing above the lower Nyquist limit folds back."""
    if rate == to or len(samples) == 0:
        return samples
    n = len(samples)
    m = max(1, int(round(n * to / rate)))
    spectrum = np.fft.rfft(samples)
    kept = np.zeros(m // 2 + 1, dtype=complex)
    k = min(len(spectrum), len(kept))
    kept[:k] = spectrum[:k]
    if k == len(kept) and m % 2 == 0 and m < n:  # the new Nyquist bin holds both halves' share
        kept[-1] = kept[-1].real
    return np.fft.irfft(kept, m) * (m / n)


def wav_bytes(samples: np.ndarray, rate: int = RATE) -> bytes:
    """16-bit PCM WAV of float samples in [-1, 1] (what a page plays), written with the standard library."""
    import wave

    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


# --- the log-mel spectrogram Whisper reads ----------------------------------------------------------------------

HOP = 160  # samples between frames: 10 ms
N_FFT = 400  # a 25-ms window
FRAMES = 3000  # 30 s of frames: what the encoder reads at once


def mel_filters(bins: int, rate: int = RATE, n_fft: int = N_FFT) -> np.ndarray:
    """Slaney-style mel filters (bins, n_fft // 2 + 1), float32: triangles on the mel scale (linear to 1 kHz,
    logarithmic above), each scaled to constant energy, as librosa makes them for Whisper."""
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / rate)
    mels = np.linspace(0.0, 45.245640471924965, bins + 2)  # 0 Hz to 8 kHz on Slaney's scale
    freqs = 200.0 / 3 * mels
    log_region = mels >= 15.0  # 1 kHz
    freqs[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_region] - 15.0))
    spacing = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fft_freqs.reshape(1, -1)
    lower = -ramps[:-2] / spacing[:-1, None]
    upper = ramps[2:] / spacing[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (freqs[2:bins + 2] - freqs[:bins]))[:, None]
    return weights.astype(np.float32)


def log_mel(samples: np.ndarray, bins: int = 80) -> np.ndarray:
    """The log-mel spectrogram of a whole sound, (bins, len(samples) // 160 + 1) float32, as faster-whisper
    computes it: 160 silent samples appended, a centred STFT (reflected edges) with a periodic Hann window of 400
    samples every 160, |X|² of each frame but the last, the mel filters, log10 clipped at 10⁻¹⁰ and floored 8
    below its maximum over the whole sound, then (x + 4) / 4. The transcript reads the frames but the last
    (faster-whisper's content frames), language detection all of them; a window of either through window()."""
    wave = np.pad(np.asarray(samples, np.float32), (0, HOP))
    wave = np.pad(wave, (N_FFT // 2, N_FFT // 2), mode="reflect")
    count = 1 + (len(wave) - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(wave, (count, N_FFT), (HOP * wave.strides[0], wave.strides[0]))
    hann = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
    spectrum = np.fft.rfft(frames * hann, n=N_FFT, axis=-1).T.astype(np.complex64)  # (201, count)
    power = np.abs(spectrum[:, :-1]) ** 2
    mel = mel_filters(bins) @ power
    logged = np.log10(np.clip(mel, 1e-10, None))
    logged = np.maximum(logged, logged.max() - 8.0)
    return (logged + 4.0) / 4.0


def window(mel: np.ndarray, start: int = 0) -> np.ndarray:
    """30 s of a log-mel spectrogram from frame `start`, (bins, 3000): what is left of the sound, then zeros (as
    faster-whisper pads a segment)."""
    part = mel[:, start:start + FRAMES]
    return np.pad(part, ((0, 0), (0, FRAMES - part.shape[1]))).astype(np.float32)
