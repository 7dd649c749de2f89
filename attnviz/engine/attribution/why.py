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
the run. Pre-norm decoders (GPT-2, Llama and the families built like it). A per-head norm on Q and K (Qwen3,
Gemma 3) is linearised at this position's own scale, as the stream's norm is, and so are the norms Gemma puts on
the attention's and the MLP's outputs before they join the stream; what is not linear this way is refused by the
checks (the parts against the stream, Σ q(a) against the recomputed query).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnviz.engine.attribution.logits import _frozen_norm
from attnviz.engine.hooks import Seen
from attnviz.engine.points import Recording, post_norm, record
from attnviz.engine.scratch.adapters import LlamaAdapter, adapter_for, layer_blocks, rotate_half
from attnviz.engine.scratch.norms import _out_weight
from attnviz.errors import UnsupportedArchitectureError

SPLIT_TOLERANCE = 1e-4  # Σ terms against the score, of max(1, |score|): float32 parts, summed in float64
PARTS_CHUNK = 64  # parts projected at once


def why_points(layer: int, post_norm: bool = False) -> list[str]:
    """What the split reads beside the recomputed Q, K, V (each earlier head's z = α·V comes from them): the
    embeddings, each earlier block's MLP output, and the stream entering `layer`."""
    kinds = ("attn.out", "resid.mid") if post_norm else ("attn.out", "mlp.out")
    return (["blocks.0.resid.pre", f"blocks.{layer}.resid.pre"]
            + [f"blocks.{n}.{p}" for n in range(layer) for p in kinds])


def is_post_norm(model) -> bool:
    """A BERT-family encoder: a norm after the attention and after the MLP of each block, none before."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    blocks = layer_blocks(base, adapter.modules(base))
    return type(adapter).__name__ == "BertAdapter" and post_norm(blocks[0]) is not None


def _after_norms(block) -> tuple:
    """A block's norms on its attention's output and its MLP's output before they join the stream (Gemma 2 and 3:
    post_attention_layernorm beside pre_feedforward_layernorm, and post_feedforward_layernorm), else None."""
    if isinstance(getattr(block, "pre_feedforward_layernorm", None), torch.nn.Module):
        return getattr(block, "post_attention_layernorm", None), getattr(block, "post_feedforward_layernorm", None)
    return None, None


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
    softcap: float | None = None  # Gemma 2: the scores split are before its cap c·tanh(s/c)


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
    blocks = layer_blocks(base, adapter.modules(base))
    for n in range(layer):
        after_attention, after_mlp = _after_norms(blocks[n])
        weight, bias = _out_weight(projections[n])  # (D, H·d)
        qkv = recording.run.layers[n]  # z_h = α_h·V_h at this position, from the weights (as the model's z)
        z = torch.einsum("ht,htd->hd", qkv.alpha_rows(slice(position, position + 1), torch.float64)[0, :, 0],
                         qkv.v[0].double())  # (H, d)
        H, d = z.shape
        per_head = weight.double().reshape(weight.shape[0], H, d)  # (D, H, d)
        heads = torch.einsum("hd,ohd->ho", z, per_head)  # (H, D)
        out_bias = None if bias is None else bias.double()
        if after_attention is not None:  # a norm on the attention's output before it joins the stream: frozen
            total = recording[f"blocks.{n}.attn.out"][0, position]
            linear, beta, _ = _frozen_norm(after_attention, total.double(), after_attention(total))
            heads = torch.stack([linear(v) for v in heads])
            out_bias = beta if out_bias is None else linear(out_bias) + beta
        names += [f"{n}.{h}" for h in range(H)]
        parts += list(heads)
        if out_bias is not None:
            names.append(f"bias attn {n}")
            parts.append(out_bias)
        names.append(f"mlp {n}")
        mlp = recording[f"blocks.{n}.mlp.out"][0, position]
        parts.append((mlp if after_mlp is None else after_mlp(mlp)).double())  # what joins the stream
    stacked = torch.stack(parts)
    target = recording[f"blocks.{layer}.resid.pre"][0, position].double()
    diff = float((stacked.sum(0) - target).abs().max()) / max(1.0, float(target.abs().max()))
    return names, stacked, diff


def _frozen(norm, x: torch.Tensor):
    """`norm` frozen at its input x's scale: (its linear part, applied to a part (D,), β); logits' _frozen_norm
    chooses the kind (LayerNorm here) by the norm's own output."""
    with torch.inference_mode():
        linear, beta, _ = _frozen_norm(norm, x, norm(x.to(norm.weight.dtype)))
    return linear, beta


