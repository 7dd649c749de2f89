"""Attention from scratch: softmax(Q·Kᵀ/√d_k)·V, recomputed from a model's own weights.

The core is `scaled_dot_product_attention`, written as the textbook writes it. For a real model, a
forward pre-hook on each attention module records exactly what that module receives (the hidden states
after any LayerNorm, and for rotary models the positions), then one small adapter per architecture
projects them with the module's own Q/K/V weights, splits heads, applies what the architecture adds
(rotary embeddings, grouped-query K/V sharing, the causal mask) and calls the core. The result is a
second producer of the same Capture, so `attnviz verify` can compare it with what the model reports.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np
import torch

from attnviz.capture import Capture
from attnviz.errors import UnsupportedArchitectureError
from attnviz.text import visible

# --- the core -----------------------------------------------------------------------------------


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


# --- per-architecture adapters ------------------------------------------------------------------


@dataclass
class Seen:
    """What one attention module received in the forward pass (recorded by a pre-hook)."""

    hidden: torch.Tensor  # (B, T, D)
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None  # rotary (cos, sin), (B, T, d)
    keys_from: torch.Tensor | None = None  # cross-attention: what keys and values come from (B, S, D)


@dataclass
class QKV:
    q: torch.Tensor  # (B, H, T, d_k)
    k: torch.Tensor  # (B, H, T, d_k)   (K/V heads already repeated for grouped-query attention)
    v: torch.Tensor  # (B, H, T, d_v)
    bias: torch.Tensor | None = None  # added to the scaled scores (T5's relative positions), (1, H, T, T_k)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.view(B, T, heads, D // heads).transpose(1, 2)  # (B, heads, T, d)


class Adapter:
    """How one family of models computes Q, K, V. Subclasses name the attention modules."""

    families: tuple[str, ...] = ()
    causal = False

    def modules(self, model) -> list:
        raise NotImplementedError

    def out_projections(self, model) -> list:
        """Per layer, the attention block's output projection W_O (Linear, or GPT-2's Conv1D)."""
        raise NotImplementedError

    def qkv(self, module, seen: Seen, layer: int, config) -> QKV:
        raise NotImplementedError

    def window(self, config) -> int | None:
        return None


class BertAdapter(Adapter):
    """BERT, RoBERTa, ELECTRA (and the bundled MiniLM): separate query/key/value Linear layers."""

    families = ("bert", "roberta", "xlm-roberta", "electra", "camembert")

    def modules(self, model):
        if getattr(model.config, "position_embedding_type", "absolute") not in (None, "absolute"):
            raise UnsupportedArchitectureError("relative position embeddings in BERT-family models are not "
                                               "supported by the from-scratch path")
        return [layer.attention.self for layer in model.encoder.layer]

    def out_projections(self, model):
        return [layer.attention.output.dense for layer in model.encoder.layer]

    def qkv(self, module, seen, layer, config):
        heads = module.num_attention_heads
        x = seen.hidden  # (B, T, D)
        return QKV(_split_heads(module.query(x), heads), _split_heads(module.key(x), heads),
                   _split_heads(module.value(x), heads))


class DistilBertAdapter(Adapter):
    """DistilBERT: q_lin / k_lin / v_lin."""

    families = ("distilbert",)

    def modules(self, model):
        return [layer.attention for layer in model.transformer.layer]

    def out_projections(self, model):
        return [layer.attention.out_lin for layer in model.transformer.layer]

    def qkv(self, module, seen, layer, config):
        heads = module.n_heads
        x = seen.hidden
        return QKV(_split_heads(module.q_lin(x), heads), _split_heads(module.k_lin(x), heads),
                   _split_heads(module.v_lin(x), heads))


class GPT2Adapter(Adapter):
    """GPT-2: one fused Conv1D c_attn, x @ W + b with W of shape (D, 3D) (transposed vs. Linear); causal."""

    families = ("gpt2",)
    causal = True

    def modules(self, model):
        return [block.attn for block in model.h]

    def out_projections(self, model):
        return [block.attn.c_proj for block in model.h]

    def qkv(self, module, seen, layer, config):
        x = seen.hidden  # (B, T, D)
        W, b = module.c_attn.weight, module.c_attn.bias  # (D, 3D), (3D,)
        q, k, v = (x @ W + b).split(module.split_size, dim=-1)  # 3 x (B, T, D)
        q, k, v = (_split_heads(t, module.num_heads) for t in (q, k, v))  # (B, H, T, d)
        # the core divides by √d_k; undo or add what this GPT-2 variant does instead
        if not module.scale_attn_weights:
            q = q * math.sqrt(q.size(-1))
        if module.scale_attn_by_inverse_layer_idx:
            q = q / float(layer + 1)
        return QKV(q, k, v)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE as in RoFormer / Llama: angle_{p,i} = p / theta^(2i/d), pairs (i, i + d/2). Returns (T, d) each."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # (d/2,)
    angles = positions.double()[:, None] * inv_freq[None, :]  # (T, d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, d)
    return angles.cos(), angles.sin()


class LlamaAdapter(Adapter):
    """Llama, Mistral, Qwen2: q/k/v_proj (Qwen2 with bias), rotary positions computed from the config,
    grouped-query attention (each K/V head serves num_heads / num_kv_heads query heads), causal."""

    families = ("llama", "mistral", "qwen2")
    causal = True

    def modules(self, model):
        return [layer.self_attn for layer in model.layers]

    def out_projections(self, model):
        return [layer.self_attn.o_proj for layer in model.layers]

    def window(self, config):
        window = getattr(config, "sliding_window", None)
        if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
            return None
        return window

    def qkv(self, module, seen, layer, config):
        x = seen.hidden  # (B, T, D)
        d = module.head_dim
        q = _split_heads(module.q_proj(x), module.q_proj.out_features // d)  # (B, H, T, d)
        k = _split_heads(module.k_proj(x), module.k_proj.out_features // d)  # (B, H_kv, T, d)
        v = _split_heads(module.v_proj(x), module.v_proj.out_features // d)  # (B, H_kv, T, d)
        cos, sin = self._cos_sin(config, d, x.shape[1], seen)  # (T, d) or (B, T, d)
        cos, sin = cos.to(device=q.device, dtype=q.dtype), sin.to(device=q.device, dtype=q.dtype)
        if cos.ndim == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = q.size(1) // k.size(1)
        k = k.repeat_interleave(groups, dim=1)  # (B, H, T, d)
        v = v.repeat_interleave(groups, dim=1)
        return QKV(q, k, v)

    @staticmethod
    def _cos_sin(config, head_dim: int, T: int, seen: Seen):
        rope = getattr(config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        if rope_type == "default":
            return rotary_cos_sin(torch.arange(T), head_dim, theta)
        if seen.position_embeddings is None:
            raise UnsupportedArchitectureError(f"rotary scaling {rope_type!r} is not supported by the "
                                               f"from-scratch path")
        return seen.position_embeddings  # scaled RoPE: use the (cos, sin) the module itself received


ADAPTERS: tuple[Adapter, ...] = (BertAdapter(), DistilBertAdapter(), GPT2Adapter(), LlamaAdapter())
SUPPORTED = tuple(f for a in ADAPTERS for f in a.families)


def _find(adapters, model, kind: str = ""):
    """The adapter of the model's family, or a one-line error naming the supported families."""
    model_type = getattr(model.config, "model_type", "?")
    for adapter in adapters:
        if model_type in adapter.families:
            return adapter
    supported = ", ".join(f for a in adapters for f in a.families)
    raise UnsupportedArchitectureError(f"the from-scratch path does not support {model_type!r} {kind}models yet; "
                                       f"supported: {supported}")


