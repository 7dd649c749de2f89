"""Long inputs without the L·H·T² tensor: attention computed a block of query rows at a time and folded
straight into what the views need, the way FlashAttention tiles it.

    text -> model, its attention through attnviz's function in transformers' attention interface
         -> per layer, per block of b query rows: softmax(Q_rows·Kᵀ·scale (soft-capped, masked, sinks))
            -> the module's output α·V, and the same α rows (H, b, T) -> every metric of the registry
               (metrics.Accumulator), a pooled α (block means, at most P × P), rollout rows, an exact
               window when asked for

Peak memory is the model's activations, its boolean masks (T² bytes each, where it needs one) and one block
(B·H·b·T), not L·H·T². The metrics are the registry's own row functions, so the numbers are the full path's
(tests: within 1e-5, for every family in engine/families.py).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from attnviz._version import __version__
from attnviz.base.blocks import equal_edges, row_shares, sum_blocks, sum_row_blocks
from attnviz.data.capture import Capture
from attnviz.data.sides import LongInput
from attnviz.engine.families import has_sinks, layer_windows, require
from attnviz.engine.forward import row_sum_tolerance
from attnviz.metrics import Accumulator, all_metrics, records_from_values, rollout_rows, Rows, Tokens
from attnviz.base.parallel import Started, runs, start_all, threads
from attnviz.engine.interface import LayerAttention, block_rows, output, streaming
from attnviz.engine.lean import give_back_memory
from attnviz.engine.models import layers_and_heads
from attnviz.engine.memory import attention_bytes
from attnviz.errors import arg, InputError, UnsupportedArchitectureError
from attnviz.base.sizes import size_text
from attnviz.base.text import fit
from attnviz.data.words import word_edges, word_labels

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


@contextlib.contextmanager
def torch_beside_fold(device) -> Iterator[None]:
    """While a layer's blocks are computed and folded: torch on this one thread, the fold's threads on the other
    cores (each block is folded while torch computes the next). torch's own OpenMP workers would otherwise
    spin after each operation on the cores the fold needs (at T = 4096 on 2 cores, measured in one process:
    35.9 s with torch on two threads against 26.9 s on one). The thread count is restored after the layer; a
    GPU's work is not affected."""
    if torch.device(device).type != "cpu" or threads() == 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_streamed(model, inputs: dict, on_call: Callable[[LayerAttention, torch.Tensor], torch.Tensor],
                  L: int) -> None:
    """The model once with its attention through `on_call` (interface.streaming), checked to make one call per
    layer; without a cache of keys and values for later tokens (a causal LM would otherwise keep every layer's K
    and V: at 32,768 tokens on Qwen2.5-Coder-0.5B, 0.8 GB that nothing reads)."""
    from attnviz.engine.ablation.runs import run_model

    with streaming(model, on_call) as calls, torch.inference_mode():
        run_model(model, inputs)  # use_cache=False where the model takes it
    if calls[0] != L:
        model_type = getattr(model.config, "model_type", "this")
        raise UnsupportedArchitectureError(f"{model_type} ran {calls[0]} attention calls for {L} layers; the "
                                           f"streamed path needs one per layer")


