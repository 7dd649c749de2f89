"""Attention while a causal language model writes: decoding with the KV cache, each step's attention row
kept as it is produced, assembled into one Capture of the whole sequence.

    prompt (P tokens) --model, output_attentions--> rows 0..P-1
    for each new token t: choose it (greedy, or sampled with temperature / top-p), feed it with the cache
        --> its row t, of length t + 1, per layer and head
    -> α [L, H, T, T] lower-triangular, tokens, and `generated` flags

Memory is one (L, H, T, T) array filled in place, not a copy per step.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from attnviz.data.capture import Capture
from attnviz.engine.forward import attentions_of, encode, make_capture
from attnviz.engine.models import layers_and_heads
from attnviz.engine.memory import check_memory
from attnviz.errors import arg, AttentionCheckError, InputError, UsageError, warn
from attnviz.base.sizes import MAX_NEW_TOKENS
from attnviz.base.tokens import readable_tokens, special_ids, special_kind as _special_kind


@dataclass(frozen=True)
class Decoding:
    """How the next token is chosen: greedy (the most likely), or sampled."""

    max_new_tokens: int = 20
    sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse what no decoding can be, naming the argument (as Python or the command line spells it)."""
        def whole(value) -> bool:
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        def real(value) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)

        if not whole(self.max_new_tokens) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise UsageError(f"{arg('max_new_tokens')} takes a whole number from 1 to {MAX_NEW_TOKENS:,}; got "
                             f"{self.max_new_tokens!r:.40}", "max_new_tokens")
        if not isinstance(self.sample, bool):
            raise UsageError(f"{arg('sample')} takes True or False; got {self.sample!r:.40}", "sample")
        if not real(self.temperature) or self.temperature <= 0:
            raise UsageError(f"{arg('temperature')} takes a number above 0; got {self.temperature!r:.40}",
                             "temperature")
        if not real(self.top_p) or not 0 < self.top_p <= 1:
            raise UsageError(f"{arg('top_p')} takes a number above 0 and at most 1; got {self.top_p!r:.40}", "top_p")
        if not whole(self.seed) or not 0 <= self.seed < 2**64:
            raise UsageError(f"{arg('seed')} takes a whole number from 0 to 2**64 - 1; got {self.seed!r:.40}", "seed")

    def describe(self) -> str:
        if not self.sample:
            return "greedy"
        return f"sampled: temperature {self.temperature:g}, top-p {self.top_p:g}, seed {self.seed}"


def choose_token(logits, decoding: Decoding, generator):
    """The next token id from the last position's logits (1, V)."""
    import torch

    if not decoding.sample:
        return int(logits[0].argmax())
    probs = torch.softmax(logits[0].double() / max(decoding.temperature, 1e-6), dim=-1)
    if decoding.top_p < 1.0:  # keep the smallest set of most likely tokens holding top_p of the probability
        ordered, order = probs.sort(descending=True)
        keep = ordered.cumsum(0) - ordered < decoding.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