def _embedding_parts(base, inputs: dict, position: int, embedded: torch.Tensor) -> tuple[list[str], list]:
    """A BERT-family embedding split into tokens, positions and segments through its LayerNorm frozen at their
    sum's scale (its β a part); one part, `embed`, where the split does not give the embeddings' own output."""
    emb = base.embeddings
    try:
        token = int(inputs["input_ids"][0, position])
        segment = int(inputs["token_type_ids"][0, position]) if inputs.get("token_type_ids") is not None else 0
        pad = getattr(emb, "padding_idx", None)
        at = position if pad is None else pad + 1 + position  # RoBERTa and XLM-R count positions after padding
        pieces = [emb.word_embeddings.weight[token].double(), emb.position_embeddings.weight[at].double(),
                  emb.token_type_embeddings.weight[segment].double()]
        linear, beta = _frozen(emb.LayerNorm, sum(pieces))
        parts = [linear(v) for v in pieces] + [beta]
        if float((sum(parts) - embedded).abs().max()) <= SPLIT_TOLERANCE * max(1.0, float(embedded.abs().max())):
            return ["tokens", "positions", "segments", "bias embed norm"], parts
    except (AttributeError, IndexError, KeyError, TypeError):
        pass
    return ["embed"], [embedded]


def _parts_post_norm(recording: Recording, model, inputs: dict, layer: int, position: int
                     ) -> tuple[list[str], torch.Tensor, float]:
    """The same parts in a BERT-family encoder: each block's LayerNorms (after the attention, after the MLP) carry
    every earlier part, frozen at their own inputs' scale, each adding its β as a part."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    projections = adapter.out_projections(base)
    blocks = layer_blocks(base, adapter.modules(base))
    names, parts = _embedding_parts(base, inputs, position, recording["blocks.0.resid.pre"][0, position].double())
    worst = 0.0
    for n in range(layer):
        weight, bias = _out_weight(projections[n])
        qkv = recording.run.layers[n]
        z = torch.einsum("ht,htd->hd", qkv.alpha_rows(slice(position, position + 1), torch.float64)[0, :, 0],
                         qkv.v[0].double())
        H, d = z.shape
        heads = torch.einsum("hd,ohd->ho", z, weight.double().reshape(weight.shape[0], H, d))
        names += [f"{n}.{h}" for h in range(H)] + ([f"bias attn {n}"] if bias is not None else [])
        parts += list(heads) + ([bias.double()] if bias is not None else [])
        block: Any = blocks[n]
        after_attention, after_mlp = post_norm(block), block.output.LayerNorm
        linear, beta = _frozen(after_attention, sum(parts))
        parts = [linear(v) for v in parts] + [beta]
        names.append(f"bias norm {n}")
        middle = recording[f"blocks.{n}.resid.mid"][0, position].double()
        worst = max(worst, float((sum(parts) - middle).abs().max()) / max(1.0, float(middle.abs().max())))
        with torch.inference_mode():
            mid = recording[f"blocks.{n}.resid.mid"][0, position]
            mlp = block.output.dense(block.intermediate(mid[None]))[0].double()  # what the MLP adds
        parts.append(mlp)
        names.append(f"mlp {n}")
        linear, beta = _frozen(after_mlp, sum(parts))
        parts = [linear(v) for v in parts] + [beta]
        names.append(f"bias mlp norm {n}")
    stacked = torch.stack(parts)
    target = recording[f"blocks.{layer}.resid.pre"][0, position].double()
    diff = float((stacked.sum(0) - target).abs().max()) / max(1.0, float(target.abs().max()))
    return names, stacked, max(diff, worst)


def _project(adapter, module, config, layer: int, normed: torch.Tensor, position: int, seen: Seen,
             head: int, side: str) -> torch.Tensor:
    """The query (side "q") or key ("k") vector of `head` that each row of `normed` (P, D) gives at `position`,
    with rotary positions as the family applies them, bias included. (P, d) float64

    Each row is projected alone: a family without rotary positions (GPT-2, BERT) as a one-token input; a Llama-like
    family's Q and K by its own projection and norm, then turned by the rotation its own code gives `position`
    (the same cos and sin); any other rotary family inside an input as long as the position."""
    frozen = _frozen_qk_norm(adapter, module, config, normed[:-1].sum(0))  # the rows but the last (zero) add up
    rotary = isinstance(adapter, LlamaAdapter)
    own_rotation = rotary and type(adapter).rotated is LlamaAdapter.rotated
    T = position + 1 if rotary and not own_rotation else 1
    at = T - 1
    cos_sin = None if seen.position_embeddings is None else tuple(t[:, :position + 1] for t in
                                                                  seen.position_embeddings)
    out = []
    try:
        if frozen is not None:  # QK-norm at this position's own scale: linear, as the stream's norm is
            adapter.normed = lambda module, q, k, config: (q * frozen[0], k * frozen[1])
        for start in range(0, normed.shape[0], PARTS_CHUNK):
            chunk = normed[start:start + PARTS_CHUNK]
            hidden = torch.zeros((chunk.shape[0], T, chunk.shape[1]), dtype=chunk.dtype, device=chunk.device)
            hidden[:, at] = chunk
            if own_rotation:
                vectors = _rotated_at(adapter, module, config, layer, hidden, position, cos_sin, side)
                out.append(vectors[:, head].double())
                continue
            qkv = adapter.qkv(module, Seen(hidden, cos_sin), layer, config)  # type: ignore[arg-type]
            vectors = qkv.q if side == "q" else qkv.k  # (P, H, T, d), K/V heads already mapped to query heads
            out.append(vectors[:, head, at].double())
    finally:
        if frozen is not None:
            del adapter.normed
    return torch.cat(out)


def _rotated_at(adapter, module, config, layer: int, hidden: torch.Tensor, position: int, cos_sin, side: str):
    """A Llama-like family's Q (or K, mapped to the query heads) of one-token inputs (P, 1, D) at `position`: its
    projection and norm, then its rotation there (rotate_half with the cos and sin its own code gives). (P, H, d)"""
    d = adapter.head_dim(module, config)
    q, k, _ = adapter.project(module, hidden, d)  # (P, H, 1, d), (P, H_kv, 1, d)
    q, k = adapter.normed(module, q, k, config)
    x = q if side == "q" else k
    if adapter.rotates(config, layer):
        cos, sin = adapter._cos_sin(config, x.shape[-1], position + 1, Seen(hidden[:, :0], cos_sin), layer)
        cos, sin = (t[..., position, :].to(device=x.device, dtype=x.dtype) for t in (cos, sin))  # (d,) or (B, d)
        if cos.shape[-1] == x.shape[-1] // 2:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        if cos.ndim == 2:  # one per batch row of the run (batch 1)
            cos, sin = cos[0], sin[0]
        x = x * cos + rotate_half(x) * sin
    if side == "k":
        x = x.repeat_interleave(q.size(1) // k.size(1), dim=1)  # each K head serves its group of query heads
    return x[:, :, 0]


def _frozen_qk_norm(adapter, module, config, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where the family norms each head's Q and K (Qwen3, Gemma 3: RMSNorm over d), the factor each takes at the
    scale of this position's own Q and K — (1, H, 1, d) and (1, H_kv, 1, d) — else None."""
    if not isinstance(adapter, LlamaAdapter) or type(adapter).normed is LlamaAdapter.normed:
        return None
    d = adapter.head_dim(module, config)
    q, k, _ = adapter.project(module, hidden[None, None, :], d)  # (1, H, 1, d), (1, H_kv, 1, d)
    q_normed, k_normed = adapter.normed(module, q, k, config)
    if torch.equal(q_normed, q) and torch.equal(k_normed, k):
        return None  # this model of the family has no QK-norm (Gemma 2)
    eps = float(getattr(config, "rms_norm_eps", 1e-6))
    gain_q, gain_k = (g * (1.0 + eps) ** 0.5 for g in adapter.normed(module, torch.ones_like(q), torch.ones_like(k),
                                                                       config))
    return (gain_q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + eps),
            gain_k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + eps))


