"""Encoder-decoder models (T5, BART, Marian): the source text through the encoder, a target through the
decoder, and all three kinds of attention kept as the Parts of one capture.

    source text --encode--> S tokens --encoder--> encoder α (L, H, S, S)
    target: --target TEXT (teacher forcing: the decoder reads <start> + the target, shifted right)
            or written greedily with the KV cache, one row per new token (as attnviz generate does)
        --decoder--> decoder α (L, H, T, T, causal) and cross α (L, H, T, S): target queries × source keys
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from attnviz._version import __version__
from attnviz.data.capture import Capture
from attnviz.data.parts import Parts, part_meta
from attnviz.data.sides import Side
from attnviz.engine.forward import encode, row_sum_tolerance
from attnviz.engine.generation import cache_argument, choose_token, Decoding, written_spans
from attnviz.engine.models import part_shapes
from attnviz.engine.memory import check_parts_memory
from attnviz.errors import AttentionCheckError, InputError, warn
from attnviz.base.tokens import readable_tokens, special_ids, special_kind as _special_kind

START_LABEL = "<start>"  # T5 and Marian start the decoder with their padding id: it is no padding here


def decoder_start(loaded) -> int:
    config = loaded.model.config
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(loaded.model.generation_config, "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise InputError(f"{loaded.name} names no decoder start token (decoder_start_token_id)")
    return start


def _start_token(loaded, start: int) -> tuple[str, str]:
    """The label and special kind of the decoder's first input."""
    raw = loaded.tokenizer.convert_ids_to_tokens([start])[0]
    pad = getattr(loaded.tokenizer, "pad_token_id", None)
    return (START_LABEL if start == pad or raw is None else str(raw)), "start"


def teacher_forced(loaded, target: str, *, truncate: bool = True) -> Side:
    """The decoder's input for a given target text: <start> followed by the target's tokens, shifted right
    (the last token, usually </s>, is what the final position predicts, so it is not an input)."""

    tgt = encode(loaded, target, truncate=truncate, target=True)
    start = decoder_start(loaded)
    label, kind = _start_token(loaded, start)
    n = len(tgt.token_ids) - 1 if len(tgt.token_ids) > 1 else len(tgt.token_ids)
    side = _side((label, *tgt.tokens[:n]), [start, *tgt.token_ids[:n]], [True, *tgt.special[:n]],
                 (kind, *tgt.special_kind[:n]), [False, *tgt.subword[:n]],
                 [(-1, -1), *(tgt.offsets or [(-1, -1)] * n)[:n]])
    return side


def parts_capture(loaded, source: str, *, target: str | None = None, decoding=None, truncate: bool = True,
                  on_step: Callable[[int], None] | None = None) -> Parts:
    """The three attention parts of an encoder-decoder model for `source`, with the decoder reading `target`
    (teacher forcing) or writing greedily (or as `decoding` says) with the KV cache."""
    import torch


    encoded = encode(loaded, source, truncate=truncate)
    source_side = _side(encoded.tokens, encoded.token_ids, encoded.special, encoded.special_kind, encoded.subword,
                        encoded.offsets)
    S = len(encoded.token_ids)
    meta = {"model": loaded.name, "model_source": loaded.source, "revision": loaded.revision, "device": loaded.device,
            "dtype": loaded.dtype, "model_type": loaded.model_type, "source": "model", "source_text": source,
            "attnviz_version": _version(), "dropped_tokens": encoded.dropped}
    if target is not None:
        target_side = teacher_forced(loaded, target, truncate=truncate)
        T = len(target_side)
        check_parts_memory(loaded, S, T)
        ids = torch.tensor([list(target_side.token_ids)], device=loaded.device)
        try:
            with torch.inference_mode():
                out = loaded.model(**encoded.inputs, decoder_input_ids=ids, output_attentions=True)
        except (ValueError, TypeError, RuntimeError, IndexError) as exc:
            raise AttentionCheckError(f"{loaded.name} could not run on this input: {str(exc).splitlines()[0]}") \
                from None
        alphas = {name: stack_layers(getattr(out, f"{name}_attentions"), loaded.name, name)
                  for name in ("encoder", "decoder", "cross")}
        meta |= {"target_text": target, "target_source": "given"}
        return assemble_parts(alphas, source_side, target_side, None, meta)
    return _written(loaded, encoded, source_side, decoding or Decoding(), meta, on_step)


