"""What holding attention costs, and the budget it must fit: the one memory formula of the full path,
checked before anything runs."""

from __future__ import annotations

from attnviz.engine.loading import LoadedModel, layers_and_heads, part_shapes
from attnviz.errors import InputError, arg
from attnviz.sizes import size_from_env, size_text

def memory_budget() -> int:
    """Bytes the full attention tensor may take: $ATTNVIZ_MEMORY_BUDGET (512M, 8G, bytes), else 2 GiB.
    Beyond it the commands that can stream a long input do so; the others refuse."""

    return size_from_env("ATTNVIZ_MEMORY_BUDGET", DEFAULT_MEMORY_BUDGET)


DEFAULT_MEMORY_BUDGET = 2 << 30


def check_parts_memory(loaded: LoadedModel, S: int, T: int, copies: float = 1.0) -> None:
    """Refuse, before running, an encoder-decoder input whose three attention parts (S² + T² + T·S weights
    per layer and head) would not fit the memory budget."""
    shapes = part_shapes(loaded.model.config)
    cells = {"encoder": S * S, "decoder": T * T, "cross": T * S}
    need = int(sum((copies * L + 4) * H * cells[p] * 4 for p, (L, H) in shapes.items()))
    budget = loaded.memory_budget or memory_budget()
    if need > budget:
        raise InputError(f"{S} source and {T} target tokens would need about {size_text(need)} for attention, "
                         f"(layers + 4) × heads × (S² + T² + T·S) weights × 4 bytes, over the budget of "
                         f"{size_text(budget)}; shorten the text, or raise {arg('max_memory')}")


def attention_bytes(loaded: LoadedModel, T: int, copies: float = 1.0) -> int:
    """What holding α costs for T tokens: L·H·T² float32 weights, `copies` times, plus a few layers' worth
    of the model's own temporaries. (The full path keeps the model's output and converts it one layer at a
    time: one copy.)"""
    L, H = layers_and_heads(loaded.model.config)
    return int((copies * L + 4) * H * T * T * 4)


def check_memory(loaded: LoadedModel, T: int, copies: float = 1.0, streams: bool = False) -> None:
    """Refuse, before running anything, an input whose attention would not fit the memory budget."""
    need, budget = attention_bytes(loaded, T, copies), loaded.memory_budget or memory_budget()
    if need > budget:
        L, H = layers_and_heads(loaded.model.config)
        hint = (f"pass {arg('stream')} to compute it a block of rows at a time" if streams else "shorten the text")
        copies_text = f"{copies:g} × {L}" if copies != 1 else f"{L}"
        raise InputError(f"{T} tokens would need about {size_text(need)} for attention, "
                         f"({copies_text} layers + 4 for the model's temporaries) × {H} heads × {T}² weights × 4 "
                         f"bytes, over the budget of {size_text(budget)}; {hint}, or raise {arg('max_memory')} "
                         f"(e.g. 16G) "
                         f"if you have the memory")
