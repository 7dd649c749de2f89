"""A speech model's attention (Whisper): the sound through the encoder, the transcript through the decoder, and
all three kinds of attention kept as the Parts of one capture, with the sound beside them.

    sound (16 kHz) --log-mel (80 × 3000: Whisper hears 30 s, the rest padded with silence)--> encoder
        --> 1500 positions, 20 ms each; N = samples // 320 of them hold the sound
    decoder reads <|startoftranscript|> (+ language and task on a multilingual model) <|notimestamps|>, then
        writes greedily as faster-whisper does (its suppressed tokens suppressed) — or reads --target
    α of the whole sequence in one teacher-forced pass: encoder (L, H, 1500, 1500), decoder (L, H, T, T),
        cross (L, H, T, 1500)

The padding after the sound is one key and one query, "(silence)", as words are (Clark et al.): attention *to*
it is the sum over its frames, *from* it the mean of their rows. Rows still sum to 1, exactly what the model
gave the sound is kept frame by frame, and a 3-s clip's encoder α is 150² not 1500² per head.
"""

from __future__ import annotations

import numpy as np

from attnviz.data import sound as sounds
from attnviz._version import __version__
from attnviz.data.parts import Parts
from attnviz.data.sides import Side
from attnviz.engine.seq2seq import assemble_parts, stack_layers
from attnviz.engine.models import LoadedModel
from attnviz.errors import arg, AttentionCheckError, InputError, UsageError

SAMPLES_PER_FRAME = 320  # two hops of 160 samples: one encoder position, 20 ms
FRAME_SECONDS = SAMPLES_PER_FRAME / sounds.RATE
SILENCE = "(silence)"  # the padding after the sound, one key


