"""The logit lens (nostalgebraist 2020): each layer's residual stream read as if it were the last — through the
model's own final norm and unembedding (its soft-cap and logit scale too) — so that each layer says what it would
predict. Row 0 is the embeddings (the stream entering block 0), row n+1 the stream after block n; the last row is
the final norm's input, whose reading is the model's own output distribution (checked).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.engine.points import Recording, final_norm, record
from attnviz.engine.scratch.adapters import adapter_for, layer_blocks
from attnviz.errors import UnsupportedArchitectureError


CHUNK = 32  # positions read at once: (CHUNK, V) float64 probabilities per stream


def lens_points(n_layers: int) -> list[str]:
    """What the lens reads: every block's input, and the final norm's input (the stream after the last block)."""
    return [f"blocks.{n}.resid.pre" for n in range(n_layers)] + ["ln_final.in", "ln_final.out"]


@dataclass(frozen=True)
class LensReading:
    """Per stream read (L + 1) and position (P): the `k` most likely tokens and their probabilities, and the
    target's probability and rank (0: the most likely); `model_diff`, the largest |p| difference between the
    last row and the model's own output distribution at those positions."""

    top_ids: np.ndarray  # (L + 1, P, k) int64
    top_p: np.ndarray  # (L + 1, P, k) float64
    target_p: np.ndarray | None  # (L + 1, P) float64
    target_rank: np.ndarray | None  # (L + 1, P) int64
    model_diff: float
    last_logits: np.ndarray  # (V,) float64: the model's own logits at the last position read


def _head(model, normed: bool = False):
    """The function from a stream (…, D) to the logits (…, V), as the model makes its own (`normed`: from the
    final norm's output)."""
    base = getattr(model, "base_model", model)
    norm = final_norm(base)
    unembed = model.get_output_embeddings()
    if unembed is None:
        raise UnsupportedArchitectureError("the logit lens needs the model's language-model head")
    cap = getattr(model.config, "final_logit_softcapping", None)
    scale = getattr(model, "logit_scale", None)

    def logits(x: torch.Tensor) -> torch.Tensor:
        out = unembed(x if normed else norm(x)).double()
        if isinstance(scale, (int, float)) and not isinstance(scale, bool):
            out = out * float(scale)
        if cap:
            out = torch.tanh(out / float(cap)) * float(cap)
        return out

    return logits


def logit_lens(model, inputs: dict, positions: list[int], *, target: int | None = None, k: int = 5,
               recording: Recording | None = None, on_step=None) -> LensReading:
    """Each stream of one text (batch of 1) at `positions` read through the final norm and the unembedding: the
    `k` most likely next tokens, and `target`'s probability and rank. A causal language model with its head.
    `on_step(1)` is called as each stream of each block of CHUNK positions is read."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    if not getattr(adapter, "causal", False):
        raise UnsupportedArchitectureError("the logit lens reads a causal language model's next-token prediction; "
                                           "this model is an encoder")
    head = _head(model)
    n_layers = len(layer_blocks(base, adapter.modules(base)))
    if recording is None:
        recording = record(model, inputs, lens_points(n_layers), attentions=False)
    streams = [recording[f"blocks.{n}.resid.pre"] for n in range(n_layers)] + [recording["ln_final.in"]]
    at = torch.tensor(positions, dtype=torch.long)
    rows = len(streams)
    top_ids = np.zeros((rows, len(positions), k), np.int64)
    top_p = np.zeros((rows, len(positions), k))
    target_p = np.zeros((rows, len(positions))) if target is not None else None
    target_rank = np.zeros((rows, len(positions)), np.int64) if target is not None else None
    diff = 0.0
    from_normed = _head(model, normed=True)
    own = getattr(recording.run.output, "logits", None)  # the model's own; a pass made without the head: its
    normed = recording["ln_final.out"]  # head applied to the final norm's own output, as the model applies it
    with torch.inference_mode():
        for start in range(0, len(positions), CHUNK):  # (chunk, V) probabilities at a time, whatever the length
            chunk = at[start:start + CHUNK]
            for n, stream in enumerate(streams):
                logits = head(stream[0, chunk.to(stream.device)])  # (P, V)
                p = torch.softmax(logits, dim=-1)
                values, ids = p.topk(k, dim=-1)
                top_ids[n, start:start + len(chunk)] = ids.cpu().numpy()
                top_p[n, start:start + len(chunk)] = values.cpu().numpy()
                if target is not None and target_p is not None and target_rank is not None:
                    got = slice(start, start + len(chunk))
                    target_p[n, got] = p[:, target].cpu().numpy()
                    target_rank[n, got] = (logits > logits[:, target:target + 1]).sum(-1).cpu().numpy()
                if on_step is not None:
                    on_step(1)
            model_logits = (own[0, chunk.to(own.device)].double() if own is not None
                            else from_normed(normed[0, chunk.to(normed.device)]))
            diff = max(diff, float((torch.softmax(model_logits, dim=-1) - p).abs().max()))
            last_logits = model_logits[-1].cpu().numpy()
    return LensReading(top_ids, top_p, target_p, target_rank, diff, last_logits)
