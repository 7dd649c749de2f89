"""Path patching (Wang et al. 2022): the senders' effect on the receivers' queries, keys or values alone. Two
passes: the receiver run with the senders' z from the donor and every other head's z frozen at its own, recording
what each receiver's projection gives; then the receiver run with only those slices put in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.ablation.runs import run_model
from attnviz.engine.ablation.seam import Site, editing
from attnviz.engine.patching import Donor, read
from attnviz.errors import UnsupportedArchitectureError

INPUTS = ("q", "k", "v")


def _projection(attention, which: str, head: int, config) -> tuple[Any, slice]:
    """The module whose output holds head `head`'s query, key or value, and the columns that are its: a separate
    q_proj / k_proj / v_proj (a key or value head shared by a group of query heads under grouped-query
    attention), or GPT-2's fused c_attn."""
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0))
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0))
    d = int(getattr(config, "head_dim", 0) or hidden // heads)
    groups = int(getattr(config, "num_key_value_heads", 0) or heads)
    separate = getattr(attention, f"{which}_proj", None)
    if isinstance(separate, torch.nn.Module):
        slot = head if which == "q" else head // max(1, heads // groups)
        return separate, slice(slot * d, (slot + 1) * d)
    fused = getattr(attention, "c_attn", None)  # GPT-2: x @ W (D, 3D): q, k, v one after the other
    if fused is not None and getattr(attention, "split_size", hidden) == hidden:
        start = INPUTS.index(which) * hidden + head * d
        return fused, slice(start, start + d)
    raise UnsupportedArchitectureError(f"path patching does not know where {type(attention).__name__} computes each "
                                       f"head's query, key and value")


def path_recording(where: Site, attention_modules: list, inputs: dict, receiver: Donor, donor: Donor,
                   senders: Sequence[tuple[int, int]], receivers: Sequence[tuple[int, int]], to: str) -> dict:
    """Path patching's first pass, once for any group of the `receivers`: the receiver run with the senders' z
    from the donor and every other head's z frozen at the receiver run's own (the MLPs recomputed), recording
    what each receiver's query / key / value projection gives. {(layer, head, input): (module, columns,
    output)}"""
    config: Any = where.model.config
    sent = set(senders)
    places = {(layer, head, which): _projection(attention_modules[layer], which, head, config)
              for layer, head in receivers for which in to}
    outputs: dict = {}

    def frozen(layer: int, z: torch.Tensor) -> torch.Tensor:
        z = receiver.z[layer].to(z.dtype).expand_as(z).clone()
        for sender_layer, head in sent:
            if sender_layer == layer:
                z[:, :, head] = donor.z[layer][0, :, head].to(z.dtype)
        return z

    def record(key):
        def hook(module, args, output):
            outputs[key] = output.detach()
        return hook

    modules = {id(module): module for module, _ in places.values()}
    with hooked([Hook(module, "forward", record(key)) for key, module in modules.items()]):
        with editing(where, frozen), torch.inference_mode():
            run_model(where.model, inputs)
    return {key: (module, columns, outputs[id(module)]) for key, (module, columns) in places.items()}


def path_patched_logits(where: Site, inputs: dict, recorded: dict,
                        receivers: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Path patching's second pass: the receiver run with only the `receivers`' recorded query / key / value
    slices (path_recording) put in. What read() reads, (R,); with no receivers, the receiver run itself."""
    chosen = [(module, columns, output) for (layer, head, _), (module, columns, output) in recorded.items()
              if (layer, head) in set(receivers)]

    def replace(key):
        def hook(module, args, output):
            output = output.clone()
            for place, columns, wanted in chosen:
                if id(place) == key:
                    output[..., columns] = wanted[..., columns].to(output.dtype)
            return output
        return hook

    modules = {id(module): module for module, _, _ in chosen}
    with hooked([Hook(module, "forward", replace(key)) for key, module in modules.items()]):
        with torch.inference_mode():
            output = run_model(where.model, inputs)
    return read(where.model, output)[0]
