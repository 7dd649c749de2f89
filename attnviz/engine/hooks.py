"""What each attention module receives in a forward pass, recorded by forward pre-hooks.

The from-scratch computations and the streamed path need the hidden states an attention module is given
(after any LayerNorm), the rotary (cos, sin) of rotary models, and for cross-attention what keys and values
come from. `recording_inputs` hooks the modules for the length of a `with` block and removes the hooks on
the way out, whatever happens inside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


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

    handles = [m.register_forward_pre_hook(make_hook(n), with_kwargs=True) for n, m in enumerate(modules)]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()
