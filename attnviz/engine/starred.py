"""AtP* (Kramár et al. 2024): attribution patching with the QK fix — the residual stream's effect through the
next attention layer's patterns computed exactly, the rest linearised — and GradDrop against cancelling paths.
It reads α (the QK fix), so it runs on the full path only; AtP itself is attnviz.engine.patching.attributed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnviz.engine.ablation.runs import run_model
from attnviz.engine.ablation.seam import Site
from attnviz.engine.hooks import Hook, hooked
from attnviz.engine.memory import EXACT_ALPHA_BYTES
from attnviz.engine.patching import Donor, _all_called, _differentiable, _hidden_of, _linearised, read
from attnviz.engine.lean import give_back_memory
from attnviz.errors import UnsupportedArchitectureError


@dataclass
class Starred:
    """AtP* (Kramár et al. 2024) of every piece, before it is combined: `heads` (L, A, H) and `residual` (L, A)
    with the QK fix (the residual stream's effect through the next attention layer's patterns computed
    exactly, the rest linearised), and `dropped`: the same once per layer ℓ with the gradient through block ℓ's
    contribution to the residual stream dropped (GradDrop), ((heads, residual), …) in layer order. float64.
    What the QK fix is made of, for the tests: `alpha` (per layer (1, H, T, T)) and `alpha_grad` (∂M/∂α) of the
    receiver run, `exact_alpha(layer, positions)` ((k, H, T, T), computed when asked, never kept for every
    position: that was L·A·H·T², the cube of the length): α with the residual stream at each of the aligned
    positions taken from the donor, and `linearised` (L, A): the estimate through each layer's patterns that
    the fix replaces, ⟨∂M/∂α_l, J Δ⟩."""

    heads: torch.Tensor
    residual: torch.Tensor
    dropped: list
    alpha: list
    alpha_grad: list
    exact_alpha: Any
    linearised: torch.Tensor
    value: float


def _detach_block(module, args, kwargs, output):
    """GradDrop's cut: the block adds what it adds, but no gradient flows back through it (only the skip)."""
    hidden, _ = _hidden_of(args, kwargs)
    out = output[0] if isinstance(output, tuple) else output
    cut = hidden + (out - hidden).detach()
    return (cut, *output[1:]) if isinstance(output, tuple) else cut