def adapter_for(model) -> Adapter:
    return _find(ADAPTERS, model)


# --- encoder-decoder models: encoder, decoder and cross-attention ----------------------------------


class Seq2SeqAdapter:
    """How one family of encoder-decoder models computes Q, K, V in each part: the encoder's self-attention
    over the source, the decoder's causal self-attention over the target, and cross-attention from target
    queries to the encoder's output."""

    families: tuple[str, ...] = ()
    folds_scaling = False  # True: the model does not divide by √d_k (qkv's q is multiplied by √d_k to undo it)

    def parts(self, model) -> dict[str, list]:
        """The attention modules of each part, per layer."""
        raise NotImplementedError

    def qkv(self, module, seen: Seen, layer: int, model, part: str) -> QKV:
        raise NotImplementedError


class BartAdapter(Seq2SeqAdapter):
    """BART and Marian: q/k/v_proj with biases, scaled by 1/√d_k; positions (learned or sinusoidal) are
    added to the inputs, so they are in what the modules receive."""

    families = ("bart", "marian")

    def parts(self, model):
        encoder, decoder = model.get_encoder(), model.get_decoder()
        return {"encoder": [layer.self_attn for layer in encoder.layers],
                "decoder": [layer.self_attn for layer in decoder.layers],
                "cross": [layer.encoder_attn for layer in decoder.layers]}

    def qkv(self, module, seen, layer, model, part):
        x = seen.hidden  # (B, T, D)
        source = seen.keys_from if part == "cross" else x  # (B, S, D)
        if source is None:
            raise UnsupportedArchitectureError("the cross-attention module was not given the encoder's output")
        heads = module.num_heads
        return QKV(_split_heads(module.q_proj(x), heads), _split_heads(module.k_proj(source), heads),
                   _split_heads(module.v_proj(source), heads))


