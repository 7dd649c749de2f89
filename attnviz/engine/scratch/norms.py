"""Value-weighted norms (Kobayashi et al. 2020, "Attention is Not Only a Weight"): ‖α_ij f_h(x_j)‖, each
head's value vectors through its slice of W_O, checked against the attention block's own output."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from attnviz.engine.forward import encode, make_capture
from attnviz.engine.scratch.adapters import adapter_for
from attnviz.engine.memory import check_memory
from attnviz.engine.points import Recording, record
from attnviz.errors import UnsupportedArchitectureError


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
class ValueNorms:
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


def norms_points(n_layers: int) -> list[str]:
    """The points value_norms reads: each attention's output (its check)."""
    return [f"blocks.{n}.attn.out" for n in range(n_layers)]


def value_norms(model, inputs: dict, recording: Recording | None = None) -> ValueNorms:
    """Run the model once (or read `recording`, a pass that kept blocks.N.attn.out); per layer recompute α and
    each head's value vectors through W_O from the model's own weights, and check that they add up to the
    attention block's own output."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    projections = adapter.out_projections(base)
    if recording is None:
        recording = record(model, inputs, norms_points(len(projections)))
    run = recording.run
    outputs = [recording.points.get(f"blocks.{n}.attn.out") for n in range(len(projections))]
    alphas, norms, diffs, scales = [], [], [], []
    key_mask = inputs.get("attention_mask")
    with torch.inference_mode():
        for n, qkv in enumerate(run.layers):  # in float64: the model's own float32 rounding is what remains
            alpha = qkv.alpha(torch.float64)  # (B, H, T, T)
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
    return ValueNorms(torch.stack(alphas).cpu().numpy(), torch.stack(norms).cpu().numpy(), np.array(diffs),
                 np.array(scales))


def norms_capture(loaded, text, *, truncate: bool = True, encoded=None, recording: Recording | None = None):
    """(Capture of value-weighted norms ‖α_ij f_h(x_j)‖, ValueNorms): meta quantity "norm", the exact check's
    largest |Δ| in meta "norm_check". `encoded` and `recording`: a Run's, read instead of running again."""

    if encoded is None:
        encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=4.0)
    result = value_norms(loaded.model, encoded.inputs, recording)
    capture = make_capture(loaded, encoded, result.alpha[:, 0].astype(np.float32), text)  # checks α first

    norms = replace(capture, attentions=result.norms[:, 0].astype(np.float32),
                    meta={**capture.meta, "quantity": "norm", "source": "scratch",
                          "norm_check": float(result.output_diff.max())})
    return norms.validate(), result
