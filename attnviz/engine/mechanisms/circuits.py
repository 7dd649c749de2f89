"""QK and OV circuits from the weights alone (Elhage et al. 2021; TransformerLens's FactoredMatrix and
all_composition_scores), in the row-vector convention (a token's residual x, a row: its query x·W_Q^h).

Each head's W_Q^h, W_K^h, W_V^h (D, d) and W_O^h (d, D), with what is linear around them folded in as
TransformerLens's fold_ln does: the gain of the norm the block reads through (Gemma's stored as w − 1), the
gains of QK-norm (per head, Qwen3 and Gemma 3; over the projection, OLMo 2) and Gemma 2/3's norm after the
attention; W_U centred over the vocabulary (TransformerLens's center_unembed: adding one number to every logit
changes no probability); the normalisations themselves, biases and rotary positions are left out.
Under grouped-query attention a key/value head serves H / H_kv query heads: query head h reads key/value
head h // (H / H_kv), as transformers' repeat_kv lays them out.

    head_weights(model)                 HeadWeights: per layer (H, D, d) q, k, v and (H, d, D) o, W_E, W_U
    composition(w)                      Q-, K-, V-composition of every pair of heads in different layers
    copying(w, vocab)                   each head's OV eigenvalue score Σλ / Σ|λ| on the chosen tokens
    qk_pairs(w, vocab, k)               each head's k strongest (query token, key token) pairs
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnviz.engine.ablation.seam import site
from attnviz.engine.scratch.adapters import adapter_for
from attnviz.errors import UnsupportedArchitectureError


@dataclass
class HeadWeights:
    q: list[torch.Tensor]  # per layer (H, D, d)
    k: list[torch.Tensor]  # (H, D, d): each query head's key head
    v: list[torch.Tensor]  # (H, D, d)
    o: list[torch.Tensor]  # (H, d, D)
    embed: torch.Tensor | None  # (V, D): W_E as the model holds it (its own dtype; a subset is made double)
    unembed: torch.Tensor | None  # (V, D): the output head's weight as the model holds it
    kv: list[torch.Tensor] | None = None  # per layer (H,): the key/value head each query head reads (None: its own)
    embed_scale: float = 1.0  # the embedding's own scale (Gemma: √D)
    unembed_mean: torch.Tensor | None = None  # (D,) float64: W_U's mean over the vocabulary (centred out)
    unembed_gain: torch.Tensor | None = None  # (D,) float64: the final norm's gain, folded in

    def embed_rows(self, index: torch.Tensor) -> torch.Tensor:
        """W_E[S] in float64 with the embedding's scale: (S, D). Only the rows asked for are converted (a 262k
        vocabulary in float64 is 1.3 GB)."""
        assert self.embed is not None
        return self.embed[index].double() * self.embed_scale

    def unembed_columns(self, index: torch.Tensor) -> torch.Tensor:
        """W_U[:, S] in float64, centred over the whole vocabulary and with the final norm's gain: (D, S)."""
        assert self.unembed is not None and self.unembed_mean is not None
        rows = self.unembed[index].double() - self.unembed_mean[None, :]
        return (rows * (self.unembed_gain[None, :] if self.unembed_gain is not None else 1.0)).T

    @property
    def layers(self) -> int:
        return len(self.q)

    @property
    def heads(self) -> int:
        return int(self.q[0].shape[0])


def _gain(norm, plus_one: bool) -> torch.Tensor | None:
    weight = getattr(norm, "weight", None)
    if weight is None:
        return None
    weight = weight.detach().double()
    return weight + 1.0 if plus_one else weight


def _first(module, names: Sequence[str]):
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


def _linear(module) -> torch.Tensor:
    """A projection's weight as (D_in, D_out): x @ W."""
    weight = module.weight.detach().double()
    return weight.T if isinstance(module, torch.nn.Linear) else weight  # GPT-2's Conv1D is (D_in, D_out) already