def stream(model, inputs: dict, tokens: Tokens, *, batch: int = 0, pool: int = DEFAULT_POOL,
           rollout_tokens: Sequence[int] = (), window: Window | None = None, edges: np.ndarray | None = None,
           block_bytes: int | None = None, on_rows: Callable[[int], None] | None = None,
           windows: Sequence[int] | None = None) -> Streamed:
    """One pass over a (long) input: the model once, its attention through attnviz's function in transformers'
    attention interface (engine/interface.py), which computes each module's output a block of query rows at
    a time and folds the same α rows into the metrics, a pooled α, rollout rows and an exact window. `tokens`
    describes the real (unpadded) tokens of batch element `batch`; padding positions are dropped, as if the
    text had run alone. `on_rows(n)` is called as each block's n query rows are folded (a progress bar of L·T
    rows). `windows`:
    each layer's sliding window (families.layer_windows), which the statistics count keys within.

    Without rollout rows each layer is folded in as the forward pass reaches it and nothing is kept across
    layers; rollout multiplies from the top layer down, so then every layer's Q and K are kept (2·L·H·T·d
    floats) and the layers are folded in top to bottom after the pass."""

    key_mask = inputs.get("attention_mask")
    device = inputs["input_ids"].device
    real = (key_mask[batch].bool() if key_mask is not None
            else torch.ones(inputs["input_ids"].shape[1], dtype=torch.bool, device=device))
    positions = torch.nonzero(real).flatten()  # the real tokens' positions in the padded batch
    T = len(positions)
    if T != tokens.T:
        raise ValueError(f"{tokens.T} tokens described, {T} real positions in the batch")
    L, _ = layers_and_heads(model.config)
    if windows is None:
        windows = layer_windows(model.config, L)
    run = _Run(tokens, T, L, pool, rollout_tokens, window, block_bytes, device, edges, windows)
    keep = bool(rollout_tokens)
    kept: list[LayerAttention] = []

    def fold(layer: int, attention: LayerAttention) -> None:
        with torch_beside_fold(device):
            run.layer(layer, attention, batch, positions, on_rows)
        give_back_memory()

    index = torch.full((inputs["input_ids"].shape[1],), -1, dtype=torch.long, device=device)
    index[positions] = torch.arange(T, device=device)  # padded position -> real position (−1: padding)
    unpadded = T == inputs["input_ids"].shape[1]

    def on_call(attention: LayerAttention, value: torch.Tensor) -> torch.Tensor:
        if keep:  # rollout: the layers are folded after the pass, top to bottom
            kept.append(attention)
            return output(attention, value, block_bytes)
        run.begin(run.folded, attention.heads)

        def on_block(queries: torch.Tensor, alpha: torch.Tensor) -> None:  # the same α rows, computed once
            if unpadded:  # every position is a real token: no copies to pick them out
                run.add(queries.cpu().numpy(), alpha[batch], attention)
                if on_rows is not None:
                    on_rows(len(queries))
                return
            real = index[queries]  # (b,)
            chosen = real >= 0
            if bool(chosen.any()):
                run.add(real[chosen].cpu().numpy(), alpha[batch][:, chosen][:, :, positions], attention)
                if on_rows is not None:
                    on_rows(int(chosen.sum()))

        with torch_beside_fold(device):
            out = output(attention, value, block_bytes, on_block)
            run.end()
        give_back_memory()
        return out

    _run_streamed(model, inputs, on_call, L)
    if keep:
        with torch.inference_mode():
            for layer in reversed(range(L)):  # top to bottom, as rollout multiplies
                fold(layer, kept[layer])
                kept[layer] = None  # type: ignore[call-overload]  # this layer's Q and K are no longer needed
    return run.result()