def t5_relative_bucket(relative: torch.Tensor, *, bidirectional: bool, buckets: int, max_distance: int
                       ) -> torch.Tensor:
    """T5's relative position buckets (Raffel et al. 2020, from Mesh TensorFlow), for key − query offsets:
    half the buckets (each direction's half, when bidirectional) hold offsets 0..n/2−1 exactly, the rest
    offsets up to max_distance on a log scale; the log is taken in float32, as the reference does, so that
    bucket edges fall where the trained model's do."""
    out = torch.zeros_like(relative)
    n = buckets
    if bidirectional:
        n //= 2
        out = out + (relative > 0).long() * n
        distance = relative.abs()
    else:
        distance = (-relative).clamp_min(0)  # only keys before the query are told apart
    exact = n // 2
    far = exact + (torch.log(distance.clamp_min(1).float() / exact) / math.log(max_distance / exact)
                   * (n - exact)).long()
    far = far.clamp_max(n - 1)
    return out + torch.where(distance < exact, distance, far)


class T5Adapter(Seq2SeqAdapter):
    """T5: q/k/v without bias and *without* 1/√d_k (T5 folds the scaling into its initialisation), and a
    learned relative position bias per head, computed in the first layer of each stack and added to every
    layer's scores: bidirectional buckets in the encoder, past-only in the decoder, none in cross-attention."""

    families = ("t5",)
    folds_scaling = True

    def parts(self, model):
        encoder, decoder = model.get_encoder(), model.get_decoder()
        return {"encoder": [block.layer[0].SelfAttention for block in encoder.block],
                "decoder": [block.layer[0].SelfAttention for block in decoder.block],
                "cross": [block.layer[1].EncDecAttention for block in decoder.block]}

    def qkv(self, module, seen, layer, model, part):
        x = seen.hidden  # (B, T, D)
        source = seen.keys_from if part == "cross" else x
        if source is None:
            raise UnsupportedArchitectureError("the cross-attention module was not given the encoder's output")
        heads, d = module.n_heads, module.key_value_proj_dim
        q = _split_heads(module.q(x), heads) * math.sqrt(d)  # the core divides by √d_k; T5 does not
        k, v = _split_heads(module.k(source), heads), _split_heads(module.v(source), heads)
        bias = None
        if part != "cross":
            stack = model.get_encoder() if part == "encoder" else model.get_decoder()
            first = stack.block[0].layer[0].SelfAttention
            T, S = x.shape[1], source.shape[1]
            relative = torch.arange(S, device=x.device)[None, :] - torch.arange(T, device=x.device)[:, None]
            buckets = t5_relative_bucket(relative, bidirectional=part == "encoder",
                                         buckets=first.relative_attention_num_buckets,
                                         max_distance=first.relative_attention_max_distance)
            table = first.relative_attention_bias.weight.to(q.dtype)  # (buckets, H)
            bias = table[buckets].permute(2, 0, 1)[None]  # (1, H, T, S)
        return QKV(q, k, v, bias)


SEQ2SEQ_ADAPTERS: tuple[Seq2SeqAdapter, ...] = (BartAdapter(), T5Adapter())


def seq2seq_adapter_for(model) -> Seq2SeqAdapter:
    return _find(SEQ2SEQ_ADAPTERS, model, "encoder-decoder ")


