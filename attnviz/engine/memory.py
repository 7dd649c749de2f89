"""What holding attention costs, and the budget it must fit: the one memory formula of the full path,
checked before anything runs."""

from __future__ import annotations

from typing import Any

from attnviz.engine.models import LoadedModel, layers_and_heads, part_shapes
from attnviz.errors import InputError, arg
from attnviz.base.sizes import size_from_env, size_text

def memory_budget() -> int:
    """Bytes the full attention tensor may take: $ATTNVIZ_MEMORY_BUDGET (512M, 8G, bytes), else 2 GiB.
    Beyond it the commands that can stream a long input do so; the others refuse."""

    return size_from_env("ATTNVIZ_MEMORY_BUDGET", DEFAULT_MEMORY_BUDGET)


DEFAULT_MEMORY_BUDGET = 2 << 30
WORKING_BYTES = 256 << 20  # ALTI works through a layer in blocks of query rows whose parts (rows, T, D) and α
                           # (H, rows, T), float64, take about this much (at least one row)


def check_parts_memory(loaded: LoadedModel, S: int, T: int, copies: float = 1.0,
                       shorter: str = "shorten the text") -> None:
    """Refuse, before running, an encoder-decoder input whose three attention parts (S² + T² + T·S weights
    per layer and head) would not fit the memory budget; `shorter` says what the user can make smaller."""
    shapes = part_shapes(loaded.model.config)
    cells = {"encoder": S * S, "decoder": T * T, "cross": T * S}
    need = int(sum((copies * L + 4) * H * cells[p] * 4 for p, (L, H) in shapes.items()))
    budget = loaded.memory_budget or memory_budget()
    if need > budget:
        raise InputError(f"{S} source and {T} target tokens would need about {size_text(need)} for attention, "
                         f"(layers + 4) × heads × (S² + T² + T·S) weights × 4 bytes, over the budget of "
                         f"{size_text(budget)}; {shorter}, or raise {arg('max_memory')}")


def attention_bytes(loaded: LoadedModel, T: int, copies: float = 1.0) -> int:
    """What holding α costs for T tokens: L·H·T² float32 weights, `copies` times, plus a few layers' worth
    of the model's own temporaries. (The full path keeps the model's output and converts it one layer at a
    time: one copy.)"""
    L, H = layers_and_heads(loaded.model.config)
    return int((copies * L + 4) * H * T * T * 4)


def fits(loaded: LoadedModel, T: int, copies: float = 1.0) -> bool:
    """Whether holding α for T tokens (`copies` times, as check_memory counts it) fits the memory budget: where it
    does not, an analysis that needs no α takes the long path (engine/lean.py)."""
    return attention_bytes(loaded, T, copies) <= (loaded.memory_budget or memory_budget())


def check_memory(loaded: LoadedModel, T: int, copies: float = 1.0, streams: bool = False, beside: int = 0,
                 beside_text: str = "", instead: str = "") -> None:
    """Refuse, before running anything, an input whose attention would not fit the memory budget (with `beside`
    bytes the analysis holds besides, named by `beside_text`; `instead`: what runs without α, said first)."""
    need, budget = attention_bytes(loaded, T, copies) + beside, loaded.memory_budget or memory_budget()
    if need > budget:
        L, H = layers_and_heads(loaded.model.config)
        hint = (f"pass {arg('stream')} to compute it a block of rows at a time" if streams else
                f"{instead}, or shorten the text" if instead else "shorten the text")
        copies_text = f"{copies:g} × {L}" if copies != 1 else f"{L}"
        total = f"{size_text(need)}: {size_text(need - beside)}" if beside else size_text(need)
        besides = f", and {size_text(beside)} for {beside_text}" if beside else ""
        raise InputError(f"{T} tokens would need about {total} for attention, "
                         f"({copies_text} layers + 4 for the model's temporaries) × {H} heads × {T}² weights × 4 "
                         f"bytes{besides}, over the budget of {size_text(budget)}; {hint}, or raise "
                         f"{arg('max_memory')} (e.g. 16G) if you have the memory")


