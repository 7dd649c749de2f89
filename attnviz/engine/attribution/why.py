"""Why a head attends: its pre-softmax score s_IJ split over the parts of the residual stream entering its layer,
on the query side and the key side (circuit-tracer's query × key split, per prompt).

The stream entering layer L at a position is a sum of parts: the embeddings (a model that adds learned positions:
`tokens` and `positions`), each earlier head's output (its z through its slice of W_O: "l.h"), each attention's
output bias ("bias attn l"), each earlier MLP's output ("mlp l"). The norm in front of the attention is
linearised at this run's own scale (its divisor frozen at the stream's; a LayerNorm's centring and gain applied to
each part; its shift β a part of its own, "bias norm"); the query and key projections are affine and rotary
positions linear, so each part gives a query vector q(a) at I and a key vector k(b) at J — computed by the family's
own adapter, the one the from-scratch check uses — and the projections' biases are parts too ("bias q", "bias k").
Then s_IJ = Σ_a Σ_b q(a)·k(b) · scale, exactly (the model's own scale), checked against the score recomputed from
the run. Pre-norm decoders (GPT-2, Llama and the families built like it); a family whose Q and K pass through a
norm of their own (QK-norm), or whose blocks add a norm after the attention, is refused by the checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.engine.attribution.logits import _frozen_norm
from attnviz.engine.hooks import Seen
from attnviz.engine.points import Recording, record
from attnviz.engine.scratch.adapters import LlamaAdapter, adapter_for, layer_blocks
from attnviz.engine.scratch.norms import _out_weight
from attnviz.errors import UnsupportedArchitectureError

SPLIT_TOLERANCE = 1e-4  # Σ terms against the score, of max(1, |score|): float32 parts, summed in float64
PARTS_CHUNK = 64  # parts projected at once


def why_points(layer: int) -> list[str]:
    """What the split reads beside the recomputed Q, K, V (each earlier head's z = α·V comes from them): the
    embeddings, each earlier block's MLP output, and the stream entering `layer`."""
    return ["blocks.0.resid.pre", f"blocks.{layer}.resid.pre"] + [f"blocks.{n}.mlp.out" for n in range(layer)]


def pre_attention_norm(block):
    for name in ("ln_1", "input_layernorm", "attention_norm", "ln_attn", "norm1"):
        found = getattr(block, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


@dataclass(frozen=True)
class ScoreSplit:
    """s_IJ (or s_IJ − s_IJ2 with `versus`) split: `terms` (A, B) float64 over the query parts × key parts,
    `query_names` (A), `key_names` (B); `score` the recomputed score(s), `scale` the factor on q·k."""

    query_names: tuple[str, ...]
    key_names: tuple[str, ...]
    terms: np.ndarray  # (A, B)
    score: float  # s_IJ (minus s_IJ2 with versus)
    scores: tuple[float, ...]  # s_IJ, and s_IJ2
    stream_diff: float  # the parts against the stream they add up to, of max(1, its largest |value|)
    query_diff: float  # Σ_a q(a) against the recomputed query, relative


def _parts(recording: Recording, model, layer: int, position: int) -> tuple[list[str], torch.Tensor, float]:
    """(names, (P, D) float64 parts of the stream entering `layer` at `position`, how far their sum is off)."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    projections = adapter.out_projections(base)
    names: list[str] = []
    parts: list[torch.Tensor] = []
    embed = recording["blocks.0.resid.pre"][0, position].double()
    wpe = getattr(base, "wpe", None)
    if isinstance(wpe, torch.nn.Embedding):  # learned positions added to the tokens' embeddings (GPT-2)
        positions = wpe.weight[position].double()
        names += ["tokens", "positions"]
        parts += [embed - positions, positions]
    else:
        names.append("embed")
        parts.append(embed)
    for n in range(layer):
        weight, bias = _out_weight(projections[n])  # (D, H·d)
        qkv = recording.run.layers[n]  # z_h = α_h·V_h at this position, from the weights (as the model's z)
        z = torch.einsum("ht,htd->hd", qkv.alpha_rows(slice(position, position + 1), torch.float64)[0, :, 0],
                         qkv.v[0].double())  # (H, d)
        H, d = z.shape
        per_head = weight.double().reshape(weight.shape[0], H, d)  # (D, H, d)
        heads = torch.einsum("hd,ohd->ho", z, per_head)  # (H, D)
        names += [f"{n}.{h}" for h in range(H)]
        parts += list(heads)
        if bias is not None:
            names.append(f"bias attn {n}")
            parts.append(bias.double())
        names.append(f"mlp {n}")
        parts.append(recording[f"blocks.{n}.mlp.out"][0, position].double())
    stacked = torch.stack(parts)
    target = recording[f"blocks.{layer}.resid.pre"][0, position].double()
    diff = float((stacked.sum(0) - target).abs().max()) / max(1.0, float(target.abs().max()))
    return names, stacked, diff


def _project(adapter, module, config, layer: int, normed: torch.Tensor, position: int, seen: Seen,
             head: int, side: str) -> torch.Tensor:
    """The query (side "q") or key ("k") vector of `head` that each row of `normed` (P, D) gives at `position`,
    with rotary positions as the family applies them, bias included. (P, d) float64"""
    out = []
    T = position + 1
    cos_sin = None if seen.position_embeddings is None else tuple(t[:, :T] for t in seen.position_embeddings)
    for start in range(0, normed.shape[0], PARTS_CHUNK):
        chunk = normed[start:start + PARTS_CHUNK]
        hidden = torch.zeros((chunk.shape[0], T, chunk.shape[1]), dtype=chunk.dtype, device=chunk.device)
        hidden[:, position] = chunk
        qkv = adapter.qkv(module, Seen(hidden, cos_sin), layer, config)  # type: ignore[arg-type]
        vectors = qkv.q if side == "q" else qkv.k  # (P, H, T, d), K/V heads already mapped to query heads
        out.append(vectors[:, head, position].double())
    return torch.cat(out)


def check_family(model):
    """The family's adapter, or UnsupportedArchitectureError in one line where its score is not split here."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    if not getattr(adapter, "causal", False):
        raise UnsupportedArchitectureError(f"attnviz why splits a pre-norm decoder's score (GPT-2, Llama, …); "
                                           f"{type(base).__name__} is an encoder with its norms after each block")
    if isinstance(adapter, LlamaAdapter) and (type(adapter).normed is not LlamaAdapter.normed
                                              or type(adapter).__name__ == "Qwen3Adapter"):
        raise UnsupportedArchitectureError(f"{type(base).__name__} passes Q and K through a norm of their own "
                                           f"(QK-norm): its score is not split into parts here yet")
    return adapter


def split_score(model, inputs: dict, *, layer: int, head: int, query: int, key: int, versus: int | None = None,
                recording: Recording | None = None) -> ScoreSplit:
    """s_{query,key} of (layer, head) — minus s_{query,versus} when `versus` is given — split over the query-side
    parts × key-side parts of the stream entering `layer`. One text (batch of 1)."""
    base = getattr(model, "base_model", model)
    adapter = check_family(model)
    modules = adapter.modules(base)
    blocks = layer_blocks(base, modules)
    norm = pre_attention_norm(blocks[layer])
    if norm is None:
        raise UnsupportedArchitectureError(f"attnviz why does not find the norm in front of "
                                           f"{type(base).__name__}'s attention")
    if recording is None:
        recording = record(model, inputs, why_points(layer))
    config = base.config
    qkv_true = recording.run.layers[layer]
    scale = qkv_true.scale if qkv_true.scale is not None else 1.0 / float(qkv_true.q.shape[-1]) ** 0.5
    if qkv_true.softcap or qkv_true.bias is not None:
        raise UnsupportedArchitectureError("this model's scores are soft-capped or carry a positional bias: the "
                                           "split is of the score before them, not written yet")
    seen = Seen(recording[f"blocks.{layer}.resid.pre"][:, :0].float(), None)  # rotary from the config
    with torch.inference_mode():
        def side(position: int, which: str) -> tuple[list[str], torch.Tensor, float]:
            names, parts, stream_diff = _parts(recording, model, layer, position)
            x = recording[f"blocks.{layer}.resid.pre"][0, position].double()
            linear, beta, norm_diff = _frozen_norm(norm, x, norm(recording[f"blocks.{layer}.resid.pre"][0, position]))
            if norm_diff > SPLIT_TOLERANCE * max(1.0, float(x.abs().max())):
                raise UnsupportedArchitectureError(f"{type(norm).__name__} in front of the attention is neither a "
                                                   f"LayerNorm nor an RMSNorm: it is not linearised here")
            normed = torch.stack([linear(p) for p in parts] + [beta])  # (P + 1, D): the parts, then β
            dtype = next(modules[layer].parameters()).dtype
            zero = torch.zeros((1, normed.shape[1]), dtype=torch.float64)
            projected = _project(adapter, modules[layer], config, layer, torch.cat([normed, zero]).to(dtype),
                                 position, seen, head, which)
            bias = projected[-1]  # the projection's bias, rotated: what a zero stream gives
            vectors = torch.cat([projected[:-1] - bias, bias[None]])
            named = names + ["bias norm", f"bias {which}"]
            kept = [n for n, name in enumerate(named)  # a bias the model does not have is left out
                    if not (name.startswith("bias") and not bool(vectors[n].abs().max() > 0))]
            return [named[n] for n in kept], vectors[kept], stream_diff

        q_names, q_vectors, q_stream = side(query, "q")
        q_true = qkv_true.q[0, head, query].double()
        query_diff = float((q_vectors.sum(0) - q_true).abs().max()) / max(1.0, float(q_true.abs().max()))
        k_names, k_vectors, k_stream = side(key, "k")
        terms = (q_vectors @ k_vectors.T) * scale  # (A, B)
        scores = [float(q_true @ qkv_true.k[0, head, key].double()) * scale]
        if versus is not None:
            _, v_vectors, v_stream = side(versus, "k")
            terms = terms - (q_vectors @ v_vectors.T) * scale
            scores.append(float(q_true @ qkv_true.k[0, head, versus].double()) * scale)
            k_stream = max(k_stream, v_stream)
    score = scores[0] - (scores[1] if versus is not None else 0.0)
    return ScoreSplit(tuple(q_names), tuple(k_names), terms.cpu().numpy(), score, tuple(scores),
                      max(q_stream, k_stream), query_diff)