def part_masks(source_mask: torch.Tensor, T: int) -> dict[str, torch.Tensor]:
    """Which keys each query may see in each part, (B, 1, rows, cols) bool: the encoder and cross-attention
    hide source padding; the decoder is causal."""
    B, S = source_mask.shape
    keys = source_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    causal = torch.ones(T, T, dtype=torch.bool, device=source_mask.device).tril()  # (T, T)
    return {"encoder": keys.expand(B, 1, S, S), "decoder": causal[None, None].expand(B, 1, T, T),
            "cross": keys.expand(B, 1, T, S)}


def scratch_parts(loaded, inputs: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For an encoder-decoder model and inputs (input_ids, attention_mask, decoder_input_ids), one forward
    pass: per part, (α from the formula, α the model reports), float32, (L, H, rows, cols) each."""
    from attnviz.model import check_parts_memory

    model = loaded.model
    adapter = seq2seq_adapter_for(model)
    groups = adapter.parts(model)
    modules = [m for part in ("encoder", "decoder", "cross") for m in groups[part]]
    check_parts_memory(loaded, inputs["input_ids"].shape[1], inputs["decoder_input_ids"].shape[1], copies=3.0)
    seen, remove = _record_inputs(model, modules)
    try:
        with torch.inference_mode():
            output = model(**inputs, output_attentions=True)
    finally:
        remove()
    source_mask = inputs.get("attention_mask")
    if source_mask is None:
        source_mask = torch.ones_like(inputs["input_ids"])
    masks = part_masks(source_mask, inputs["decoder_input_ids"].shape[1])
    reported = {"encoder": output.encoder_attentions, "decoder": output.decoder_attentions,
                "cross": output.cross_attentions}
    results, at = {}, 0
    for part in ("encoder", "decoder", "cross"):
        alphas = []
        for n, module in enumerate(groups[part]):
            record = seen[at + n]
            if record is None:
                raise UnsupportedArchitectureError(f"the {part} attention module of layer {n} was not called")
            if next(module.parameters()).dtype != torch.float32:  # half precision: reference in float32
                module = copy.deepcopy(module).float()
                record = Seen(record.hidden.float(), None,
                              None if record.keys_from is None else record.keys_from.float())
            with torch.inference_mode():
                qkv = adapter.qkv(module, record, n, model, part)
                alphas.append(attention_weights(qkv.q, qkv.k, masks[part], qkv.bias)[0].cpu().numpy())
        at += len(groups[part])
        if not reported[part] or any(a is None for a in reported[part]):
            raise UnsupportedArchitectureError(f"{loaded.name} returned no {part} attention weights")
        model_alpha = np.stack([a[0].float().cpu().numpy() for a in reported[part]])
        results[part] = (np.stack(alphas).astype(np.float32), model_alpha)
    return results


# --- running a real model -----------------------------------------------------------------------


def _record_inputs(model, modules: list, on_seen: Callable[[int, Seen], None] | None = None
                   ) -> tuple[list[Seen | None], Callable[[], None]]:
    """Pre-hooks that store what each attention module receives (or hand it to `on_seen(layer, seen)` as the
    forward pass reaches it, keeping nothing). Returns (records, remove)."""
    seen: list[Seen | None] = [None] * len(modules)

    def make_hook(n: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states", kwargs.get("query"))
            keys_from = kwargs.get("key_value_states")
            record = Seen(hidden.detach(), kwargs.get("position_embeddings"),
                          None if keys_from is None else keys_from.detach())
            if on_seen is None:
                seen[n] = record
            else:
                on_seen(n, record)

        return hook

    handles = [m.register_forward_pre_hook(make_hook(n), with_kwargs=True) for n, m in enumerate(modules)]

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return seen, remove


def layer_qkv(adapter: Adapter, module, record: Seen | None, n: int, config) -> QKV:
    """Q, K, V of layer n from what its attention module received, in float32 whatever the model's dtype."""
    if record is None:
        raise UnsupportedArchitectureError(f"the attention module of layer {n} was not called")
    if next(module.parameters()).dtype != torch.float32:  # half precision: reference in fp32
        module = copy.deepcopy(module).float()
        rotary = record.position_embeddings
        record = Seen(record.hidden.float(), None if rotary is None else (rotary[0].float(), rotary[1].float()),
                      None if record.keys_from is None else record.keys_from.float())
    return adapter.qkv(module, record, n, config)


@dataclass
class Recomputed:
    """One forward pass of the model, and per layer the Q, K, V recomputed from what each attention
    module received."""

    output: object  # the model's own output (with .attentions)
    layers: list[QKV]  # per layer, (B, H, T, d) each
    mask: torch.Tensor  # (B, 1, T, T) bool, what the core applies


def recompute(model, inputs: dict) -> Recomputed:
    """Run `model` on `inputs` once (eager, output_attentions) and recompute every layer's Q, K, V
    from its own weights, in float32 whatever the model's dtype."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    modules = adapter.modules(base)
    seen, remove = _record_inputs(base, modules)
    try:
        with torch.inference_mode():
            output = model(**inputs, output_attentions=True)
            layers = [layer_qkv(adapter, module, record, n, base.config)
                      for n, (module, record) in enumerate(zip(modules, seen))]
    finally:
        remove()
    key_mask = inputs.get("attention_mask")
    if key_mask is None:
        key_mask = torch.ones(inputs["input_ids"].shape, device=inputs["input_ids"].device)
    mask = attention_mask(key_mask, causal=adapter.causal, window=adapter.window(base.config))
    return Recomputed(output, layers, mask)


def scratch_attentions(model, inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(scratch α, model α), each float32 (L, B, H, T, T), from one forward pass."""
    run = recompute(model, inputs)
    with torch.inference_mode():
        alphas = [scaled_dot_product_attention(qkv.q, qkv.k, qkv.v, run.mask)[1] for qkv in run.layers]
    from attnviz.model import attentions_of

    reported = attentions_of(run.output, model, getattr(model, "name_or_path", "the model"))
    model_alpha = torch.stack([a.float() for a in reported])  # (L, B, H, T, T)
    return torch.stack(alphas).cpu().numpy(), model_alpha.cpu().numpy()


def capture_both(loaded, text: str, *, truncate: bool = True):
    """(model Capture, scratch Capture) for one text, from a single forward pass."""
    from attnviz.model import check_memory, encode, make_capture

    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=4.0)  # the model's α, scores, both stacks
    scratch, reported = scratch_attentions(loaded.model, encoded.inputs)
    return (make_capture(loaded, encoded, reported[:, 0], text),
            make_capture(loaded, encoded, scratch[:, 0], text, source="scratch"))


