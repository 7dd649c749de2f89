"""Where heads are removed: each family's output projection W_O (the input columns of head h are its z_h),
the hooks that edit or record what W_O receives, and the same edit made on the weights (for the tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.scratch.adapters import adapter_for
from attnviz.engine.models import layers_and_heads
from attnviz.errors import UnsupportedArchitectureError



MODES = ("zero", "mean")
OUTPUT_BYTES = 256 << 20  # logits (or hidden states) of the batched copies held at once in importance
ATTENTION_BYTES = 1 << 30  # what the copies' eager attention may take at once (3 × H·T² float32 each per layer)


def copies_that_fit(where: Site, T: int, width: int, *, backward: bool = False) -> int:
    """How many copies of a T-token input one batched pass may hold: their outputs (T × width float32) within
    OUTPUT_BYTES and their attention (3 · H · T² float32 per layer at a time, every layer when a backward pass
    keeps them) within ATTENTION_BYTES; at least 1."""
    if where.lean:  # the long path: no α; each copy's logits at the last position, and one block's activations
        from attnviz.engine.lean import block_activation_bytes

        return max(1, min(OUTPUT_BYTES // max(width * 4, 1),
                          ATTENTION_BYTES // max(block_activation_bytes(where.model.config, T), 1)))
    attention = 3 * where.heads * T * T * 4 * (where.layers if backward else 1)
    return max(1, min(OUTPUT_BYTES // max(T * width * 4, 1), ATTENTION_BYTES // max(attention, 1)))


# --- where heads are removed ---------------------------------------------------------------------------


@dataclass
class Site:
    """A model's output projections (per layer W_O, Linear or GPT-2's Conv1D) and layer blocks, and the head
    split of each projection's input (H heads of d)."""

    model: torch.nn.Module
    projections: list
    blocks: list
    heads: int
    dims: list[int]  # per layer, d: the projection's input is H·d wide
    lean: bool = False  # run on the long path (engine/lean.py): the model's own SDPA, blocks recomputed backward
    on_block: Callable[[int], None] | None = None  # a long gradient pass reports each block, forward and backward
    recomputed: int = 0  # on the long path, the first blocks recomputed in the backward pass (the rest do not fit)
    keeping: int = 0  # of those, the first keeping their attention's output (engine/lean.py recomputing)
    pending: Any = None  # the receiver run's forward pass made ahead for AtP (engine/patching.py Pending)

    @property
    def layers(self) -> int:
        return len(self.projections)


def _in_features(module) -> int:
    if isinstance(module, torch.nn.Linear):
        return int(module.in_features)
    return int(module.weight.shape[0])  # Conv1D: x @ W + b, W (D_in, D_out)