def alti_bytes(loaded: LoadedModel, T: int, streamed: bool) -> int:
    """What ALTI holds for T tokens. Full: the model's α and its copy, the contributions and the model's own
    temporaries of about four layers, (2·L·H + L + 4·H)·T² float32; streamed: the contributions, the mean of α
    over heads and the same temporaries, (2·L + 4·H)·T² float32. Beside it, the block of query rows worked
    through at a time: 2·T²·(D + H) float64 numbers (float32 streamed), or WORKING_BYTES if less."""
    L, H = layers_and_heads(loaded.model.config)
    D = int(getattr(loaded.model.config, "hidden_size", 0) or getattr(loaded.model.config, "dim", 0) or 1024)
    held = (2 * L + 4 * H) if streamed else (2 * L * H + L + 4 * H)
    working = min(WORKING_BYTES, (4 if streamed else 8) * 2 * T * T * (D + H))
    return int(held * T * T * 4 + working)


def check_alti_memory(loaded: LoadedModel, T: int, streamed: bool) -> None:
    """Refuse, before running, an ALTI whose result would not fit the memory budget."""
    need, budget = alti_bytes(loaded, T, streamed), loaded.memory_budget or memory_budget()
    if need > budget:
        L, H = layers_and_heads(loaded.model.config)
        held = (f"(2 × {L} layers of contributions and mean α + 4 × {H} heads of the model's temporaries)"
                if streamed else f"(2 × {L} layers × {H} heads of α + {L} layers of contributions + 4 × {H} heads of "
                                 f"the model's temporaries)")
        hint = "" if streamed else f"pass {arg('stream')} to hold less, "
        raise InputError(f"{T} tokens would need about {size_text(need)}{' even streamed' if streamed else ''}: "
                         f"{held} × {T}² × 4 bytes and a block of rows, over the budget of {size_text(budget)}; "
                         f"{hint}shorten the text, or raise {arg('max_memory')} (e.g. 16G) if you have the memory")


def check_parts(loaded: LoadedModel, parts: dict[str, int], what: str, hint: str) -> None:
    """Refuse, before running, an analysis whose parts (name → bytes, as its own estimate counts them) would
    not fit the memory budget: one line naming the total, each part and what to change (`hint`)."""
    need, budget = sum(parts.values()), loaded.memory_budget or memory_budget()
    if need > budget:
        shown = ", ".join(f"{name} {size_text(size)}" for name, size in parts.items())
        raise InputError(f"{what} would need about {size_text(need)} ({shown}), over the budget of "
                         f"{size_text(budget)}; {hint}, or raise {arg('max_memory')} (e.g. 16G) if you have the "
                         f"memory")


EXACT_ALPHA_BYTES = 64 << 20  # the QK fix runs a layer's attention for this much α of patched positions at once
                              # (the attention module's own temporaries about 3 times more)


def starred_bytes(where: Any, T: int, A: int) -> dict[str, int]:
    """What AtP* holds at its peak for T tokens and A aligned positions, by part (float32 unless said):

        gradients    GradDrop's run d keeps ∂M/∂α of the layers below block d: L(L − 1)/2 · H·T²
        graphs       two runs' activations for the backward pass (the receiver run's, which the attention
                     calls recorded for the QK fix keep, and the run in progress): per layer α and the scores
                     (2·H·T²), the MLP's (4·T·I) and the rest of the block (10·T·D)
        patterns     the receiver run's α and ∂M/∂α, 2·L·H·T²
        qk fix       one layer's ∂M/∂α of every run in float64, (L + 1)·H·T²·8, and a block of patched
                     positions' α (at most EXACT_ALPHA_BYTES) with the attention module's temporaries, 4 times
    """
    config = where.model.config
    L, H = where.layers, where.heads
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or getattr(config, "dim", 0) or 1024)
    intermediate = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * D)
    square = H * T * T * 4
    return {"gradients": L * (L - 1) // 2 * square,
            "graphs": 2 * L * T * (2 * H * T + 4 * intermediate + 10 * D) * 4,
            "patterns": 2 * L * square,
            "qk fix": (L + 1) * square * 2 + 4 * min(EXACT_ALPHA_BYTES, max(1, A) * square)}
