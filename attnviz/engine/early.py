"""α of every layer without running what comes after the last attention: the attention weights recorded where
the model's own output recorder takes them (transformers' `_can_record_outputs["attentions"]`: the module and the
index of its output), and the forward pass stopped once the last layer's weights are out. What follows them —
the last layer's output projection and MLP, a pooler or a language-model head — cannot change any α, so the
weights are those of the full pass, exactly; on a 6-layer encoder the work saved is about a tenth of the pass.

Where a model does not say where its weights come from, or the modules found are not one per layer, or a module
gives no weights, `stopped_attentions` returns None and the caller runs the full pass.
"""

from __future__ import annotations

from typing import Any

import torch

from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.forward import declared_layers


class _Done(Exception):
    """Raised by the hook on the last layer's attention: the weights are all out."""


def _recorded(model) -> tuple[type, int, str | None] | None:
    """(module class, output index, name suffix) of where the model's own recorder reads attention weights."""
    for owner in (model, getattr(model, "base_model", None)):
        spec = getattr(owner, "_can_record_outputs", None)
        if isinstance(spec, dict) and "attentions" in spec:
            entry = spec["attentions"]
            if isinstance(entry, type):
                return entry, 1, None
            target = getattr(entry, "target_class", None)
            if isinstance(target, type):
                return target, int(getattr(entry, "index", 1) or 1), getattr(entry, "layer_name", None)
    return None


def attention_modules(model) -> tuple[list, int] | None:
    """The modules whose output holds each layer's attention weights, in order, and the index in their output;
    None where they are not exactly one per declared layer."""
    found = _recorded(model)
    if found is None:
        return None
    target, index, suffix = found
    modules = [m for name, m in model.named_modules()
               if type(m) is target and (suffix is None or name.endswith(suffix.lstrip(".")))]
    if not modules or len(modules) != declared_layers(model):
        return None
    return modules, index


def stopped_attentions(model, inputs: dict[str, Any]) -> list | None:
    """Every layer's attention weights (B, H, T, T) from one forward pass stopped after the last layer's attention,
    or None where this model cannot be read that way (run the full pass then)."""
    found = attention_modules(model)
    if found is None:
        return None
    modules, index = found
    records: list = [None] * len(modules)

    def hook(n: int):
        def record(module, args, output):
            weights = output[index] if isinstance(output, (tuple, list)) and len(output) > index else None
            records[n] = weights
            if n == len(modules) - 1:
                raise _Done
        return record

    with hooked([Hook(module, "forward", hook(n)) for n, module in enumerate(modules)]):
        try:
            with torch.inference_mode():
                model(**inputs)
        except _Done:
            pass
    if any(not torch.is_tensor(r) or r.dim() != 4 for r in records):
        return None
    return records
