"""The residual graph of a pre-norm decoder, edge by edge (edge attribution patching: EAP, Syed et al. 2023;
EAP-IG, Hanna et al. 2024; circuits scored as MIB does, Mueller et al. 2025).

    nodes      input (the first block's input: the token and position embeddings), every head a{l}.{h} (what it
               adds to the residual stream, W_O^h z_h), every MLP m{l} (its output), in the order they run
    receivers  every head's query, key and value input (under grouped-query attention a key or value input is
               a key-value head's), every MLP's input, and the logits (the final norm's input)
    edges      from every node to every receiver that reads the residual stream after the node wrote to it

A receiver's input is the sum of what the nodes before it wrote (and the biases, the same in every run). An edge
is patched by giving its receiver the corrupted run's contribution of that sender instead: the input of
receiver r is x_r^corrupt + Σ_{kept u→r} (a_u − a_u^corrupt), with a_u what node u writes in this run. Every
edge kept, the run is the clean run; none kept, the corrupted one.

Each receiver reads its own copy of its input (the per-head split of q, k and v), so that ∂M/∂x_r is the
gradient through that receiver alone: an edge u→r is scored (a_u^clean − a_u^corrupt) · ∂M/∂x_r, the gradient
at the clean run (EAP) or averaged over inputs between the corrupted and the clean embeddings (EAP-IG).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnviz.engine.ablation.runs import last_logits, run_model
from attnviz.engine.hooks import Hook, hooked
from attnviz.errors import UnsupportedArchitectureError

SCORE_BLOCK = 16  # nodes whose change is held in float64 at once while edges are scored
FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "smollm3")  # pre-norm, heads add W_O z to the stream


@dataclass
class Layer:
    """One block's pieces: the norm before attention, the q/k/v projections (`fused`: GPT-2's c_attn, one
    projection whose columns are q, k, v), the output projection, the norm before the MLP, the MLP."""

    block: Any
    attention_norm: Any
    projections: dict  # {"q": module, "k": module, "v": module}; fused: all three the same module
    out: Any
    mlp_norm: Any
    mlp: Any
    fused: bool


@dataclass
class Graph:
    """A model's residual graph: its layers, H query heads and G key-value heads of d, model width D; the node
    and receiver names in the order they run; for each receiver, how many nodes (a prefix of `nodes`) write
    before it reads."""

    model: Any
    layers: list[Layer]
    final_norm: Any
    H: int
    G: int
    d: int
    D: int
    nodes: list[str] = field(default_factory=list)
    receivers: list[str] = field(default_factory=list)
    reach: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        kv = (lambda g: str(g)) if self.G == self.H else (lambda g: f"kv{g}")
        self.nodes, self.receivers, self.reach = ["input"], [], []
        for n in range(len(self.layers)):
            before = len(self.nodes)
            for which, count in (("q", self.H), ("k", self.G), ("v", self.G)):
                for h in range(count):
                    self.receivers.append(f"a{n}.{h if which == 'q' else kv(h)}.{which}")
                    self.reach.append(before)
            self.nodes += [f"a{n}.{h}" for h in range(self.H)]
            self.receivers.append(f"m{n}")
            self.reach.append(len(self.nodes))
            self.nodes.append(f"m{n}")
        self.receivers.append("logits")
        self.reach.append(len(self.nodes))

    @property
    def per_layer(self) -> int:
        """Receivers of one layer's attention: H queries, G keys, G values."""
        return self.H + 2 * self.G

    def attention_receivers(self, layer: int) -> range:
        start = layer * (self.per_layer + 1)
        return range(start, start + self.per_layer)

    def mlp_receiver(self, layer: int) -> int:
        return layer * (self.per_layer + 1) + self.per_layer

    def head_node(self, layer: int, head: int) -> int:
        return 1 + layer * (self.H + 1) + head

    def mlp_node(self, layer: int) -> int:
        return 1 + layer * (self.H + 1) + self.H

    def edges(self) -> int:
        return sum(self.reach)


