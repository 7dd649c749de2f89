"""Activation patching (Meng et al. 2022; Wang et al. 2022; Heimersheim & Nanda 2024): run a clean prompt and a
corrupted one of the same length, put one piece of one run into the other, and measure how much of the answer
comes back.

    receiver run (corrupted, to denoise; clean, to noise) with one piece taken from the donor run:
        a head's z_h (what W_O receives from it) at every position, or at one position
        a layer's attention output at one position (every head's z at that position)
        the residual stream entering a layer at one position (the block's input)
    metric: the logit difference LD = logit(answer) − logit(other answer) at the last position, normalised
        (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted): 0 is the corrupted run, 1 the clean one

Batched like `importance`: one forward pass holds the receiver run and a copy per patch; each copy joins the
batch at the layer where its patch is made (a copy of the receiver's state there), so the layers below run
once. The same seam as ablation: the output projection's input, split into heads (engine/ablation/seam.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from attnviz.engine.hooks import Hook, hooked, on_gradient
from attnviz.engine.ablation.seam import Site, copies_that_fit, editing, recording
from attnviz.engine.ablation.runs import embedding, is_causal_lm, last_logits, outputs_of, run_model
from attnviz.engine.lean import lean
from attnviz.errors import UnsupportedArchitectureError

KINDS = ("head", "attention", "residual")


@dataclass(frozen=True)
class Patch:
    """One piece moved from the donor run into the receiver: `kind` head (layer, head, position or None for
    every position), attention (layer, position: every head's z there) or residual (layer, position: the
    block's input there)."""

    kind: str
    layer: int
    head: int | None = None
    position: int | None = None


@dataclass
class Donor:
    """What the donor run gives the patches: each layer's W_O input z (1, T, H, d) and each block's input
    hidden state (1, T, D)."""

    z: list
    hidden: list
    reading: torch.Tensor  # (R,): what the metric reads (read())
    inputs: dict  # the donor run's own inputs
    pairs: tuple | None = None  # aligned(): ((receiver position, donor position), …); None: position for position
    pending: Pending | None = None  # a receiver run made as AtP's forward pass (receiving_run): z, hidden empty


@dataclass
class Pending:
    """The receiver run's forward pass for AtP made ahead of its backward pass (the long path: one forward pass
    serves both the metric's value the prompts are checked with and the gradients): what read() reads, with
    its graph; each layer's z and block input in the graph; and the long path's context, open until the
    backward pass (a block recomputed then must run as it ran: on SDPA). close() ends it; attributed() does."""

    output: torch.Tensor  # (R,) with its graph
    zs: list
    hiddens: list
    stack: contextlib.ExitStack

    def close(self) -> None:
        self.stack.close()


def receiving_run(where: Site, inputs: dict) -> Donor:
    """The receiver's run for AtP on the long path: AtP's own forward pass (Pending), whose reading the prompts
    are checked with; no z or block input recorded apart from the graph's. Close its `pending` if it is not
    used."""
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(passing(where, grad=True))
        tick = where.on_block or (lambda n: None)
        with _differentiable(where) as (zs, hiddens), hooked([Hook(b, "pre", lambda m, a: tick(1))
                                                              for b in where.blocks] if where.on_block else []):
            output = read(where.model, run(where, inputs))[0]
        _all_called(where, zs, hiddens)
    except BaseException:
        stack.close()
        raise
    pending = Pending(output, zs, hiddens, stack)
    return Donor([], [], output.detach(), inputs, pending=pending)


def aligned(donor: Donor, receiver: Donor, pairs: Sequence[tuple[int, int]]) -> Donor:
    """The donor's recordings moved to the receiver's positions, for prompts of different lengths: at each
    receiver position r of `pairs` ((r, d), …) the donor's position d, elsewhere the receiver's own (a patch
    there changes nothing). z and the block inputs take the receiver's length; `pairs` is kept for the MLP
    outputs all_patched_logits moves."""
    T = int(receiver.inputs["input_ids"].shape[1])
    if len(pairs) == T == int(donor.inputs["input_ids"].shape[1]) and all(r == d for r, d in pairs):
        return donor
    at = torch.tensor([r for r, _ in pairs], dtype=torch.long)
    source = torch.tensor([d for _, d in pairs], dtype=torch.long)

    def moved(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
        out = mine.clone()
        out[:, at.to(out.device)] = theirs[:, source.to(theirs.device)].to(out.dtype)
        return out

    return Donor([moved(a, b) for a, b in zip(receiver.z, donor.z)],
                 [moved(a, b) for a, b in zip(receiver.hidden, donor.hidden)], donor.reading, donor.inputs,
                 tuple((int(r), int(d)) for r, d in pairs))


def _hidden_of(args, kwargs) -> tuple[torch.Tensor, str | None]:
    if args:
        return args[0], None
    name = next(k for k in ("hidden_states", "x", "hidden_state") if k in kwargs)
    return kwargs[name], name


def passing(where: Site, *, grad: bool = False) -> contextlib.AbstractContextManager:
    """How the model runs: as loaded, or on the long path (its own SDPA; with `grad`, the first
    `where.recomputed` blocks recomputed in the backward pass, the first `where.keeping` of them keeping their
    attention's output, the others keeping their activations, as the budget allows) where the site says so."""
    if not where.lean:
        return contextlib.nullcontext()
    return lean(where.model, where.blocks[:where.recomputed], grad=grad, keeping=where.keeping)


def run(where: Site, inputs: dict):
    """The model's forward pass on `inputs`; on the long path a causal LM's logits at the last position only
    (what read() reads: every position's would be T·V numbers)."""
    if where.lean and is_causal_lm(where.model):
        inputs = {**inputs, **last_logits(where.model)}
    return run_model(where.model, inputs)


def donor_run(where: Site, inputs: dict) -> Donor:
    """One run recording what every patch takes: each W_O input and each block input."""
    hidden: list = [None] * where.layers

    def keep(module, args, kwargs):
        value, _ = _hidden_of(args, kwargs)
        hidden[where.blocks.index(module)] = value.detach()

    with hooked([Hook(b, "pre_kwargs", keep) for b in where.blocks]), passing(where):
        with recording(where) as z, torch.inference_mode():
            output = run(where, inputs)
    if any(v is None for v in z) or any(v is None for v in hidden):
        raise UnsupportedArchitectureError(f"{type(where.model).__name__}: a layer was not called")
    return Donor(list(z), hidden, read(where.model, output)[0], inputs)


def read(model, output) -> torch.Tensor:
    """What the metric reads of each element of a run, (B, R) float64: a causal LM's logits at the last
    position (R = V); an encoder's unit sentence embedding (the mean over tokens, as `ablate` pools it) followed
    by every token's final hidden state (R = D + T·D)."""
    if is_causal_lm(model):
        return output.logits[:, -1].double()
    hidden = outputs_of(output, False)  # (B, T, D)
    return torch.cat([embedding(hidden), hidden.flatten(1)], dim=1).double()


def patched_logits(where: Site, inputs: dict, donor: Donor, patches: Sequence[Patch]) -> torch.Tensor:
    """What read() reads with each patch made alone, in one forward pass: row 0 is the receiver run unpatched,
    row 1 + n has patches[n] (which must be in layer order). (1 + N, R) float64"""
    layers = [p.layer for p in patches]
    if layers != sorted(layers):
        raise ValueError("patches must be in layer order")
    start: dict[int, int] = {}
    at_layer: dict[int, list[Patch]] = {}
    for n, patch in enumerate(patches):
        start.setdefault(patch.layer, 1 + n)
        at_layer.setdefault(patch.layer, []).append(patch)

    def grow(module, args, kwargs):
        layer = where.blocks.index(module)
        here = at_layer.get(layer)
        if not here:
            return None
        hidden, name = _hidden_of(args, kwargs)
        more = hidden[:1].expand(len(here), *hidden.shape[1:]).clone()  # copies of the receiver's state here
        for k, patch in enumerate(here):
            if patch.kind == "residual":
                more[k, patch.position] = donor.hidden[layer][0, patch.position].to(more.dtype)
        grown = torch.cat([hidden, more])
        return ((grown, *args[1:]), kwargs) if name is None else (args, {**kwargs, name: grown})

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:  # z (B, T, H, d)
        here = at_layer.get(layer)
        if not here or all(p.kind == "residual" for p in here):
            return z
        z = z.clone()
        source = donor.z[layer][0].to(z.dtype)  # (T, H, d)
        for k, patch in enumerate(here):
            row = start[layer] + k
            if patch.kind == "head":
                if patch.position is None:
                    z[row, :, patch.head] = source[:, patch.head]
                else:
                    z[row, patch.position, patch.head] = source[patch.position, patch.head]
            elif patch.kind == "attention":
                z[row, patch.position] = source[patch.position]
        return z

    with hooked([Hook(b, "pre_kwargs", grow) for b in where.blocks]), passing(where):
        with editing(where, edit), torch.inference_mode():
            output = run(where, inputs)
    logits = read(where.model, output)
    if logits.shape[0] != 1 + len(patches):
        raise UnsupportedArchitectureError(f"{type(where.model).__name__} did not keep the batch it was given "
                                           f"({logits.shape[0]} outputs for {1 + len(patches)})")
    return logits


def run_patches(where: Site, inputs: dict, donor: Donor, patches: Sequence[Patch], *, batched: bool = True,
                on_done=None) -> torch.Tensor:
    """What read() reads with each patch made alone (N, R): in batched passes of as many copies as fit memory,
    or (`batched=False`) one pass per patch, the loop the batched path must equal."""
    T = int(inputs["input_ids"].shape[1])
    if is_causal_lm(where.model):
        head: Any = where.model.get_output_embeddings()  # type: ignore[operator]
        width = int(head.weight.shape[0])  # the model's logits at every position, for each copy
    else:
        width = 2 * int(getattr(where.model.config, "hidden_size", 0) or 1024)
    size = copies_that_fit(where, T, width) if batched else 1
    ordered = sorted(range(len(patches)), key=lambda n: patches[n].layer)
    results: list = [None] * len(patches)
    for first in range(0, len(ordered), size):
        chunk = ordered[first:first + size]
        logits = patched_logits(where, inputs, donor, [patches[n] for n in chunk])
        for k, n in enumerate(chunk):
            results[n] = logits[1 + k]
        if on_done is not None:
            on_done(len(chunk))
    return torch.stack(results) if results else torch.zeros(0)


@contextlib.contextmanager
def _differentiable(where: Site) -> Iterator[tuple[list, list]]:
    """A forward pass run inside keeps, in the autograd graph, each layer's W_O input z (B, T, H, d) and each
    block's input; the first block's input is made the leaf where the graph starts, so gradients flow whether or
    not the model's weights take them. Yields (zs, hiddens), filled as the pass runs; the hooks are removed at
    the end."""
    L = where.layers
    zs: list = [None] * L
    hiddens: list = [None] * L

    def keep_z(layer: int, z: torch.Tensor) -> torch.Tensor:
        if zs[layer] is None:  # the pass's own z (a block recomputed in the backward pass calls this again)
            zs[layer] = z
        return z

    def keep_hidden(module, args, kwargs):
        layer = where.blocks.index(module)
        hidden, name = _hidden_of(args, kwargs)
        if layer != 0:
            hiddens[layer] = hidden
            return None
        hidden = hidden.detach().requires_grad_(True)
        hiddens[0] = hidden
        return ((hidden, *args[1:]), kwargs) if name is None else (args, {**kwargs, name: hidden})

    with hooked([Hook(b, "pre_kwargs", keep_hidden) for b in where.blocks]):
        with editing(where, keep_z), torch.enable_grad():
            yield zs, hiddens


def _all_called(where: Site, *recorded: list) -> None:
    """Refuse, before taking gradients, a pass in which a layer recorded nothing."""
    if any(v is None for values in recorded for v in values):
        raise UnsupportedArchitectureError(f"{type(where.model).__name__}: a layer was not called")


def _linearised(places: torch.Tensor, mine: torch.Tensor, theirs: torch.Tensor,
                grad: torch.Tensor | None) -> torch.Tensor:
    """(a_donor − a_receiver) · ∂M/∂a at each of `places` (summed over the last axis), float64 on the CPU; 0
    where the metric does not read the piece at all."""
    here = places.to(mine.device)
    change = theirs[0, here].to(mine.device).double() - mine.detach()[0, here].double()
    if grad is None:
        return torch.zeros(change.shape[:-1], dtype=torch.float64)
    return (change * grad[0, here].double()).sum(-1).cpu()


def attributed(where: Site, inputs: dict, donor: Donor, at: Sequence[int],
               metric: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Attribution patching (AtP, Nanda 2023; Kramár et al. 2024): every patch's effect on the metric from one
    forward and one backward pass of the receiver run, linearised there: (a_donor − a_receiver) · ∂M/∂a for
    each piece a, a head's z_h and the residual stream entering each layer, at each position of `at` (the
    receiver's positions the `donor`, an aligned() Donor, is patched into). `metric` maps what read() reads
    of the one run, (R,) float64, to the scalar M.

    Returns (heads (L, A, H): each head at each position; residual (L, A): each block's input at each position;
    M of the receiver run), float64. A head patched at every position is the sum over positions, a layer's
    attention output at a position the sum over heads: the estimate is linear in what is patched. Each
    gradient is folded into its estimate as the backward pass makes it (a hook on the tensor), so no layer's
    gradient outlives its block; the backward pass is asked for the first block's input only
    (torch.autograd.grad), so no parameter's .grad is touched."""
    L = where.layers
    places = torch.tensor(list(at), dtype=torch.long)
    heads = torch.zeros(L, len(places), where.heads, dtype=torch.float64)
    residual = torch.zeros(L, len(places), dtype=torch.float64)

    def fold(into: torch.Tensor, n: int, mine: torch.Tensor, theirs: torch.Tensor, done=None):
        def hook(grad: torch.Tensor) -> None:
            into[n] = _linearised(places, mine, theirs, grad)
            if done is not None:  # the backward pass is through block n
                done(1)
        return hook

    pending = where.pending
    where.pending = None
    if pending is None:
        pending = receiving_run(where, inputs).pending
    assert pending is not None
    tick = where.on_block or (lambda n: None)
    try:
        with torch.enable_grad():
            value = metric(pending.output)
        zs, hiddens = pending.zs, pending.hiddens
        for n in range(L):
            on_gradient(zs[n], fold(heads, n, zs[n], donor.z[n]))
            on_gradient(hiddens[n], fold(residual, n, hiddens[n], donor.hidden[n], tick))
        if value.requires_grad:  # a metric that reads nothing of the run has no gradient: every estimate 0
            torch.autograd.grad(value, [hiddens[0]], allow_unused=True)
    finally:
        pending.close()
    return heads, residual, float(value.detach())


def check_lean(loaded: Any, where: Site, T: int) -> None:
    """Refuse, before running, patching on the long path whose recordings would not fit the memory budget:
    each run's z and stream at every layer (L·T·(H·d + D) float32 each, two runs) and one block's activations,
    linear in T."""
    from attnviz.engine.lean import attention_kept_bytes, block_activation_bytes, recomputing
    from attnviz.engine.memory import check_parts

    from attnviz.engine.memory import memory_budget

    config = where.model.config
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    run_bytes = 4 * T * sum(where.heads * d + D for d in where.dims)
    block = block_activation_bytes(config, T)
    check_parts(loaded, {"the two runs' z and stream at every layer": 2 * run_bytes,
                         "one block recomputed for the backward pass": block},
                f"patching {T} tokens without α (the model's own SDPA attention; {where.layers} layers)",
                "shorten the prompts (on this path the memory grows linearly in the tokens)")
    # the rest of the budget keeps the recomputed blocks' attention outputs, then whole blocks' activations
    spare = (loaded.memory_budget or memory_budget()) - 2 * run_bytes - block
    where.recomputed, where.keeping = recomputing(where.layers, spare, block, attention_kept_bytes(config, T))


def every_patch(kind: str, L: int, H: int, at: int | Sequence[int], positions: bool = False) -> list[Patch]:
    """Every patch of a kind: each head (at every position together, or at each position), or each layer and
    position (attention output, residual stream); `at` the positions (T: all of 0 … T − 1). Layer-major."""
    places = range(at) if isinstance(at, int) else list(at)
    if kind == "head":
        return [Patch("head", n, h, p) for n in range(L) for h in range(H)
                for p in (places if positions else [None])]
    return [Patch(kind, n, None, p) for n in range(L) for p in places]


def all_patched_logits(where: Site, inputs: dict, donor: Donor) -> torch.Tensor:
    """The receiver run with every head's z and every MLP's output replaced by the donor's, at every layer (an
    aligned() donor: at its aligned positions): at any position whose token is the same in both runs (and,
    with absolute position embeddings, the same index) this is the donor's run there. What read() reads, (R,).
    (A check, not a metric.)"""
    found = [_mlp_of(block) for block in where.blocks]
    if any(m is None for m in found):
        raise UnsupportedArchitectureError("this model's blocks have no MLP to patch (mlp, ffn or BERT's output.dense)")
    mlps: list[Any] = list(found)
    recorded: list = [None] * where.layers

    def keep(n: int):
        def hook(module, args, output):
            recorded[n] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    with hooked([Hook(m, "forward", keep(n)) for n, m in enumerate(mlps)]), passing(where):
        with torch.inference_mode():
            run(where, donor.inputs)

    def moved(n: int, live: torch.Tensor) -> torch.Tensor:
        if donor.pairs is None:
            return recorded[n].to(live.dtype)
        out = live.clone()  # prompts of different lengths: the donor's outputs at the aligned positions only
        out[:, [r for r, _ in donor.pairs]] = recorded[n][:, [d for _, d in donor.pairs]].to(out.dtype)
        return out

    def replace(n: int):
        def hook(module, args, output):
            if isinstance(output, tuple):
                return (moved(n, output[0]), *output[1:])
            return moved(n, output)
        return hook

    with hooked([Hook(m, "forward", replace(n)) for n, m in enumerate(mlps)]), passing(where):
        with editing(where, lambda layer, z: donor.z[layer].to(z.dtype).expand_as(z)), torch.inference_mode():
            output = run(where, inputs)
    return read(where.model, output)[0]


def _mlp_of(block):
    """What a block's MLP adds before the residual (and, in a post-norm block, before its norm): .mlp, .ffn
    (DistilBERT), or BERT's output.dense (its second linear layer)."""
    for name in ("mlp", "ffn"):
        found = getattr(block, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    dense = getattr(getattr(block, "output", None), "dense", None)
    return dense if getattr(block, "intermediate", None) is not None and isinstance(dense, torch.nn.Module) else None


def positions_inside_attention(model) -> bool:
    """Positions enter only inside attention (rotary embeddings, no table of absolute positions): a token's
    embedding does not depend on its index."""
    config = model.config
    rotary = any(getattr(config, name, None) for name in ("rope_parameters", "rope_theta", "rope_scaling"))
    return rotary and not any("position_embeddings" in name or name.endswith("wpe")
                              for name, _ in model.named_modules())