def starred(where: Site, inputs: dict, donor: Donor, at: Sequence[int], metric: Any) -> Starred:
    """AtP* (Kramár et al. 2024) of every head's z_h and every residual-stream position of `at`, from L + 1
    forward and backward passes of the receiver run (and one of the donor's, for what its attention reads).

    QK fix: AtP linearises the attention softmax, which a saturated pattern makes blind. A head's z_h already
    holds its own exact pattern change (z_donor − z_receiver); the pieces that feed queries and keys are the
    residual stream's, so for the stream entering layer l at position p the estimate through layer l's
    patterns, ⟨∂M/∂α_l, J Δ⟩ (J the Jacobian of α_l in the stream there), is replaced by ⟨∂M/∂α_l, α_l(patched)
    − α_l⟩, α_l(patched) layer l's attention run again with position p's input taken from the donor.
    GradDrop: the same estimate once per layer ℓ with the gradient through block ℓ's contribution dropped;
    the caller sums their magnitudes (Σ_ℓ |c_ℓ| / (L − 1)), which a cancellation of paths cannot hide."""
    from attnviz.engine.scratch.adapters import adapter_for

    base = getattr(where.model, "base_model", where.model)
    attention = adapter_for(base).modules(base)
    L = where.layers
    places = list(at)
    source = dict(donor.pairs) if donor.pairs is not None else {p: p for p in places}
    donor_reads: list = [None] * L

    def keep_read(n: int):
        def hook(module, args, kwargs):
            donor_reads[n] = (args[0] if args else kwargs["hidden_states"]).detach()
        return hook

    with hooked([Hook(m, "pre_kwargs", keep_read(n)) for n, m in enumerate(attention)]):
        with torch.inference_mode():
            run_model(where.model, donor.inputs)

    calls: list = [None] * L  # (args, kwargs) of each attention module's call in the receiver run
    reads: list = [None] * L

    def one(drop: int | None):
        alphas: list = [None] * L

        def keep_call(n: int):
            def hook(module, args, kwargs):
                calls[n] = (args, kwargs)
                reads[n] = (args[0] if args else kwargs["hidden_states"]).detach()
            return hook

        def keep_alpha(n: int):
            def hook(module, args, output):
                alphas[n] = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            return hook

        hooks = [Hook(m, "forward", keep_alpha(n)) for n, m in enumerate(attention)]
        if drop is None:
            hooks += [Hook(m, "pre_kwargs", keep_call(n)) for n, m in enumerate(attention)]
        else:
            hooks.append(Hook(where.blocks[drop], "forward_kwargs", _detach_block))
        with hooked(hooks):
            with _differentiable(where) as (zs, hiddens):
                value = metric(read(where.model, run_model(where.model, inputs))[0])
                _all_called(where, zs, hiddens)
                if any(a is None or not a.requires_grad for a in alphas):
                    raise UnsupportedArchitectureError(f"{type(where.model).__name__}: AtP* needs each layer's "
                                                       f"attention weights (eager attention)")
                grads = torch.autograd.grad(value, [*zs, *hiddens, *alphas], allow_unused=True, retain_graph=True)
                linear = []
                for n in range(L):  # J^T ∂M/∂α_n: the stream's effect through layer n's patterns, linearised
                    g = grads[2 * L + n]
                    linear.append(None if g is None else torch.autograd.grad(
                        (alphas[n] * g.detach()).sum(), hiddens[n], retain_graph=True, allow_unused=True)[0])
        return zs, hiddens, [a.detach() for a in alphas], grads, linear, float(value.detach())

    def exact_alpha(n: int, chosen: Sequence[int]) -> torch.Tensor:
        """Layer n's α (k, H, T, T) with the input at each position of `chosen` (of `at`) from the donor."""
        args, kwargs = calls[n]
        batch = reads[n].expand(len(chosen), *reads[n].shape[1:]).clone()
        for k, r in enumerate(chosen):
            batch[k, r] = donor_reads[n][0, source[r]].to(batch.dtype)
        given = ((batch, *args[1:]), kwargs) if args else ((), {**kwargs, "hidden_states": batch})
        with torch.inference_mode():
            out = attention[n](*given[0], **given[1])
        return out[1].detach()

    def partial(zs, hiddens, grads, linear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[bool]]:
        """Everything of the estimate but the exact pattern change: the heads, the residual stream less its
        linearised pattern change where the QK fix applies (which layers: `fixed`), the linearised terms."""
        heads, residual, linears, fixed = [], [], [], []
        for n in range(L):
            heads.append(_linearised(index, zs[n], donor.z[n], grads[n]))
            through = _linearised(index, hiddens[n], donor.hidden[n], grads[L + n])
            linearised = torch.zeros(len(places), dtype=torch.float64)
            applies = grads[2 * L + n] is not None and linear[n] is not None
            if applies:
                linearised = _linearised(index, hiddens[n], donor.hidden[n], linear[n])
                through = through - linearised
            residual.append(through)
            linears.append(linearised)
            fixed.append(applies)
        return torch.stack(heads), torch.stack(residual), torch.stack(linears), fixed

    zs, hiddens, alphas, grads, linear, value = one(None)
    index = torch.tensor(places, dtype=torch.long)
    heads, residual, linearised, fixed = partial(zs, hiddens, grads, linear)
    alpha_grad = [None if g is None else g.detach() for g in grads[2 * L:]]
    del zs, hiddens, grads, linear
    # GradDrop's run d cuts the gradient through block d: layer n's ∂M/∂α is the receiver run's own for n > d
    # (nothing after α_n runs through block d) and none for n = d; only n < d is kept, L(L − 1)/2 of them
    dropped_parts = []
    kept: dict[tuple[int, int], torch.Tensor] = {}
    for d in range(L):
        zs_d, hiddens_d, _, grads_d, linear_d, _ = one(d)
        dropped_parts.append(partial(zs_d, hiddens_d, grads_d, linear_d))
        for n in range(d):
            if grads_d[2 * L + n] is not None:
                kept[(d, n)] = grads_d[2 * L + n].detach()
        del zs_d, hiddens_d, grads_d, linear_d
        give_back_memory()  # freed heap back to the system: it would otherwise creep up run after run
    # ⟨∂M/∂α_n, α_n(patched) − α_n⟩ for every run, layer n's patched α made a block of positions at a time,
    # each position's change taken in float64 against every run's ∂M/∂α_n at once (one product)
    H, T = alphas[0].shape[1], alphas[0].shape[-1]
    block = max(1, EXACT_ALPHA_BYTES // (H * T * T * 4))
    exact: dict[int, dict[int | None, torch.Tensor]] = {}
    for n in range(L):
        runs = [None, *sorted(d for (d, m) in kept if m == n)]
        gradients = [alpha_grad[n] if d is None else kept[(d, n)] for d in runs]
        runs = [d for d, g in zip(runs, gradients) if g is not None]
        if not runs:
            exact[n] = {}
            continue
        table = torch.stack([g[0].double().flatten().cpu() for g in gradients if g is not None])  # (runs, H·T²)
        base = alphas[n][0].double().flatten().cpu()
        sums = torch.zeros(len(runs), len(places), dtype=torch.float64)
        for start in range(0, len(places), block):
            chosen = places[start:start + block]
            patched = exact_alpha(n, chosen).cpu()  # (k, H, T, T)
            for k in range(len(chosen)):
                sums[:, start + k] = table @ (patched[k].double().flatten() - base)
            del patched
        exact[n] = {d: sums[i] for i, d in enumerate(runs)}
        del table
        give_back_memory()
    for n in range(L):
        if fixed[n]:
            residual[n] = residual[n] + exact[n][None]
    dropped = []
    for d, (d_heads, d_residual, _, d_fixed) in enumerate(dropped_parts):
        for n in range(L):
            if d_fixed[n]:
                d_residual[n] = d_residual[n] + exact[n][d if n < d else None]
        dropped.append((d_heads, d_residual))
    return Starred(heads, residual, dropped, alphas, alpha_grad, exact_alpha, linearised, value)