def capture_both_ids(loaded, saved: Capture) -> tuple[Capture, Capture]:
    """(model Capture, scratch Capture) for the token ids of a saved capture (e.g. one written by
    attnviz generate), run through `loaded` in one forward pass: the saved α can then be compared with
    both."""
    from dataclasses import replace

    from attnviz.errors import InputError
    from attnviz.model import _forward_args, check_memory

    if saved.pooled or saved.meta.get("level") == "word" or saved.quantity != "alpha":
        raise InputError("verify --from needs a capture of token-level α (not pooled, --words or --norms)")
    from attnviz.model import layers_and_heads

    made_by = f"give the model that made it (the capture names {visible(saved.model)!r})"
    L, H = layers_and_heads(loaded.model.config)
    if (L, H) != (saved.n_layers, saved.n_heads):
        raise InputError(f"the capture has {saved.n_layers} layers × {saved.n_heads} heads, {loaded.name} has "
                         f"{L} × {H}: {made_by}")
    ids = np.asarray(saved.token_ids, dtype=np.int64)
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if ids.min() < 0 or ids.max() >= vocab:
        raise InputError(f"the capture's token ids (up to {int(ids.max())}) do not fit {loaded.name}'s vocabulary of "
                         f"{vocab}: {made_by}")
    if loaded.max_positions and len(ids) > loaded.max_positions:
        raise InputError(f"the capture has {len(ids)} tokens; {loaded.name} takes at most {loaded.max_positions}")
    check_memory(loaded, len(ids), copies=4.0)
    input_ids = torch.tensor(ids[None, :], device=loaded.device)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if "token_type_ids" in getattr(loaded.tokenizer, "model_input_names", ()):  # one segment, as encode gives
        inputs["token_type_ids"] = torch.zeros_like(input_ids)  # (GPT-2 would add wte[0] for it: never there)
    scratch, reported = scratch_attentions(loaded.model, {k: v for k, v in inputs.items()
                                                          if k in _forward_args(loaded.model)})
    meta = {**saved.meta, "model": loaded.name, "dtype": loaded.dtype, "device": loaded.device}
    return (replace(saved, attentions=reported[:, 0], meta={**meta, "source": "model"}),
            replace(saved, attentions=scratch[:, 0], meta={**meta, "source": "scratch"}))


