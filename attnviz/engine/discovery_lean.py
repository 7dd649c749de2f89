"""discover's long path: the residual graph's edges scored, and its circuits run, without α and without a copy of
the stream per receiver (engine/discovery.py holds (receivers)·T·D for the gradients, and every node's output,
N·T·D, for the circuits: at 8,192 tokens on SmolLM2, 18 GB and 5.7 GB).

What it holds instead, linear in T:

    changes      what each node writes, this run's minus the corrupted run's, kept compact: each layer's
                 W_O input z (T·H·d: a head's write is z_h·W_O^h, made again a block of positions at a time
                 where it is read), each MLP's output and the first block's input (T·D each)
    gradients    ∂M/∂x_r for a receiver r reading its own copy of the stream, from the gradients the backward
                 pass makes anyway: a head's q, k or v receiver is the vector-Jacobian product of its norm and
                 its slice of the projection with ∂M/∂(that slice of the projection's output); an MLP's
                 receiver is its norm's input made a node of its own (a view) in the graph; the logits' is the
                 final norm's input. Held compactly as the backward pass makes them (a layer's attention input
                 and its projections' gradients), a group of layers' at a time (as many as the receivers' part
                 of the budget holds), then scored together a block of positions at a time: each receiver's
                 ∂M/∂x_r made there, every node's write made once per block for the whole group, and one matrix
                 product (receivers × positions·D by positions·D × nodes).
    circuits     a receiver's input is the live stream minus the changes of the nodes outside the circuit that
                 write before it reads (x_live − Σ_{u not kept} Δa_u = x_r^corrupt + Σ_{u kept} Δa_u), one
                 layer's receivers at a time

Scores equal engine/discovery.py's: (a_u^clean − a_u^corrupt) · ∂M/∂x_r summed over positions and width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnviz.engine.ablation.runs import last_logits, run_model
from attnviz.engine.discovery import _columns, _logit_difference, _projected, Graph, kept
from attnviz.engine.hooks import Hook, hooked, on_gradient
from attnviz.engine.lean import give_back_memory, lean
from attnviz.engine.norm_pullback import Pullback
from attnviz.errors import UnsupportedArchitectureError

CHUNK = 512  # positions whose heads' writes (H·CHUNK·D) are made at once in the curve
ROWS = 8_192  # receivers × positions whose gradients (ROWS·D) are made again at once while a group is scored


@dataclass(frozen=True)
class Plan:
    """The long path as the memory budget allows (api/patching/discovery.py lean_path): how many blocks (the
    first) the backward pass recomputes and how many of those keep their attention's output (engine/lean.py
    recomputing); how many layers' receivers' gradients are held and scored together; how many layers' heads'
    writes the curve keeps once made; whether the curve keeps the corrupted run's record whole."""

    recomputed: int
    keeping: int
    group: int = 1
    cached: int = 0
    hold: bool = True