def check_family(model):
    """The family's adapter, or UnsupportedArchitectureError in one line where its score is not split here."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    if not getattr(adapter, "causal", False) and not is_post_norm(model):
        raise UnsupportedArchitectureError(f"attnviz why splits the score of a pre-norm decoder (GPT-2, Llama, …) or "
                                           f"a BERT-family encoder; not {type(base).__name__}'s")
    if getattr(base.config, "model_type", "") == "olmo2":
        raise UnsupportedArchitectureError(f"{type(base).__name__} norms its whole Q and K projections before they "
                                           f"are split into heads: its score is not split into parts here yet")
    return adapter


def split_score(model, inputs: dict, *, layer: int, head: int, query: int, key: int, versus: int | None = None,
                recording: Recording | None = None) -> ScoreSplit:
    """s_{query,key} of (layer, head) — minus s_{query,versus} when `versus` is given — split over the query-side
    parts × key-side parts of the stream entering `layer`. One text (batch of 1)."""
    base = getattr(model, "base_model", model)
    adapter = check_family(model)
    modules = adapter.modules(base)
    blocks = layer_blocks(base, modules)
    post = is_post_norm(model)
    norm = None if post else pre_attention_norm(blocks[layer])
    if norm is None and not post:
        raise UnsupportedArchitectureError(f"attnviz why does not find the norm in front of "
                                           f"{type(base).__name__}'s attention")
    if recording is None:
        recording = record(model, inputs, why_points(layer, post))
    config = base.config
    qkv_true = recording.run.layers[layer]
    scale = qkv_true.scale if qkv_true.scale is not None else 1.0 / float(qkv_true.q.shape[-1]) ** 0.5
    if qkv_true.bias is not None:
        raise UnsupportedArchitectureError("this model's scores carry a positional bias (ALiBi or T5's buckets), "
                                           "which no part of the stream makes: they are not split here")
    seen = Seen(recording[f"blocks.{layer}.resid.pre"][:, :0].float(), None)  # rotary from the config
    with torch.inference_mode():
        def side(position: int, which: str) -> tuple[list[str], torch.Tensor, float]:
            if post:  # the attention reads the stream itself
                names, parts, stream_diff = _parts_post_norm(recording, model, inputs, layer, position)
                normed = parts
                extra: list[str] = []
            else:
                names, parts, stream_diff = _parts(recording, model, layer, position)
                assert norm is not None
                x = recording[f"blocks.{layer}.resid.pre"][0, position].double()
                linear, beta, norm_diff = _frozen_norm(norm, x, norm(recording[f"blocks.{layer}.resid.pre"][0,
                                                                                                       position]))
                if norm_diff > SPLIT_TOLERANCE * max(1.0, float(x.abs().max())):
                    raise UnsupportedArchitectureError(f"{type(norm).__name__} in front of the attention is neither "
                                                       f"a LayerNorm nor an RMSNorm: it is not linearised here")
                normed = torch.stack([linear(p) for p in parts] + [beta])  # (P + 1, D): the parts, then β
                extra = ["bias norm"]
            dtype = next(modules[layer].parameters()).dtype
            zero = torch.zeros((1, normed.shape[1]), dtype=torch.float64)
            projected = _project(adapter, modules[layer], config, layer, torch.cat([normed, zero]).to(dtype),
                                 position, seen, head, which)
            bias = projected[-1]  # the projection's bias, rotated: what a zero stream gives
            vectors = torch.cat([projected[:-1] - bias, bias[None]])
            named = names + extra + [f"bias {which}"]
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
                      max(q_stream, k_stream), query_diff, qkv_true.softcap)
