"""The formula as the textbook writes it: α = softmax(Q·Kᵀ/√d_k + bias, masked), output = α·V.

Every from-scratch computation (verify, steps, scaling, norms, the streamed path) calls these; nothing here
knows a model family."""

from __future__ import annotations

import math

import torch


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None, bias: torch.Tensor | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """out, alpha = softmax(Q·Kᵀ/√d_k + bias)·V, and alpha itself.

    q: (..., T_q, d_k)   k: (..., T_k, d_k)   v: (..., T_k, d_v)
    mask: bool, broadcastable to (..., T_q, T_k); True where query i may attend to key j.
    bias: added to the scaled scores, broadcastable to (..., T_q, T_k) (T5's relative position bias).
    A row whose keys are all masked attends to nothing: its alpha row is all zeros and its out is 0
    (not NaN), and no NaN leaks into other rows."""
    alpha = attention_weights(q, k, mask, bias)  # (..., T_q, T_k)
    return alpha @ v, alpha  # (..., T_q, d_v), (..., T_q, T_k)


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """alpha = softmax(Q·Kᵀ/√d_k + bias), masked keys at −∞: the weights alone, for any block of query rows.
    (..., T_q, d_k), (..., T_k, d_k) -> (..., T_q, T_k)"""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., T_q, T_k)
    row_max = scores.amax(dim=-1, keepdim=True)  # (..., T_q, 1)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # all-masked rows
    weights = torch.exp(scores - row_max)  # (..., T_q, T_k); masked -> exp(-inf) = 0
    total = weights.sum(dim=-1, keepdim=True)  # (..., T_q, 1)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny),
                       torch.zeros_like(weights))  # (..., T_q, T_k), rows sum to 1 (or 0 if all masked)


def attention_mask(key_mask: torch.Tensor, *, causal: bool, window: int | None = None) -> torch.Tensor:
    """Which keys each query may see. key_mask: (B, T) 1 for real tokens, 0 for padding.
    Returns bool (B, 1, T, T): padding keys hidden; for causal models also j > i (and j ≤ i - window)."""
    B, T = key_mask.shape
    allowed = key_mask.bool()[:, None, None, :].expand(B, 1, T, T)  # (B, 1, T, T)
    if causal:
        i = torch.arange(T, device=key_mask.device)[:, None]
        j = torch.arange(T, device=key_mask.device)[None, :]
        keep = j <= i  # (T, T)
        if window is not None:
            keep = keep & (i - j < window)
        allowed = allowed & keep
    return allowed