def graph(model) -> Graph:
    """The residual graph of a pre-norm decoder of FAMILIES; any other refused in one line."""
    config = model.config
    kind = str(getattr(config, "model_type", ""))
    if kind not in FAMILIES:
        raise UnsupportedArchitectureError(
            f"discover reads pre-norm decoders whose heads add W_O·z to the residual stream ({', '.join(FAMILIES)}); "
            f"this model is {kind or type(model).__name__}")
    layers: list[Layer] = []
    if kind == "gpt2":
        base = model.transformer
        for block in base.h:
            layers.append(Layer(block, block.ln_1, {w: block.attn.c_attn for w in "qkv"}, block.attn.c_proj,
                                block.ln_2, block.mlp, True))
        final = base.ln_f
        H = int(config.n_head)
        D = int(config.n_embd)
        d, G = D // H, H
    else:
        base = model.model
        for block in base.layers:
            attention = block.self_attn
            layers.append(Layer(block, block.input_layernorm, {w: getattr(attention, f"{w}_proj") for w in "qkv"},
                                attention.o_proj, block.post_attention_layernorm, block.mlp, False))
        final = base.norm
        H = int(config.num_attention_heads)
        D = int(config.hidden_size)
        d = int(getattr(config, "head_dim", 0) or D // H)
        G = int(getattr(config, "num_key_value_heads", 0) or H)
    return Graph(model, layers, final, H, G, d, D)


SAVED_PER_RECEIVER = 4  # a receiver's input in the run that takes gradients: its copy, and what its norm and
                        # projection keep for the backward pass (the squared input, the normed input, its scaling)


def scoring_bytes(g: Graph, T: int, batch: int = 1) -> dict[str, int]:
    """What scoring the edges of one pair of T tokens holds at its peak (the backward pass of the run that takes
    gradients, `batch` = EAP-IG's steps, else 1), in float32 bytes unless said, by part:

        runs           the clean and the corrupted runs: every node's output, every MLP's input and the
                       logits' input, (N + L + 1)·T·D each (the attention receivers share one input there)
        gradient run   the same, batch times, and every attention receiver's own copy of its input with what
                       its norm and projection keep for the backward pass, SAVED_PER_RECEIVER·L·R·T·D
        model          the model's own activations kept for the backward pass: per layer α and the scores
                       (2·H·T²), the MLP's gate, up, activation and product (4·T·I), and the rest of the
                       block — norms' inputs and outputs, q, k, v before and after the rotation, the grouped
                       heads repeated, the heads' output (10·T·D) — batch times
        gradients      ∂M/∂x for every receiver, float32 as autograd returns them (batch times), then their
                       float64 sum, (receivers)·T·D·8
        logits         the logits of the last position (of every position where the model cannot keep only the
                       last), and their gradient in the run that takes it
    """
    config = g.model.config
    L, R, N, D = len(g.layers), g.per_layer, len(g.nodes), g.D
    intermediate = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * D)
    stream = (N + L + 1) * T * D * 4
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    positions = 1 if last_logits(g.model) else T  # a model that cannot keep only the last position's logits
    return {
        "logits": (2 + 2 * batch) * positions * vocab * 4,
        "runs": 2 * stream,
        "gradient run": batch * (stream + SAVED_PER_RECEIVER * L * R * T * D * 4),
        "model": batch * L * T * (2 * g.H * T + 4 * intermediate + 10 * D) * 4,
        "gradients": batch * (L * R + L + 1) * T * D * 4 + len(g.receivers) * T * D * 8,
    }


def _columns(g: Graph, which: str, count: int) -> list[slice]:
    """Each head's columns of the projection's output (GPT-2's fused c_attn: q, k, v one after the other)."""
    offset = "qkv".index(which) * g.D if g.layers[0].fused else 0
    return [slice(offset + h * g.d, offset + (h + 1) * g.d) for h in range(count)]


def _projected(layer: Layer, which: str, columns: list[slice], normed: torch.Tensor,
               inputs: list[int] | None = None) -> torch.Tensor:
    """Each head's q, k or v from its own normed input: normed (B, n, T, D) -> (B, T, n·d); `inputs`: head h's
    is normed[:, inputs[h]] (heads sharing one)."""
    module = layer.projections[which]
    weight = module.weight  # Linear (out, D); GPT-2's Conv1D (D, out)
    bias = module.bias
    parts = []
    for h, cols in enumerate(columns):
        w = weight[:, cols] if layer.fused else weight[cols].T  # (D, d)
        part = normed[:, h if inputs is None else inputs[h]] @ w.to(normed.dtype)
        if bias is not None:
            part = part + bias[cols].to(normed.dtype)
        parts.append(part)
    return torch.cat(parts, dim=-1)


