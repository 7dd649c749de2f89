"""Direct logit attribution: how much each attention head writes the predicted token's logit.

A pre-norm decoder's last residual stream is a sum of what each part wrote into it,

    x_L = x_0 (embeddings) + Σ_l (attention_l + MLP_l),    attention_l = Σ_h c_lh + b_O,
    c_lh = Σ_j α_lh[p, j] f_h(x_j)                          (f_h: head h's values through its slice of W_O)

and with the final norm's scale frozen at the one it used (TransformerLens's `logit_attrs`), the norm is
affine: N(x) = γ ⊙ P(x) / s + β (P centres x for a LayerNorm, is the identity for an RMSNorm). So the logit
of token t at position p splits exactly into one term per part:

    logit_t = Σ_lh u·P(c_lh)/s + Σ_l u·P(b_O,l)/s + Σ_l u·P(MLP_l)/s + u·P(x_0)/s + W_U[t]·β + b_U[t],
    u = W_U[t] ⊙ γ

α and the values are recomputed from the model's own weights (the from-scratch path), the other parts come
from hooks on the model's modules, and three checks are measured, not assumed: the heads and bias rebuild
each output projection's output; the parts rebuild the stream the final norm reads; the frozen norm rebuilds
the norm's own output, and the terms the model's own logit. A decoder whose blocks normalise what they add
(Gemma 2 and 3, OLMo 2) fails the second check and is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnviz.engine.norm_pullback import epsilon
from attnviz.engine.scratch.adapters import adapter_for, layer_blocks
from attnviz.engine.scratch.norms import _out_weight, head_outputs
from attnviz.engine.points import Recording, final_norm, record
from attnviz.errors import UnsupportedArchitectureError

STREAM_TOLERANCE = 1e-4  # of the stream's largest |value|: float32 sums over a few dozen parts


@dataclass
class LogitParts:
    """The logit of `target` at `position`, split into what each part of the model wrote (float64 sums)."""

    target: int
    position: int
    logit: float  # the model's own
    heads: np.ndarray  # (L, H) each head's direct effect
    by_source: np.ndarray  # (L, H, T) each head's effect through each source token j: α_pj · u·P(f_h(x_j))/s
    attention_bias: np.ndarray  # (L,) b_O's share (0 where there is none)
    mlps: np.ndarray  # (L,)
    embeddings: float
    final_bias: float  # W_U[t]·β + b_U[t]
    head_directions: np.ndarray  # (L, H, D) N's linear part applied to c_lh: what the head adds to N(x_L)
    output_diff: float  # largest |Σ_h c_lh + b_O − the output projection's own output| over layers
    stream_diff: float  # largest |x_0 + Σ parts − the stream the final norm reads|, over its largest |value|
    norm_diff: float  # largest |frozen N(x_L) − the norm's own output|

    @property
    def rebuilt(self) -> float:
        return float(self.heads.sum() + self.attention_bias.sum() + self.mlps.sum() + self.embeddings
                     + self.final_bias)


def _frozen_norm(norm, x: torch.Tensor, y: torch.Tensor):
    """(linear part as a function of a vector (…, D), β): the norm with its scale frozen at x's, chosen
    among LayerNorm, RMSNorm and RMSNorm with (1 + γ) as the one that gives the norm's own output y."""
    gamma = norm.weight.double()
    beta = norm.bias.double() if getattr(norm, "bias", None) is not None else torch.zeros_like(gamma)
    eps = epsilon(norm)
    x = x.double()
    centred = torch.sqrt(x.var(-1, unbiased=False) + eps)  # a LayerNorm's scale (Cohere's has no bias)
    rms = torch.sqrt((x * x).mean(-1) + eps)  # an RMSNorm's
    candidates = [(lambda c: gamma * (c - c.mean(-1, keepdim=True)) / centred, beta),
                  (lambda c: gamma * c / rms, beta),
                  (lambda c: (1 + gamma) * c / rms, beta)]  # Gemma's RMSNorm scales by 1 + γ
    best = min(candidates, key=lambda pair: float((pair[0](x) + pair[1] - y.double()).abs().max()))
    return best[0], best[1], float((best[0](x) + best[1] - y.double()).abs().max())


def logit_points(n_layers: int) -> list[str]:
    """The points logit attribution reads: each attention's and MLP's output, the first block's input (the
    embeddings) and the final norm's input and output."""
    return [*(f"blocks.{n}.{point}" for n in range(n_layers) for point in ("attn.out", "mlp.out")),
            "blocks.0.resid.pre", "ln_final.in", "ln_final.out"]