@dataclass
class Changes:
    """Per layer z (T, H·d) and MLP output (T, D) and the first block's input (T, D): a run's own (record), or
    its minus the corrupted run's (`against`)."""

    first: Any = None
    z: list = field(default_factory=list)
    mlp: list = field(default_factory=list)
    logits: Any = None  # (V,) the last position's
    cached: int = 0  # how many layers' heads' writes (H·T·D each) may be kept once made (the budget's spare)
    writes: dict = field(default_factory=dict)  # layer -> (H, T, D)

    def node_terms(self, g: Graph, G: torch.Tensor, at: slice, reach: list[int]) -> torch.Tensor:
        """Σ over positions `at` and width of G (R, c, D) times each node's change, row r against the first
        reach[r] nodes (`reach` descending): (R, reach[0]) float64, zero beyond a row's reach. Every node's write
        is made once for all the rows, ROWS // nodes positions at a time, and all of them multiplied at once
        ((R, positions·D) by (positions·D, nodes))."""
        R, upto = G.shape[0], reach[0]
        out = torch.zeros(R, upto, dtype=torch.float64, device=G.device)
        step = max(1, ROWS // upto)
        for first in range(0, G.shape[1], step):
            part = G[:, first:first + step]
            where = slice(at.start + first, at.start + first + part.shape[1])
            writes = G.new_empty(upto, part.shape[1] * g.D)
            writes[0] = self.first[where].reshape(-1)
            for n in range(len(g.layers)):
                start, mlp = g.head_node(n, 0), g.mlp_node(n)
                if start >= upto:
                    break
                if n in self.writes:
                    writes[start:start + g.H] = self.writes[n][:, where].reshape(g.H, -1)
                else:
                    _writes(g, n, self.z[n][where], out=writes[start:start + g.H].view(g.H, -1, g.D))
                if mlp < upto:
                    writes[mlp] = self.mlp[n][where].reshape(-1)
            out += (part.reshape(R, -1) @ writes.T).double()
        out[torch.arange(upto, device=out.device)[None, :] >= torch.tensor(reach, device=out.device)[:, None]] = 0
        return out

    def node_sums(self, g: Graph, weights: torch.Tensor, at: slice) -> torch.Tensor:
        """Σ_u weights[r, u] · (node u's change) at positions `at`, weights (R, upto): (R, c, D), summed in place
        (one (R, c·D) buffer); a head no row weighs is not made."""
        upto, R = weights.shape[1], weights.shape[0]
        w = weights.to(self.first.dtype)
        first = self.first[at]
        out = torch.outer(w[:, 0], first.reshape(-1))  # (R, c·D)
        for n in range(len(g.layers)):
            start, mlp = g.head_node(n, 0), g.mlp_node(n)
            if start >= upto:
                break
            self._add_heads(g, out, w[:, start:start + g.H], at, n)
            if mlp < upto and w[:, mlp].any():
                out.addr_(w[:, mlp], self.mlp[n][at].reshape(-1))
        return out.view(R, *first.shape)

    def layer_sums(self, g: Graph, weights: torch.Tensor, at: slice, n: int) -> torch.Tensor:
        """node_sums for layer n's heads alone, weights (R, H): (R, c, D)."""
        out = torch.zeros(weights.shape[0], self.first[at].numel(), dtype=self.first.dtype)
        self._add_heads(g, out, weights.to(self.first.dtype), at, n)
        return out.view(weights.shape[0], -1, g.D)

    def _add_heads(self, g: Graph, out: torch.Tensor, w: torch.Tensor, at: slice, n: int) -> None:
        """out (R, c·D) += Σ_h w[r, h] · (layer n's head h's write at `at`), w (R, H): the heads some row weighs
        alone made (all of them, kept, for the first `cached` layers)."""
        used = w.any(0).nonzero().flatten()
        if not len(used):
            return
        if n not in self.writes and len(self.writes) < self.cached:
            self.writes[n] = _writes(g, n, self.z[n])
        if n in self.writes:
            heads = self.writes[n][used, at]
        else:
            z = self.z[n][at].view(-1, g.H, g.d).transpose(0, 1)[used]  # (used, c, d)
            heads = torch.bmm(z, _per_head(g, n, z.dtype)[used])
        out.addmm_(w[:, used], heads.reshape(len(used), -1))

    def attention_sum(self, g: Graph, n: int) -> torch.Tensor:
        """Layer n's heads' writes summed, (T, D): its z's change times W_O (one product, no head made)."""
        z = self.z[n]
        return z @ _per_head(g, n, z.dtype).reshape(g.H * g.d, g.D)


def _writes(g: Graph, n: int, z: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Each head's write to the stream, z_h·W_O^h: z (T, H·d) -> (H, T, D) (into `out`, if given)."""
    return torch.bmm(z.view(z.shape[0], g.H, g.d).transpose(0, 1), _per_head(g, n, z.dtype), out=out)


def _head_weights(layer: Any, module: Any, columns: list[slice]) -> torch.Tensor:
    """Each head's slice of a q, k or v projection's weight, (heads, d, D): its output's `columns` (one after the
    other) as rows of a Linear's (out, D) weight, or as columns of GPT-2's Conv1D (D, out)."""
    span = slice(columns[0].start, columns[-1].stop)
    weight = module.weight[:, span].T if layer.fused else module.weight[span]
    return weight.reshape(len(columns), -1, weight.shape[1])


def _per_head(g: Graph, n: int, dtype) -> torch.Tensor:
    layer = g.layers[n]
    weight = layer.out.weight  # Linear (D, H·d); Conv1D (H·d, D)
    return (weight.T if not layer.fused else weight).reshape(g.H, g.d, g.D).to(dtype)


def record(g: Graph, inputs: dict, *, against: Changes | None = None,
           embeddings: torch.Tensor | None = None, consume: bool = False) -> Changes:
    """A run (inference, on SDPA) recording each node's write compactly; with `against`, minus that run's (the
    changes; `consume`: each of its layers let go once subtracted). `embeddings` (T, D): the first block's input
    instead of the tokens' own."""
    found = _empty(g)
    with lean(g.model), torch.inference_mode(), hooked(_recording(g, found, against, embeddings, consume=consume)):
        found.logits = run_model(g.model, {**inputs, **last_logits(g.model)}).logits[0, -1]
    _check(found)
    return found


def _empty(g: Graph) -> Changes:
    return Changes(z=[None] * len(g.layers), mlp=[None] * len(g.layers))


def _check(found: Changes) -> None:
    if found.first is None or any(z is None for z in found.z) or any(m is None for m in found.mlp):
        raise UnsupportedArchitectureError("a piece of the residual graph was not called")


def _recording(g: Graph, found: Changes | None, against: Changes | None, embeddings: torch.Tensor | None,
               leaf: list | None = None, consume: bool = False) -> list[Hook]:
    """Hooks recording `found` (None: nothing) on the first call per layer only (a block recomputed in the
    backward pass calls them again). `leaf`: the first block's input made the leaf the gradients start from,
    appended to it. `consume`: each of `against`'s layers let go once subtracted (one copy held, not two)."""
    def minus(mine: torch.Tensor, theirs: Any) -> torch.Tensor:
        mine = mine.detach()
        return mine.clone() if theirs is None else mine - theirs.to(mine.dtype)

    def first_input(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if embeddings is not None:
            hidden = embeddings[None].to(hidden.dtype)
        if leaf is not None and not leaf:
            hidden = hidden.detach().requires_grad_(True)
            leaf.append(hidden)
        if found is not None and found.first is None:
            found.first = minus(hidden[0], against.first if against else None)
        return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

    def z_of(n: int):
        def hook(module, args):
            if found is not None and found.z[n] is None:
                found.z[n] = minus(args[0][0], against.z[n] if against else None)
                if consume and against is not None:
                    against.z[n] = None
        return hook

    def mlp_of(n: int):
        def hook(module, args, output):
            if found is not None and found.mlp[n] is None:
                out = output[0] if isinstance(output, tuple) else output
                found.mlp[n] = minus(out[0], against.mlp[n] if against else None)
                if consume and against is not None:
                    against.mlp[n] = None
        return hook

    hooks = [Hook(g.layers[0].block, "pre_kwargs", first_input)]
    if found is not None:
        for n, layer in enumerate(g.layers):
            hooks += [Hook(layer.out, "pre", z_of(n)), Hook(layer.mlp, "forward", mlp_of(n))]
    return hooks


def scores(g: Graph, inputs: dict, metric: Any, *, plan: Plan, changes: Changes | None = None,
           corrupt: Changes | None = None, embeddings: torch.Tensor | None = None) -> tuple[torch.Tensor, Changes]:
    """Every edge's score (receivers, nodes) float64 from one backward pass of M at this run: the clean run
    (EAP), its changes from the `corrupt` run's record made by its own forward pass (which lets go of that record
    a layer at a time); or one of EAP-IG's inputs (`embeddings`), with the clean run's `changes` given. Returns
    (scores, the changes, with this run's logits at the last position).

    The receivers' gradients are held as they come, compactly (a layer's attention input and its projections'
    gradients; an MLP's and the logits' gradient), `plan.group` layers' at a time; then scored together a block of
    positions at a time, each receiver's ∂M/∂x_r made again there (its norm's vector-Jacobian product, per
    position, in closed form where engine/norm_pullback.py finds one) and each node's write made once for the
    whole group."""
    R, N, L = len(g.receivers), len(g.nodes), len(g.layers)
    table = torch.zeros(R, N, dtype=torch.float64)
    found = _empty(g) if changes is None else changes
    found.cached = 0  # the scoring keeps no writes: its spare goes to blocks and the group (lean_path)
    projected: list[dict] = [{} for _ in range(L)]
    attention_in: list = [None] * L
    seen: set = set()  # (layer, what): the pieces whose gradient is asked (a recomputed block calls again)
    wanted = [1 if layer.fused else 3 for layer in g.layers]
    pending: list = []  # (receiver rows, (at, out) -> their gradients at positions `at` made in out), as they came
    arrived: list[int] = []  # the layers whose attention receivers' gradients have come
    pullbacks = [Pullback(layer.attention_norm) for layer in g.layers]  # in closed form where it is the norm's

    def flush() -> None:
        """The pending receivers scored against every node before them, a block of positions at a time."""
        entries = sorted(pending, key=lambda entry: -g.reach[entry[0][0]])
        pending.clear()
        rows = [r for entry in entries for r in entry[0]]
        reach = [g.reach[r] for r in rows]
        T, width = found.first.shape[0], max(1, ROWS // len(rows))  # G: ROWS·D at most (the writes: node_terms)
        buffer = found.first.new_empty(len(rows) * min(width, T) * g.D)
        with torch.no_grad():  # in the backward pass or after it: nothing here is differentiated
            for first in range(0, T, width):
                at = slice(first, first + width)
                G = buffer[:len(rows) * len(range(T)[at]) * g.D].view(len(rows), -1, g.D)
                start = 0
                for entry_rows, gradients in entries:  # each made in its own rows of G
                    gradients(at, G[start:start + len(entry_rows)])
                    start += len(entry_rows)
                table[rows, :reach[0]] += found.node_terms(g, G, at, reach).cpu()
        entries.clear()  # the group's gradients and the writes made again for them, let go of and given back
        buffer = G = None
        give_back_memory()

    def keep_input(n: int):
        def hook(module, args):
            if attention_in[n] is None:  # the block's input: a recomputed block keeps it anyway
                attention_in[n] = args[0]
        return hook

    def on_projection(n: int):
        def hook(module, args, output):
            if (n, id(module)) in seen:
                return
            seen.add((n, id(module)))

            def came(grad: torch.Tensor) -> None:
                projected[n][id(module)] = grad[0].detach()
                if len(projected[n]) == wanted[n]:
                    attention_came(n)
            on_gradient(output, came)
        return hook

    def attention_came(n: int) -> None:
        """Layer n's q, k and v receivers, pending: each head's ∂M/∂x through its norm and its slice of the
        projection alone, made when scored."""
        layer, x = g.layers[n], attention_in[n].detach()[0]
        spans = [(layer.projections[which], _columns(g, which, g.H if which == "q" else g.G)) for which in "qkv"]
        heads = torch.cat([projected[n][id(module)][:, cols[0].start:cols[-1].stop] for module, cols in spans],
                          dim=1)  # (T, receivers·d): ∂M/∂ each head's q, k, v
        weights = torch.cat([_head_weights(layer, module, cols) for module, cols in spans]).to(heads.dtype)
        projected[n], attention_in[n] = {}, None

        def gradients(at: slice, out: torch.Tensor) -> None:
            """∂M/∂normed through each head's slice, pulled back through the norm, made in `out` (rows, c, D)."""
            torch.bmm(heads[at].unflatten(1, (len(weights), g.d)).transpose(0, 1), weights, out=out)
            pullbacks[n](x[at], out, in_place=True)
        pending.append((list(g.attention_receivers(n)), gradients))
        arrived.append(n)
        if len(arrived) % plan.group == 0:
            flush()

    def came_whole(rows: list[int]):
        """A receiver whose gradient is ∂M/∂(its own view of the stream) itself: pending."""
        return lambda grad: pending.append((rows, lambda at, out: out.copy_(grad[at][None])))

    def own_input(key: Any, came: Any):
        """A pre-hook giving a norm its own view of the stream (a node of the graph whose gradient is this
        receiver's alone: the residual connection reads the stream itself), `came(gradient (T, D))` when its
        gradient comes."""
        def hook(module, args):
            x = args[0].view_as(args[0])
            if key not in seen:
                seen.add(key)
                on_gradient(x, lambda grad: came(grad[0].detach()))
            return (x, *args[1:])
        return hook

    hooks = [Hook(g.final_norm, "pre", own_input("final", came_whole([R - 1])))]
    for n, layer in enumerate(g.layers):
        hooks.append(Hook(layer.attention_norm, "pre", keep_input(n)))
        for module in {id(m): m for m in layer.projections.values()}.values():
            hooks.append(Hook(module, "forward", on_projection(n)))
        hooks.append(Hook(layer.mlp_norm, "pre", own_input(("mlp", n), came_whole([g.mlp_receiver(n)]))))
    leaf: list = []
    hooks += _recording(g, found if changes is None else None, corrupt, embeddings, leaf, consume=True)
    blocks = [layer.block for layer in g.layers][:plan.recomputed]
    with lean(g.model, blocks, grad=True, keeping=plan.keeping), torch.enable_grad(), hooked(hooks):
        logits = run_model(g.model, {**inputs, **last_logits(g.model)}).logits[:, -1]
        if changes is None:
            _check(found)
        value = metric(logits).sum()
        torch.autograd.grad(value, leaf)  # the hooks above hold each receiver's gradient as it is made
    if len(arrived) != L:
        raise UnsupportedArchitectureError("a layer's attention receivers got no gradient")
    if pending:
        flush()
    found.logits = logits[0].detach()
    return table, found


def circuit_logits(g: Graph, inputs: dict, corrupt: Changes, keep: torch.Tensor, cached: int = 0,
                   consume: bool = False) -> torch.Tensor:
    """The logits at the last position (V,) of the run where each receiver r reads the corrupted run's input plus
    the changes of the nodes kept for it (`keep` (receivers, nodes) 0/1), one layer's receivers at a time, in
    whichever of two equal forms makes fewer heads' writes: the live stream minus the changes of the nodes not
    kept, or the live stream minus every change so far (the corrupted run's stream: a running sum, each layer's
    heads summed by one product) plus the changes of the nodes kept. `cached`: layers whose heads' writes may be
    kept. `consume`: each of `corrupt`'s layers let go once subtracted (one record held, not two; `corrupt` is
    spent)."""
    found = _empty(g)
    found.cached = cached
    outside = torch.zeros_like(keep)
    for r, upto in enumerate(g.reach):
        outside[r, :upto] = 1 - keep[r, :upto]
    made: dict = {}
    so_far: dict = {}  # "stream": Σ of every node's change written before this point of the run, (T, D)
    later: dict = {}  # layer -> (kept form?, the MLP receiver's sum over the nodes before the layer's heads (T, D))

    def weighed(rows: list[int], upto: int) -> tuple[bool, torch.Tensor, list[int]]:
        """(kept form?, the distinct rows' weights (U, upto), each row's index among them): each receiver reads
        the live stream minus every change so far plus the first `upto` nodes' changes kept, or the live stream
        minus those not kept, whichever weighs fewer nodes; receivers weighing alike share one sum."""
        kept_form = bool(keep[rows, :upto].any(0).sum() < outside[rows, :upto].any(0).sum())
        weights, index = torch.unique((keep if kept_form else outside)[rows, :upto], dim=0, return_inverse=True)
        return kept_form, weights, index.tolist()

    def read(x: torch.Tensor, kept_form: bool, summed: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """A receiver's input: the live stream `x` minus every change so far (`total`) plus those kept, or minus
        those not kept."""
        return x - total + summed if kept_form else x - summed

    def attention_norm(n: int):
        layer = g.layers[n]

        def hook(module, args):
            """Layer n's receivers' q, k and v, CHUNK positions at a time (their inputs never made whole)."""
            total = so_far["stream"] = found.first if n == 0 else so_far.pop("middle") + found.mlp[n - 1]
            rows = [*g.attention_receivers(n), g.mlp_receiver(n)]  # the MLP's: its part before this layer's heads
            kept_form, weights, index = weighed(rows, g.reach[rows[0]])
            x = args[0][0]
            before = torch.empty_like(x)  # the MLP receiver's part
            heads = {which: _columns(g, which, g.H if which == "q" else g.G) for which in "qkv"}
            own = {which: x.new_empty(x.shape[0], len(columns) * g.d) for which, columns in heads.items()}
            for at in (slice(s, s + CHUNK) for s in range(0, x.shape[0], CHUNK)):
                summed = found.node_sums(g, weights, at)  # (distinct rows, c, D)
                before[at] = summed[index[-1]]
                normed = layer.attention_norm.forward(read(x[at][None], kept_form, summed, total[at]))
                start = 0
                for which, columns in heads.items():
                    own[which][at] = _projected(layer, which, columns, normed[None],
                                                index[start:start + len(columns)])[0]
                    start += len(columns)
            later[n] = (kept_form, before)
            for which in "qkv":
                made.setdefault(id(layer.projections[which]), []).append(own[which])
            give_back_memory()  # the receivers' inputs, made and projected
        return hook

    def projection(module, args, output):
        return torch.cat(made.pop(id(module)), dim=-1)[None].to(output.dtype)

    def final_input(module, args):
        kept_form, weights, _ = weighed([len(g.receivers) - 1], len(g.nodes))
        x, total = args[0][0], so_far.pop("middle") + found.mlp[-1]
        parts = [read(x[at], kept_form, found.node_sums(g, weights, at)[0], total[at])
                 for at in (slice(s, s + CHUNK) for s in range(0, x.shape[0], CHUNK))]
        return (torch.cat(parts)[None].to(args[0].dtype), *args[1:])

    def mlp_input(n: int):
        row, start = g.mlp_receiver(n), g.head_node(n, 0)

        def hook(module, args):
            total = so_far["middle"] = so_far.pop("stream") + found.attention_sum(g, n)
            kept_form, before = later.pop(n)
            weights = (keep if kept_form else outside)[row, start:start + g.H][None]
            x = args[0][0]
            parts = [read(x[at], kept_form, before[at] + found.layer_sums(g, weights, at, n)[0], total[at])
                     for at in (slice(s, s + CHUNK) for s in range(0, x.shape[0], CHUNK))]
            del before
            joined = torch.cat(parts)[None].to(args[0].dtype)
            del parts
            give_back_memory()
            return (joined, *args[1:])
        return hook

    hooks = _recording(g, found, corrupt, None, consume=consume)
    for n, layer in enumerate(g.layers):
        hooks.append(Hook(layer.attention_norm, "pre", attention_norm(n)))
        for module in {id(m): m for m in layer.projections.values()}.values():
            hooks.append(Hook(module, "forward", projection))
        hooks.append(Hook(layer.mlp_norm, "pre", mlp_input(n)))
    hooks.append(Hook(g.final_norm, "pre", final_input))
    with lean(g.model), torch.inference_mode(), hooked(hooks):
        logits = run_model(g.model, {**inputs, **last_logits(g.model)}).logits[0, -1]
    return logits


def score_edges(g: Graph, prepared: list, steps: int, plan: Plan, step: Any) -> tuple[Any, float, float]:
    """engine.discovery.score_edges on the long path: `steps` 0 for EAP (the gradient at the clean run), else
    EAP-IG's inputs between the corrupted and the clean first-block input, each its own backward pass."""
    table = torch.zeros(len(g.receivers), len(g.nodes), dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for first, second, (right, wrong) in prepared:
        def metric(logits, right=right, wrong=wrong):
            return _logit_difference(logits, right, wrong)

        corrupt = record(g, second)
        corrupt_sum += float(metric(corrupt.logits[None])[0])
        if not steps:
            found, changes = scores(g, first, metric, plan=plan, corrupt=corrupt)
            table += found
        else:
            changes = record(g, first, against=corrupt, consume=True)  # one record held, not two
            start = corrupt.first
            del corrupt
            for t in torch.arange(1, steps + 1, dtype=torch.float64) / steps:
                embeddings = (start.double() + float(t) * changes.first.double()).to(start.dtype)
                found, _ = scores(g, first, metric, plan=plan, changes=changes, embeddings=embeddings)
                table += found / steps
        clean_sum += float(metric(changes.logits[None])[0])
        del changes
        step(1)
    return table.numpy(), clean_sum, corrupt_sum


def circuit_sums(g: Graph, prepared: list, table: Any, counts: list[int], step: Any, plan: Plan) -> dict[int, float]:
    """engine.discovery.circuit_sums on the long path: `plan.cached` layers' heads' writes kept once made;
    `plan.hold`: the corrupted run's record kept whole beside each circuit's changes (two records); else each
    circuit spends a record of its own, made again before it (one record held, one forward pass more per
    circuit)."""
    import numpy as np

    scored = torch.from_numpy(np.asarray(table, dtype=np.float64))
    masks = {n: kept(g, scored, n) for n in counts}
    sums = {n: 0.0 for n in counts}
    for first, second, (right, wrong) in prepared:
        corrupt = record(g, second) if plan.hold else None
        for n in counts:
            against = corrupt if corrupt is not None else record(g, second)
            logits = circuit_logits(g, first, against, masks[n], plan.cached, consume=not plan.hold)
            sums[n] += float(_logit_difference(logits[None], right, wrong)[0])
            step(1)
    return sums


def lean_parts(g: Graph, T: int) -> tuple[dict[str, int], int]:
    """What the long path holds at its peak for T tokens, by part (one record of every node's write: the
    corrupted run's, spent layer by layer as this run's changes are made; while scoring, the stream entering
    every block, which the backward pass keeps), and the last of these alone (the curve does not hold it). The
    receivers' part is the larger of the curve's (`curve_bytes`) and the scoring's (`group_bytes`: one layer's
    receivers' gradients held compactly, and a block of them made again). Beyond these, the budget's spare
    (api/patching/discovery.py lean_path) keeps, in the curve, the corrupted run's record whole (`record_bytes`:
    no forward pass more per circuit), then layers' heads' writes once made (H·T·D each, `write_bytes`); in the
    scoring, the recomputed blocks' attention outputs, then more layers' receivers' gradients held together
    (`layer_bytes` each), then blocks' activations."""
    from attnviz.engine.lean import block_activation_bytes

    stream = 4 * T * len(g.layers) * g.D
    return ({"one run's changes at every node (z and the MLPs' outputs)": record_bytes(g, T),
             "one layer's receivers' inputs or gradients": receiver_bytes(g, T),
             "one block's activations": block_activation_bytes(g.model.config, T),
             "the stream entering every block, kept for the backward pass": stream}, stream)


def receiver_bytes(g: Graph, T: int) -> int:
    """The receivers' part of the long path's peak: the curve's (`curve_bytes`) or the scoring's group of one
    layer, whichever is larger."""
    return max(curve_bytes(g, T), group_bytes(g, T, 1))


def curve_bytes(g: Graph, T: int) -> int:
    """What a circuit's run holds for one layer's receivers beyond the records, float32: their q, k and v
    ((H + 2·G)·d·T), the running sums of every change, the MLP receiver's part and input (6·T·D), and a block of
    CHUNK positions of their inputs: the sums, the inputs and their norms (4·(R + 1)·CHUNK·D)."""
    return 4 * (g.per_layer * g.d * T + 6 * T * g.D + 4 * (g.per_layer + 1) * min(T, CHUNK) * g.D)


def group_bytes(g: Graph, T: int, layers: int) -> int:
    """The scoring's receivers' gradients for `layers` layers held compactly (each layer's q/k/v projections'
    gradients and its MLP's receiver's gradient, `layer_bytes` each), the logits' receiver's (T·D), and a block of
    positions: the group's gradients made again there, with their norm's inputs and the gradients through the
    projections, and every node's write (4·ROWS·D), float32."""
    block = min(ROWS, T * max(len(g.nodes), len(g.receivers)))  # receivers or nodes × positions
    return layers * layer_bytes(g, T) + 4 * (T * g.D + 4 * block * g.D)


def layer_bytes(g: Graph, T: int) -> int:
    """One layer's receivers' gradients held compactly: (D + (H + 2·G)·d)·T float32. Its attention's input,
    held beside them, is the block's input: the stream the backward pass keeps (lean_parts), held in its place
    once the backward pass has left the block."""
    return 4 * T * (g.D + g.per_layer * g.d)


def record_bytes(g: Graph, T: int) -> int:
    """One run's record: every layer's z (T, H·d) and MLP output (T, D) and the first block's input, float32."""
    return 4 * T * (len(g.layers) * (g.H * g.d + g.D) + g.D)


def write_bytes(g: Graph, T: int) -> int:
    """One layer's heads' writes to the stream, (H, T, D) float32."""
    return 4 * g.H * T * g.D