def site(model) -> Site:
    """Where `model`'s heads can be removed; a family without an adapter is refused in one line."""

    base = getattr(model, "base_model", model)
    if getattr(base.config, "is_encoder_decoder", False):
        raise UnsupportedArchitectureError("ablate, importance and detect take encoder-only and decoder-only models "
                                           "(an encoder-decoder model has three kinds of attention)")
    adapter = adapter_for(base)
    projections = adapter.out_projections(base)
    modules = adapter.modules(base)
    _, heads = layers_and_heads(base.config)
    dims = []
    for n, projection in enumerate(projections):
        width = _in_features(projection)
        if width % heads:
            raise UnsupportedArchitectureError(f"layer {n}'s output projection takes {width} inputs, not a multiple "
                                               f"of its {heads} heads")
        dims.append(width // heads)
    return Site(model, projections, _blocks(base, modules), heads, dims)


def _blocks(base, modules: list) -> list:
    """Per layer, the layer block holding attention module n: an element of the model's list of layers."""
    for lst in base.modules():
        if isinstance(lst, torch.nn.ModuleList) and len(lst) == len(modules) and all(
                any(m is module for m in block.modules()) for block, module in zip(lst, modules)):
            return list(lst)
    raise UnsupportedArchitectureError("could not find the model's list of layers")


# A head edit sees one layer's W_O input as (B, T, H, d) and returns it changed.
Edit = Callable[[int, torch.Tensor], torch.Tensor]


@contextlib.contextmanager
def editing(where: Site, edit: Edit) -> Iterator[None]:
    """Forward pre-hooks on every output projection for the block: its input, split into heads, goes through
    `edit(layer, z)`. The hooks are removed when the block ends, whatever happens inside."""
    def make(layer: int):
        def hook(module, args):
            x = args[0]  # (B, T, H·d)
            z = x.reshape(*x.shape[:-1], where.heads, where.dims[layer])  # (B, T, H, d)
            return (edit(layer, z).reshape(x.shape), *args[1:])
        return hook

    with hooked([Hook(p, "pre", make(n)) for n, p in enumerate(where.projections)]):
        yield


def removal(removed: Sequence[tuple[int, int]], fills: list[torch.Tensor] | None) -> Edit:
    """Replace the heads `removed` ((layer, head) pairs) by 0, or by fills[layer][head] (H, d) for mean
    ablation. The other heads pass through exactly."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in removed:
        by_layer.setdefault(layer, []).append(head)

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        heads = by_layer.get(layer)
        if not heads:
            return z
        z = z.clone()
        z[..., heads, :] = 0.0 if fills is None else fills[layer][heads].to(z.dtype)
        return z

    return edit


@contextlib.contextmanager
def recording(where: Site) -> Iterator[list]:
    """Record each layer's W_O input (B, T, H, d) as the forward pass makes it; yields the list."""
    seen: list = [None] * where.layers

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        seen[layer] = z.detach()
        return z

    with editing(where, edit):
        yield seen


@contextlib.contextmanager
def weights_removed(where: Site, removed: Sequence[tuple[int, int]],
                    fills: list[torch.Tensor] | None = None) -> Iterator[None]:
    """The second mechanism: the heads removed by editing W_O itself for the block — head h's input columns
    set to 0 and, for mean ablation, W_O^h · m_h added to the bias. The weights are put back afterwards."""
    saved = []
    try:
        with torch.no_grad():
            for layer, head in removed:
                projection = where.projections[layer]
                d = where.dims[layer]
                cols = slice(head * d, (head + 1) * d)
                conv = not isinstance(projection, torch.nn.Linear)  # Conv1D: W (D_in, D_out)
                saved.append((projection, projection.weight.detach().clone(),
                              None if projection.bias is None else projection.bias.detach().clone()))
                w_h = (projection.weight[cols, :].T if conv else projection.weight[:, cols])  # (D_out, d)
                if fills is not None:
                    shift = w_h.float() @ fills[layer][head].float()  # (D_out,)
                    if projection.bias is None:
                        projection.bias = torch.nn.Parameter(torch.zeros_like(shift).to(projection.weight.dtype))
                    projection.bias += shift.to(projection.bias.dtype)
                if conv:
                    projection.weight[cols, :] = 0.0
                else:
                    projection.weight[:, cols] = 0.0
        yield
    finally:
        with torch.no_grad():
            for projection, weight, bias in reversed(saved):
                projection.weight.copy_(weight)
                if bias is None:
                    projection.bias = None
                else:
                    projection.bias.copy_(bias)




def every_head(L: int, H: int) -> list[tuple[int, int]]:
    """(layer, head) for every head, layer-major."""
    return [(layer, head) for layer in range(L) for head in range(H)]


def gated(where: Site, gate: torch.Tensor, fills: list[torch.Tensor] | None) -> Edit:
    """z_h -> m_h + ξ_h (z_h − m_h) with a gate (B, L, H) per element (m = 0 for zero ablation)."""
    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        xi = gate[:, layer][:, None, :, None].to(z.dtype)  # (B, 1, H, 1)
        if fills is None:
            return z * xi
        m = fills[layer].to(z.dtype)  # (H, d)
        return m + xi * (z - m)
    return edit