# --- the √d_k experiment ------------------------------------------------------------------------


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
    from attnviz.model import check_memory, encode

    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=3.0)
    if loaded.seq2seq:  # the encoder's self-attention over the source
        layers, mask = encoder_qk(loaded, encoded.inputs)
    else:
        run = recompute(loaded.model, encoded.inputs)
        layers, mask = [(qkv.q, qkv.k) for qkv in run.layers], run.mask
    rows, d_k = [], 0
    for n, (q, k) in enumerate(layers):
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
    from attnviz.seq2seq import decoder_start

    model = loaded.model
    adapter = seq2seq_adapter_for(model)
    modules = adapter.parts(model)["encoder"]
    seen, remove = _record_inputs(model, modules)
    ids = inputs["input_ids"]
    try:
        with torch.inference_mode():
            model(**inputs, decoder_input_ids=torch.full((ids.shape[0], 1), decoder_start(loaded), device=ids.device))
            layers = []
            for n, (module, record) in enumerate(zip(modules, seen)):
                if record is None:
                    raise UnsupportedArchitectureError(f"the encoder attention module of layer {n} was not called")
                qkv = adapter.qkv(copy.deepcopy(module).float(), Seen(record.hidden.float()), n, model, "encoder")
                q = qkv.q / math.sqrt(qkv.q.size(-1)) if adapter.folds_scaling else qkv.q
                layers.append((q, qkv.k))
    finally:
        remove()
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


# --- one head, step by step (attnviz steps) ------------------------------------------------------------


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
    from attnviz.model import attentions_of, check_memory

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


# --- what position embeddings do (attnviz positions) -----------------------------------------------------


@dataclass
class PositionsResult:
    """The same text in two word orders, run with the model's position embeddings and with them zeroed.

    permutation (T,): shuffled position p holds the original token permutation[p]. alpha_* are (L, H, T, T):
    the original order, and the shuffled order re-ordered back to the original positions."""

    words: list[str]
    shuffled: list[str]
    tokens: list[str]
    permutation: np.ndarray
    alpha_with: np.ndarray
    back_with: np.ndarray
    alpha_without: np.ndarray
    back_without: np.ndarray
    similarity: np.ndarray | None = None  # (P, P) cosine similarity of position embeddings 0..P-1

    @staticmethod
    def _per_layer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.abs(a - b).reshape(len(a), -1).max(axis=-1)  # (L,)

    @property
    def diff_with(self) -> np.ndarray:
        return self._per_layer(self.alpha_with, self.back_with)

    @property
    def diff_without(self) -> np.ndarray:
        return self._per_layer(self.alpha_without, self.back_without)


def position_embeddings(loaded):
    """The learned position-embedding table of an encoder, or UnsupportedArchitectureError (one line)."""
    base = getattr(loaded.model, "base_model", loaded.model)
    if loaded.causal:
        raise UnsupportedArchitectureError(
            f"{loaded.name} is causal: it also sees word order through its mask (each token looks only back), so "
            f"removing its positions cannot make α a set; `positions` works with encoders (BERT, RoBERTa, …)")
    table = getattr(getattr(base, "embeddings", None), "position_embeddings", None)
    if not isinstance(table, torch.nn.Embedding):
        raise UnsupportedArchitectureError(
            f"{loaded.name} adds positions in a way attnviz cannot switch off (rotary or relative positions); "
            f"`positions` works with models that add learned position embeddings (BERT, RoBERTa, DistilBERT)")
    return table


def _word_spans(text_words: list[str]) -> tuple[str, list[tuple[int, int]]]:
    spans, at = [], 0
    for word in text_words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    return " ".join(text_words), spans


