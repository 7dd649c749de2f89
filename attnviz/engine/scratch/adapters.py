"""One adapter per architecture family: how that family turns what its attention module received into
Q, K and V with the module's own weights (split heads, rotary positions, grouped-query K/V sharing, the
causal mask and sliding window, T5's relative position bias). Written out by hand, so that verify is an
independent second computation, not a call into the model's attention."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from attnviz.engine.scratch.formula import attention_weights
from attnviz.engine.families import family_of, layer_window, support_line
from attnviz.engine.hooks import Seen
from attnviz.errors import UnsupportedArchitectureError


@dataclass
class QKV:
    """One layer's attention as its family computes it, ready for the formula."""

    q: torch.Tensor  # (B, H, T, d_k)
    k: torch.Tensor  # (B, H, T, d_k)   (K/V heads already repeated for grouped-query attention)
    v: torch.Tensor  # (B, H, T, d_v)
    bias: torch.Tensor | None = None  # added to the scaled scores (T5's relative positions), (1, H, T, T_k)
    scale: float | None = None  # the factor on Q·Kᵀ; None: 1/√d_k
    softcap: float | None = None  # logit soft-capping c·tanh(s/c) (Gemma 2)
    sinks: torch.Tensor | None = None  # (H,) per-head sink logits (gpt-oss)
    window: int | None = None  # causal sliding window: key j visible from query i when i − j < window
    reach: int | None = None  # bidirectional local attention: key j visible when |i − j| ≤ reach (ModernBERT)
    mask: torch.Tensor | None = None  # (B, 1, T, T) bool, set by recompute from the key mask and the above

    def alpha(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """softmax of this layer's scores, everything the family adds written out. (B, H, T, T_k)"""
        q, k = (self.q, self.k) if dtype is None else (self.q.to(dtype), self.k.to(dtype))
        return attention_weights(q, k, self.mask, self.bias, scale=self.scale, softcap=self.softcap,
                                 sinks=self.sinks)

    def alpha_rows(self, rows: slice, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The same α for a block of query rows only: what a long input's streamed path holds at a time.
        (B, H, rows, T_k)"""
        q, k = (self.q, self.k) if dtype is None else (self.q.to(dtype), self.k.to(dtype))
        mask = None if self.mask is None else self.mask[:, :, rows]
        bias = None if self.bias is None else self.bias[:, :, rows]
        return attention_weights(q[:, :, rows], k, mask, bias, scale=self.scale, softcap=self.softcap,
                                 sinks=self.sinks)


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.view(B, T, heads, D // heads).transpose(1, 2)  # (B, heads, T, d)


REGISTERED: dict[str, type] = {}  # class name -> adapter class; engine/families.py names one for each family


def registered(cls: type) -> type:
    """Make an adapter class available to the families that name it (engine/families.py, Family.adapter)."""
    REGISTERED[cls.__name__] = cls
    return cls


class Adapter:
    """How one family of models computes Q, K, V. Subclasses name the attention modules. The families it
    serves name it in engine/families.py (Family.adapter)."""

    causal = False

    def modules(self, model) -> list:
        raise NotImplementedError

    def out_projections(self, model) -> list:
        """Per layer, the attention block's output projection W_O (Linear, or GPT-2's Conv1D)."""
        raise NotImplementedError

    def qkv(self, module, seen: Seen, layer: int, config) -> QKV:
        raise NotImplementedError

    def window(self, config, layer: int = 0) -> int | None:
        """The causal sliding window of a layer (None: all earlier keys)."""
        return None


@registered
class BertAdapter(Adapter):
    """BERT, RoBERTa, ELECTRA (and the bundled MiniLM): separate query/key/value Linear layers."""


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


@registered
class VisionAdapter(Adapter):
    """Vision transformers (DINOv2, ViT, DeiT, CLIP and SigLIP vision towers): a stack of pre-norm blocks whose
    attention module has q_proj / k_proj / v_proj (and o_proj or out_proj), on [CLS] (if any) and the patches.
    DINOv2's layer scale comes after the attention's output projection: α does not see it."""

    STACKS = ("encoder.layer", "layers", "encoder.layers", "vision_model.encoder.layers")

    def _blocks(self, model) -> list:
        for path in self.STACKS:
            found: Any = model
            for part in path.split("."):
                found = getattr(found, part, None)
            if found is not None:
                return list(found)
        raise UnsupportedArchitectureError(f"{type(model).__name__}: no stack of layers where a vision model has one")

    def modules(self, model):
        found = [getattr(block, "attention", None) or getattr(block, "self_attn", None)
                 for block in self._blocks(model)]
        if any(m is None or not hasattr(m, "q_proj") for m in found):
            raise UnsupportedArchitectureError(f"{type(model).__name__}: an attention module without q_proj")
        return found

    def out_projections(self, model):
        return [getattr(m, "o_proj", None) or m.out_proj for m in self.modules(model)]

    def qkv(self, module, seen, layer, config):
        heads = int(config.num_attention_heads)
        x = seen.hidden  # (B, T, D): the block's input after its first norm
        return QKV(_split_heads(module.q_proj(x), heads), _split_heads(module.k_proj(x), heads),
                   _split_heads(module.v_proj(x), heads))


@registered
class DistilBertAdapter(Adapter):
    """DistilBERT: q_lin / k_lin / v_lin."""


    def modules(self, model):
        return [layer.attention for layer in model.transformer.layer]

    def out_projections(self, model):
        return [layer.attention.out_lin for layer in model.transformer.layer]

    def qkv(self, module, seen, layer, config):
        heads = module.n_heads
        x = seen.hidden
        return QKV(_split_heads(module.q_lin(x), heads), _split_heads(module.k_lin(x), heads),
                   _split_heads(module.v_lin(x), heads))


@registered
class GPT2Adapter(Adapter):
    """GPT-2: one fused Conv1D c_attn, x @ W + b with W of shape (D, 3D) (transposed vs. Linear); causal."""

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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, plus_one: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension, in float32: x / √(mean(x²) + eps) · w, with Gemma's w = 1 + weight."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (weight.float() + 1.0 if plus_one else weight.float())).to(x.dtype)


def _layer_type(config, layer: int) -> str:
    types = getattr(config, "layer_types", None)
    return str(types[layer]) if types else "full_attention"


@registered
class LlamaAdapter(Adapter):
    """Llama, Mistral, Qwen2 and the decoders built like them: q/k/v_proj (Qwen2 with bias), rotary positions
    computed from the config, grouped-query attention (each K/V head serves num_heads / num_kv_heads query
    heads), causal, a sliding window where the config (or the layer's type) has one. Subclasses change one
    step each: the projection, a norm on Q and K, the scale, soft-capping, sinks, which layers rotate."""

    causal = True

    def modules(self, model):
        return [layer.self_attn for layer in model.layers]

    def out_projections(self, model):
        return [layer.self_attn.o_proj for layer in model.layers]

    def window(self, config, layer: int = 0) -> int | None:
        return layer_window(config, layer) or None

    def project(self, module, x: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (B, H, T, d), K and V (B, H_kv, T, d) from the module's input x (B, T, D)."""
        return (_split_heads(module.q_proj(x), module.q_proj.out_features // d),
                _split_heads(module.k_proj(x), module.k_proj.out_features // d),
                _split_heads(module.v_proj(x), module.v_proj.out_features // d))

    def normed(self, module, q: torch.Tensor, k: torch.Tensor, config) -> tuple[torch.Tensor, torch.Tensor]:
        """Q and K after the family's norm, if it has one (QK-norm); (B, H, T, d) each."""
        return q, k

    def rotates(self, config, layer: int) -> bool:
        return True

    def extras(self, module, config, layer: int) -> dict:
        """scale, softcap, sinks: what the family adds to the formula."""
        return {}

    def qkv(self, module, seen, layer, config):
        x = seen.hidden  # (B, T, D)
        d = self.head_dim(module, config)
        q, k, v = self.project(module, x, d)
        q, k = self.normed(module, q, k, config)
        if self.rotates(config, layer):
            q, k = self.rotated(q, k, config, x.shape[1], seen, layer)
        groups = q.size(1) // k.size(1)
        k = k.repeat_interleave(groups, dim=1)  # (B, H, T, d)
        v = v.repeat_interleave(groups, dim=1)
        return QKV(q, k, v, window=self.window(config, layer), **self.extras(module, config, layer))

    def rotated(self, q, k, config, T: int, seen: Seen, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Q and K with rotary positions: dimension i paired with i + d/2 (rotate_half), as Llama does."""
        d = q.shape[-1]
        cos, sin = self._cos_sin(config, d, T, seen, layer)  # (T, d) or (B, T, d)
        cos, sin = cos.to(device=q.device, dtype=q.dtype), sin.to(device=q.device, dtype=q.dtype)
        if cos.shape[-1] == d // 2:  # (cos, sin) of each pair once: as rotate_half pairs them, twice
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        if cos.ndim == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    @staticmethod
    def head_dim(module, config) -> int:
        return int(getattr(module, "head_dim", None) or config.hidden_size // config.num_attention_heads)

    @staticmethod
    def _cos_sin(config, head_dim: int, T: int, seen: Seen, layer: int = 0):
        rope = getattr(config, "rope_parameters", None) or {}
        if _layer_type(config, layer) in rope:  # one set of rotary parameters per kind of layer (Gemma 3)
            rope = rope[_layer_type(config, layer)]
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        if float(getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
            raise UnsupportedArchitectureError("partial rotary embeddings are not supported by the from-scratch "
                                               "path")
        if rope_type == "default":
            return rotary_cos_sin(torch.arange(T), head_dim, theta)
        if seen.position_embeddings is None:
            raise UnsupportedArchitectureError(f"rotary scaling {rope_type!r} is not supported by the "
                                               f"from-scratch path")
        return seen.position_embeddings  # scaled RoPE: use the (cos, sin) the module itself received


@registered
class Qwen3Adapter(LlamaAdapter):
    """Qwen3 and SmolLM3's cousin OLMo 2 norm Q and K (QK-norm): Qwen3 each head's d values, OLMo 2 the whole
    projection before it is split into heads. SmolLM3 leaves rotary positions out of some layers."""


    def project(self, module, x, d):
        if getattr(module.config, "model_type", "") != "olmo2":
            return super().project(module, x, d)
        eps = module.config.rms_norm_eps
        q = rms_norm(module.q_proj(x), module.q_norm.weight, eps)  # (B, T, H·d): over the whole projection
        k = rms_norm(module.k_proj(x), module.k_norm.weight, eps)
        return (_split_heads(q, q.shape[-1] // d), _split_heads(k, k.shape[-1] // d),
                _split_heads(module.v_proj(x), module.v_proj.out_features // d))

    def normed(self, module, q, k, config):
        if config.model_type != "qwen3":
            return q, k
        eps = config.rms_norm_eps
        return rms_norm(q, module.q_norm.weight, eps), rms_norm(k, module.k_norm.weight, eps)  # per head

    def rotates(self, config, layer):
        no_rope = getattr(config, "no_rope_layers", None)
        return not (config.model_type == "smollm3" and no_rope is not None and not no_rope[layer])


@registered
class Phi3Adapter(LlamaAdapter):
    """Phi-3: one fused qkv_proj, Q then K then V along its output."""


    def project(self, module, x, d):
        qkv = module.qkv_proj(x)  # (B, T, (H + 2·H_kv)·d)
        H, H_kv = module.config.num_attention_heads, module.config.num_key_value_heads
        q, k, v = qkv.split([H * d, H_kv * d, H_kv * d], dim=-1)
        return _split_heads(q, H), _split_heads(k, H_kv), _split_heads(v, H_kv)


@registered
class GemmaAdapter(LlamaAdapter):
    """Gemma 2 and 3: scores scaled by 1/√query_pre_attn_scalar instead of 1/√d_k; sliding-window layers
    between full ones; Gemma 2 soft-caps the scaled scores, s ↦ c·tanh(s/c); Gemma 3 norms Q and K per head
    with Gemma's RMSNorm (weights stored as w − 1)."""


    def normed(self, module, q, k, config):
        if config.model_type != "gemma3_text":
            return q, k
        eps = config.rms_norm_eps
        return (rms_norm(q, module.q_norm.weight, eps, plus_one=True),
                rms_norm(k, module.k_norm.weight, eps, plus_one=True))

    def extras(self, module, config, layer):
        scale = float(config.query_pre_attn_scalar) ** -0.5
        softcap = getattr(config, "attn_logit_softcapping", None) if config.model_type == "gemma2" else None
        return {"scale": scale, "softcap": None if softcap is None else float(softcap)}


@registered
class GptOssAdapter(LlamaAdapter):
    """gpt-oss: q/k/v_proj with bias, one sink logit per head that joins each row's softmax and is dropped
    after it, sliding-window layers between full ones; rotary positions (YaRN) as the module received them."""


    def extras(self, module, config, layer):
        return {"sinks": module.sinks.detach().float()}


@registered
class Cohere2Adapter(LlamaAdapter):
    """Cohere 2: rotary positions only in its sliding-window layers (the full layers have none), and
    interleaved: dimension 2i paired with 2i + 1, not i with i + d/2."""


    def rotates(self, config, layer):
        return _layer_type(config, layer) == "sliding_attention"

    def rotated(self, q, k, config, T, seen, layer):
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise UnsupportedArchitectureError("rotary scaling is not supported by the from-scratch path for Cohere 2")
        d = q.shape[-1]
        inv_freq = 1.0 / (rope.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, d/2)
        angles = angles.repeat_interleave(2, dim=-1)  # (T, d): each pair's angle on both of its dimensions
        cos, sin = angles.cos().to(q.device, q.dtype), angles.sin().to(q.device, q.dtype)

        def rotate_pairs(x: torch.Tensor) -> torch.Tensor:  # (x_2i, x_2i+1) -> (−x_2i+1, x_2i)
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        return q * cos + rotate_pairs(q) * sin, k * cos + rotate_pairs(k) * sin


@registered
class ModernBertAdapter(LlamaAdapter):
    """ModernBERT, an encoder: one fused Wqkv (Q, K, V, each split into heads), rotary positions with a theta
    per kind of layer, every few layers global attention and local attention between them (key j visible from
    query i when |i − j| ≤ local_attention / 2)."""

    causal = False

    def modules(self, model):
        return [layer.attn for layer in model.layers]

    def out_projections(self, model):
        return [layer.attn.Wo for layer in model.layers]

    def window(self, config, layer: int = 0) -> int | None:
        return None

    def project(self, module, x, d):
        B, T, _ = x.shape
        qkv = module.Wqkv(x).view(B, T, 3, -1, d)  # (B, T, 3, H, d)
        q, k, v = qkv.unbind(dim=2)  # (B, T, H, d) each
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def qkv(self, module, seen, layer, config):
        qkv = super().qkv(module, seen, layer, config)
        qkv.reach = layer_window(config, layer) or None  # local_attention // 2 in its local layers
        return qkv


def _find(model, base: type, kind: str = ""):
    """The adapter the model's family names (engine/families.py), or a one-line error naming what works."""
    model_type = getattr(model.config, "model_type", "?")
    family = family_of(model_type)
    cls = REGISTERED.get(family.adapter) if family is not None else None
    if cls is None or not issubclass(cls, base):
        raise UnsupportedArchitectureError(f"the from-scratch path (verify, steps, norms, scaling, positions) has "
                                           f"no adapter for {model_type!r} {kind}models: {support_line(model_type)}")
    return cls()


def adapter_for(model) -> Adapter:
    return _find(model, Adapter)


# --- encoder-decoder models: encoder, decoder and cross-attention ----------------------------------


class Seq2SeqAdapter:
    """How one family of encoder-decoder models computes Q, K, V in each part: the encoder's self-attention
    over the source, the decoder's causal self-attention over the target, and cross-attention from target
    queries to the encoder's output."""

    folds_scaling = False  # True: the model does not divide by √d_k (qkv's q is multiplied by √d_k to undo it)

    def parts(self, model) -> dict[str, list]:
        """The attention modules of each part, per layer."""
        raise NotImplementedError

    def qkv(self, module, seen: Seen, layer: int, model, part: str) -> QKV:
        raise NotImplementedError


@registered
class BartAdapter(Seq2SeqAdapter):
    """BART and Marian: q/k/v_proj with biases, scaled by 1/√d_k; positions (learned or sinusoidal) are
    added to the inputs, so they are in what the modules receive."""


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


@registered
class T5Adapter(Seq2SeqAdapter):
    """T5: q/k/v without bias and *without* 1/√d_k (T5 folds the scaling into its initialisation), and a
    learned relative position bias per head, computed in the first layer of each stack and added to every
    layer's scores: bidirectional buckets in the encoder, past-only in the decoder, none in cross-attention."""

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


def seq2seq_adapter_for(model) -> Seq2SeqAdapter:
    return _find(model, Seq2SeqAdapter, "encoder-decoder ")


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


def layer_blocks(base, attention_modules: list) -> torch.nn.ModuleList:
    """The ModuleList of the model's blocks (BERT's encoder.layer, GPT-2's h, Llama's layers, …): the one whose
    elements each hold one of `attention_modules` (the adapter's modules(), in layer order)."""
    for found in base.modules():
        if isinstance(found, torch.nn.ModuleList) and len(found) == len(attention_modules):
            if all(any(m is a for m in block.modules()) for block, a in zip(found, attention_modules)):
                return found
    raise UnsupportedArchitectureError(f"attnviz does not find the blocks of {type(base).__name__}")