def frames_of(samples: int, positions: int = 1500) -> int:
    """Encoder positions that hold sound: what whisper's timing.py and faster-whisper align over."""
    return max(1, min(positions, samples // SAMPLES_PER_FRAME))


def multilingual(loaded: LoadedModel) -> bool:
    """A multilingual Whisper (99 languages, transcribe or translate), not an English-only one (tiny.en, …)."""
    config = getattr(loaded.model, "generation_config", None)
    found = getattr(config, "is_multilingual", None)
    return bool(found) if found is not None else int(getattr(loaded.model.config, "vocab_size", 0)) >= 51865


def languages(loaded: LoadedModel) -> dict[str, int]:
    """{code: its token id} of the languages a multilingual model knows (en, zh, …, in its own order)."""
    config = getattr(loaded.model, "generation_config", None)
    table = getattr(config, "lang_to_id", None) or {}
    if not table:
        from attnviz.data.sound import LANGUAGES

        table = {f"<|{code}|>": loaded.tokenizer.convert_tokens_to_ids(f"<|{code}|>") for code in LANGUAGES}
    unknown = getattr(loaded.tokenizer, "unk_token_id", None)
    return {name[2:-2]: int(i) for name, i in table.items() if isinstance(i, int) and i != unknown}


def prompt_ids(loaded: LoadedModel, language: str | None = "en", task: str = "transcribe") -> list[int]:
    """<|startoftranscript|> (<|language|><|task|> on a multilingual model) <|notimestamps|>."""
    tok = loaded.tokenizer
    names = ["<|startoftranscript|>"]
    if multilingual(loaded):
        names += [f"<|{language or 'en'}|>", f"<|{task}|>"]
    names.append("<|notimestamps|>")
    ids = [tok.convert_tokens_to_ids(n) for n in names]
    if any(not isinstance(i, int) or i == getattr(tok, "unk_token_id", None) for i in ids):
        raise InputError(f"{loaded.name}'s tokenizer lacks Whisper's prompt tokens ({', '.join(names)})")
    return ids


def reading(loaded: LoadedModel, heard: sounds.Sound) -> tuple[str | None, str]:
    """(the language asked for, the task) checked against the model: an English-only model hears English and
    cannot translate; a multilingual one must know the language. None: detect it."""
    if not multilingual(loaded):
        if heard.language not in (None, "en"):
            raise UsageError(f"{loaded.name} is English-only and cannot hear {heard.language!r}: use a multilingual "
                             f"model ({arg('model', 'whisper-base')})", "language")
        if heard.task == "translate":
            raise UsageError(f"{loaded.name} is English-only: it cannot translate; use a multilingual model "
                             f"({arg('model', 'whisper-base')})", "task")
        return "en", heard.task
    known = languages(loaded)
    if heard.language is not None and heard.language not in known:
        raise UsageError(f"{loaded.name} does not know the language {heard.language!r}; it knows "
                         f"{' '.join(known)}", "language")
    return heard.language, heard.task


SURE_LANGUAGE = 0.5  # a detected language less likely than this is said to be unsure, pointing to --language


def detect_language(loaded: LoadedModel, heard: sounds.Sound) -> tuple[str, float]:
    """The spoken language as Whisper detects it, on the first 30 s: the decoder reads <|startoftranscript|>
    alone, and the softmax of its next-token logits over the language tokens only (whisper's
    decoding.detect_language, faster-whisper's too) names the most likely language and its probability."""
    import torch

    first = sounds.Sound(heard.samples[:int(sounds.WINDOW_SECONDS * sounds.RATE)], heard.name)
    with torch.inference_mode():
        memory = loaded.model.model.encoder(features(loaded, first, detecting=True)).last_hidden_state
    known = languages(loaded)
    codes, ids = list(known), list(known.values())
    start = loaded.tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    with torch.inference_mode():
        logits = loaded.model(encoder_outputs=(memory,), decoder_input_ids=torch.tensor([[start]],
                                                                                        device=memory.device)).logits
    probabilities = torch.softmax(logits[0, -1, ids].double(), dim=-1)
    top = [int(i) for i in torch.topk(probabilities, min(2, len(ids))).indices.tolist()]
    best, second = top[0], top[-1]
    if float(probabilities[best]) < SURE_LANGUAGE:
        from attnviz.errors import arg, warn

        warn(f"the spoken language was detected as {codes[best]} with only {float(probabilities[best]):.0%} "
             f"confidence (next: {codes[second]}, {float(probabilities[second]):.0%}): what Whisper writes may be "
             f"nonsense; if you know the language, give its code (e.g. {arg('language', 'ko')})")
    return codes[best], float(probabilities[best])


def windowed(heard: sounds.Sound) -> bool:
    """Over 30 s: the sound is read 30 s at a time (engine/windows.py)."""
    return len(heard.samples) // sounds.HOP > sounds.FRAMES


def features(loaded: LoadedModel, heard: sounds.Sound, start: int = 0, *, detecting: bool = False):
    """The log-mel spectrogram Whisper reads, 30 s from frame `start`: (1, bins, 3000), as faster-whisper computes
    it (data/sound.py log_mel: the whole sound's spectrogram, its window, zeros after the sound); the last frame
    only when `detecting` the language, as faster-whisper's detect_language reads it."""
    import torch

    bins = int(getattr(loaded.model.config, "num_mel_bins", 80))
    mel = sounds.log_mel(heard.samples, bins)
    mel = sounds.window(mel if detecting else mel[:, :-1], start)
    return torch.from_numpy(mel[None]).to(loaded.device, getattr(torch, loaded.dtype))


def suppressed(loaded: LoadedModel) -> tuple[list[int], list[int]]:
    """(tokens never written, tokens not written first): the model's own lists, as faster-whisper uses them."""
    config = loaded.model.generation_config if hasattr(loaded.model, "generation_config") else loaded.model.config
    always = list(getattr(config, "suppress_tokens", None) or getattr(loaded.model.config, "suppress_tokens", None)
                  or [])
    first = list(getattr(config, "begin_suppress_tokens", None)
                 or getattr(loaded.model.config, "begin_suppress_tokens", None) or [])
    return always, first


def capture_sound(loaded: LoadedModel, heard: sounds.Sound, *, target: str | None = None,
                  max_new_tokens: int | None = None, on_step=None) -> Parts:
    """The three attention parts of a Whisper model for `heard`: the decoder writes greedily (or reads
    `target`), then one teacher-forced pass gives every row of α."""
    import torch

    model = loaded.model
    language, task = reading(loaded, heard)
    if windowed(heard):
        raise InputError(f"{heard.name} lasts {heard.seconds:.1f} s: over 30 s a sound is read window by window "
                         f"(attnviz.engine.windows)", "audio")
    mel = features(loaded, heard)
    start = prompt_ids(loaded, language or "en", task)  # its length: the language token is one token either way
    tok = loaded.tokenizer
    eot = int(getattr(model.config, "eos_token_id", None) or tok.convert_tokens_to_ids("<|endoftext|>"))
    limit = int(getattr(model.config, "max_target_positions", 448))
    from attnviz.engine.memory import check_parts_memory

    room = min(max_new_tokens or 224, limit - len(start))
    check_parts_memory(loaded, int(getattr(model.config, "max_source_positions", 1500)), len(start) + room + 1,
                       shorter=f"a sound is always {int(getattr(model.config, 'max_source_positions', 1500))} "
                               f"encoder positions: write fewer tokens ({arg('max_new_tokens')})")
    try:
        with torch.inference_mode():
            encoded = model.model.encoder(mel, output_attentions=True)
            memory = encoded.last_hidden_state
            probability = None
            if language is None:
                language, probability = detect_language(loaded, heard)
                start = prompt_ids(loaded, language, task)
            if target is not None:
                text_ids = tok(target, add_special_tokens=False).input_ids
                if not text_ids:
                    raise InputError("the target text gives no tokens", "target")
                if len(start) + len(text_ids) > limit:
                    raise InputError(f"the target takes {len(text_ids)} tokens; {loaded.name} reads at most "
                                     f"{limit - len(start)}", "target")
                stopped, source = "target", "given"
            else:
                text_ids, stopped = _write(model, memory, start, eot, room, suppressed(loaded), on_step)
                source = "generated"
            ids = torch.tensor([start + text_ids], device=memory.device)
            out = model(encoder_outputs=(memory,), decoder_input_ids=ids, output_attentions=True)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise AttentionCheckError(f"{loaded.name} could not run on this sound: {str(exc).splitlines()[0]}") \
            from None
    N = frames_of(len(heard.samples), int(memory.shape[1]))
    encoder = fold(stack_layers(encoded.attentions, loaded.name, "encoder"), N, rows=True)
    decoder = stack_layers(out.decoder_attentions, loaded.name, "decoder")
    cross = fold(stack_layers(out.cross_attentions, loaded.name, "cross"), N, rows=False)
    source_side = frame_side(N, int(memory.shape[1]))
    from attnviz.engine.generation import written_spans

    text, spans = written_spans(tok, [], text_ids, 0)
    target_side = _target_side(tok, start, text_ids, spans)
    meta = {"model": loaded.name, "model_source": loaded.source, "revision": loaded.revision, "device": loaded.device,
            "dtype": loaded.dtype, "model_type": loaded.model_type, "source": "model",
            "source_text": heard.name, "target_text": text, "target_source": source, "stopped": stopped,
            "attnviz_version": __version__, "audio_name": heard.name, "audio_seconds": round(heard.seconds, 4),
            "audio_frames": N, "frame_seconds": FRAME_SECONDS, "audio_file_rate": heard.file_rate,
            "audio_channels": heard.channels, "prompt_tokens": len(start), "language": language, "task": task,
            "multilingual": multilingual(loaded)}
    if probability is not None:
        meta["language_probability"] = round(probability, 6)
    heads = alignment_heads(loaded)
    if heads:
        meta["alignment_heads"] = ",".join(f"{layer}.{head}" for layer, head in heads)
    if source == "generated":
        meta["decoding"] = "greedy"
    spectrogram = mel[0, :, :2 * N].float().cpu().numpy()
    generated = np.arange(len(target_side)) >= len(start) if source == "generated" else None
    return assemble_parts({"encoder": encoder, "decoder": decoder, "cross": cross}, source_side, target_side,
                          generated, meta, sound=heard.samples, mel=spectrogram)


def _write(model, memory, start: list[int], eot: int, room: int, suppress, on_step) -> tuple[list[int], str]:
    """Greedy decoding with the KV cache: the model's suppressed tokens never, the blank and <|endoftext|>
    not first (faster-whisper's suppress_blank), until <|endoftext|> or `room` tokens."""
    import torch

    always, first = suppress
    written: list[int] = []
    from attnviz.engine.generation import cache_argument

    cache: dict = {}
    step_ids = torch.tensor([start], device=memory.device)
    stopped = "max_new_tokens"
    for step in range(room + 1):
        out = model(encoder_outputs=(memory,), decoder_input_ids=step_ids, use_cache=True, **cache)
        logits = out.logits[0, -1].float().clone()
        banned = [t for t in always if 0 <= t < logits.shape[0]]
        if step == 0:
            banned += [t for t in first if 0 <= t < logits.shape[0]]
        if banned:
            logits[banned] = -float("inf")
        choice = int(logits.argmax())
        if choice == eot:
            stopped = "eos"
            break
        if step == room:
            break
        written.append(choice)
        cache = cache_argument(out)
        step_ids = torch.tensor([[choice]], device=memory.device)
        if on_step is not None:
            on_step(1)
    return written, stopped


def fold(alpha: np.ndarray, N: int, *, rows: bool) -> np.ndarray:
    """(L, H, R, P) over the encoder's P positions -> the N that hold sound and one "(silence)" column (their
    sum); with `rows` (the encoder's square α) the silence's rows become one row, their mean. Without padding
    (30 s of sound) nothing is folded."""
    P = alpha.shape[-1]
    if N >= P:
        return np.ascontiguousarray(alpha, np.float32)
    cols = np.concatenate([alpha[..., :N], alpha[..., N:].sum(axis=-1, dtype=np.float64)[..., None]], axis=-1)
    if rows:
        cols = np.concatenate([cols[..., :N, :], cols[..., N:, :].mean(axis=-2, dtype=np.float64)[..., None, :]],
                              axis=-2)
    return np.ascontiguousarray(cols, np.float32)


def frame_side(N: int, positions: int = 1500) -> Side:
    """The encoder's positions as tokens: 0.00s, 0.02s, … (each the start of its 20 ms), then (silence)."""
    labels = [f"{i * FRAME_SECONDS:.2f}s" for i in range(N)]
    pad = N < positions
    return Side(tuple(labels + ([SILENCE] if pad else [])), np.arange(N + pad, dtype=np.int64),
                np.array([False] * N + [True] * pad), tuple([""] * N + ["other"] * pad),
                np.zeros(N + pad, bool), None)


def alignment_heads(loaded: LoadedModel) -> list[tuple[int, int]]:
    """The cross-attention heads the model lists as following the sound in time (its generation config's
    alignment_heads), as (layer, head); [] where it lists none."""
    config = getattr(loaded.model, "generation_config", None)
    listed = getattr(config, "alignment_heads", None) or []
    try:
        return [(int(layer), int(head)) for layer, head in listed]
    except (TypeError, ValueError):
        return []


def _target_side(tok, start: list[int], text_ids: list[int], spans: list[tuple[int, int]]) -> Side:
    from attnviz.base.tokens import readable_tokens

    ids = start + text_ids
    raw = tok.convert_ids_to_tokens(ids)
    special = [n < len(start) for n in range(len(ids))]
    decoded = [tok.decode([i]) for i in ids]
    subword = [n > len(start) and not special[n] and not decoded[n].startswith(" ") for n in range(len(ids))]
    tokens = readable_tokens(raw, decoded, [None] * len(ids), special, subword)
    kinds = ["start" if n == 0 else ("other" if special[n] else "") for n in range(len(ids))]
    offsets = [(-1, -1)] * len(start) + list(spans)
    return Side(tuple(tokens), np.asarray(ids, np.int64), np.asarray(special), tuple(kinds),
                np.asarray(subword), np.asarray(offsets, np.int64))