@dataclass
class Run:
    """One run through the graph: what each node wrote (B, T, D each), each layer's attention receivers' inputs
    (B, R, T, D), each MLP's input and the logits' input (B, T, D), and the logits at the last position (B, V)."""

    outputs: list
    attention_inputs: list
    mlp_inputs: list
    final_input: Any
    logits: torch.Tensor


def run(g: Graph, inputs: dict, *, embeddings: torch.Tensor | None = None, keep: torch.Tensor | None = None,
        corrupt: Run | None = None) -> Run:
    """The model run with each receiver reading its own input. `embeddings` (B, T, D): the first block's input
    instead of the tokens' own (EAP-IG's interpolations). `keep` (receivers, nodes) of 0/1 with `corrupt` (the
    corrupted prompt's Run, B = 1): each receiver's input built edge by edge, x_r^corrupt + Σ keep[r, u] (a_u −
    a_u^corrupt); without them every receiver reads the live residual stream (a copy each). Gradients flow
    (call under torch.enable_grad() to take them)."""
    L = len(g.layers)
    outputs: list = [None] * len(g.nodes)
    attention_inputs: list = [None] * L
    mlp_inputs: list = [None] * L
    final: dict = {}
    live: dict = {}
    columns = {w: _columns(g, w, g.H if w == "q" else g.G) for w in "qkv"}

    def built(receivers: Sequence[int], base: torch.Tensor) -> torch.Tensor:
        """(B, R, T, D): the receivers' inputs."""
        if keep is None or corrupt is None:  # each receiver its own copy only where its gradient is taken
            shared = base.unsqueeze(1).expand(-1, len(receivers), -1, -1)
            return shared.clone() if torch.is_grad_enabled() else shared
        width = g.reach[receivers[-1]]
        deltas = torch.stack([outputs[u] - corrupt.outputs[u].to(outputs[u].dtype) for u in range(width)], 1)
        mask = keep[list(receivers), :width].to(deltas.device, deltas.dtype)  # (R, U)
        return base.unsqueeze(1) + torch.einsum("ru,butd->brtd", mask, deltas)

    def first_input(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        if embeddings is not None:
            hidden = embeddings.to(hidden.dtype)
        if torch.is_grad_enabled():  # the graph starts here, whether or not the model's weights take gradients
            hidden = hidden.detach().requires_grad_(True)
        outputs[0] = hidden
        return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

    def attention_norm(n: int):
        def hook(module, args):
            x = args[0]
            base = x if corrupt is None or keep is None else corrupt.attention_inputs[n][:, 0].to(x.dtype)
            attention_inputs[n] = built(list(g.attention_receivers(n)), base)
            live[n] = module
        return hook

    def projection(n: int):
        layer = g.layers[n]
        rows = {"q": slice(0, g.H), "k": slice(g.H, g.H + g.G), "v": slice(g.H + g.G, g.H + 2 * g.G)}

        def hook(module, args, output):
            X = attention_inputs[n]  # (B, R, T, D)
            wanted = "qkv" if layer.fused else [next(w for w in "qkv" if layer.projections[w] is module)]
            parts = []
            for which in wanted:
                chosen = X[:, rows[which]]
                if chosen.stride(1) == 0:  # every receiver reads the same input (a run without gradients)
                    normed = layer.attention_norm.forward(chosen[:, 0]).unsqueeze(1).expand(chosen.shape)
                else:  # the norm of the last dimension, each receiver's own (its forward: not its hook)
                    normed = layer.attention_norm.forward(chosen)
                parts.append(_projected(layer, which, columns[which], normed))
            return torch.cat(parts, dim=-1).to(output.dtype)
        return hook

    def head_outputs(n: int):
        layer = g.layers[n]

        def hook(module, args):
            z = args[0]  # (B, T, H·d)
            B, T = z.shape[:2]
            weight = module.weight  # Linear (D, H·d); Conv1D (H·d, D)
            per_head = (weight.T if not layer.fused else weight).reshape(g.H, g.d, g.D).to(z.dtype)
            written = torch.einsum("bthe,heD->bhtD", z.view(B, T, g.H, g.d), per_head)
            for h in range(g.H):
                outputs[g.head_node(n, h)] = written[:, h]
        return hook

    def mlp_norm(n: int):
        def hook(module, args):
            x = args[0]
            base = x if corrupt is None or keep is None else corrupt.mlp_inputs[n].to(x.dtype)
            mlp_inputs[n] = built([g.mlp_receiver(n)], base)[:, 0]
            return (mlp_inputs[n], *args[1:])
        return hook

    def mlp_output(n: int):
        def hook(module, args, output):
            outputs[g.mlp_node(n)] = output[0] if isinstance(output, tuple) else output
        return hook

    def final_norm(module, args):
        x = args[0]
        base = x if corrupt is None or keep is None else corrupt.final_input.to(x.dtype)
        final["x"] = built([len(g.receivers) - 1], base)[:, 0]
        return (final["x"], *args[1:])

    hooks = [Hook(g.layers[0].block, "pre_kwargs", first_input), Hook(g.final_norm, "pre", final_norm)]
    for n, layer in enumerate(g.layers):
        hooks.append(Hook(layer.attention_norm, "pre", attention_norm(n)))
        for module in {id(m): m for m in layer.projections.values()}.values():
            hooks.append(Hook(module, "forward", projection(n)))
        hooks.append(Hook(layer.out, "pre", head_outputs(n)))
        hooks.append(Hook(layer.mlp_norm, "pre", mlp_norm(n)))
        hooks.append(Hook(layer.mlp, "forward", mlp_output(n)))
    with hooked(hooks):
        output = run_model(g.model, {**inputs, **last_logits(g.model)})  # only the last position's logits
    if any(o is None for o in outputs) or "x" not in final:
        raise UnsupportedArchitectureError(f"{type(g.model).__name__}: a piece of the residual graph was not called")
    return Run(outputs, attention_inputs, mlp_inputs, final["x"], output.logits[:, -1])


def receiver_gradients(g: Graph, inputs: dict, metric, *, embeddings: torch.Tensor | None = None) -> torch.Tensor:
    """∂M/∂x_r for every receiver r, through r alone: (receivers, T, D) float64, summed over the batch (the
    batch rows are separate runs, EAP-IG's steps). `metric` maps the logits at the last position (B, V) to M
    (B,)."""
    with torch.enable_grad():
        result = run(g, inputs, embeddings=embeddings)
        tensors = [*result.attention_inputs, *result.mlp_inputs, result.final_input]
        grads = torch.autograd.grad(metric(result.logits).sum(), tensors, allow_unused=True)
    del result, tensors
    L = len(g.layers)
    pending: list[torch.Tensor | None] = list(grads)
    del grads
    T = pending[-1].shape[1] if pending[-1] is not None else int(inputs["input_ids"].shape[1])
    out = torch.zeros(len(g.receivers), T, g.D, dtype=torch.float64)
    for n in range(L):  # each layer's gradients let go once copied
        a, pending[n] = pending[n], None
        if a is not None:
            out[list(g.attention_receivers(n))] = a.double().sum(0).cpu()
        m, pending[L + n] = pending[L + n], None
        if m is not None:
            out[g.mlp_receiver(n)] = m.double().sum(0).cpu()
        del a, m
    if pending[-1] is not None:
        out[-1] = pending[-1].double().sum(0).cpu()
    return out


def edge_scores(g: Graph, clean: Run, corrupt: Run, gradients: torch.Tensor) -> torch.Tensor:
    """Every edge's score (receivers, nodes), float64: (a_u^clean − a_u^corrupt) · ∂M/∂x_r summed over positions
    and width; 0 where u does not write before r reads."""
    flat = gradients.reshape(len(gradients), -1)  # (R, T·D), a view
    scores = torch.zeros(len(gradients), len(clean.outputs), dtype=torch.float64)
    for start in range(0, len(clean.outputs), SCORE_BLOCK):  # a block of nodes' changes at a time, in float64
        pairs = list(zip(clean.outputs, corrupt.outputs))[start:start + SCORE_BLOCK]
        change = torch.stack([(c[0].double() - k[0].double()).cpu().flatten() for c, k in pairs])
        scores[:, start:start + len(pairs)] = flat @ change.T
    reach = torch.tensor(g.reach)
    allowed = torch.arange(len(g.nodes))[None, :] < reach[:, None]
    return torch.where(allowed, scores, torch.zeros_like(scores))


def kept(g: Graph, scores: torch.Tensor, n: int) -> torch.Tensor:
    """The top-n edges by |score| (ties by order), as a (receivers, nodes) 0/1 mask."""
    reach = torch.tensor(g.reach)
    allowed = torch.arange(len(g.nodes))[None, :] < reach[:, None]
    magnitude = torch.where(allowed, scores.abs(), torch.full_like(scores, -1.0)).flatten()
    mask = torch.zeros_like(magnitude)
    if n > 0:
        order = torch.sort(magnitude, descending=True, stable=True).indices[:n]
        mask[order] = 1.0
    return mask.view(scores.shape)


def _logit_difference(logits: torch.Tensor, right: int, wrong: int) -> torch.Tensor:
    return logits[:, right].double() - logits[:, wrong].double()


def at_clean(g: Graph, first: dict, clean_run: Run, corrupt_run: Run, metric: Any) -> torch.Tensor:
    """EAP's gradients: at the clean run."""
    return receiver_gradients(g, first, metric)


def integrated(steps: int) -> Any:
    """EAP-IG's gradients: averaged over `steps` embeddings between the corrupted and the clean run's."""
    def gradients(g: Graph, first: dict, clean_run: Run, corrupt_run: Run, metric: Any) -> torch.Tensor:
        start, end = corrupt_run.outputs[0], clean_run.outputs[0]
        alphas = torch.arange(1, steps + 1, dtype=torch.float64) / steps
        embeddings = torch.stack([(start.double() + float(t) * (end.double() - start.double()))[0]
                                  for t in alphas]).to(start.dtype)
        batch = {key: value.expand(steps, *value.shape[1:]) if torch.is_tensor(value) else value
                 for key, value in first.items()}
        return receiver_gradients(g, batch, metric, embeddings=embeddings) / steps

    return gradients


def score_edges(g: Graph, prepared: Sequence[tuple[dict, dict, tuple[int, int]]], gradients: Any,
                step: Any) -> tuple[np.ndarray, float, float]:
    """Every edge's score summed over the pairs (clean inputs, corrupted inputs, (answer id, other id)), each pair's
    `gradients(g, clean inputs, clean run, corrupted run, metric)` (at_clean: EAP; integrated(steps): EAP-IG); with
    the sums of the clean and the corrupted logit differences. `step(1)` after each pair."""
    scores = torch.zeros(len(g.receivers), len(g.nodes), dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for first, second, (right, wrong) in prepared:
        def metric(logits, right=right, wrong=wrong):
            return _logit_difference(logits, right, wrong)

        with torch.inference_mode():
            clean_run, corrupt_run = run(g, first), run(g, second)
        clean_sum += float(metric(clean_run.logits)[0])
        corrupt_sum += float(metric(corrupt_run.logits)[0])
        scores += edge_scores(g, clean_run, corrupt_run, gradients(g, first, clean_run, corrupt_run, metric))
        step(1)
    return scores.numpy(), clean_sum, corrupt_sum


def circuit_sums(g: Graph, prepared: Sequence[tuple[dict, dict, tuple[int, int]]], scores: np.ndarray,
                 counts: Sequence[int], step: Any) -> dict[int, float]:
    """For each n in `counts`, the logit difference summed over the pairs when only the top-n edges by |score|
    carry the clean run (the rest the corrupted run's). `step(1)` after each run."""
    table = torch.from_numpy(np.asarray(scores, dtype=np.float64))
    masks = {n: kept(g, table, n) for n in counts}
    sums = {n: 0.0 for n in counts}
    for first, second, (right, wrong) in prepared:
        with torch.inference_mode():
            corrupt_run = run(g, second)
            for n in counts:
                logits = run(g, first, keep=masks[n], corrupt=corrupt_run).logits
                sums[n] += float(_logit_difference(logits, right, wrong)[0])
                step(1)
    return sums
