"""scaling: why the scores are divided by √d_k — the spread of Q·K with and without it, in a real model
and in random vectors, and what it does to the softmax (entropy, the largest weight)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from attnviz.engine.forward import encode
from attnviz.engine.scratch.adapters import seq2seq_adapter_for
from attnviz.engine.scratch.verify import part_masks, recompute
from attnviz.engine.hooks import Seen, recording_inputs
from attnviz.engine.memory import check_memory
from attnviz.engine.seq2seq import decoder_start
from attnviz.errors import UnsupportedArchitectureError


@dataclass
class ScalingRow:
    """One layer: raw logits Q·Kᵀ against scaled Q·Kᵀ/√d_k, over every head and allowed (i, j)."""

    layer: int
    std_raw: float
    std_scaled: float
    entropy_raw: float  # mean over heads and rows of the softmax entropy, nats
    entropy_scaled: float
    max_raw: float  # mean over heads and rows of the largest weight
    max_scaled: float


def _softmax_stats(logits: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    alpha = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)  # (B, H, T, T)
    plogp = torch.where(alpha > 0, alpha * alpha.log(), torch.zeros_like(alpha))
    entropy = -plogp.sum(-1)  # (B, H, T)
    return float(entropy.mean()), float(alpha.amax(-1).mean())


def scaling_rows(loaded, text: str, *, truncate: bool = True) -> tuple[list[ScalingRow], int, int]:
    """Per layer of the real model: spread, entropy and peak of softmax(QKᵀ) vs softmax(QKᵀ/√d_k).
    Returns (rows, T, d_k)."""

    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=3.0)
    if loaded.seq2seq:  # the encoder's self-attention over the source
        pairs, source_mask = encoder_qk(loaded, encoded.inputs)
        layers = [(q, k, source_mask) for q, k in pairs]
    else:
        run = recompute(loaded.model, encoded.inputs)
        layers = [(qkv.q, qkv.k, qkv.mask) for qkv in run.layers if qkv.mask is not None]  # each its own mask
    rows, d_k = [], 0
    for n, (q, k, mask) in enumerate(layers):
        d_k = q.size(-1)
        raw = q @ k.transpose(-2, -1)  # (B, H, T, T)
        scaled = raw / math.sqrt(d_k)
        allowed = mask.expand_as(raw)
        e_raw, m_raw = _softmax_stats(raw, mask)
        e_scaled, m_scaled = _softmax_stats(scaled, mask)
        rows.append(ScalingRow(n, float(raw[allowed].std()), float(scaled[allowed].std()),
                               e_raw, e_scaled, m_raw, m_scaled))
    return rows, len(encoded.token_ids), d_k


def encoder_qk(loaded, inputs: dict) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """An encoder-decoder model's encoder: per layer the queries and keys as the model multiplies them (for
    T5, without the 1/√d_k it does not apply), and the source mask (B, 1, S, S)."""

    model = loaded.model
    adapter = seq2seq_adapter_for(model)
    modules = adapter.parts(model)["encoder"]
    ids = inputs["input_ids"]
    with recording_inputs(modules) as seen, torch.inference_mode():
        model(**inputs, decoder_input_ids=torch.full((ids.shape[0], 1), decoder_start(loaded), device=ids.device))
        layers = []
        for n, (module, record) in enumerate(zip(modules, seen)):
            if record is None:
                raise UnsupportedArchitectureError(f"the encoder attention module of layer {n} was not called")
            qkv = adapter.qkv(copy.deepcopy(module).float(), Seen(record.hidden.float()), n, model, "encoder")
            q = qkv.q / math.sqrt(qkv.q.size(-1)) if adapter.folds_scaling else qkv.q
            layers.append((q, qkv.k))
    source_mask = inputs.get("attention_mask", torch.ones_like(ids))
    return layers, part_masks(source_mask, 1)["encoder"]


def synthetic_scaling(d_k: int = 64, n: int = 100_000, seed: int = 0) -> tuple[float, float]:
    """The essay's check: for q, k with independent N(0, 1) entries, q·k has variance d_k, so its std is
    √d_k (8 for d_k = 64) raw and 1 after dividing by √d_k. Returns (std raw, std scaled)."""
    gen = torch.Generator().manual_seed(seed)
    n = min(n, max(20_000_000 // d_k, 1000))  # memory stays near 300 MB at any d_k
    q = torch.randn(n, d_k, generator=gen, dtype=torch.float64)
    k = torch.randn(n, d_k, generator=gen, dtype=torch.float64)
    dots = (q * k).sum(-1)  # (n,)
    return float(dots.std()), float((dots / math.sqrt(d_k)).std())


@dataclass
class SyntheticRow:
    """Random q, k with N(0, 1) entries at one d_k: the spread of q·k, and what the softmax over T keys does
    with it, raw and divided by √d_k (entropy in nats; ln T is uniform)."""

    d_k: int
    std_raw: float
    std_scaled: float
    entropy_raw: float
    entropy_scaled: float
    max_raw: float
    max_scaled: float


def synthetic_row(d_k: int, T: int, rows: int = 512, seed: int = 0) -> SyntheticRow:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d_k, generator=gen, dtype=torch.float64)  # (rows, d_k)
    k = torch.randn(max(T, 2), d_k, generator=gen, dtype=torch.float64)  # (T, d_k)
    logits = q @ k.T  # (rows, T)

    def softmax_stats(x: torch.Tensor) -> tuple[float, float]:
        alpha = torch.softmax(x, dim=-1)
        entropy = -(alpha * torch.log(alpha.clamp_min(1e-300))).sum(-1)
        return float(entropy.mean()), float(alpha.max(-1).values.mean())

    raw_std, scaled_std = synthetic_scaling(d_k, seed=seed)
    (h_raw, m_raw), (h_scaled, m_scaled) = softmax_stats(logits), softmax_stats(logits / math.sqrt(d_k))
    return SyntheticRow(d_k, raw_std, scaled_std, h_raw, h_scaled, m_raw, m_scaled)
