"""A sound over 30 s, read 30 s at a time as faster-whisper reads it (without timestamps, each window decoded on
its own): the log-mel spectrogram of the whole sound, cut into windows of 3,000 frames (the last padded with
zeros), each window encoded, its text written greedily, and one teacher-forced pass giving its rows of α.

The parts are put on the sound's own clock: the keys of cross-attention are every 20-ms frame of the sound (and
one "(silence)" for the padding of the last window), and window k's rows hold its weights at its own frames,
0 elsewhere; decoder self-attention is block-diagonal (a window's text never reads another's). Each row still
sums to 1. There is no encoder part: the encoder never attends across windows, and its α over minutes of sound
would be gigabytes. The windows' sizes are kept in the metadata (window_rows, window_frames), so that word
timings are found window by window and placed on the sound's clock (attnviz.align).
"""

from __future__ import annotations

import numpy as np

from attnviz._version import __version__
from attnviz.base.sizes import size_text
from attnviz.data import sound as sounds
from attnviz.data.parts import Parts
from attnviz.data.sides import Side
from attnviz.engine.memory import memory_budget
from attnviz.engine.models import LoadedModel
from attnviz.engine.seq2seq import assemble_parts, stack_layers
from attnviz.engine.speech import (_target_side, _write, alignment_heads, detect_language, FRAME_SECONDS, fold,
                                   frame_side, multilingual, prompt_ids, suppressed)
from attnviz.errors import AttentionCheckError, InputError, arg


def capture_windows(loaded: LoadedModel, heard: sounds.Sound, language: str | None, task: str,
                    max_new_tokens: int | None, on_step) -> Parts:
    import torch

    model, tok = loaded.model, loaded.tokenizer
    bins = int(getattr(model.config, "num_mel_bins", 80))
    mel = sounds.log_mel(heard.samples, bins)[:, :-1]  # the content frames, as faster-whisper's transcribe reads
    starts = list(range(0, mel.shape[1], sounds.FRAMES))
    positions = int(getattr(model.config, "max_source_positions", 1500))
    limit = int(getattr(model.config, "max_target_positions", 448))
    start = prompt_ids(loaded, language or "en", task)
    room = min(max_new_tokens or 224, limit - len(start))
    frames = [min(positions, (min(mel.shape[1] - s, sounds.FRAMES)) // 2) for s in starts]
    rows_most = len(starts) * (len(start) + room + 1)
    L, H = (int(getattr(model.config, name)) for name in ("decoder_layers", "decoder_attention_heads"))
    need = (L + 4) * H * (rows_most ** 2 + rows_most * (sum(frames) + 1)) * 4
    budget = loaded.memory_budget or memory_budget()
    if need > budget:
        raise InputError(f"{heard.seconds:.0f} s of sound in {len(starts)} windows, up to {rows_most} tokens, would "
                         f"need about {size_text(need)} for cross- and self-attention, over the budget of "
                         f"{size_text(budget)}: write fewer tokens ({arg('max_new_tokens')}), cut the sound, or "
                         f"raise {arg('max_memory')}", "audio")
    probability = None
    if language is None:
        language, probability = detect_language(loaded, heard)
        start = prompt_ids(loaded, language, task)
    eot = int(getattr(model.config, "eos_token_id", None) or tok.convert_tokens_to_ids("<|endoftext|>"))
    blocks = []
    try:
        for s, N in zip(starts, frames):
            window = torch.from_numpy(sounds.window(mel, s)[None]).to(loaded.device, getattr(torch, loaded.dtype))
            with torch.inference_mode():
                memory = model.model.encoder(window).last_hidden_state
                text_ids, stopped = _write(model, memory, start, eot, room, suppressed(loaded), on_step)
                ids = torch.tensor([start + text_ids], device=memory.device)
                out = model(encoder_outputs=(memory,), decoder_input_ids=ids, output_attentions=True)
            decoder = stack_layers(out.decoder_attentions, loaded.name, "decoder")
            cross = fold(stack_layers(out.cross_attentions, loaded.name, "cross"), N, rows=False)
            blocks.append((text_ids, decoder, cross, N))
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise AttentionCheckError(f"{loaded.name} could not run on this sound: {str(exc).splitlines()[0]}") \
            from None
    return _joined(loaded, heard, start, blocks, language, probability, task, stopped)


def _joined(loaded: LoadedModel, heard: sounds.Sound, start: list[int], blocks: list, language: str,
            probability: float | None, task: str, stopped: str) -> Parts:
    """The windows' parts on the sound's clock (see the module's docstring)."""
    from attnviz.engine.generation import written_spans

    tok = loaded.tokenizer
    sizes = [len(start) + len(text_ids) for text_ids, _, _, _ in blocks]
    total_frames = sum(N for _, _, _, N in blocks)
    silence = blocks[-1][2].shape[-1] > blocks[-1][3]  # the last window is padded
    L, H = blocks[0][1].shape[:2]
    T, K = sum(sizes), total_frames + silence
    decoder = np.zeros((L, H, T, T), np.float32)
    cross = np.zeros((L, H, T, K), np.float32)
    text, sides = "", []
    row = frame = 0
    for (text_ids, d, c, N), size in zip(blocks, sizes):
        decoder[:, :, row:row + size, row:row + size] = d
        cross[:, :, row:row + size, frame:frame + N] = c[..., :N]
        if c.shape[-1] > N:
            cross[:, :, row:row + size, -1] = c[..., N]
        piece, spans = written_spans(tok, [], text_ids, 0)
        sides.append(_target_side(tok, start, text_ids, [(a + len(text), b + len(text)) if a >= 0 else (a, b)
                                                          for a, b in spans]))
        text += piece
        row, frame = row + size, frame + N
    target = Side(tuple(t for side in sides for t in side.tokens),
                  np.concatenate([side.token_ids for side in sides]),
                  np.concatenate([side.special for side in sides]),
                  tuple(k for side in sides for k in side.special_kind),
                  np.concatenate([side.subword for side in sides]),
                  np.concatenate([side.offsets for side in sides if side.offsets is not None]))
    meta = {"model": loaded.name, "model_source": loaded.source, "revision": loaded.revision, "device": loaded.device,
            "dtype": loaded.dtype, "model_type": loaded.model_type, "source": "model",
            "source_text": heard.name, "target_text": text, "target_source": "generated", "stopped": stopped,
            "attnviz_version": __version__, "audio_name": heard.name, "audio_seconds": round(heard.seconds, 4),
            "audio_frames": total_frames, "frame_seconds": FRAME_SECONDS, "audio_file_rate": heard.file_rate,
            "audio_channels": heard.channels, "prompt_tokens": len(start), "language": language, "task": task,
            "multilingual": multilingual(loaded), "decoding": "greedy", "sound_windows": len(blocks),
            "window_rows": sizes, "window_frames": [N for _, _, _, N in blocks]}
    if probability is not None:
        meta["language_probability"] = round(probability, 6)
    heads = alignment_heads(loaded)
    if heads:
        meta["alignment_heads"] = ",".join(f"{layer}.{head}" for layer, head in heads)
    bins = int(getattr(loaded.model.config, "num_mel_bins", 80))
    spectrogram = sounds.log_mel(heard.samples, bins)[:, :2 * total_frames]
    source = frame_side(total_frames, total_frames + silence)
    return assemble_parts({"decoder": decoder, "cross": cross}, source, target, None, meta,  # prompts inside
                          sound=heard.samples, mel=spectrogram.astype(np.float32))