def _tokens_by_word(loaded, words: list[str]):
    """Encode the words joined by spaces; return (encoded, for each word its token positions, the special
    token positions in order)."""
    from attnviz.model import encode

    text, spans = _word_spans(words)
    encoded = encode(loaded, text, truncate=False)
    offsets = loaded.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    by_word: list[list[int]] = [[] for _ in words]
    specials = []
    for position, ((start, end), special) in enumerate(zip(offsets, encoded.special)):
        if special or end <= start:
            specials.append(position)
            continue
        # a SentencePiece "▁" piece starts on the space before its word: it belongs to the next word
        word = next(n for n, (_, b) in enumerate(spans) if start < b)
        by_word[word].append(position)
    return encoded, by_word, specials


def positions_experiment(loaded, text: str, *, seed: int = 0) -> PositionsResult:
    """Shuffle the words of `text`; run the model on both orders with its position embeddings and with them
    zeroed. Without positions self-attention sees a set: α of the shuffled text is exactly the same
    permutation of α. With them it is not."""
    from attnviz.errors import InputError
    from attnviz.model import model_attentions

    table = position_embeddings(loaded)
    if not getattr(loaded.tokenizer, "is_fast", False):
        raise UnsupportedArchitectureError(f"{loaded.name} has a slow tokenizer; `positions` needs token offsets")
    words = text.split()
    if len(set(words)) < 2:
        raise InputError("the text needs at least two different words to shuffle")
    rng = np.random.default_rng(seed)
    order = np.arange(len(words))
    while (order == np.arange(len(words))).all() or [words[i] for i in order] == words:
        order = rng.permutation(len(words))
    shuffled = [words[i] for i in order]
    original, orig_words, orig_special = _tokens_by_word(loaded, words)
    moved, moved_words, moved_special = _tokens_by_word(loaded, shuffled)
    T = len(original.token_ids)
    permutation = np.full(T, -1)
    for p, o in zip(moved_special, orig_special):
        permutation[p] = o
    for new_index, old_index in enumerate(order):
        old, new = orig_words[old_index], moved_words[new_index]
        if len(old) != len(new) or [original.token_ids[i] for i in old] != [moved.token_ids[i] for i in new]:
            raise UnsupportedArchitectureError(f"{loaded.name}'s tokenizer splits {words[old_index]!r} differently "
                                               f"once it moves, so the two orders cannot be compared token by token")
        permutation[new] = old
    if len(moved.token_ids) != T or len(moved_special) != len(orig_special) or (permutation < 0).any():
        raise UnsupportedArchitectureError("the shuffled text does not tokenise into the same tokens")

    def both() -> tuple[np.ndarray, np.ndarray]:
        a = model_attentions(loaded, original)  # (L, H, T, T)
        b = model_attentions(loaded, moved)
        inverse = np.argsort(permutation)  # original position -> shuffled position
        return a, b[:, :, inverse][:, :, :, inverse]  # the shuffled run, back in the original order

    alpha_with, back_with = both()
    saved = table.weight.detach().clone()
    try:
        with torch.no_grad():
            table.weight.zero_()
        alpha_without, back_without = both()
    finally:
        with torch.no_grad():
            table.weight.copy_(saved)
    return PositionsResult(words, shuffled, original.tokens, permutation, alpha_with, back_with, alpha_without,
                           back_without, position_similarity(saved, SIMILARITY_POSITIONS))


SIMILARITY_POSITIONS = 64  # positions shown in the similarity picture


def position_similarity(weight: torch.Tensor, n: int) -> np.ndarray:
    """Cosine similarity of the first n position embeddings with each other: how alike the vectors the model
    adds at positions i and j are. (n, n), 1 on the diagonal."""
    table = weight[:n].detach().double()  # (n, D)
    unit = table / table.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (unit @ unit.T).float().cpu().numpy()


# --- value-weighted norms (Kobayashi et al. 2020, "Attention is Not Only a Weight") ------------------------


