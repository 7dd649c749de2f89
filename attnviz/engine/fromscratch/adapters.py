"""One adapter per architecture family: how that family turns what its attention module received into
Q, K and V with the module's own weights (split heads, rotary positions, grouped-query K/V sharing, the
causal mask and sliding window, T5's relative position bias). Written out by hand, so that verify is an
independent second computation, not a call into the model's attention."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from attnviz.engine.hooks import Seen
from attnviz.errors import UnsupportedArchitectureError


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
