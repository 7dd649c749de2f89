"""The one place that chooses how a text's attention is computed: the full α, streamed a block of query rows
at a time (over the memory budget, or asked for), word level, or an encoder-decoder model's three parts.
`attnviz.capture` calls it for the library, and through it every command of the command line.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.engine.families import can, require
from attnviz.engine.forward import encode, make_capture, model_attentions
from attnviz.engine.generation import Decoding
from attnviz.engine.models import layers_and_heads
from attnviz.engine.memory import attention_bytes, check_memory, memory_budget
from attnviz.engine.seq2seq import parts_capture
from attnviz.engine.stream import streamed_capture, streamed_words, Window
from attnviz.errors import arg
from attnviz.progress import Reporter
from attnviz.base.selection import find_token, Selection
from attnviz.base.sizes import size_text
from attnviz.base.text import check_text, visible
from attnviz.data.words import to_words


def run_capture(loaded, text: str, *, words: bool, stream: bool | None, part: str | None, target: str | None,
             max_new_tokens: int | None, truncate: bool, pool: int, window: tuple | None, rollout_token: str | None,
             pictures: bool, decoding: Any, reporter: Reporter) -> Capture | Parts:
    loaded.check_inputs(part=part, target=target, max_new_tokens=max_new_tokens, stream=stream)
    if loaded.seq2seq:
        whole = _parts(loaded, text, target, max_new_tokens, truncate, decoding, reporter)
        if words:
            whole = to_words(whole)
        return whole.part(part) if part is not None else whole
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.token_ids)
    budget = loaded.memory_budget or memory_budget()

    streams = can(loaded, "stream")
    if stream is False or not (stream or attention_bytes(loaded, T) > budget) or (stream is None and not streams):
        check_memory(loaded, T, streams=stream is not False and streams)  # over the budget: says why, and how
        with reporter.status("Running the model…"):
            full = make_capture(loaded, encoded, model_attentions(loaded, encoded), text)
        return to_words(full) if words else full

    require(loaded, "stream")
    if words:
        from attnviz.data.words import word_edges

        W = len(word_edges(encoded.tokens, encoded.subword, encoded.special)) - 1
        reporter.note(f"Streamed: {T} tokens in {W} words, attention computed a block of query rows at a time "
                      f"({arg('stream') if stream else 'over ' + arg('max_memory')}).")
        return streamed_words(loaded, encoded, text, budget)
    why = arg("stream") if stream else (f"the full attention would take {size_text(attention_bytes(loaded, T))}, "
                                        f"over {arg('max_memory')} {size_text(budget)}")
    reporter.note(f"Streamed: {T} tokens, attention computed a block of query rows at a time ({why}); pictures "
                  f"show block means.")
    return _streamed(loaded, encoded, text, window, rollout_token, pictures, pool, reporter)


def _parts(loaded, text: str, target: str | None, max_new_tokens: int | None, truncate: bool, decoding: Any,
           reporter: Reporter) -> Parts:
    """An encoder-decoder model's three parts: the decoder reads `target`, or writes (greedy)."""
    if target is not None:
        check_text(target)
        with reporter.status("Running the model…"):
            return parts_capture(loaded, text, target=target, truncate=truncate)
    decoding = decoding or Decoding(max_new_tokens=max_new_tokens or 20)
    with reporter.progress("Writing", decoding.max_new_tokens, "tokens") as step:
        parts = parts_capture(loaded, text, decoding=decoding, truncate=truncate, on_step=step)

    reporter.note(f"Decoder input: written by the model ({decoding.describe()}, "
                  f"{len(parts.part('decoder').tokens) - 1} tokens): “{visible(parts.meta.get('target_text', ''))}”; "
                  f"{arg('target')} gives your own.")
    return parts


def _streamed(loaded, encoded, text: str, window: tuple | None, rollout_token: str | None, pictures: bool,
              pool: int, reporter: Reporter) -> Capture:
    """The streamed path: statistics exact, pictures pooled, the rollout row of the first token (the last for
    causal models) and of `rollout_token`, and the exact `window` (rows, cols, layers) asked for."""

    import numpy as np


    T = len(encoded.token_ids)
    L, _ = layers_and_heads(loaded.model.config)
    starts = [n for n, kind in enumerate(encoded.special_kind) if kind == "start"]
    rollout = [T - 1 if loaded.causal or not starts else starts[0]]
    if rollout_token is not None:
        rollout.append(find_token(encoded.tokens, rollout_token))
    spec = None
    if window is not None:
        rows, cols, layers = window
        rows = rows or Selection.everything("row", "rows")
        cols = cols or Selection.everything("col", "cols")
        spec = Window(rows=np.asarray(rows.indices(T)), cols=np.asarray(cols.indices(T)),
                      layers=tuple(layers.indices(L)))
    with reporter.progress("Streaming", L * T, "query rows") as step:
        pooled, kept = streamed_capture(loaded, encoded, text,
                                        rollout_tokens=list(dict.fromkeys(rollout)) if pictures else [],
                                        window=spec, pool=pool if pictures else 1, on_rows=step)
    if spec is not None and pooled.long is not None:
        pooled = replace(pooled, long=replace(pooled.long, window=kept, window_rows=spec.rows,
                                              window_cols=spec.cols, window_layers=spec.layers))
    return pooled
