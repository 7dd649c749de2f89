"""Named hook points, TransformerLens's way, mapped per family in this one table, and one recorded forward pass.

    blocks.N.resid.pre    the stream entering block N (its input)             (B, T, D)
    blocks.N.attn.z       each head's α·V, concatenated: the output projection's input   (B, T, H·d)
    blocks.N.attn.out     the attention's output: the output projection's output         (B, T, D)
    blocks.N.resid.mid    the stream after the attention block: a post-norm block's norm output (BERT), else
                          the input of the norm before the MLP (GPT-2, Llama, …)          (B, T, D)
    blocks.N.mlp.out      the MLP's output                                                (B, T, D)
    ln_final.in, .out     the final norm's input and output                              (B, T, D)

`record(model, inputs, names)` runs the model once (eager, α asked for) with those points recorded and every
layer's Q, K, V recomputed from its weights (attnviz.engine.scratch.verify.recompute): what the analyses of
one Run read, so that norms, sinks, ALTI and logit attribution share one forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.scratch.adapters import adapter_for, layer_blocks
from attnviz.engine.scratch.verify import Recomputed, recompute
from attnviz.errors import UnsupportedArchitectureError

KINDS = ("resid.pre", "attn.z", "attn.out", "resid.mid", "mlp.out")


def post_norm(block) -> Any:
    """A post-norm block's norm after the attention (BERT's attention.output.LayerNorm, DistilBERT's
    sa_layer_norm), else None."""
    output = getattr(getattr(block, "attention", None), "output", None)
    for found in (getattr(output, "LayerNorm", None), getattr(block, "sa_layer_norm", None)):
        if isinstance(found, torch.nn.LayerNorm):
            return found
    return None


def pre_mlp_norm(block) -> Any:
    """A pre-norm block's norm in front of its MLP, whose input is the stream after the attention."""
    for name in ("post_attention_layernorm", "ln_2", "mlp_norm", "pre_feedforward_layernorm"):
        found = getattr(block, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    return None


def final_norm(base) -> Any:
    """The norm after the last block (Llama's norm, GPT-2's ln_f, …); UnsupportedArchitectureError if none."""
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        found = getattr(base, name, None)
        if isinstance(found, torch.nn.Module) and getattr(found, "weight", None) is not None:
            return found
    raise UnsupportedArchitectureError(f"logit attribution needs the final norm of {type(base).__name__}, and "
                                       f"finds none")


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, tuple) else value


def locate(model, name: str) -> tuple[Any, str]:
    """(the module, "input" or "output") where the point `name` is read."""
    base = getattr(model, "base_model", model)
    if name in ("ln_final.in", "ln_final.out"):
        return final_norm(base), "input" if name.endswith(".in") else "output"
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blocks" or not parts[1].isdigit() or ".".join(parts[2:]) not in KINDS:
        raise ValueError(f"no hook point {name!r} (blocks.N.{{{','.join(KINDS)}}}, ln_final.in, ln_final.out)")
    adapter = adapter_for(base)
    attention = adapter.modules(base)
    n = int(parts[1])
    if not 0 <= n < len(attention):
        raise ValueError(f"no hook point {name!r}: the model has {len(attention)} blocks")
    kind = ".".join(parts[2:])
    block = layer_blocks(base, attention)[n]
    if kind == "resid.pre":
        return block, "input"
    if kind in ("attn.z", "attn.out"):
        return adapter.out_projections(base)[n], "input" if kind == "attn.z" else "output"
    if kind == "mlp.out":
        mlp = getattr(block, "mlp", None)
        if not isinstance(mlp, torch.nn.Module):
            raise UnsupportedArchitectureError(f"attnviz does not know {type(base).__name__}'s MLPs")
        return mlp, "output"
    norm = post_norm(block)
    if norm is not None:
        return norm, "output"
    norm = pre_mlp_norm(block)
    if norm is None:
        raise UnsupportedArchitectureError(f"attnviz does not find where {type(base).__name__}'s attention block "
                                           f"ends (no norm after it, nor one before its MLP)")
    return norm, "input"


def keeping(model, names: Iterable[str], kept: dict[str, torch.Tensor],
            change: Callable[[str, torch.Tensor], torch.Tensor | None] | None = None,
            at: int | None = None) -> list[Hook]:
    """Hooks that store each point's tensor (detached) in `kept[name]` as the forward pass reaches it; `at`: only
    that position's (B, 1, D), a copy (the long path keeps no T × D tensor it does not read)."""
    hooks = []

    def kept_of(value: torch.Tensor) -> torch.Tensor:
        return value.detach() if at is None else value.detach()[:, at:at + 1].clone()

    for name in names:
        module, where = locate(model, name)

        def read(module, args, *rest, name=name, where=where):
            if where == "output":
                kept[name] = kept_of(_first(rest[-1]))
            else:
                kwargs = rest[0] if rest and isinstance(rest[0], dict) else {}
                value = args[0] if args else kwargs.get("hidden_states")
                if value is not None:
                    kept[name] = kept_of(_first(value))

        hooks.append(Hook(module, "forward" if where == "output" else "pre_kwargs", read))
    return hooks


@dataclass
class Recording:
    """One forward pass: the model's output (its α, its logits where it has a head), every layer's Q, K, V
    recomputed from its weights, and the named points asked for."""

    run: Recomputed
    points: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        found = self.points.get(name)
        if found is None:
            raise UnsupportedArchitectureError(f"the forward pass did not reach {name} (a module attnviz watches "
                                               f"was not called)")
        return found

    def __contains__(self, name: str) -> bool:
        return name in self.points

    @property
    def n_layers(self) -> int:
        return len(self.run.layers)


def every_point(model) -> list[str]:
    """Every point of every block, and the final norm's where there is one: what a Run keeps by default."""
    base = getattr(model, "base_model", model)
    L = len(adapter_for(base).modules(base))
    names = [*(f"blocks.{n}.{kind}" for n in range(L) for kind in KINDS if kind != "attn.z"),
             "ln_final.in", "ln_final.out"]
    return [name for name in names if _found(model, name)]


def _found(model, name: str) -> bool:
    try:
        locate(model, name)
    except UnsupportedArchitectureError:
        return False
    return True


def record(model, inputs: dict, names: Iterable[str], *, attentions: bool = True) -> Recording:
    """Run `model` once on `inputs` with the points `names` recorded (see the table above)."""
    kept: dict[str, torch.Tensor] = {}
    with hooked(keeping(model, names, kept)):
        run = recompute(model, inputs, attentions=attentions)
    return Recording(run, kept)