class _Run:
    """The accumulators of one streamed pass."""

    def __init__(self, tokens: Tokens, T: int, L: int, pool: int, rollout_tokens: Sequence[int],
                 window: Window | None, block_bytes: int | None, device, edges: np.ndarray | None = None,
                 windows: Sequence[int] | None = None):
        self.tokens, self.T, self.L, self.window, self.block_bytes = tokens, T, L, window, block_bytes
        self.windows = windows
        self.device, self.folded = device, 0
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
        self.H = 0
        self.folding = Started([], [])  # the runs of the last block, while they are folded

    def layer(self, layer: int, attention: LayerAttention, batch: int, positions: torch.Tensor,
              on_rows: Callable[[int], None] | None = None) -> None:
        """Fold one layer's α, computed here a block of query rows at a time: batch element `batch`, its real
        positions only (query rows and key columns). For layers kept until after the forward pass."""
        self.begin(layer, attention.heads)
        step = block_rows(self.block_bytes, self.T, attention.heads, self.T)
        for start in range(0, self.T, step):
            at = np.arange(start, min(start + step, self.T))  # (b,) real query positions
            self.add(at, attention.rows(positions[start:start + len(at)])[batch][:, :, positions], attention)
            if on_rows is not None:
                on_rows(len(at))
        self.end()

    def begin(self, layer: int, H: int) -> None:
        P = len(self.edges) - 1
        self.H, self.current = H, layer
        if self.pooled is None:
            self.pooled = np.zeros((self.L, H, P, P), np.float32)
        if self.window is not None and self.kept is None:
            self.kept = np.zeros((len(self.window.layers), H, len(self.window.rows), len(self.window.cols)),
                                 np.float32)
        self.layer_tokens = self.tokens.at_layer(self.windows, layer)  # with this layer's sliding window
        self.accs = [Accumulator(self.metrics, H, self.layer_tokens) for _ in range(threads())]  # one a thread
        self.rolled = np.zeros_like(self.vectors)

    def add(self, at: np.ndarray, alpha: torch.Tensor, attention: LayerAttention) -> None:
        """Fold α rows (H, b, T) of the real query positions `at` (consecutive) over the real keys: the rows cut
        into runs, one per thread (parallel.run_all), each run folded into that thread's accumulator."""
        layer = self.current
        rows = alpha.float().cpu().numpy()  # (H, b, T): float32, as the model made it (metrics.Rows: which sums
        # are taken in float32, which in float64)
        sinks = attention.sinks is not None
        causal = attention.causal  # a causal layer without a mask: no weight past a run's last row (Rows.reach)
        cuts = runs(len(at), len(self.accs))
        ids = self.block_of[at]  # (b,) sorted: the rows of a query block are consecutive
        assert self.pooled is not None
        pooled = self.pooled[layer]

        def fold(k: int) -> None:
            r0, r1 = cuts[k]
            mine = rows[:, r0:r1]
            self.accs[k].add(Rows(row_shares(mine) if sinks else mine, at[r0:r1], self.layer_tokens,
                                  mine.sum(axis=-1, dtype=np.float64) if sinks else None,
                                  reach=int(at[r1 - 1]) + 1 if causal else 0))  # shares, as the full
            # path's as_distribution(); blocks.pool_blocks a block of rows at a time: rows summed per query
            # block, then key columns per key block (float32 is plenty for a few rows and keys of a picture);
            # divided at the end
            mine_ids = ids[r0:r1]
            firsts = np.flatnonzero(np.r_[True, mine_ids[1:] != mine_ids[:-1]])
            summed = sum_blocks(sum_row_blocks(mine, np.r_[firsts, len(mine_ids)]), self.edges, -1)  # (H, g, P)
            with lock:  # two runs may share a query block
                pooled[:, mine_ids[firsts]] += summed

        lock = threading.Lock()
        self.folding.wait()  # the block before: each accumulator takes one run at a time
        self.folding = start_all([functools.partial(fold, k) for k in range(len(cuts))])  # while the model
        # computes the next block
        if self.rollout_tokens:
            self.rolled += self.vectors[:, at] @ rollout_rows(row_shares(rows) if sinks else rows, at)  # (k, T)
        if self.window is not None and layer in self.window.layers:
            inside = np.nonzero(np.isin(self.window.rows, at))[0]
            if len(inside) and self.kept is not None:
                here = self.window.rows[inside] - at[0]
                window_layer = self.window.layers.index(layer)
                self.kept[window_layer][:, inside] = rows[:, here][:, :, self.window.cols]

    def end(self) -> None:
        self.folding.wait()
        if self.rollout_tokens:
            self.vectors = self.rolled
        for other in self.accs[1:]:
            self.accs[0].absorb(other)
        self.per_layer[self.current] = self.accs[0].result()
        self.folded += 1

    def result(self) -> Streamed:
        pooled = self.pooled if self.pooled is not None else np.zeros((self.L, 0, 1, 1), np.float32)
        pooled /= np.diff(self.edges).astype(np.float32)[None, None, :, None]  # rows averaged: each sums to 1
        values = {m.name: np.stack([self.per_layer[n][m.name] for n in range(self.L)]) for m in self.metrics}
        rollout = {token: self.vectors[n] for n, token in enumerate(self.rollout_tokens)}
        return Streamed(values, pooled, self.edges, self.block, rollout, self.kept)