def _out_weight(module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W_O as (D_out, D_in) and its bias, whether the module is a Linear or GPT-2's transposed Conv1D."""
    weight = module.weight.float()
    if not isinstance(module, torch.nn.Linear):  # Conv1D: x @ W + b with W (D_in, D_out)
        weight = weight.T
    bias = module.bias.float() if getattr(module, "bias", None) is not None else None
    return weight, bias


def head_outputs(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """f_h(x_j) = v_h(x_j) · W_O^h, each head's value vectors through its own slice of the output projection.
    v (B, H, T, d), weight (D_out, H·d) -> (B, H, T, D_out)"""
    B, H, T, d = v.shape
    per_head = weight.reshape(weight.shape[0], H, d).permute(1, 2, 0)  # (H, d, D_out)
    return torch.einsum("bhtd,hdo->bhto", v, per_head)


@dataclass
class Norms:
    """Per layer: α (B, H, T, T), ‖f_h(x_j)‖ (B, H, T), and how far Σ_h Σ_j α_ij f_h(x_j) + b_O lies from the
    attention block's own output (max |Δ|, the exact check)."""

    alpha: np.ndarray  # (L, B, H, T, T)
    value_norms: np.ndarray  # (L, B, H, T)
    output_diff: np.ndarray  # (L,)
    output_scale: np.ndarray | None = None  # (L,) the block output's largest |value|

    @property
    def relative_diff(self) -> np.ndarray:
        """max |Δ| over max(1, the output's largest |value|): float32 rounding grows with the values, and
        some models' outputs reach the hundreds (SmolLM2's later layers). (L,)"""
        scale = np.ones_like(self.output_diff) if self.output_scale is None else np.maximum(self.output_scale, 1.0)
        return self.output_diff / scale

    @property
    def norms(self) -> np.ndarray:
        """‖α_ij f_h(x_j)‖ = α_ij ‖f_h(x_j)‖ (α ≥ 0). (L, B, H, T, T)"""
        return self.alpha * self.value_norms[..., None, :]


def value_norms(model, inputs: dict) -> Norms:
    """Run the model once; per layer recompute α and each head's value vectors through W_O from the model's
    own weights, and check that they add up to the attention block's output (recorded by a hook)."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    projections = adapter.out_projections(base)
    outputs: list[torch.Tensor | None] = [None] * len(projections)

    def make_hook(n: int):
        def hook(module, args, output):
            outputs[n] = output.detach()

        return hook

    handles = [m.register_forward_hook(make_hook(n)) for n, m in enumerate(projections)]
    try:
        run = recompute(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    alphas, norms, diffs, scales = [], [], [], []
    key_mask = inputs.get("attention_mask")
    with torch.inference_mode():
        for n, qkv in enumerate(run.layers):  # in float64: the model's own float32 rounding is what remains
            alpha = attention_weights(qkv.q.double(), qkv.k.double(), run.mask)  # (B, H, T, T)
            weight, bias = _out_weight(projections[n])
            weight, bias = weight.double(), None if bias is None else bias.double()
            f = head_outputs(qkv.v.double(), weight)  # (B, H, T, D)
            summed = torch.einsum("bhij,bhjo->bio", alpha, f)  # Σ_h Σ_j α_ij f_h(x_j)
            if bias is not None:
                summed = summed + bias
            reported = outputs[n]
            if reported is None:
                raise UnsupportedArchitectureError(f"the output projection of layer {n} was not called")
            delta = (summed - reported.float()).abs()  # (B, T, D)
            if key_mask is not None:  # padding queries are not part of the text
                delta = delta * key_mask[:, :, None].to(delta.dtype)
            alphas.append(alpha)
            norms.append(f.norm(dim=-1))  # (B, H, T)
            diffs.append(float(delta.max()))
            shown = reported.float().abs()
            if key_mask is not None:
                shown = shown * key_mask[:, :, None].to(shown.dtype)
            scales.append(float(shown.max()))
    return Norms(torch.stack(alphas).cpu().numpy(), torch.stack(norms).cpu().numpy(), np.array(diffs),
                 np.array(scales))


def norms_capture(loaded, text: str, *, truncate: bool = True):
    """(Capture of value-weighted norms ‖α_ij f_h(x_j)‖, Norms): meta quantity "norm", the exact check's
    largest |Δ| in meta "norm_check"."""
    from attnviz.model import check_memory, encode, make_capture

    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=4.0)
    result = value_norms(loaded.model, encoded.inputs)
    capture = make_capture(loaded, encoded, result.alpha[:, 0].astype(np.float32), text)  # checks α first
    from dataclasses import replace

    norms = replace(capture, attentions=result.norms[:, 0].astype(np.float32),
                    meta={**capture.meta, "quantity": "norm", "source": "scratch",
                          "norm_check": float(result.output_diff.max())})
    return norms.validate(), result
