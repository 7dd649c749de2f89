"""ALTI (Ferrando et al., EMNLP 2022; pre-norm decoders as Ferrando et al. 2023 and inseq's `Alti` do): how
much each token contributes to each token's output of a layer's attention block.

The attention block's output for token i, residual included, is a sum of one vector per input token j:

    pre-norm (GPT-2, Llama, …):   y_i = Σ_j T_i(x_j) + b_O,          T_i(x_j) = Σ_h α^h_ij f_h(x_j) + [i = j] x_i
    post-norm (BERT, RoBERTa, …): y_i = LN(Σ_j T_i(x_j) + b_O), and with LN's scale frozen at the one it used
                                  (σ_i of that sum), T'_i(x_j) = γ ⊙ (T_i(x_j) − mean) / σ_i, so
                                  y_i = Σ_j T'_i(x_j) + γ ⊙ (b_O − mean(b_O)) / σ_i + β

f_h(x_j) is token j's value through head h's slice of W_O (as `norms` computes it), α and the values
recomputed from the model's own weights. Then, as the paper and the reference code do,

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁),   rows normalised to sum to 1

(a row where no part is closer to y_i than the zero vector is, so every c_ij is 0, is given to token i itself:
its residual; the reference code leaves it 0/0)

and rolled out over layers by multiplying the layers' matrices. The sum is checked against the block's own
output (a hook) in every layer; a family whose blocks are built otherwise fails that check and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from attnviz.engine.forward import attentions_of
from attnviz.engine.scratch.adapters import adapter_for, layer_blocks
from attnviz.engine.scratch.norms import _out_weight, head_outputs
from attnviz.engine.points import Recording, post_norm, pre_mlp_norm, record
from attnviz.engine.memory import WORKING_BYTES
from attnviz.errors import UnsupportedArchitectureError

CHECK_TOLERANCE = 1e-4  # of the output's largest |value|: float64 sums of float32 parts, and LN's rounding


def alti_points(n_layers: int) -> list[str]:
    """The points ALTI reads: each block's input (the residual), its attention's output, the stream after it."""
    return [f"blocks.{n}.{point}" for n in range(n_layers) for point in ("resid.pre", "attn.out", "resid.mid")]


def alti(model, inputs: dict, *, streamed: bool = False, on_layer: Callable[[int], None] | None = None,
         recording: Recording | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(contributions (L, T, T) float32, rows summing to 1; the decomposition check per layer (L,): the largest
    |Σ_j T_i(x_j) + bias − the block's own output| over that output's largest |value|; α of the same forward
    pass). One text.

    α: the model's own (L, H, T, T) float32; `streamed`, the mean over heads of α recomputed from the weights,
    (L, 1, T, T), and the model never asked for its L·H·T² weights. Either way each layer is worked through a
    block of query rows at a time (WORKING_BYTES), so what is held is the result: 4·L·T² bytes, twice when
    streamed, beside what the model itself holds. The parts are summed in float64, or float32 when streamed
    (a long input: T·D·H products per row, half the time; the decomposition check is measured all the same).
    `on_layer(1)` is called as each layer is done."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    attention_modules = adapter.modules(base)
    blocks = layer_blocks(base, attention_modules)
    projections = adapter.out_projections(base)
    post: list[Any] = [post_norm(block) for block in blocks]
    after: list[Any] = [norm if norm is not None else pre_mlp_norm(block) for norm, block in zip(post, blocks)]
    if any(module is None for module in after):
        raise UnsupportedArchitectureError(f"ALTI does not find where {type(base).__name__}'s attention block ends "
                                           f"(no norm after it, nor one before its MLP)")
    L = len(blocks)
    if recording is None:
        recording = record(model, inputs, alti_points(L), attentions=not streamed)
    run = recording.run
    seen = {kind: [recording[f"blocks.{n}.{point}"] for n in range(L)]
            for kind, point in (("x", "resid.pre"), ("out", "attn.out"), ("y", "resid.mid"))}
    T = int(seen["x"][0].shape[1])
    scores = np.zeros((L, T, T), np.float32)
    means = np.zeros((L, 1, T, T), np.float32) if streamed else None
    checks = np.zeros(L)
    work = torch.float32 if streamed else torch.float64
    with torch.inference_mode():
        for n, qkv in enumerate(run.layers):
            weight, bias = _out_weight(projections[n])
            f = head_outputs(qkv.v.to(work), weight.to(work))[0]  # (H, T, D)
            H, _, D = f.shape
            x = seen["x"][n][0].to(work)  # (T, D): the block's input, the residual
            b_o = bias.to(work) if bias is not None else torch.zeros(D, dtype=work, device=f.device)
            target = seen["y"][n][0].double()  # (T, D): the block's own output
            worst = 0.0
            size = torch.finfo(work).bits // 8
            step = max(1, min(T, WORKING_BYTES // (size * T * (D + H) * 2)))  # rows whose parts and α fit
            for start in range(0, T, step):
                rows = slice(start, min(start + step, T))
                at = torch.arange(rows.start, rows.stop, device=f.device)
                alpha = qkv.alpha_rows(rows, torch.float64)[0].to(work)  # (H, r, T)
                if means is not None:
                    means[n, 0, rows] = alpha.mean(0).float().cpu().numpy()
                parts = torch.einsum("hij,hjd->ijd", alpha, f)  # (r, T, D): Σ_h α_ij f_h(x_j)
                del alpha
                parts[torch.arange(len(at)), at] += x[at]  # the residual: token i's own input
                summed = parts.sum(1) + b_o  # (r, D)
                if post[n] is not None:  # LN with its scale frozen at σ of the sum it normalised
                    norm = post[n]
                    gamma, beta = norm.weight.to(work), norm.bias.to(work)
                    sigma = torch.sqrt(summed.var(-1, unbiased=False) + norm.eps)  # (r,)
                    parts = gamma * (parts - parts.mean(-1, keepdim=True)) / sigma[:, None, None]
                    summed = parts.sum(1) + gamma * (b_o - b_o.mean()) / sigma[:, None] + beta
                worst = max(worst, float((summed.double() - target[at]).abs().max()))
                distance = parts.sub_(summed[:, None, :]).abs_().sum(-1)  # (r, T): ‖y_i − T_i(x_j)‖₁, in place
                del parts
                share = (summed.abs().sum(-1, keepdim=True) - distance).clamp_min(0)  # (r, T)
                sums = share.sum(-1, keepdim=True)
                eye = torch.zeros_like(share)
                eye[torch.arange(len(at)), at] = 1.0  # a row that nothing is closer than zero: its residual's
                share = torch.where(sums > 0, share / torch.where(sums > 0, sums, 1), eye)
                scores[n, rows] = share.float().cpu().numpy()
            checks[n] = worst / max(1.0, float(target.abs().max()))
            if on_layer is not None:
                on_layer(1)
    if float(checks.max()) > CHECK_TOLERANCE:
        layer = int(checks.argmax())
        raise UnsupportedArchitectureError(
            f"{type(base).__name__}'s attention blocks are not built as ALTI decomposes them: in layer {layer} the "
            f"parts miss the block's output by {checks[layer]:.1e} of its size")
    if means is not None:
        return scores, checks, means
    reported = attentions_of(run.output, model, getattr(model, "name_or_path", "the model"))
    model_alpha = np.stack([a[0].float().cpu().numpy() for a in reported])  # (L, H, T, T)
    return scores, checks, model_alpha


def alti_logit(model, inputs: dict, by_source: np.ndarray,
               recording: Recording | None = None) -> tuple[np.ndarray | None, str]:
    """ALTI-Logit (Ferrando et al. 2023, the reference code's `logit_aff_x_j_alti`): each head's direct effect on
    a logit through each token it reads (by_source (L, H, T), token j's stream entering layer l), traced back
    to the input tokens by ALTI's contributions of the layers below: by_input[l, h] = by_source[l, h] · R_(l−1),
    R_(l−1) = C_(l−1) ··· C_0 (R_(−1) = I). Rows of each C sum to 1, so each head's effect is kept whole.
    (by_input (L, H, T) or None, why not: a line where ALTI does not split this family's blocks.)"""
    try:
        scores, _, _ = alti(model, inputs, recording=recording)
    except UnsupportedArchitectureError as exc:
        return None, str(exc)
    return traced_back(scores, by_source), ""


def traced_back(scores: np.ndarray, by_source: np.ndarray) -> np.ndarray:
    """by_source (L, H, T) traced back to the input tokens through ALTI's `scores` (L, T, T) (alti_logit)."""
    T = scores.shape[-1]
    reach = np.eye(T)  # R_(l−1): row j is how much each input token makes up token j's stream entering layer l
    traced = np.zeros(by_source.shape)
    for n in range(by_source.shape[0]):
        traced[n] = by_source[n].astype(np.float64) @ reach  # (H, T)
        reach = scores[n].astype(np.float64) @ reach
    return traced