def generate_capture(loaded, text: str, decoding: Decoding, *, truncate: bool = True,
                     on_step: Callable[[int], None] | None = None) -> Capture:
    """Generate from `text` with the KV cache, keeping every layer's and head's attention row of every
    position; the Capture of prompt + generated tokens, with `generated` flags."""
    import torch


    encoded = encode(loaded, text, truncate=truncate)
    tok = loaded.tokenizer
    ids = encoded.inputs["input_ids"]  # (1, P)
    P = ids.shape[1]
    room = decoding.max_new_tokens
    stopped = "max_new_tokens"
    if loaded.max_positions and P >= loaded.max_positions:
        raise InputError(f"the prompt is {P} tokens long and {loaded.name} takes at most {loaded.max_positions}: "
                         f"no room to generate; give a shorter prompt")
    if loaded.max_positions and P + room > loaded.max_positions:
        stopped = "max_positions"
        room = max(loaded.max_positions - P, 0)
        warn(f"{loaded.name} takes at most {loaded.max_positions} positions: generating {room} new tokens, "
                      f"not {decoding.max_new_tokens}")
    T_max = P + room
    check_memory(loaded, T_max)
    L, H = layers_and_heads(loaded.model.config)
    alpha = np.zeros((L, H, T_max, T_max), np.float32)  # filled in place, row by row
    eos = {i for i in (getattr(tok, "eos_token_id", None), getattr(loaded.model.config, "eos_token_id", None))
           if isinstance(i, int)}
    generator = torch.Generator().manual_seed(decoding.seed)
    new_ids: list[int] = []
    device = ids.device
    try:
        with torch.inference_mode():
            out = loaded.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True,
                               output_attentions=True)
            _rows(alpha, out, 0, P, loaded)
            for step in range(room):
                next_id = choose_token(out.logits[:, -1], decoding, generator)
                if next_id in eos:
                    stopped = "eos"
                    break
                t = P + step  # the new token's position
                new_ids.append(next_id)
                out = loaded.model(input_ids=torch.tensor([[next_id]], device=device),
                                   attention_mask=torch.ones((1, t + 1), dtype=ids.dtype, device=device),
                                   **cache_argument(out), use_cache=True, output_attentions=True)
                _rows(alpha, out, t, t + 1, loaded)
                if on_step is not None:
                    on_step(1)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise AttentionCheckError(f"{loaded.name} could not generate: {str(exc).splitlines()[0]}") from None
    T = P + len(new_ids)
    alpha = np.ascontiguousarray(alpha[:, :, :T, :T])
    marked = special_ids(tok)
    raw = tok.convert_ids_to_tokens(new_ids)
    generated_text, spans = written_spans(tok, encoded.token_ids, new_ids, len(text))
    special = [i in marked for i in new_ids]
    previous_special = [encoded.special[-1], *special[:-1]]
    subword = [not r.startswith(("Ġ", "▁", "Ċ")) and not s and not before and not tok.decode([i]).startswith(" ")
               for r, i, s, before in zip(raw, new_ids, special, previous_special)]
    full = text + generated_text
    tokens = readable_tokens(raw, [tok.decode([i]) for i in new_ids], [full[a:b] if a >= 0 else None for a, b in spans],
                             special, subword)
    kinds = [_special_kind(tok, i, P + n, s) for n, (i, s) in enumerate(zip(new_ids, special))]
    encoded.tokens += tokens
    encoded.token_ids = [*encoded.token_ids, *new_ids]
    encoded.special = [*encoded.special, *special]
    encoded.special_kind = [*encoded.special_kind, *kinds]
    encoded.subword = [*encoded.subword, *subword]
    encoded.offsets = [*(encoded.offsets or [(-1, -1)] * P), *spans]
    capture = make_capture(loaded, encoded, alpha, full)

    meta = {**capture.meta, "source": "generate", "prompt": text, "generated_text": generated_text,
            "decoding": decoding.describe(), "stopped": stopped}
    return replace(capture, meta=meta, generated=np.arange(T) >= P)


SPAN_LIMIT = 2048  # new tokens up to which each one's span of the text is worked out (one decode per token)


def written_spans(tok, prompt_ids: list[int], new_ids: list[int], prompt_chars: int
                  ) -> tuple[str, list[tuple[int, int]]]:
    """The generated text as it continues the prompt (decoded together with the prompt ids, so a leading
    space is kept), and each new token's (start, end) in prompt + generated text, (-1, -1) where a token
    has no span of its own (a piece of a multi-byte character)."""
    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    before = decode(prompt_ids)
    whole = decode(prompt_ids + new_ids)
    if not whole.startswith(before):  # a tokenizer that does not decode prefix-stably
        return decode(new_ids), [(-1, -1)] * len(new_ids)
    written = whole[len(before):]
    spans: list[tuple[int, int]] = [(-1, -1)] * len(new_ids)
    if len(new_ids) > SPAN_LIMIT:
        return written, spans
    end, pending = 0, list[int]()
    for n in range(len(new_ids)):
        upto = decode(prompt_ids + new_ids[:n + 1])[len(before):]
        stop = len(upto) if written.startswith(upto) else -1
        if stop > end and "\ufffd" not in written[end:stop]:
            for m in [*pending, n]:  # the pieces of one character share its span
                spans[m] = (prompt_chars + end, prompt_chars + stop)
            end, pending = stop, []
        else:
            pending.append(n)
    return written, spans


def cache_argument(out) -> dict:
    """The returned KV cache, passed back under the name this transformers version takes (5.x: `cache`)."""
    if getattr(out, "cache", None) is not None:
        return {"cache": out.cache}
    return {"past_key_values": out.past_key_values}


def _rows(alpha: np.ndarray, out, start: int, stop: int, loaded) -> None:
    """Copy the rows start..stop-1 of every layer's attention (1, H, rows, stop) into alpha."""

    for layer, weights in enumerate(attentions_of(out, loaded.model, loaded.name)):
        alpha[layer, :, start:stop, :stop] = weights[0].float().cpu().numpy()
