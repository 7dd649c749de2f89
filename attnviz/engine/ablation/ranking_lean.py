"""importance on the long path (engine/lean.py): every head removed alone with no α and no T·V logits.

    clean run (the model's own SDPA attention) -> keeps the output of every k-th block and its final states
    each head of layer l, `copies` at a time -> the blocks below the kept output nearest below l return it
        instead of running (lean.replayed), the batch grows there to one copy per head, each copy with its
        head removed -> each copy's final states (a causal LM's final norm output, an encoder's last hidden
        state), (copies, T, D)
    -> a causal LM's next-token distributions made a block of positions at a time (removing.DISTRIBUTION_BYTES):
       mean KL(p_clean ‖ p_removed) and the next-token loss; an encoder's sentence embedding

The layers below each head's layer run once per kept output instead of once per head (k = 1: once in all, as
the full path's batched pass shares them). Michel et al.'s gradient estimate: one forward + backward pass with
a gate on every head, blocks recomputed in the backward pass as the budget needs, the loss summed a block of
positions at a time, each block's logits made again in the backward pass (checkpointed), never T·V at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attnviz.engine.ablation.removing import distribution_positions
from attnviz.engine.ablation.runs import embedding, last_logits, outputs_of, run_model
from attnviz.engine.ablation.seam import Site, editing, gated
from attnviz.engine.hooks import Hook, hooked


@dataclass(frozen=True)
class LeanPlan:
    """How the long path runs importance within the budget: the clean run keeps every `every`-th block's output
    (1: all), `copies` heads run at once, the gradient pass recomputes its first `recomputed` blocks, the first
    `keeping` of them keeping their attention's output (engine/lean.py recomputing)."""

    every: int = 1
    copies: int = 1
    recomputed: int = 0
    keeping: int = 0


def kept_blocks(L: int, every: int) -> list[int]:
    """The blocks whose outputs the clean run keeps: block n's output is layer n + 1's input, kept where n + 1 is
    a multiple of `every`."""
    return [n for n in range(L - 1) if (n + 1) % every == 0]


class _Final:
    """What a run ends with: a causal LM's final norm output (its logits made at the last position only), an
    encoder's last hidden state; (B, T, D)."""

    def __init__(self, model, causal: bool) -> None:
        from attnviz.engine.points import final_norm

        self.model, self.causal = model, causal
        self.norm = final_norm(getattr(model, "base_model", model)) if causal else None
        self.kept: dict[str, torch.Tensor] = {}

    def hooks(self) -> list[Hook]:
        def keep(module, args, output):
            self.kept["x"] = output[0] if isinstance(output, tuple) else output
        return [Hook(self.norm, "forward", keep)] if self.norm is not None else []

    def run(self, inputs: dict) -> torch.Tensor:
        out = run_model(self.model, {**inputs, **(last_logits(self.model) if self.causal else {})})
        return self.kept.pop("x") if self.causal else outputs_of(out, False)


def _grown(where: Site, layer: int, copies: int) -> Hook:
    """Block `layer` receives `copies` copies of its (batch of 1) input, each its own tensor."""
    def grow(module, args, kwargs):
        if args:
            hidden = args[0]
            return (hidden[:1].expand(copies, *hidden.shape[1:]).clone(), *args[1:]), kwargs
        name = next(k for k in ("hidden_states", "x", "hidden_state") if k in kwargs)
        hidden = kwargs[name]
        return args, {**kwargs, name: hidden[:1].expand(copies, *hidden.shape[1:]).clone()}
    return Hook(where.blocks[layer], "pre_kwargs", grow)


def lean_measures(head: Callable[[torch.Tensor], torch.Tensor], clean: torch.Tensor, outs: torch.Tensor,
                  ids: torch.Tensor) -> tuple[np.ndarray, np.ndarray, float]:
    """A causal LM's measures from final norm outputs, a block of positions at a time: (the mean over positions of
    KL(p_clean ‖ p_copy) for each copy, each copy's next-token loss minus the clean loss, the clean loss). `clean`
    (T, D), `outs` (B, T, D), `ids` (T,); `head` makes float64 logits from final norm outputs."""
    T, B = int(clean.shape[0]), int(outs.shape[0])
    kl, lost = torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    clean_lost = 0.0
    step = distribution_positions(int(head(clean[:1]).shape[-1]))
    for start in range(0, T, step):
        at = slice(start, min(T, start + step))
        lp = torch.log_softmax(head(clean[at]), -1)  # (c, V) float64
        p = lp.exp()
        rows = torch.arange(at.start, at.stop)
        rows = rows[rows < T - 1]  # the positions whose next token the text has
        nxt = ids[rows + 1].to(lp.device)
        clean_lost -= float(lp[rows - start, nxt].sum())
        for b in range(B):
            lq = torch.log_softmax(head(outs[b, at]), -1)
            kl[b] += float((p * (lp - lq)).sum())
            lost[b] -= float(lq[rows - start, nxt].sum())
    if T < 2:
        return (kl / T).numpy(), np.zeros(B), 0.0
    return (kl / T).numpy(), ((lost - clean_lost) / (T - 1)).numpy(), clean_lost / (T - 1)


