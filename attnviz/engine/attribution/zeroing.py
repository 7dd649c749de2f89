"""Value zeroing (Mohebbi et al., EACL 2023): how much each token's layer output depends on token j's value.

For each layer and each token j, the value vector of j is zeroed in every head of that layer's attention, and
the layer's output for every token i is compared with the clean one:

    distance[l, i, j] = 1 − cos(x_l,i, x_l,i with v_j zeroed in layer l)
    score[l, i, j]    = distance[l, i, j] / Σ_j' distance[l, i, j']          (rows sum to 1)

as inseq's `ValueZeroing.attribute` computes it: every layer reads the clean output of the layer below (each
block's output is put back to the clean one after it is recorded), so one run zeroes v_j in every layer at
once and each layer's scores are its own. The T runs (one per j) go as batches of copies of the text, each
copy zeroing its own j, through attnviz's function in transformers' attention interface (the family's own
projections, norms and rotary positions; the value zeroed where attention multiplies it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnviz.engine.ablation.runs import last_logits, run_model
from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.scratch.adapters import layer_blocks
from attnviz.engine.interface import output, streaming

BLOCK_BYTES = 1 << 24  # α held at once per attention call, in float64


def value_zeroing(model, inputs: dict, attention_modules: list, *, batch: int = 8,
                  on_done=None) -> tuple[np.ndarray, np.ndarray]:
    """(scores (L, T, T) float64 with rows summing to 1, distances (L, T, T) float64 before normalising) for
    one text (a batch of 1). `attention_modules`: the model's attention modules in layer order."""
    base = getattr(model, "base_model", model)
    blocks = layer_blocks(base, attention_modules)
    L, T = len(blocks), int(inputs["input_ids"].shape[1])
    clean: list[Any] = [None] * L  # each block's clean output (1, T, D), then its zeroed one (B, T, D)
    seen: list[Any] = [None] * L
    patch = {"on": False}

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    def block_hook(n: int):
        def hook(module, args, out):
            hidden = first(out)
            if not patch["on"]:
                clean[n] = hidden.detach()
                return None
            seen[n] = hidden.detach()
            fixed = clean[n].expand_as(hidden)  # the next block reads the clean output
            return (fixed, *out[1:]) if isinstance(out, tuple) else fixed
        return hook

    zeroed: dict[str, Any] = {"tokens": None}

    def attend(attention, value):
        tokens = zeroed["tokens"]
        if tokens is not None:
            value = value.clone()
            value[torch.arange(value.shape[0], device=value.device), :, tokens] = 0  # v_j of copy b, every head
        return output(attention, value, BLOCK_BYTES)

    distances = torch.zeros(L, T, T, dtype=torch.float64)
    # only the blocks' outputs are read: a causal LM keeps no KV cache and unembeds one position, not the
    # batch's B·T (8 copies × 1,000 tokens × Qwen's 151,936-word vocabulary would be 4.9 GB of float32 logits)
    lean = last_logits(model)
    with hooked([Hook(block, "forward", block_hook(n)) for n, block in enumerate(blocks)]):
        with streaming(model, attend), torch.inference_mode():
            run_model(model, {**inputs, **lean})  # clean (value untouched: the family's eager computation)
            patch["on"] = True
            for start in range(0, T, batch):
                tokens = torch.arange(start, min(start + batch, T), device=inputs["input_ids"].device)
                zeroed["tokens"] = tokens
                copies = {k: v.repeat(len(tokens), *[1] * (v.dim() - 1)) for k, v in inputs.items()}
                run_model(model, {**copies, **lean})
                for n in range(L):
                    a, b = clean[n][0].double(), seen[n].double()  # (T, D), (B, T, D)
                    cos = torch.nn.functional.cosine_similarity(a[None], b, dim=-1)  # (B, T)
                    distances[n, :, start:start + len(tokens)] = (1 - cos).T.cpu()
                if on_done is not None:
                    on_done(len(tokens))
    distances = distances.clamp_min(0)  # 1 − cos of two nearly equal vectors rounds to ±1e-16
    sums = distances.sum(-1, keepdim=True)
    empty = sums[..., 0] == 0  # no token's value changes the output at all: the residual alone
    scores = torch.where(sums > 0, distances / torch.where(sums > 0, sums, 1), 0)
    if empty.any():
        eye = torch.eye(T, dtype=torch.float64).expand(L, T, T)
        scores = torch.where(empty[..., None], eye, scores)
    return scores.numpy(), distances.numpy()
