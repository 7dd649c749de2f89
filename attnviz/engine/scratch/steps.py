"""steps: one head of one layer, every intermediate of softmax(Q·Kᵀ/√d_k)·V, from the model's own weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import torch

from attnviz.engine.forward import attentions_of
from attnviz.engine.scratch.formula import attention_weights
from attnviz.engine.scratch.verify import recompute
from attnviz.engine.memory import check_memory


@dataclass
class HeadSteps:
    """Every intermediate of one head's attention, from the model's own weights, as numpy float64.

    q, k (T, d_k); v (T, d_v); scores = q·kᵀ (T, T); scaled = scores / √d_k (T, T); allowed (T, T) bool
    (False where the mask hides a key); alpha = softmax(scaled + mask) (T, T); out = alpha·v (T, d_v);
    model_alpha: the model's own α for this head (T, T)."""

    layer: int
    head: int
    d_k: int
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    allowed: np.ndarray
    alpha: np.ndarray
    out: np.ndarray
    model_alpha: np.ndarray
    scaling: str = ""  # how this family scales the scores, when not ÷ √d_k alone (Gemma: 1/√query_pre_attn_scalar,
    # soft-capping); "" for the textbook ÷ √d_k
    sink: float | None = None  # this head's sink logit (gpt-oss): an extra key in every row's softmax
    window: str = ""  # the layer's sliding window or local reach, in words ("" if it sees every allowed key)

    @property
    def scaling_text(self) -> str:
        return self.scaling or f"÷ √d_k = {math.sqrt(self.d_k):.2f}"

    @property
    def max_diff(self) -> float:
        """max |α from these steps − the model's α|."""
        return float(np.abs(self.alpha - self.model_alpha).max())


def window_words(window: int | None, reach: int | None) -> str:
    """A layer's sliding window or local reach, said as the mask applies it."""
    if window is not None:
        return f"keys {window} or more tokens back masked too (a sliding window of {window})"
    if reach is not None:
        return f"keys more than {reach} tokens away masked (local attention, ±{reach})"
    return ""


def head_steps(loaded, encoded, layer: int, head: int) -> HeadSteps:
    """Recompute one head's attention step by step: Q and K from the module's own input and weights, the
    scores, the scaling by √d_k, the mask, the softmax and α·V, beside the model's own α."""

    check_memory(loaded, len(encoded.token_ids), copies=3.0)
    run = recompute(loaded.model, encoded.inputs)
    qkv = run.layers[layer]
    q, k, v = (t[0, head].double() for t in (qkv.q, qkv.k, qkv.v))  # (T, d) each
    d_k = q.size(-1)
    scores = q @ k.T  # (T, T)
    factor = 1.0 / math.sqrt(d_k) if qkv.scale is None else qkv.scale
    scaled = scores * factor
    scaling = "" if qkv.scale is None else f"× {factor:.3g} (1/√query_pre_attn_scalar, not 1/√d_k)"
    if qkv.softcap is not None:  # Gemma 2: the scaled scores soft-capped, s ↦ c·tanh(s/c), before the mask
        scaled = torch.tanh(scaled / qkv.softcap) * qkv.softcap
        cap = f"{qkv.softcap:g}"
        scaling = (scaling or f"÷ √d_k = {math.sqrt(d_k):.2f}") + f", soft-capped {cap}·tanh(s/{cap})"
    allowed = qkv.mask[0, 0] if qkv.mask is not None else torch.ones_like(scores, dtype=torch.bool)  # (T, T)
    sinks = None if qkv.sinks is None else qkv.sinks[head:head + 1].double()
    alpha = attention_weights(q[None], k[None], allowed[None], scale=factor, softcap=qkv.softcap,
                              sinks=sinks)[0]  # the textbook formula, in float64
    out = alpha @ v
    reported = attentions_of(run.output, loaded.model, loaded.name)[layer][0, head].double()  # (T, T)
    numpy = lambda t: t.detach().cpu().numpy()
    return HeadSteps(layer, head, d_k, numpy(q), numpy(k), numpy(v), numpy(scores), numpy(scaled), numpy(allowed),
                 numpy(alpha), numpy(out), numpy(reported), scaling, None if sinks is None else float(sinks[0]),
                 window_words(qkv.window, qkv.reach))