def removals_lean(where: Site, inputs: dict, fills: list[torch.Tensor] | None, causal: bool, plan: LeanPlan,
                  on_heads: Callable[[int], None] | None = None
                  ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, float | None]:
    """Every head removed alone on one text (batch of 1) without α: (effect (L, H), Δloss (L, H) or None, the
    estimated quantity (L, H), the clean loss or None), as ranking.importance's batched pass makes them.
    `on_heads(n)` is called as each batch of n heads is measured."""
    from attnviz.engine.attribution.lens import _head
    from attnviz.engine.lean import lean, replayed

    model = where.model
    L, H = where.layers, where.heads
    final = _Final(model, causal)
    kept: dict[int, Any] = {}
    wanted = kept_blocks(L, plan.every)

    def keep(n: int):
        def fn(module, args, output):
            kept[n] = output
        return fn

    ids = inputs["input_ids"][0]
    effect, estimated = np.zeros((L, H)), np.zeros((L, H))
    loss = np.zeros((L, H)) if causal else None
    head = _head(model, normed=True) if causal else None
    clean_loss = None
    with lean(model), torch.inference_mode():
        with hooked([*(Hook(where.blocks[n], "forward", keep(n)) for n in wanted), *final.hooks()]):
            clean = final.run(inputs)[0]  # (T, D)
        e0 = None if causal else embedding(clean[None])
        for layer in range(L):
            start = plan.every * (layer // plan.every)  # the first block that runs: its input was kept
            for at in range(0, H, plan.copies):
                heads = list(range(at, min(H, at + plan.copies)))
                B = len(heads)

                def edit(n: int, z: torch.Tensor, heads=heads, layer=layer) -> torch.Tensor:
                    if n != layer:
                        return z
                    z = z.clone()
                    rows, cols = torch.arange(len(heads), device=z.device), torch.tensor(heads, device=z.device)
                    z[rows, :, cols] = 0.0 if fills is None else fills[layer][cols].to(z.dtype)[:, None, :]
                    return z

                skip = replayed(where.blocks[:start], kept[start - 1]) if start else contextlib.nullcontext()
                with skip, editing(where, edit), hooked([_grown(where, start, B), *final.hooks()]):
                    outs = final.run(inputs)  # (B, T, D)
                if outs.shape[0] != B:
                    from attnviz.errors import UnsupportedArchitectureError

                    raise UnsupportedArchitectureError(f"{type(model).__name__} did not keep the batch it was given "
                                                       f"({outs.shape[0]} outputs for {B})")
                if causal:
                    assert head is not None and loss is not None
                    kl, lost, clean_loss = lean_measures(head, clean, outs, ids)
                    effect[layer, heads], loss[layer, heads] = kl, lost
                    estimated[layer, heads] = np.abs(lost)
                else:
                    assert e0 is not None
                    change = (embedding(outs) - e0).double().norm(dim=-1).cpu().numpy()
                    effect[layer, heads] = estimated[layer, heads] = change
                if on_heads is not None:
                    on_heads(B)
    return effect, loss, estimated, clean_loss


def gradient_lean(where: Site, inputs: dict, fills: list[torch.Tensor] | None, recomputed: int,
                  keeping: int = 0) -> np.ndarray:
    """Michel et al.'s estimate (L, H) of a causal LM on the long path: |∂loss/∂ξ_h| from one forward + backward
    pass on the model's own SDPA attention (its first `recomputed` blocks recomputed in the backward pass, the
    first `keeping` of them keeping their attention's output), the
    next-token loss summed a block of positions at a time, each block's logits made again in the backward pass.
    (An encoder's exact Jacobian is ranking.gradient_scores's, run on SDPA with every block recomputed.)"""
    from attnviz.engine.attribution.lens import _head
    from attnviz.engine.lean import give_back_memory, lean

    model = where.model
    L, H = where.layers, where.heads
    ids = inputs["input_ids"][0]
    T = int(ids.shape[0])
    if T < 2:
        return np.zeros((L, H))
    head = _head(model, normed=True)
    final = _Final(model, True)

    def nll(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        give_back_memory()  # the last block's logits freed (in the backward pass too, made again there)
        logp = torch.log_softmax(head(x), -1)
        return -logp.gather(-1, targets[:, None]).sum()

    gate = torch.ones(1, L, H, dtype=torch.float64, requires_grad=True)
    with lean(model, where.blocks[:recomputed], grad=True, keeping=keeping), torch.enable_grad():
        with editing(where, gated(where, gate, fills)), hooked(final.hooks()):
            normed = final.run(inputs)[0]  # (T, D)
            targets = ids[1:].to(normed.device)
            with torch.no_grad():
                step = distribution_positions(int(head(normed[:1]).shape[-1]))
            total = torch.zeros((), dtype=torch.float64)
            for start in range(0, T - 1, step):
                stop = min(T - 1, start + step)
                total = total + torch.utils.checkpoint.checkpoint(nll, normed[start:stop], targets[start:stop],
                                                                  use_reentrant=False)
            found, = torch.autograd.grad(total / (T - 1), gate)  # inside the hooks: the recomputed blocks meet
            # the gate again; no parameter gets a .grad
    return found[0].abs().cpu().numpy()
