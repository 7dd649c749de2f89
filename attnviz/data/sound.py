"""Sound as a speech model's input, read as untrusted: a WAV or FLAC file (or its bytes, or standard input),
its header checked before anything is decoded, mixed to one channel and resampled to the 16 kHz Whisper hears.
No torch here (soundfile and numpy).

    read_sound   bytes -> (samples at 16 kHz float32 in [-1, 1], the file's rate, its channels)
    resample     band-limited, by the discrete Fourier transform (exact for what lies under both Nyquist limits)

Whisper hears 30 s at a time; a longer file is refused in one line (cut it first) rather than cut silently.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import InputError

RATE = 16_000  # what Whisper hears
MAX_SECONDS = 30.0  # Whisper's window
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

    is_sound = True  # what check_text looks for (attnviz.base.text imports nothing of this module)

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE

    def __repr__(self) -> str:
        return f"Sound({self.name!r}, {self.seconds:.2f} s at {RATE:,} Hz)"


def sound(source, name: str | None = None) -> Sound:
    """A Sound of `source`: a path, "-" (standard input), the file's bytes, or a Sound. A numpy array is taken
    as samples at 16 kHz (one channel, float in [-1, 1])."""
    if isinstance(source, Sound):
        return source
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
        raise InputError(f"{name} lasts {frames / rate:.1f} s; Whisper hears {MAX_SECONDS:g} s at a time: cut it to "
                         f"at most {MAX_SECONDS:g} s", "audio")
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
        raise InputError(f"{name} lasts {seconds:.1f} s; Whisper hears {MAX_SECONDS:g} s at a time: cut it to at "
                         f"most {MAX_SECONDS:g} s", "audio")
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
