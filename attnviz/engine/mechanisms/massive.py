"""Massive activations (Sun et al. 2024) on the torch side: each block's output recorded in the run that also
recomputes α and each head's value vectors (value_norms, checked against the attention output), and the
intervention of the paper: chosen entries of a block's output set to a value (0, or their mean over other
texts) before the rest of the model runs, measured by the next-token loss and by α.

    record(model, inputs)            one run: hidden (L, T, D) block outputs, α (L, H, T, T), ‖f_h(x_j)‖ (L, H, T)
    block_outputs(model, inputs, n)  the outputs of the blocks in n only (for the means over other texts)
    intervened(model, inputs, {layer: [(position, dim, value), …]})  (loss, α) with those entries replaced
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.ablation.runs import is_causal_lm, run_model
from attnviz.engine.ablation.seam import site
from attnviz.engine.scratch.norms import value_norms
from attnviz.errors import UnsupportedArchitectureError


@dataclass
class Recorded:
    hidden: np.ndarray  # (L, T, D) float32: each block's output, the residual stream after it
    alpha: np.ndarray  # (L, H, T, T) float64, recomputed from the weights
    value_norms: np.ndarray  # (L, H, T): ‖f_h(x_j)‖, head h's value vector of token j through its slice of W_O
    output_diff: np.ndarray  # (L,): the recomputation's check against each attention output
    output_scale: np.ndarray  # (L,)


def _output_of(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _recording(blocks: Sequence, wanted: Iterable[int]) -> tuple[dict, list[Hook]]:
    kept: dict[int, torch.Tensor] = {}

    def keep(n: int):
        def hook(module, args, output):
            kept[n] = _output_of(output).detach()
        return hook

    return kept, [Hook(blocks[n], "forward", keep(n)) for n in wanted]


def record(model, inputs: dict) -> Recorded:
    """One run of the model: every block's output, and α and the value vectors recomputed (value_norms)."""
    blocks = site(model).blocks
    kept, hooks = _recording(blocks, range(len(blocks)))
    with hooked(hooks):
        norms = value_norms(model, inputs)
    if len(kept) != len(blocks):
        raise UnsupportedArchitectureError(f"{type(model).__name__}: a block was not called")
    hidden = torch.stack([kept[n][0].float() for n in range(len(blocks))]).cpu().numpy()  # (L, T, D)
    return Recorded(hidden, norms.alpha[:, 0], norms.value_norms[:, 0], norms.output_diff,
                    norms.output_scale if norms.output_scale is not None else np.ones_like(norms.output_diff))


def block_outputs(model, inputs: dict, layers: Iterable[int]) -> dict[int, np.ndarray]:
    """The outputs (T, D) of the blocks in `layers`, from one plain run."""
    blocks = site(model).blocks
    wanted = sorted(set(layers))
    kept, hooks = _recording(blocks, wanted)
    with hooked(hooks), torch.inference_mode():
        run_model(model, inputs)
    return {n: kept[n][0].float().cpu().numpy() for n in wanted}


def intervened(model, inputs: dict, changes: Mapping[int, Sequence[tuple[int, int, float]]]) -> tuple[float | None,
                                                                                                    np.ndarray]:
    """The model run with, after block n, the entries (position, dim) of its output set to the values given
    (changes {n: [(position, dim, value), …]}; none: the plain run). (the mean next-token loss over the text
    in nats, for a causal LM, else None; α (L, H, T, T) as the model reports it)."""
    blocks = site(model).blocks

    def setter(entries):
        def hook(module, args, output):
            hidden = _output_of(output).clone()
            for position, dim, value in entries:
                hidden[:, position, dim] = value
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
        return hook

    with hooked([Hook(blocks[n], "forward", setter(entries)) for n, entries in changes.items() if entries]):
        with torch.inference_mode():
            output = run_model(model, inputs, attentions=True)
    attentions = getattr(output, "attentions", None)
    if not attentions or any(a is None for a in attentions):
        raise UnsupportedArchitectureError(f"{type(model).__name__} returned no attention weights")
    alpha = torch.stack([a[0].double() for a in attentions]).cpu().numpy()
    loss = None
    if is_causal_lm(model):
        logits = output.logits[0, :-1].double()  # (T − 1, V): each position predicts the next token
        target = inputs["input_ids"][0, 1:].to(logits.device)
        loss = float(torch.nn.functional.cross_entropy(logits, target))
    return loss, alpha
