"""Long inputs without the L·H·T² tensor: attention computed a block of query rows at a time and folded
straight into what the views need, the way FlashAttention tiles it.

    text -> model(SDPA, no attention weights), hooks keep what each attention module receives (B, T, D)
         -> per layer (top to bottom), per block of b query rows: Q_rows·Kᵀ/√d_k + mask -> softmax
            -> α rows (H, b, T) -> every metric of the registry (metrics.Accumulator),
                                    a pooled α (block means, at most P × P), rollout rows,
                                    an exact window when asked for

Peak memory is the kept activations (L·T·D) plus one block (H·b·T), not L·H·T². The metrics are the
registry's own row functions, so the numbers are the full path's (tests: within 1e-5).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.blocks import equal_edges, sum_blocks
from attnviz.metrics import Accumulator, Rows, Tokens, all_metrics, rollout_rows
from attnviz.engine.hooks import recording_inputs
from attnviz.engine.fromscratch.adapters import adapter_for, layer_qkv
from attnviz.engine.fromscratch.formula import attention_weights

BLOCK_BYTES = 16 << 20  # one block of α rows in float64 (the numpy side); the torch side holds a float32 copy
DEFAULT_POOL = 512  # pooled pictures have at most this many cells a side


@dataclass
class Window:
    """An exact window of α to keep: query rows × key columns, for some layers."""

    rows: np.ndarray  # (r,) query positions
    cols: np.ndarray  # (c,) key positions
    layers: tuple[int, ...]


@dataclass
class Streamed:
    """What one streamed pass over a long input keeps.

    values   metric name -> (L, H), the registry's metrics and the label inputs
    pooled   (L, H, P, P) float32: rows averaged and key columns summed over blocks of `block` tokens, so
             each pooled row still sums to 1
    edges    (P + 1,) token positions where blocks start (and T at the end)
    rollout  token -> (T,): its row of attention rollout
    window   (len(layers), H, r, c) float32 exact α, or None"""

    values: dict[str, np.ndarray]
    pooled: np.ndarray
    edges: np.ndarray
    block: int
    rollout: dict[int, np.ndarray] = field(default_factory=dict)
    window: np.ndarray | None = None


def _give_back_memory() -> None:
    """Return freed heap to the system (glibc keeps it per thread arena; torch's threads allocate in
    several), so that memory stays flat over layers instead of creeping up. A no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _sdpa(model):
    """The model's own attention as SDPA while streaming (it then holds no T × T per head), eager again after."""
    before = getattr(model.config, "_attn_implementation", "eager")
    switched = False
    try:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("sdpa")
            switched = getattr(model.config, "_attn_implementation", before) == "sdpa"
    except (ValueError, ImportError, AttributeError):
        switched = False
    try:
        yield switched
    finally:
        if switched:
            model.set_attn_implementation(before)