NORM_BYTES = 64 << 20  # the value vectors of a chunk of keys in float64, while their norms through W_O are made


def value_norms_streamed(value: torch.Tensor, weight: torch.Tensor, heads: int) -> torch.Tensor:
    """‖f_h(x_j)‖ = ‖v_h(x_j)·W_O^h‖ for every head and key of batch element 0, (H, T) float64, without the
    (H, T, D) vectors: ‖v·W_hᵀ‖² = v·(W_hᵀ·W_h)·vᵀ with each head's d × d Gram matrix, a chunk of keys at a time.
    value (B, K, T, d) as the family passes it (K heads repeated for grouped-query attention), weight (D, H·d)."""
    from attnviz.engine.interface import _repeat_heads

    v = _repeat_heads(value[:1], heads)[0]  # (H, T, d)
    H, T, d = v.shape
    w = weight.double().reshape(weight.shape[0], H, d)  # (D, H, d)
    gram = torch.einsum("ohd,ohe->hde", w, w)  # (H, d, d)
    norms = torch.empty(H, T, dtype=torch.float64, device=v.device)
    step = max(1, NORM_BYTES // (H * d * 8 * 2))
    for start in range(0, T, step):
        chunk = v[:, start:start + step].double()  # (H, c, d)
        norms[:, start:start + step] = torch.einsum("hcd,hde,hce->hc", chunk, gram, chunk).clamp_min(0).sqrt()
    return norms


def stream_sinks(model, inputs: dict, projections: Sequence, *, block_bytes: int | None = None,
                 on_rows: Callable[[int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What the sinks need of a long input (batch of 1, no padding), in one pass of the model with its attention
    computed a block of query rows at a time: per layer and head, each key's column sum of α, and of each
    query's shares of the value-weighted norms ‖α_ij f_h(x_j)‖ (α_ij ‖f_h(x_j)‖ over the row's sum), (L, H, T)
    float64 — L·H·T numbers, never L·H·T². `projections`: each layer's W_O (norms._out_weight reads it)."""
    from attnviz.engine.scratch.norms import _out_weight

    T = int(inputs["input_ids"].shape[1])
    L = len(projections)
    sums: list[list[torch.Tensor]] = []

    def on_call(attention: LayerAttention, value: torch.Tensor) -> torch.Tensor:
        n = len(sums)
        if n >= L:
            raise UnsupportedArchitectureError(f"the model ran more attention calls than its {L} layers")
        weight, _ = _out_weight(projections[n])
        fnorm = value_norms_streamed(value, weight, attention.heads)  # (H, T)
        by_alpha = torch.zeros(attention.heads, T, dtype=torch.float64, device=fnorm.device)
        by_norm = torch.zeros_like(by_alpha)
        norms = fnorm.float()
        tiny = torch.finfo(torch.float32).tiny

        def on_block(queries: torch.Tensor, alpha: torch.Tensor) -> None:
            # a causal layer's rows have no weight past the block's last row: those keys are skipped (exact). The
            # products are float32, as α is (each share off by about eps32 of itself); the sums float64
            reach = int(queries[-1]) + 1 if attention.causal else T
            a = alpha[0, :, :, :reach]  # (H, b, reach)
            by_alpha[:, :reach].add_(a.sum(dim=1, dtype=torch.float64))
            weighted = a * norms[:, None, :reach]
            totals = weighted.sum(dim=-1, keepdim=True, dtype=torch.float64)  # 0: the row's shares are all 0
            by_norm[:, :reach].add_(weighted.div_(totals.float().clamp_min(tiny)).sum(dim=1, dtype=torch.float64))
            if on_rows is not None:
                on_rows(len(queries))

        out = output(attention, value, block_bytes, on_block)
        sums.append([by_alpha.cpu(), by_norm.cpu()])
        give_back_memory()
        return out

    _run_streamed(model, inputs, on_call, L)
    return (torch.stack([a for a, _ in sums]).numpy(), torch.stack([b for _, b in sums]).numpy())


def block_labels(tokens: Sequence[str], edges: np.ndarray) -> list[str]:
    """A label per pooled block: its first token, and the token positions it spans."""

    labels = []
    for start, stop in zip(edges[:-1], edges[1:]):
        first = fit(str(tokens[start]), 10)
        labels.append(first if stop - start == 1 else f"{start}–{stop - 1} {first}")
    return labels


def streamed_capture(loaded, encoded, text: str, *, pool: int = DEFAULT_POOL, rollout_tokens: Sequence[int] = (),
                     window: Window | None = None, edges: np.ndarray | None = None,
                     on_rows: Callable[[int], None] | None = None):
    """A pooled Capture of a long input: α averaged over blocks of tokens (at most `pool` a side, each row
    still summing to 1), the head statistics and rollout rows of the exact α computed a block of rows at a
    time, and the exact window when one was asked for (returned beside the capture)."""


    require(loaded, "stream")
    causal = bool(loaded.causal)
    tokens = Tokens(tuple(encoded.tokens), np.asarray(encoded.special, bool), np.array(encoded.special_kind), causal,
                    ids=tuple(int(i) for i in encoded.token_ids))
    result = stream(loaded.model, encoded.inputs, tokens, pool=pool, rollout_tokens=rollout_tokens, window=window,
                    edges=edges, on_rows=on_rows)
    edges = result.edges
    spans = list(zip(edges[:-1], edges[1:]))
    special = [bool(np.all(tokens.special[a:b])) for a, b in spans]
    kinds = [encoded.special_kind[a] if b - a == 1 else "" for a, b in spans]
    meta = {"model": loaded.name, "model_source": loaded.source, "revision": loaded.revision, "device": loaded.device,
            "dtype": loaded.dtype, "model_type": loaded.model_type, "causal": causal, "text": text, "source": "stream",
            "attnviz_version": __version__, "dropped_tokens": encoded.dropped,
            "pooled": {"tokens": tokens.T, "block": result.block}, "head_stats": records_from_values(result.values)}
    if has_sinks(loaded.model_type):
        meta["sinks"] = True
    windows = layer_windows(loaded.model.config, int(result.pooled.shape[0]))
    if windows is not None:
        meta["windows"] = windows  # in tokens: Capture.masked draws the blocks a window leaves out wholly
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


    edges = word_edges(encoded.tokens, encoded.subword, encoded.special)
    W = len(edges) - 1
    need = attention_bytes(loaded, W)  # the same formula as the full path, with W words for T tokens
    if need > budget:
        raise InputError(f"{W} words would need {size_text(need)} of word-level attention, "
                         f"over {arg('max_memory')} {size_text(budget)}; drop {arg('words')} (the token view streams), "
                         f"or raise {arg('max_memory')}")
    capture, _ = streamed_capture(loaded, encoded, text, edges=edges)
    unk = getattr(loaded.tokenizer, "unk_token_id", None)
    unknown = [i == unk and not s for i, s in zip(encoded.token_ids, encoded.special)] if unk is not None else None
    labels = word_labels(encoded.tokens, edges, encoded.offsets, text, encoded.special, unknown)
    meta = {k: v for k, v in capture.meta.items() if k not in ("pooled", "head_stats")}
    return replace(capture, tokens=tuple(labels), long=None,
                   meta={**meta, "level": "word", "pieces": len(encoded.token_ids)}).validate()
