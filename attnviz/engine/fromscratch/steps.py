"""steps: one head of one layer, every intermediate of softmax(Q·Kᵀ/√d_k)·V, from the model's own weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnviz.engine.fromscratch.formula import scaled_dot_product_attention
from attnviz.engine.fromscratch.verify import recompute


@dataclass
class Steps:
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

    @property
    def max_diff(self) -> float:
        """max |α from these steps − the model's α|."""
        return float(np.abs(self.alpha - self.model_alpha).max())


def head_steps(loaded, encoded, layer: int, head: int) -> Steps:
    """Recompute one head's attention step by step: Q and K from the module's own input and weights, the
    scores, the scaling by √d_k, the mask, the softmax and α·V, beside the model's own α."""
    from attnviz.engine.forward import attentions_of
    from attnviz.engine.memory import check_memory

    check_memory(loaded, len(encoded.token_ids), copies=3.0)
    run = recompute(loaded.model, encoded.inputs)
    qkv = run.layers[layer]
    q, k, v = (t[0, head].double() for t in (qkv.q, qkv.k, qkv.v))  # (T, d) each
    d_k = q.size(-1)
    scores = q @ k.T  # (T, T)
    scaled = scores / math.sqrt(d_k)
    allowed = run.mask[0, 0]  # (T, T) bool
    out, alpha = scaled_dot_product_attention(q, k, v, allowed)  # the textbook core, in float64
    reported = attentions_of(run.output, loaded.model, loaded.name)[layer][0, head].double()  # (T, T)
    numpy = lambda t: t.detach().cpu().numpy()
    return Steps(layer, head, d_k, numpy(q), numpy(k), numpy(v), numpy(scores), numpy(scaled), numpy(allowed),
                 numpy(alpha), numpy(out), numpy(reported))