def head_weights(model) -> HeadWeights:
    """Every head's weights with the linear parts around them folded in (see the module's docstring)."""
    base = getattr(model, "base_model", model)
    config = base.config
    where = site(model)
    attention = adapter_for(base).modules(base)
    H = where.heads
    plus_one = str(getattr(config, "model_type", "")).startswith("gemma")
    qs, ks, vs, os_, kvs = [], [], [], [], []
    for layer, (module, block) in enumerate(zip(attention, where.blocks)):
        d = where.dims[layer]
        if all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("q_proj", "k_proj", "v_proj")):
            q, k, v = (_linear(getattr(module, f"{n}_proj")) for n in "qkv")
        elif isinstance(getattr(module, "qkv_proj", None), torch.nn.Module):  # Phi-3: Q, K, V along the output
            fused = _linear(module.qkv_proj)
            kv = (fused.shape[1] - H * d) // 2
            q, k, v = fused[:, :H * d], fused[:, H * d:H * d + kv], fused[:, H * d + kv:]
        elif isinstance(getattr(module, "c_attn", None), torch.nn.Module):  # GPT-2: Q, K, V one after the other
            fused = _linear(module.c_attn)
            q, k, v = fused.split(H * d, dim=1)
        else:
            raise UnsupportedArchitectureError(f"circuits: {type(module).__name__} has no q/k/v projections attnviz "
                                               f"can read")
        D = q.shape[0]
        H_kv = k.shape[1] // d
        if H_kv < 1 or H % H_kv or k.shape[1] != H_kv * d:
            raise UnsupportedArchitectureError(f"circuits: layer {layer}'s keys do not split into heads of {d}")
        q_norm, k_norm = _first(module, ("q_norm",)), _first(module, ("k_norm",))
        if q_norm is not None and k_norm is not None:
            gq, gk = _gain(q_norm, plus_one), _gain(k_norm, plus_one)
            if gq is not None and gk is not None:
                q = q * (gq.repeat(H * d // gq.numel()) if gq.numel() != q.shape[1] else gq)[None, :]
                k = k * (gk.repeat(k.shape[1] // gk.numel()) if gk.numel() != k.shape[1] else gk)[None, :]
        reading = _first(block, ("input_layernorm", "ln_1", "attention_norm"))
        gain = None if reading is None else _gain(reading, plus_one)
        if gain is not None:
            q, k, v = (gain[:, None] * w for w in (q, k, v))
        group = H // H_kv
        per_head = torch.arange(H) // group  # query head h reads key/value head h // group
        kvs.append(per_head)
        qs.append(q.reshape(D, H, d).permute(1, 0, 2).contiguous())
        ks.append(k.reshape(D, H_kv, d).permute(1, 0, 2)[per_head].contiguous())
        vs.append(v.reshape(D, H_kv, d).permute(1, 0, 2)[per_head].contiguous())
        out = _linear(where.projections[layer])  # (H·d, D)
        if _first(block, ("pre_feedforward_layernorm",)) is not None:  # Gemma 2/3: a norm on the attention output
            post = _gain(_first(block, ("post_attention_layernorm",)), plus_one)
            if post is not None:
                out = out * post[None, :]
        os_.append(out.reshape(H, d, -1).contiguous())
    embed = unembed = mean = final_gain = None
    scale = 1.0
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embedding is not None:
        scale = float(torch.as_tensor(getattr(embedding, "embed_scale", 1.0)))
        embed = embedding.weight.detach()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        final = _first(base, ("norm", "ln_f", "final_layernorm"))
        final_gain = None if final is None else _gain(final, plus_one)
        unembed = head.weight.detach()  # (V, D)
        mean = unembed.mean(dim=0, dtype=torch.float64)  # logits shifted alike change nothing: TL's center_unembed
    return HeadWeights(qs, ks, vs, os_, embed, unembed, kvs, scale, mean, final_gain)


def composition(w: HeadWeights) -> dict[str, np.ndarray]:
    """Q-, K- and V-composition (Elhage et al. 2021) of every sender head (layer l1) into every receiver head
    (layer l2 > l1): ‖OV_s · R‖_F / (‖OV_s‖_F ‖R‖_F), R the receiver's QK (Q), QKᵀ (K) or OV (V); 0 where l2 ≤ l1.
    Computed on the d × d factors: ‖A X B‖²_F = Σ (AᵀA·X) ⊙ (X·BBᵀ), X = B_s·A_r. {mode: (L, H, L, H)}"""
    L, H = w.layers, w.heads
    V, W_O, Q, K = (torch.stack(x) for x in (w.v, w.o, w.q, w.k))  # (L, H, D, d) or (L, H, d, D)

    def gram_left(A):  # A (…, D, d) -> AᵀA (…, d, d)
        return A.transpose(-1, -2) @ A

    def gram_right(B):  # B (…, d, D) -> BBᵀ (…, d, d)
        return B @ B.transpose(-1, -2)

    send_a, send_b = V, W_O  # OV_s = V·O
    GA_s = gram_left(send_a)  # (L, H, d, d)
    norm_s = torch.einsum("lhij,lhji->lh", GA_s, gram_right(send_b)).clamp_min(0).sqrt()
    receivers = {"q": (Q, K.transpose(-1, -2)), "k": (K, Q.transpose(-1, -2)), "v": (V, W_O)}
    scores = {}
    for mode, (recv_a, recv_b) in receivers.items():
        GB_r = gram_right(recv_b)  # (L, H, d, d)
        norm_r = torch.einsum("lhij,lhji->lh", gram_left(recv_a), GB_r).clamp_min(0).sqrt()
        result = torch.zeros(L, H, L, H, dtype=torch.float64)
        for l2 in range(1, L):
            # A_r of K- and V-composition is a key/value head's, shared by its group of query heads: B_s·A_r and
            # AᵀA_s·B_s·A_r made once per key/value head (grouped-query attention: H / H_kv times fewer)
            group = w.kv[l2] if w.kv is not None and mode != "q" else torch.arange(H)
            shared, back = torch.unique(group, return_inverse=True)  # back: each head's place among the shared
            first = torch.tensor([int(torch.nonzero(group == g)[0]) for g in shared])
            X = torch.einsum("shdD,rDe->shrde", send_b[:l2], recv_a[l2][first])  # (l2, H, U, d, d): B_s·A_r
            left = torch.einsum("shij,shrjk->shrik", GA_s[:l2], X)[:, :, back]  # (l2, H, H, d, d)
            X = X[:, :, back]
            right = torch.einsum("shrij,rjk->shrik", X, GB_r[l2])
            squared = (left * right).sum(dim=(-1, -2)).clamp_min(0)  # (l2, H, H)
            denominator = norm_s[:l2, :, None] * norm_r[l2][None, None, :]
            result[:l2, :, l2, :] = squared.sqrt() / denominator.clamp_min(1e-300)
        scores[mode] = result.numpy()
    return scores


def copying(w: HeadWeights, vocab: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each head's OV circuit on the tokens `vocab`, W_E[S]·W_V^h·W_O^h·W_U[:, S] (S × S), through its d nonzero
    eigenvalues (those of the d × d matrix W_O^h·W_U[:, S]·W_E[S]·W_V^h): (Σλ / Σ|λ| (L, H): 1 a pure copying
    head, −1 a pure anti-copying one; the share of the eigenvalues' total size on a positive real part (L, H))."""
    if w.embed is None or w.unembed is None:
        raise UnsupportedArchitectureError("the OV copying score needs the model's embedding and its output head")
    index = torch.as_tensor(list(vocab), dtype=torch.long)
    E, U = w.embed_rows(index), w.unembed_columns(index)  # (S, D), (D, S)
    middle = U @ E  # (D, D): W_U[:, S]·W_E[S]
    score, positive = np.zeros((w.layers, w.heads)), np.zeros((w.layers, w.heads))
    for layer in range(w.layers):
        small = w.o[layer] @ middle @ w.v[layer]  # (H, d, d)
        values = torch.linalg.eigvals(small)  # (H, d) complex
        size = values.abs().sum(-1).clamp_min(1e-300)
        score[layer] = (values.sum(-1).real / size).numpy()
        positive[layer] = ((values.real > 0) * values.abs()).sum(-1).div(size).numpy()
    return score, positive


def qk_pairs(w: HeadWeights, vocab: Sequence[int], k: int = 5) -> list[list[list[tuple[int, int, float]]]]:
    """Each head's k largest entries of its QK circuit on the tokens `vocab`, W_E[S]·W_Q^h·(W_E[S]·W_K^h)ᵀ (rotary
    positions left out: as if query and key sat at the same place): [layer][head] -> [(query token id, key
    token id, score), …], largest first."""
    if w.embed is None:
        raise UnsupportedArchitectureError("the QK circuit needs the model's embedding")
    index = torch.as_tensor(list(vocab), dtype=torch.long)
    E = w.embed_rows(index)  # (S, D)
    S = len(index)
    found = []
    for layer in range(w.layers):
        rows = []
        for head in range(w.heads):
            scores = (E @ w.q[layer][head]) @ (E @ w.k[layer][head]).T  # (S, S)
            top = torch.topk(scores.flatten(), min(k, S * S))
            rows.append([(int(index[i // S]), int(index[i % S]), float(v))
                         for v, i in zip(top.values.tolist(), top.indices.tolist())])
        found.append(rows)
    return found
