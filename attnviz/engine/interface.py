"""attnviz's own attention function in transformers' attention interface, for long inputs.

Transformers 5 runs almost every family's attention through one registry (`AttentionInterface`): the function
registered there receives query, key and value after the family's own projections, norms and rotary
positions, with the mask (causal, sliding window, padding), the scaling and the family's extras (logit
soft-capping, per-head sink logits). `streaming(model, on_layer)` switches the model to attnviz's function for
the length of a `with` block; each call becomes a `LayerAttention`, which computes the module's output a block
of query rows at a time with the textbook formula (`scratch.formula.attention_weights`) — the same
computation as the family's eager attention, without ever holding a T × T matrix per head — and hands the
layer to `on_layer`, where the streamed path folds its α rows into the statistics.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from attnviz.engine.scratch.formula import attention_weights
from attnviz.errors import UnsupportedArchitectureError

NAME = "attnviz_stream"  # the implementation's name in transformers' registries

# What families pass to the attention function beside Q, K, V and the mask, and what the formula does with it.
# Anything else that is set is refused rather than ignored: it would change α.
USED = {"scaling", "softcap", "s_aux", "sliding_window", "is_causal", "dropout"}
INERT = {"position_ids", "use_cache", "output_attentions", "cache_position", "deterministic", "encoder_hidden_states",
         "past_key_values", "cache", "layer_head_mask", "head_mask", "token_type_ids"}

BLOCK_BYTES = 16 << 20  # one block of α rows in float64 (the numpy side); the torch side holds a float32 copy
# ... and by default at least this many rows: a block re-reads the layer's whole K and V, so at long inputs a block
# of 16 MB (4 rows of 14 heads at 32,768 keys) spends its time reading them. Measured on Qwen2.5-Coder-0.5B's
# `heads --stream` over 32,768 tokens, its first two layers: 355.8 s with 4 rows, 294.1 s with 16, 260.6 s with
# 24; but over 8,192 tokens the whole run took 124 s with 16 MB's 18 rows and 178 s with 24, so the floor is
# 16, which leaves 8,192 tokens as they were
MIN_ROWS = 16

_handler: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("attnviz_stream_handler", default=None)
_registered = False


@dataclass
class LayerAttention:
    """One attention call as the family made it, ready to give α a block of query rows at a time.

    q (B, H, T, d) and k (B, H, T, d) float32 (K heads repeated for grouped-query attention); mask (B, 1, T, T)
    bool (True: may attend), or None with `causal` saying what it stands for; scale, softcap, sinks (H,) as
    the family passes them."""

    q: torch.Tensor
    k: torch.Tensor
    mask: torch.Tensor | None
    causal: bool
    scale: float
    softcap: float | None
    sinks: torch.Tensor | None

    @property
    def heads(self) -> int:
        return int(self.q.shape[1])

    def rows(self, queries: torch.Tensor) -> torch.Tensor:
        """α for the query rows `queries` (b,), over every key: (B, H, b, T) float32."""
        T = self.k.shape[2]
        if self.mask is not None:
            mask = self.mask[:, :, queries]  # (B, 1, b, T)
        elif self.causal:
            mask = (torch.arange(T, device=queries.device)[None, :] <= queries[:, None])[None, None]  # (1, 1, b, T)
        else:
            mask = None
        return attention_weights(self.q[:, :, queries], self.k, mask, scale=self.scale, softcap=self.softcap,
                                 sinks=self.sinks, fused=True)

    def block(self, start: int, stop: int, buffer: torch.Tensor) -> tuple[torch.Tensor, int]:
        """α for the query rows start..stop−1 written into `buffer` (B, H, ≥ stop − start, T) float32, which the
        caller reuses from block to block, and how many keys from the first can be non-zero. A fresh tensor per
        block costs its pages' first touch: at T = 32,768 a new (14, 64, T) tensor took 140 ms to fill with
        zeros, against 44 ms for the Q·Kᵀ that fills it. Without a mask or sinks each step runs in place, as
        `rows` computes it; a causal layer computes only the keys up to its last row and sets the rest of each
        row to 0 (half the work over a long input). With a mask or sinks it is `rows`, copied in."""
        b = stop - start
        alpha = buffer[:, :, :b]
        T = self.k.shape[2]
        if self.mask is not None or self.sinks is not None:
            alpha.copy_(self.rows(torch.arange(start, stop, device=buffer.device)))
            return alpha, T
        reach = stop if self.causal else T  # a causal row's keys past the block's last row are masked
        scores = alpha[..., :reach]
        torch.matmul(self.q[:, :, start:stop], self.k[:, :, :reach].transpose(-2, -1), out=scores)
        scores.mul_(self.scale)
        if self.softcap is not None:
            scores.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.causal:  # within the block's own keys, row r sees keys start..start+r
            above = torch.ones(b, b, dtype=torch.bool, device=buffer.device).triu(1)
            scores[..., start:].masked_fill_(above, float("-inf"))
        scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()  # every row sees at least its own key
        scores.div_(scores.sum(dim=-1, keepdim=True))
        alpha[..., reach:].zero_()
        return alpha, reach


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V with each key/value head repeated for the query heads it serves (grouped-query attention)."""
    groups = heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)  # (B, H, T, d)


