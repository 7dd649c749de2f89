"""Hooks on a model's modules: the one place that registers them, and removes every one on every exit path.

`hooked(hooks)` registers a list of `Hook`s for the length of a `with` block (forward hooks, pre-hooks, with or
without keyword arguments) and removes them on the way out, whatever happens inside: a return, an error,
Ctrl-C. Every intervention and every recording of the engine goes through it; no other module calls
`register_forward_hook` or `register_forward_pre_hook` (a test holds the line). Where a hook sits is named
TransformerLens's way ("blocks.3.attn.out", "blocks.3.resid.pre", …) in attnviz.engine.points, one table
for every family.

`recording_inputs` records what each attention module receives (the hidden states after any LayerNorm,
rotary (cos, sin), and for cross-attention what keys and values come from): what the from-scratch
computations and the streamed path need.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

# "forward": fn(module, args, output) -> output or None; "forward_kwargs": fn(module, args, kwargs, output);
# "pre": fn(module, args) -> args or None; "pre_kwargs": fn(module, args, kwargs) -> (args, kwargs) or None
When = Literal["forward", "forward_kwargs", "pre", "pre_kwargs"]


@dataclass(frozen=True)
class Hook:
    """One hook: `fn` called on `module` at `when` (see When)."""

    module: Any  # torch.nn.Module
    when: When
    fn: Callable[..., Any]


def _register(hook: Hook):
    module, fn = hook.module, hook.fn
    if hook.when == "forward":
        return module.register_forward_hook(fn)
    if hook.when == "forward_kwargs":
        return module.register_forward_hook(fn, with_kwargs=True)
    if hook.when == "pre":
        return module.register_forward_pre_hook(fn)
    if hook.when == "pre_kwargs":
        return module.register_forward_pre_hook(fn, with_kwargs=True)
    raise ValueError(f"unknown hook time {hook.when!r}")


@contextlib.contextmanager
def hooked(hooks: Iterable[Hook]) -> Iterator[None]:
    """`hooks` registered for the block, in order, and every one removed when it ends, however it ends (one
    that fails to register removes those before it)."""
    handles = []
    try:
        for hook in hooks:
            handles.append(_register(hook))
        yield
    finally:
        for handle in reversed(handles):
            handle.remove()


def on_gradient(tensor: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> None:
    """`fn(gradient)` when a backward pass makes `tensor`'s gradient: the long path folds each layer's gradient
    into its estimate as it is made. The hook lives as long as the tensor (the run's graph), so nothing is left
    on a model."""
    tensor.register_hook(fn)


def on_each(modules: Iterable[Any], when: When, make: Callable[[int], Callable[..., Any]]) -> list[Hook]:
    """One hook per module, `make(n)` giving module n's function."""
    return [Hook(module, when, make(n)) for n, module in enumerate(modules)]


def counting_calls(module: Any) -> tuple[Hook, list[int]]:
    """(a pre-hook on `module`, a one-element counter of how many times it was called while hooked): how many
    forward passes an analysis made."""
    counter = [0]

    def count(_module, _args):
        counter[0] += 1

    return Hook(module, "pre", count), counter


@dataclass
class Seen:
    """What one attention module received in the forward pass."""

    hidden: torch.Tensor  # (B, T, D)
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None  # rotary (cos, sin), (B, T, d)
    keys_from: torch.Tensor | None = None  # cross-attention: what keys and values come from (B, S, D)


@contextlib.contextmanager
def recording_inputs(modules: list, on_seen: Callable[[int, Seen], None] | None = None
                     ) -> Iterator[list[Seen | None]]:
    """Pre-hooks on `modules` for the block: what module n receives is stored at records[n] (or handed to
    `on_seen(n, seen)` as the forward pass reaches it, keeping nothing). Yields records; the hooks are
    removed when the block ends."""
    records: list[Seen | None] = [None] * len(modules)

    def make_hook(n: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states", kwargs.get("query"))
            keys_from = kwargs.get("key_value_states")
            record = Seen(hidden.detach(), kwargs.get("position_embeddings"),
                          None if keys_from is None else keys_from.detach())
            if on_seen is None:
                records[n] = record
            else:
                on_seen(n, record)

        return hook

    with hooked(on_each(modules, "pre_kwargs", make_hook)):
        yield records