def _written(loaded, encoded, source_side: Side, decoding, meta: dict, on_step) -> Parts:
    """The decoder writes: each step feeds one token with the cache, and its rows of decoder and cross α
    are copied into arrays allocated once."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput


    S = len(source_side)
    start = decoder_start(loaded)
    limit = loaded.max_positions
    room = decoding.max_new_tokens
    stopped = "max_new_tokens"
    if limit and 1 + room > limit:
        room, stopped = limit - 1, "max_positions"
        warn(f"{loaded.name} takes at most {limit} target positions: writing {room} new tokens, not "
                      f"{decoding.max_new_tokens}")
    T_max = 1 + room
    check_parts_memory(loaded, S, T_max)
    shapes = part_shapes(loaded.model.config)
    decoder = np.zeros((*shapes["decoder"], T_max, T_max), np.float32)
    cross = np.zeros((*shapes["cross"], T_max, S), np.float32)
    tok = loaded.tokenizer
    eos = {i for i in (getattr(tok, "eos_token_id", None), getattr(loaded.model.config, "eos_token_id", None))
           if isinstance(i, int)}
    generator = torch.Generator().manual_seed(decoding.seed)
    device = encoded.inputs["input_ids"].device
    new_ids: list[int] = []
    try:
        with torch.inference_mode():
            out = loaded.model(**encoded.inputs, decoder_input_ids=torch.tensor([[start]], device=device),
                               use_cache=True, output_attentions=True)
            encoder_alpha = stack_layers(out.encoder_attentions, loaded.name, "encoder")
            memory = BaseModelOutput(last_hidden_state=out.encoder_last_hidden_state)
            t = 0
            while True:
                for layer, (d, c) in enumerate(zip(out.decoder_attentions, out.cross_attentions)):
                    decoder[layer, :, t, :t + 1] = d[0, :, -1].float().cpu().numpy()
                    cross[layer, :, t] = c[0, :, -1].float().cpu().numpy()
                if t == room:
                    break
                next_id = choose_token(out.logits[:, -1], decoding, generator)
                if next_id in eos:
                    stopped = "eos"
                    break
                new_ids.append(next_id)
                t += 1
                out = loaded.model(encoder_outputs=memory, attention_mask=encoded.inputs.get("attention_mask"),
                                   decoder_input_ids=torch.tensor([[next_id]], device=device), **cache_argument(out),
                                   use_cache=True, output_attentions=True)
                if on_step is not None:
                    on_step(1)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise AttentionCheckError(f"{loaded.name} could not write: {str(exc).splitlines()[0]}") from None
    T = 1 + len(new_ids)
    text, spans = written_spans(tok, [], new_ids, 0)
    marked = special_ids(tok)
    raw = tok.convert_ids_to_tokens(new_ids)
    special = [i in marked for i in new_ids]
    subword = [not r.startswith(("Ġ", "▁", "Ċ")) and not s and n > 0 and not tok.decode([i]).startswith(" ")
               for n, (r, i, s) in enumerate(zip(raw, new_ids, special))]
    tokens = readable_tokens(raw, [tok.decode([i]) for i in new_ids], [text[a:b] if a >= 0 else None for a, b in spans],
                             special, subword)
    label, kind = _start_token(loaded, start)
    kinds = [_special_kind(tok, i, n + 1, s) for n, (i, s) in enumerate(zip(new_ids, special))]
    target_side = _side((label, *tokens), [start, *new_ids], [True, *special], (kind, *kinds), [False, *subword],
                        [(-1, -1), *spans])
    meta |= {"target_text": text, "target_source": "generated", "decoding": decoding.describe(), "stopped": stopped}
    alphas = {"encoder": encoder_alpha, "decoder": np.ascontiguousarray(decoder[:, :, :T, :T]),
              "cross": np.ascontiguousarray(cross[:, :, :T])}
    return assemble_parts(alphas, source_side, target_side, np.arange(T) > 0, meta)


def _side(tokens, ids, special, kinds, subword, offsets) -> Side:
    return Side(tuple(tokens), np.asarray(ids, np.int64), np.asarray(special, bool), tuple(kinds),
                np.asarray(subword, bool), None if offsets is None else np.asarray(offsets, np.int64))


def stack_layers(layers, name: str, part: str) -> np.ndarray:
    """A model's per-layer attention output (1, H, R, C) each as one (L, H, R, C) float32 array."""
    if not layers or any(a is None for a in layers):
        raise AttentionCheckError(f"{name} returned no {part} attention weights; attnviz needs a model loaded with "
                                  f"attn_implementation='eager'")
    return np.stack([a[0].float().cpu().numpy() for a in layers])


def _version() -> str:
    return __version__


def assemble_parts(alphas: dict[str, np.ndarray], source: Side, target: Side, generated: np.ndarray | None,
                   meta: dict, sound: np.ndarray | None = None, mel: np.ndarray | None = None) -> Parts:
    """Parts from the α arrays (the three parts, or those given) and the two sides, each part validated; a speech
    model's `sound` and its spectrogram `mel` go with the parts that hear it (encoder and cross)."""

    atol = row_sum_tolerance(str(meta.get("dtype", "float32")))
    sides = {"encoder": (source, None), "decoder": (target, None), "cross": (target, source)}
    captures = {}
    for name, (rows, keys) in sides.items():
        if name not in alphas:  # a sound over 30 s: no encoder attention across its windows
            continue
        capture = Capture(attentions=alphas[name], tokens=rows.tokens, token_ids=rows.token_ids,
                          special=rows.special, special_kind=rows.special_kind, subword=rows.subword,
                          meta=part_meta(meta, name), offsets=rows.offsets,
                          generated=generated if rows is target else None, keys=keys,
                          sound=sound if name != "decoder" else None, mel=mel if name != "decoder" else None)
        captures[name] = capture.validate(atol=atol)
    return Parts(captures)