def _attention(module, query, key, value, attention_mask, **kwargs):
    """The function registered in AttentionInterface: hand the call to the run that switched the model."""
    handler = _handler.get()
    if handler is None:
        raise RuntimeError("attnviz's streamed attention was called outside a streamed run")
    return handler(module, query, key, value, attention_mask, **kwargs)


def layer_attention(module, query, key, attention_mask, kwargs: dict) -> LayerAttention:
    """What the family computes in this call, as a LayerAttention; anything it passes that the formula does not
    compute is refused in one line."""
    model_type = getattr(getattr(module, "config", None), "model_type", None) or type(module).__name__
    unknown = sorted(name for name, value in kwargs.items()
                     if name not in USED | INERT and value is not None and value is not False)
    if unknown:
        raise UnsupportedArchitectureError(f"{model_type} passes {', '.join(unknown)} to its attention, which "
                                           f"attnviz's streamed path does not compute")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise UnsupportedArchitectureError(f"{model_type} gives its attention a mask of {attention_mask.dtype}, "
                                           f"not the boolean mask the streamed path reads")
    is_causal = kwargs.get("is_causal")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    scaling = kwargs.get("scaling")
    sinks = kwargs.get("s_aux")
    heads = query.shape[1]
    return LayerAttention(q=query.float(), k=_repeat_heads(key, heads).float(), mask=attention_mask,
                          causal=causal and attention_mask is None and query.shape[2] > 1,
                          scale=float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
                          softcap=kwargs.get("softcap"), sinks=None if sinks is None else sinks.float())


def block_rows(block_bytes: int | None, rows: int, heads: int, keys: int) -> int:
    """Query rows in one block of α (heads × b × keys): as many as block_bytes holds in float64, at least one;
    block_bytes None: BLOCK_BYTES' worth, at least MIN_ROWS. Never more than `rows`."""
    per_row = heads * keys * 8
    step = max(1, block_bytes // per_row) if block_bytes is not None else max(MIN_ROWS, BLOCK_BYTES // per_row)
    return min(rows, step)


def output(attention: LayerAttention, value: torch.Tensor, block_bytes: int | None = None,
           on_block: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> torch.Tensor:
    """The module's attention output α·V computed a block of query rows at a time, (B, T, H, d_v) as the family's
    eager attention returns it; `on_block(queries, alpha)` sees each block's α (B, H, b, T) as it is made. A
    block's rows: block_rows (block_bytes of α in float64 for the batch, what the numpy side folds; by default
    at least MIN_ROWS).

    The blocks' α are written into two buffers in turn (LayerAttention.block): a block's α stays as it is while
    the next block is computed (the fold of one block runs beside the next block's computation), and is
    overwritten by the block after that. A consumer that keeps α longer copies it."""
    B, H, T, _ = attention.q.shape
    v = _repeat_heads(value, H)  # (B, H, T, d_v)
    out = torch.empty(B, H, T, v.shape[-1], dtype=value.dtype, device=value.device)
    keys = attention.k.shape[2]
    step = block_rows(block_bytes, T, B * H, keys)
    buffers = [torch.empty(B, H, step, keys, dtype=torch.float32, device=value.device) for _ in range(2)]
    for n, start in enumerate(range(0, T, step)):
        stop = min(start + step, T)
        alpha, reach = attention.block(start, stop, buffers[n % 2])  # (B, H, b, T)
        out[:, :, start:stop] = alpha[..., :reach].to(v.dtype) @ v[:, :, :reach]  # (B, H, b, d_v)
        if on_block is not None:
            on_block(torch.arange(start, stop, device=value.device), alpha)
    return out.transpose(1, 2).contiguous()


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # boolean masks (True: attend), None where causal says all
    _registered = True


@contextlib.contextmanager
def streaming(model, on_call: Callable[[LayerAttention, torch.Tensor], torch.Tensor]) -> Iterator[list[int]]:
    """The model's attention through attnviz's function for the block: each call is made a LayerAttention and
    given to `on_call(attention, value)`, which returns the module's output. Yields a one-element list that
    counts the calls. The model's own implementation is put back when the block ends."""
    _register()
    before = getattr(model.config, "_attn_implementation", None) or "eager"
    calls = [0]

    def handle(module, query, key, value, attention_mask, **kwargs):
        calls[0] += 1
        return on_call(layer_attention(module, query, key, attention_mask, kwargs), value), None

    token = _handler.set(handle)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError, AttributeError, KeyError) as exc:
        _handler.reset(token)
        raise UnsupportedArchitectureError(f"{getattr(model.config, 'model_type', 'this')} models do not run "
                                           f"their attention through transformers' attention interface "
                                           f"({exc})") from None
    try:
        yield calls
    finally:
        _handler.reset(token)
        model.set_attn_implementation(before)
