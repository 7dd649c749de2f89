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
                      bias: torch.Tensor | None = None, *, scale: float | None = None, softcap: float | None = None,
                      sinks: torch.Tensor | None = None, fused: bool = False) -> torch.Tensor:
    """alpha = softmax(Q·Kᵀ/√d_k + bias), masked keys at −∞: the weights alone, for any block of query rows.
    (..., T_q, d_k), (..., T_k, d_k) -> (..., T_q, T_k)

    What some families add, each written out:
    scale    the factor on Q·Kᵀ instead of 1/√d_k (Gemma's 1/√query_pre_attn_scalar)
    softcap  logit soft-capping, s ↦ c·tanh(s/c), before the mask (Gemma 2)
    sinks    one logit per head (H,) that joins every row's softmax as an extra key and is then dropped
             (gpt-oss): the weights over the real keys then sum to 1 − the sink's share
    fused    torch's softmax kernel instead of the written-out exp / sum (not for sinks): what the streamed
             path uses for speed; verify and steps keep the formula written out, independent of the model's
             own softmax"""
    factor = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * factor  # (..., T_q, T_k)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., T_q, T_k)
    if fused and sinks is None:  # one kernel, for the streamed path's speed; the same numbers to rounding
        alpha = torch.softmax(scores, dim=-1)
        if mask is not None or bias is not None:  # a row with every key masked: zeros, not softmax's NaN
            dead = (~mask.any(dim=-1, keepdim=True) if mask is not None
                    else ~torch.isfinite(scores).any(dim=-1, keepdim=True))
            if bool(dead.any()):
                alpha = alpha.masked_fill(dead, 0.0)
        return alpha
    if sinks is not None:  # (H,) -> a column per row, broadcast over the batch and the query rows
        column = sinks.to(scores.dtype).reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)  # (..., H, T_q, 1)
        scores = torch.cat([scores, column], dim=-1)  # (..., T_q, T_k + 1)
    row_max = scores.amax(dim=-1, keepdim=True)  # (..., T_q, 1)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # all-masked rows
    weights = torch.exp(scores - row_max)  # (..., T_q, T_k); masked -> exp(-inf) = 0
    total = weights.sum(dim=-1, keepdim=True)  # (..., T_q, 1)
    alpha = torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny),
                        torch.zeros_like(weights))  # rows sum to 1 (or 0 if all masked)
    return alpha[..., :-1] if sinks is not None else alpha  # (..., T_q, T_k): the sink's column dropped


def attention_mask(key_mask: torch.Tensor, *, causal: bool, window: int | None = None,
                   reach: int | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Which keys each query may see. key_mask: (B, T) 1 for real tokens, 0 for padding.
    Returns bool (B, 1, T, T): padding keys hidden; for causal models also j > i (and, with a sliding
    window, j ≤ i − window); with a bidirectional `reach`, keys further than it either way (|i − j| > reach).
    `rows` (R,): only those query rows, (B, 1, R, T) (a long input's explained position)."""
    B, T = key_mask.shape
    i = (torch.arange(T, device=key_mask.device) if rows is None else rows.to(key_mask.device))[:, None]
    j = torch.arange(T, device=key_mask.device)[None, :]
    allowed = key_mask.bool()[:, None, None, :].expand(B, 1, i.shape[0], T)  # (B, 1, R, T)
    if causal:
        keep = j <= i  # (T, T)
        if window is not None:
            keep = keep & (i - j < window)
        allowed = allowed & keep
    if reach is not None:
        allowed = allowed & ((i - j).abs() <= reach)
    return allowed