def logit_parts(model, inputs: dict, *, position: int, target: int | None, recording: Recording | None = None,
                lean: bool = False) -> tuple[LogitParts, np.ndarray]:
    """(the split of one logit, the model's logits at `position` (V,) float64). `target` None: the model's top
    token.
    `model` has its language-model head; one text (batch of 1). `recording`: a pass that kept logit_points
    (made before the head was attached, it has no logits: the head is applied to the final norm's output).
    `lean`: the long path (_lean_pass), which holds no α but the position's row."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    if not getattr(adapter, "causal", False):
        raise UnsupportedArchitectureError("logit attribution is for causal language models (the next token's "
                                           "logit); this model is an encoder")
    layers = layer_blocks(base, adapter.modules(base))
    projections = adapter.out_projections(base)
    mlps_modules: list[torch.nn.Module] = [getattr(layer, "mlp", None) for layer in layers]  # type: ignore[misc]
    if any(m is None for m in mlps_modules):
        raise UnsupportedArchitectureError(f"logit attribution does not know {type(base).__name__}'s MLPs")
    norm = final_norm(base)
    unembed = model.get_output_embeddings()
    if unembed is None:
        raise UnsupportedArchitectureError("logit attribution needs the model's language-model head")
    if getattr(model.config, "final_logit_softcapping", None):
        raise UnsupportedArchitectureError("this model soft-caps its logits (tanh): a logit does not split into "
                                           "parts that add up")

    L = len(layers)
    if lean:  # the long path: the model's own SDPA, only the row of α at the position recomputed
        rows, seen, output = _lean_pass(model, inputs, position, L)
        T = int(inputs["input_ids"].shape[1])
        p = position % T
    else:
        if recording is None:
            recording = record(model, inputs, logit_points(L))
        T = int(recording["ln_final.out"].shape[1])
        p = position % T
        rows = [(qkv.alpha(torch.float64)[0, :, p], qkv.v) for qkv in recording.run.layers]  # (H, T) each
        seen = {"outputs": [recording[f"blocks.{n}.attn.out"][0, p] for n in range(L)],
                "mlps": [recording[f"blocks.{n}.mlp.out"][0, p] for n in range(L)],
                "x0": recording["blocks.0.resid.pre"][0, p], "xL": recording["ln_final.in"][0, p],
                "y": recording["ln_final.out"][0, p]}
        output = recording.run.output
        every_y = recording["ln_final.out"]  # (1, T, D): the head applied to every position, as the model does
    if getattr(output, "logits", None) is not None:
        logits = output.logits[0, -1 if lean else position].double()  # (V,)
    else:  # the head applied as the model applies it: to the final norm's output
        with torch.inference_mode():
            logits = model.get_output_embeddings()(seen["y"] if lean else every_y)
            logits = (logits if lean else logits[0, p]).double()
            factor = getattr(model, "logit_scale", None)
            if isinstance(factor, (int, float)) and not isinstance(factor, bool):
                logits = logits * float(factor)
    t = int(logits.argmax()) if target is None else int(target)

    with torch.inference_mode():
        x_last = seen["xL"].double()  # (D,)
        linear, beta, norm_diff = _frozen_norm(norm, x_last, seen["y"])
        if norm_diff > STREAM_TOLERANCE * max(1.0, float(seen["y"].abs().max())):
            raise UnsupportedArchitectureError(f"{type(norm).__name__}, {type(base).__name__}'s final norm, is "
                                               f"neither a LayerNorm nor an RMSNorm: its logit cannot be split here")
        factor = getattr(model, "logit_scale", None)  # Cohere multiplies its logits by a constant
        factor = float(factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else 1.0
        u = unembed.weight[t].double() * factor  # (D,)
        b_u = float(unembed.bias[t]) * factor if getattr(unembed, "bias", None) is not None else 0.0

        def effect(c: torch.Tensor) -> torch.Tensor:  # u · N's linear part of c, over the last axis
            return (linear(c) * u).sum(-1)

        heads, sources, directions, biases, mlp_effects, output_diff = [], [], [], [], [], 0.0
        stream = seen["x0"].double().clone()
        for n, (alpha, v) in enumerate(rows):  # alpha (H, T): the row of position p
            weight, bias = _out_weight(projections[n])
            f = head_outputs(v.double(), weight.double())[0]  # (H, T, D)
            c = torch.einsum("hj,hjo->ho", alpha, f)  # (H, D)
            b_o = bias.double() if bias is not None else torch.zeros_like(c[0])
            output = c.sum(0) + b_o
            output_diff = max(output_diff, float((output - seen["outputs"][n].double()).abs().max()))
            heads.append(effect(c))
            sources.append(alpha * effect(f))  # (H, T)
            directions.append(linear(c))
            biases.append(float(effect(b_o)))
            mlp = seen["mlps"][n].double()
            mlp_effects.append(float(effect(mlp)))
            stream += output + mlp
        stream_diff = float((stream - x_last).abs().max()) / max(1.0, float(x_last.abs().max()))
        if stream_diff > STREAM_TOLERANCE:
            raise UnsupportedArchitectureError(
                f"{type(base).__name__}'s blocks do not simply add their attention and MLP outputs to the residual "
                f"stream (a norm after each, as in Gemma 2 and 3 or OLMo 2): its logit does not split into heads "
                f"this way (the parts miss the stream by {stream_diff:.1e} of its size)")
        parts = LogitParts(
            target=t, position=p, logit=float(logits[t]), heads=torch.stack(heads).cpu().numpy(),
            by_source=torch.stack(sources).cpu().numpy(), attention_bias=np.array(biases),
            mlps=np.array(mlp_effects), embeddings=float(effect(seen["x0"].double())),
            final_bias=float((u * beta).sum()) + b_u,
            head_directions=torch.stack(directions).cpu().numpy(), output_diff=output_diff,
            stream_diff=stream_diff, norm_diff=norm_diff)
    return parts, logits.cpu().numpy()


def _lean_pass(model, inputs: dict, position: int, L: int) -> tuple[list, dict, Any]:
    """One pass on the model's own SDPA attention (engine/lean.py) that keeps what logit_parts reads at
    `position` only: per layer the row of α there (H, T) float64, recomputed from the layer's Q and K as the
    forward pass reaches it, and its values V (B, H_kv, T, d); each point at the position (D,); the output, its
    logits at the position only. What it holds grows linearly in T: no T × T matrix, no mask but the row's."""
    from attnviz.engine.ablation.runs import last_logits
    from attnviz.engine.hooks import hooked, recording_inputs
    from attnviz.engine.lean import lean
    from attnviz.engine.points import keeping
    from attnviz.engine.scratch.adapters import layer_qkv
    from attnviz.engine.scratch.formula import attention_mask, attention_weights

    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    modules = adapter.modules(base)
    T = int(inputs["input_ids"].shape[1])
    p = position % T
    key_mask = inputs.get("attention_mask")
    key_mask = torch.ones(1, T, dtype=torch.long) if key_mask is None else key_mask[:1].cpu()
    rows: list = [None] * L

    def on_seen(n: int, seen) -> None:
        qkv = layer_qkv(adapter, modules[n], seen, n, base.config)
        if qkv.bias is not None:
            raise UnsupportedArchitectureError(f"{type(base).__name__} adds a positional bias to its scores: its "
                                               f"long inputs are not split here")
        mask = attention_mask(key_mask, causal=adapter.causal, window=qkv.window, reach=qkv.reach,
                              rows=torch.tensor([p])).to(qkv.q.device)  # (1, 1, 1, T): the position's row
        alpha = attention_weights(qkv.q[:, :, p:p + 1].double(), qkv.k.double(), mask, scale=qkv.scale,
                                  softcap=qkv.softcap, sinks=None if qkv.sinks is None else qkv.sinks.double())
        rows[n] = (alpha[0, :, 0], qkv.v)

    kept: dict[str, torch.Tensor] = {}
    keep = [f"blocks.{n}.{point}" for n in range(L) for point in ("attn.out", "mlp.out")]
    keep += ["blocks.0.resid.pre", "ln_final.in", "ln_final.out"]
    at = torch.tensor([p])
    with lean(model), recording_inputs(modules, on_seen), hooked(keeping(model, keep, kept, at=p)):
        with torch.inference_mode():
            output = model(**inputs, **last_logits(model, at if p != T - 1 else 1), use_cache=False)
    if any(r is None for r in rows) or any(name not in kept for name in keep):
        raise UnsupportedArchitectureError(f"{type(base).__name__}: a layer was not called")
    seen = {"outputs": [kept[f"blocks.{n}.attn.out"][0, 0] for n in range(L)],
            "mlps": [kept[f"blocks.{n}.mlp.out"][0, 0] for n in range(L)],
            "x0": kept["blocks.0.resid.pre"][0, 0], "xL": kept["ln_final.in"][0, 0], "y": kept["ln_final.out"][0, 0]}
    return rows, seen, output


def raised_and_lowered(model, directions: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """For each direction (N, D), the ids of the k tokens whose logits W_U · d raises most and lowers most:
    which tokens a head's output pushes up and down. ((N, k), (N, k))"""
    weight = model.get_output_embeddings().weight.double()
    with torch.inference_mode():
        effects = torch.from_numpy(directions).to(weight.device) @ weight.T  # (N, V)
        return effects.topk(k, dim=-1).indices.cpu().numpy(), (-effects).topk(k, dim=-1).indices.cpu().numpy()
