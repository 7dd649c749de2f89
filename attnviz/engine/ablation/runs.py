"""One text through a model: its inputs, a run with or without α, what the model outputs (logits of a
causal LM, an encoder's sentence embedding), and each head's mean z_h (the fill of mean ablation).
"""

from __future__ import annotations

from collections.abc import Sequence
import inspect

import numpy as np
import torch

from attnviz.errors import InputError, UnsupportedArchitectureError

from attnviz.engine.ablation.seam import Site, recording
from attnviz.engine.families import encoder_types


# --- one text: inputs, runs, what the model outputs ----------------------------------------------------


def is_causal_lm(model) -> bool:
    """A causal language model: a decoder by what it is (its config), not by whether its head was loaded. One
    without its head cannot be measured as one (nor, silently, as an encoder): that is an error here, and the
    API loads the head first (attnviz.engine.models.attach_head)."""
    from attnviz.engine.lm_head import has_head, is_decoder

    config = model.config
    if getattr(config, "is_encoder_decoder", False) or str(getattr(config, "model_type", "")) in encoder_types():
        return False
    if is_decoder(model) and not has_head(model):
        raise InputError(f"{getattr(config, 'model_type', 'this model')} is a causal language model loaded without "
                         f"its output layer (lm_head): load it with attnviz.load_model(name, lm_head=True)")
    return has_head(model)


def run_model(model, inputs: dict, *, attentions: bool = False):
    kwargs = dict(inputs)
    if attentions:
        kwargs["output_attentions"] = True
    return model(**kwargs, use_cache=False) if "use_cache" in _params(model) else model(**kwargs)


def last_logits(model, keep: int | torch.Tensor = 1) -> dict:
    """The argument that makes a causal LM compute its logits for the last `keep` positions only (or, a 1-D
    tensor, at those positions), where its forward takes one (transformers' logits_to_keep): the unembedding of
    every prompt position is most of a prompt's cost for a large vocabulary (Gemma 3's 262k: 117 GFLOP for 700
    tokens) and none of it is read."""
    accepted = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in accepted:
            return {name: keep}
    return {}


def _params(model) -> set[str]:
    return set(inspect.signature(model.forward).parameters)


def outputs_of(output, causal: bool) -> torch.Tensor:
    """What the comparison reads: the logits (B, T, V) of a causal LM, else the last hidden state (B, T, D); in
    float32 at least (a float64 model's stay float64)."""
    found = output.logits if causal else getattr(output, "last_hidden_state", None)
    if found is None:
        found = output.hidden_states[-1]
    return found if found.dtype == torch.float64 else found.float()


def embedding(hidden: torch.Tensor) -> torch.Tensor:
    """The sentence embedding as sentence-transformers pools these models: the mean over the tokens, made unit
    length (B, T, D) -> (B, D)."""
    pooled = hidden.mean(dim=1)
    return pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def head_means(where: Site, runs: Sequence[dict]) -> list[torch.Tensor]:
    """Per layer (H, d): each head's z_h averaged over every token of the inputs `runs` (the clean model)."""
    sums: list[torch.Tensor | None] = [None] * where.layers
    count = 0
    with torch.inference_mode():
        for inputs in runs:
            with recording(where) as seen:
                run_model(where.model, inputs)
            for n, z in enumerate(seen):
                if z is None:
                    raise UnsupportedArchitectureError(f"layer {n}'s output projection was not called")
                total = z.double().sum(dim=(0, 1))  # (H, d)
                sums[n] = total if sums[n] is None else sums[n] + total
            count += int(inputs["input_ids"].numel())
    return [(s / max(count, 1)).float() for s in sums if s is not None]




def alpha_of(output) -> np.ndarray:
    """α of a run with output_attentions, as float32 numpy. (L, H, T, T)"""
    return np.stack([a[0].float().cpu().numpy() for a in output.attentions])