def _row_mask(allowed_keys: torch.Tensor, queries: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor:
    """Which keys each query row may see: real keys; for causal models only j ≤ i (and i − j < window).
    allowed_keys (T,) bool, queries (b,) -> (1, b, T) bool"""
    T = allowed_keys.shape[0]
    keys = torch.arange(T, device=queries.device)[None, :]  # (1, T)
    mask = allowed_keys[None, :].expand(len(queries), T)  # (b, T)
    if causal:
        mask = mask & (keys <= queries[:, None])
        if window is not None:
            mask = mask & (queries[:, None] - keys < window)
    return mask[None]


def stream(model, inputs: dict, tokens: Tokens, *, batch: int = 0, pool: int = DEFAULT_POOL,
           rollout_tokens: Sequence[int] = (), window: Window | None = None, edges: np.ndarray | None = None,
           block_bytes: int = BLOCK_BYTES, on_layer_done: Callable[[int], None] | None = None) -> Streamed:
    """One pass over a (long) input: the model once, then attention a block of rows at a time, folded into
    the metrics, a pooled α, rollout rows and an exact window. `tokens` describes the real (unpadded)
    tokens of batch element `batch`; padding positions are dropped, as if the text had run alone.
    `on_layer_done(heads)` is called after each layer (for a progress bar).

    Without rollout rows each layer is folded in as the forward pass reaches it and its input is dropped
    (nothing is kept across layers); rollout multiplies from the top layer down, so then every layer's input
    is kept (L·T·D floats) and the layers are folded in top to bottom after the pass."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    modules = adapter.modules(base)
    key_mask = inputs.get("attention_mask")
    device = inputs["input_ids"].device
    real = (key_mask[batch].bool() if key_mask is not None
            else torch.ones(inputs["input_ids"].shape[1], dtype=torch.bool, device=device))
    positions = torch.nonzero(real).flatten()  # the real tokens' positions in the padded batch
    T = len(positions)
    if T != tokens.T:
        raise ValueError(f"{tokens.T} tokens described, {T} real positions in the batch")
    L = len(modules)
    run = _Run(tokens, T, L, pool, rollout_tokens, window, block_bytes, adapter.causal, adapter.window(base.config),
               device, edges)

    def fold(layer: int, record) -> None:
        qkv = layer_qkv(adapter, modules[layer], record, layer, base.config)
        run.layer(layer, qkv.q[batch][:, positions], qkv.k[batch][:, positions])  # (H, T, d) each
        del qkv
        _give_back_memory()
        if on_layer_done is not None:
            on_layer_done(run.H)

    keep = bool(rollout_tokens)
    with recording_inputs(modules, None if keep else fold) as seen, _sdpa(model), torch.inference_mode():
        model(**inputs)
    if keep:
        with torch.inference_mode():
            for layer in reversed(range(L)):  # top to bottom, as rollout multiplies
                record, seen[layer] = seen[layer], None  # this layer's input is no longer needed after
                fold(layer, record)
    return run.result()


class _Run:
    """The accumulators of one streamed pass."""

    def __init__(self, tokens: Tokens, T: int, L: int, pool: int, rollout_tokens: Sequence[int],
                 window: Window | None, block_bytes: int, causal: bool, sliding: int | None, device,
                 edges: np.ndarray | None = None):
        self.tokens, self.T, self.L, self.window, self.block_bytes = tokens, T, L, window, block_bytes
        self.causal, self.sliding, self.device = causal, sliding, device
        self.metrics = all_metrics()
        if edges is not None:  # blocks of the caller's choosing (words), not equal ones
            self.edges, self.block = np.asarray(edges, np.int64), int(np.diff(edges).max())
        else:
            self.edges, self.block = equal_edges(T, pool)
        P = len(self.edges) - 1
        self.block_of = np.repeat(np.arange(P), np.diff(self.edges))  # (T,) pooled block of each token
        self.per_layer: list[dict] = [{} for _ in range(L)]
        self.pooled: np.ndarray | None = None
        self.rollout_tokens = list(rollout_tokens)
        self.vectors = np.zeros((len(self.rollout_tokens), T))
        self.vectors[np.arange(len(self.rollout_tokens)), self.rollout_tokens] = 1.0
        self.kept: np.ndarray | None = None
        self.allowed = torch.ones(T, dtype=torch.bool, device=device)
        self.H = 0

    def layer(self, layer: int, q: torch.Tensor, k: torch.Tensor) -> None:
        T, P = self.T, len(self.edges) - 1
        self.H = H = q.shape[0]
        if self.pooled is None:
            self.pooled = np.zeros((self.L, H, P, P), np.float32)
        if self.window is not None and self.kept is None:
            self.kept = np.zeros((len(self.window.layers), H, len(self.window.rows), len(self.window.cols)),
                                 np.float32)
        acc = Accumulator(self.metrics, H, self.tokens)
        rolled = np.zeros_like(self.vectors)
        step = max(1, self.block_bytes // (H * T * 8))
        for start in range(0, T, step):
            queries = torch.arange(start, min(start + step, T), device=self.device)
            alpha = attention_weights(q[:, queries], k, _row_mask(self.allowed, queries, self.causal, self.sliding))
            rows = alpha.double().cpu().numpy()  # (H, b, T)
            del alpha
            at = queries.cpu().numpy()
            acc.add(Rows(rows, at, self.tokens))
            # blocks.pool_blocks, a block of rows at a time: key columns summed per block, rows summed here and
            # divided by the block's size at the end
            key_blocks = sum_blocks(rows, self.edges, -1)  # (H, b, P)
            ids = self.block_of[at]  # (b,) sorted: the rows of a query block are consecutive
            firsts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            self.pooled[layer][:, ids[firsts]] += sum_blocks(key_blocks, np.r_[firsts, len(at)], 1).astype(np.float32)
            if self.rollout_tokens:
                rolled += self.vectors[:, at] @ rollout_rows(rows, at)  # (k, T)
            if self.window is not None and layer in self.window.layers:
                inside = np.nonzero(np.isin(self.window.rows, at))[0]
                if len(inside) and self.kept is not None:
                    here = self.window.rows[inside] - start
                    window_layer = self.window.layers.index(layer)
                    self.kept[window_layer][:, inside] = rows[:, here][:, :, self.window.cols]
        if self.rollout_tokens:
            self.vectors = rolled
        self.per_layer[layer] = acc.result()

    def result(self) -> Streamed:
        pooled = self.pooled if self.pooled is not None else np.zeros((self.L, 0, 1, 1), np.float32)
        pooled /= np.diff(self.edges).astype(np.float32)[None, None, :, None]  # rows averaged: each sums to 1
        values = {m.name: np.stack([self.per_layer[n][m.name] for n in range(self.L)]) for m in self.metrics}
        rollout = {token: self.vectors[n] for n, token in enumerate(self.rollout_tokens)}
        return Streamed(values, pooled, self.edges, self.block, rollout, self.kept)


def block_labels(tokens: Sequence[str], edges: np.ndarray) -> list[str]:
    """A label per pooled block: its first token, and the token positions it spans."""
    from attnviz.text import fit

    labels = []
    for start, stop in zip(edges[:-1], edges[1:]):
        first = fit(str(tokens[start]), 10)
        labels.append(first if stop - start == 1 else f"{start}–{stop - 1} {first}")
    return labels


def streamed_capture(loaded, encoded, text: str, *, pool: int = DEFAULT_POOL, rollout_tokens: Sequence[int] = (),
                     window: Window | None = None, edges: np.ndarray | None = None,
                     on_layer_done: Callable[[int], None] | None = None):
    """A pooled Capture of a long input: α averaged over blocks of tokens (at most `pool` a side, each row
    still summing to 1), the head statistics and rollout rows of the exact α computed a block of rows at a
    time, and the exact window when one was asked for (returned beside the capture)."""
    from attnviz import __version__
    from attnviz.capture import Capture, LongInput
    from attnviz.metrics import records_from_values
    from attnviz.engine.forward import row_sum_tolerance

    base = getattr(loaded.model, "base_model", loaded.model)
    causal = bool(loaded.causal if loaded.causal is not None else adapter_for(base).causal)
    tokens = Tokens(tuple(encoded.tokens), np.asarray(encoded.special, bool), np.array(encoded.special_kind), causal)
    result = stream(loaded.model, encoded.inputs, tokens, pool=pool, rollout_tokens=rollout_tokens, window=window,
                    edges=edges, on_layer_done=on_layer_done)
    edges = result.edges
    spans = list(zip(edges[:-1], edges[1:]))
    special = [bool(np.all(tokens.special[a:b])) for a, b in spans]
    kinds = [encoded.special_kind[a] if b - a == 1 else "" for a, b in spans]
    meta = {"model": loaded.name, "revision": loaded.revision, "device": loaded.device, "dtype": loaded.dtype,
            "model_type": loaded.model_type, "causal": causal, "text": text, "source": "stream",
            "attnviz_version": __version__, "dropped_tokens": encoded.dropped,
            "pooled": {"tokens": tokens.T, "block": result.block}, "head_stats": records_from_values(result.values)}
    long = LongInput(tokens.tokens, tokens.special, tuple(encoded.special_kind), edges,
                     {int(t): r for t, r in result.rollout.items()})
    capture = Capture(attentions=result.pooled, tokens=tuple(block_labels(tokens.tokens, edges)),
                      token_ids=np.asarray([encoded.token_ids[a] for a, _ in spans]), special=np.asarray(special),
                      special_kind=tuple(kinds), subword=np.zeros(len(spans), bool), meta=meta, long=long)
    return capture.validate(atol=max(row_sum_tolerance(loaded.dtype), 1e-4)), result.window


def streamed_words(loaded, encoded, text: str, budget: int):
    """Word-level attention of a long input: streamed with each word as a block, which gives the word-level
    α exactly (rows averaged over a word's pieces, keys summed), when W × W per head fits the budget. Words
    the model cannot read are labelled as on the full path ([UNK:먹었다])."""
    from dataclasses import replace

    from attnviz.errors import InputError
    from attnviz.engine.memory import attention_bytes
    from attnviz.sizes import size_text
    from attnviz.words import word_edges, word_labels

    edges = word_edges(encoded.tokens, encoded.subword, encoded.special)
    W = len(edges) - 1
    need = attention_bytes(loaded, W)  # the same formula as the full path, with W words for T tokens
    if need > budget:
        raise InputError(f"{W} words would need {size_text(need)} of word-level attention, "
                         f"over --max-memory {size_text(budget)}; drop --words (the token view streams), "
                         f"or raise --max-memory")
    capture, _ = streamed_capture(loaded, encoded, text, edges=edges)
    unk = getattr(loaded.tokenizer, "unk_token_id", None)
    unknown = [i == unk and not s for i, s in zip(encoded.token_ids, encoded.special)] if unk is not None else None
    labels = word_labels(encoded.tokens, edges, encoded.offsets, text, encoded.special, unknown)
    meta = {k: v for k, v in capture.meta.items() if k not in ("pooled", "head_stats")}
    return replace(capture, tokens=tuple(labels), long=None,
                   meta={**meta, "level": "word", "pieces": len(encoded.token_ids)}).validate()
