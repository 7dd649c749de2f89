"""What a head does, tested by taking it away (head ablation).

Head h of layer l adds z_h · W_O^h to its attention block's output, where z_h (T, d) is the head's α·V and
W_O^h the head's slice of the output projection's input columns. Removing the head replaces z_h, where the
output projection receives it, by 0 (zero ablation) or by its mean over positions (mean ablation: over the
text's tokens, or over the texts of a corpus file), with a forward pre-hook on the output projection: the same
seam for every family with an adapter (engine/fromscratch/adapters.py names each family's W_O).

    clean run (each W_O's input recorded: the means) -> the run with the heads removed (α kept)
        -> causal LM: next-token distributions (KL per position, top token before and after)
           encoder: the sentence embedding (mean over tokens, as sentence-transformers pools it) and each
           token's final hidden state
        -> Δα of every later layer

`importance` removes every head alone, batched: one forward pass grows its batch layer by layer (at layer l
it appends one copy of the clean hidden state per head of l, each with that head removed), so the layers
below l run once instead of once per head, and the copies run together. Beside it the gradient estimate of
Michel et al. 2019: a gate ξ_h on each head's z_h, |∂loss/∂ξ_h| at ξ = 1 (a causal LM's next-token loss), or
for an encoder ‖∂ê/∂ξ_h‖, the first-order size of the normalised embedding's change (its exact Jacobian).

The second mechanism the tests hold the hook to: `weights_removed` edits the output projection's weights (the
head's columns zeroed; for mean ablation W_O^h·m_h moved into the bias).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.errors import InputError, UnsupportedArchitectureError, arg

MODES = ("zero", "mean")
OUTPUT_BYTES = 256 << 20  # logits (or hidden states) of the batched copies held at once in importance
ATTENTION_BYTES = 1 << 30  # what the copies' eager attention may take at once (3 × H·T² float32 each per layer)
JACOBIAN_BATCH = 64  # copies per backward pass for an encoder's embedding Jacobian, at most


def copies_that_fit(where: Site, T: int, width: int, *, backward: bool = False) -> int:
    """How many copies of a T-token input one batched pass may hold: their outputs (T × width float32) within
    OUTPUT_BYTES and their attention (3 · H · T² float32 per layer at a time, every layer when a backward pass
    keeps them) within ATTENTION_BYTES; at least 1."""
    attention = 3 * where.heads * T * T * 4 * (where.layers if backward else 1)
    return max(1, min(OUTPUT_BYTES // max(T * width * 4, 1), ATTENTION_BYTES // max(attention, 1)))


# --- where heads are removed ---------------------------------------------------------------------------


@dataclass
class Site:
    """A model's output projections (per layer W_O, Linear or GPT-2's Conv1D) and layer blocks, and the head
    split of each projection's input (H heads of d)."""

    model: torch.nn.Module
    projections: list
    blocks: list
    heads: int
    dims: list[int]  # per layer, d: the projection's input is H·d wide

    @property
    def layers(self) -> int:
        return len(self.projections)


def _in_features(module) -> int:
    if isinstance(module, torch.nn.Linear):
        return int(module.in_features)
    return int(module.weight.shape[0])  # Conv1D: x @ W + b, W (D_in, D_out)


def site(model) -> Site:
    """Where `model`'s heads can be removed; a family without an adapter is refused in one line."""
    from attnviz.engine.fromscratch.adapters import adapter_for
    from attnviz.engine.loading import layers_and_heads

    base = getattr(model, "base_model", model)
    if getattr(base.config, "is_encoder_decoder", False):
        raise UnsupportedArchitectureError("ablate, importance and detect take encoder-only and decoder-only models "
                                           "(an encoder-decoder model has three kinds of attention)")
    adapter = adapter_for(base)
    projections = adapter.out_projections(base)
    modules = adapter.modules(base)
    _, heads = layers_and_heads(base.config)
    dims = []
    for n, projection in enumerate(projections):
        width = _in_features(projection)
        if width % heads:
            raise UnsupportedArchitectureError(f"layer {n}'s output projection takes {width} inputs, not a multiple "
                                               f"of its {heads} heads")
        dims.append(width // heads)
    return Site(model, projections, _blocks(base, modules), heads, dims)


def _blocks(base, modules: list) -> list:
    """Per layer, the layer block holding attention module n: an element of the model's list of layers."""
    for lst in base.modules():
        if isinstance(lst, torch.nn.ModuleList) and len(lst) == len(modules) and all(
                any(m is module for m in block.modules()) for block, module in zip(lst, modules)):
            return list(lst)
    raise UnsupportedArchitectureError("could not find the model's list of layers")


# A head edit sees one layer's W_O input as (B, T, H, d) and returns it changed.
Edit = Callable[[int, torch.Tensor], torch.Tensor]


@contextlib.contextmanager
def editing(where: Site, edit: Edit) -> Iterator[None]:
    """Forward pre-hooks on every output projection for the block: its input, split into heads, goes through
    `edit(layer, z)`. The hooks are removed when the block ends, whatever happens inside."""
    def make(layer: int):
        def hook(module, args):
            x = args[0]  # (B, T, H·d)
            z = x.reshape(*x.shape[:-1], where.heads, where.dims[layer])  # (B, T, H, d)
            return (edit(layer, z).reshape(x.shape), *args[1:])
        return hook

    handles = [p.register_forward_pre_hook(make(n)) for n, p in enumerate(where.projections)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def removal(removed: Sequence[tuple[int, int]], fills: list[torch.Tensor] | None) -> Edit:
    """Replace the heads `removed` ((layer, head) pairs) by 0, or by fills[layer][head] (H, d) for mean
    ablation. The other heads pass through exactly."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in removed:
        by_layer.setdefault(layer, []).append(head)

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        heads = by_layer.get(layer)
        if not heads:
            return z
        z = z.clone()
        z[..., heads, :] = 0.0 if fills is None else fills[layer][heads].to(z.dtype)
        return z

    return edit


@contextlib.contextmanager
def recording(where: Site) -> Iterator[list]:
    """Record each layer's W_O input (B, T, H, d) as the forward pass makes it; yields the list."""
    seen: list = [None] * where.layers

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        seen[layer] = z.detach()
        return z

    with editing(where, edit):
        yield seen


@contextlib.contextmanager
def weights_removed(where: Site, removed: Sequence[tuple[int, int]],
                    fills: list[torch.Tensor] | None = None) -> Iterator[None]:
    """The second mechanism: the heads removed by editing W_O itself for the block — head h's input columns
    set to 0 and, for mean ablation, W_O^h · m_h added to the bias. The weights are put back afterwards."""
    saved = []
    try:
        with torch.no_grad():
            for layer, head in removed:
                projection = where.projections[layer]
                d = where.dims[layer]
                cols = slice(head * d, (head + 1) * d)
                conv = not isinstance(projection, torch.nn.Linear)  # Conv1D: W (D_in, D_out)
                saved.append((projection, projection.weight.detach().clone(),
                              None if projection.bias is None else projection.bias.detach().clone()))
                w_h = (projection.weight[cols, :].T if conv else projection.weight[:, cols])  # (D_out, d)
                if fills is not None:
                    shift = w_h.float() @ fills[layer][head].float()  # (D_out,)
                    if projection.bias is None:
                        projection.bias = torch.nn.Parameter(torch.zeros_like(shift).to(projection.weight.dtype))
                    projection.bias += shift.to(projection.bias.dtype)
                if conv:
                    projection.weight[cols, :] = 0.0
                else:
                    projection.weight[:, cols] = 0.0
        yield
    finally:
        with torch.no_grad():
            for projection, weight, bias in reversed(saved):
                projection.weight.copy_(weight)
                if bias is None:
                    projection.bias = None
                else:
                    projection.bias.copy_(bias)


# --- one text: inputs, runs, what the model outputs ----------------------------------------------------


def is_causal_lm(model) -> bool:
    """A decoder with its language-model head (its outputs are next-token logits)."""
    from attnviz.engine.families import encoder_types

    config = model.config
    if getattr(config, "is_encoder_decoder", False) or str(getattr(config, "model_type", "")) in encoder_types():
        return False
    heads = getattr(model, "get_output_embeddings", None)
    return callable(heads) and heads() is not None


def _run(model, inputs: dict, *, attentions: bool = False):
    kwargs = dict(inputs)
    if attentions:
        kwargs["output_attentions"] = True
    return model(**kwargs, use_cache=False) if "use_cache" in _params(model) else model(**kwargs)


def _params(model) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def outputs_of(output, causal: bool) -> torch.Tensor:
    """What the comparison reads: the logits (B, T, V) of a causal LM, else the last hidden state (B, T, D)."""
    if causal:
        return output.logits.float()
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None:
        hidden = output.hidden_states[-1]
    return hidden.float()


def embedding(hidden: torch.Tensor) -> torch.Tensor:
    """The sentence embedding as sentence-transformers pools these models: the mean over the tokens, made unit
    length (B, T, D) -> (B, D)."""
    pooled = hidden.mean(dim=1)
    return pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def head_means(where: Site, runs: Sequence[dict]) -> list[torch.Tensor]:
    """Per layer (H, d): each head's z_h averaged over every token of the inputs `runs` (the clean model)."""
    sums: list[torch.Tensor | None] = [None] * where.layers
    count = 0
    with torch.inference_mode():
        for inputs in runs:
            with recording(where) as seen:
                _run(where.model, inputs)
            for n, z in enumerate(seen):
                if z is None:
                    raise UnsupportedArchitectureError(f"layer {n}'s output projection was not called")
                total = z.double().sum(dim=(0, 1))  # (H, d)
                sums[n] = total if sums[n] is None else sums[n] + total
            count += int(inputs["input_ids"].numel())
    return [(s / max(count, 1)).float() for s in sums if s is not None]


@dataclass
class Ablation:
    """One text with heads removed, against the clean model.

    kind        "causal" or "encoder"
    alpha       (L, H, T, T) float32 of the clean run and of the run with the heads removed
    causal: per position i (predicting token i + 1): kl (T,) KL(p_clean ‖ p_removed) in nats, top_before/
    top_after (T,) token ids, p_top (T, 2) the clean top token's probability before and after, loss (2,) the
    mean next-token loss (nats) before and after, top5 (T, 2, 5) ids and probs5 (T, 2, 5)
    encoder: cosine of the sentence embeddings before and after, token_cosine (T,) each token's final hidden
    states before and after, token_change (T,) ‖Δh‖ / ‖h‖
    check       max |Δ| of the outputs between the hook and the weights edited (the second mechanism)"""

    removed: list[tuple[int, int]]
    mode: str
    kind: str
    alpha_clean: np.ndarray
    alpha_removed: np.ndarray
    check: float
    scale: float  # the outputs' largest |value| (what check is relative to)
    kl: np.ndarray | None = None
    top_before: np.ndarray | None = None
    top_after: np.ndarray | None = None
    p_top: np.ndarray | None = None
    loss: tuple[float, float] | None = None
    top5: np.ndarray | None = None
    probs5: np.ndarray | None = None
    cosine: float | None = None
    token_cosine: np.ndarray | None = None
    token_change: np.ndarray | None = None
    means_from: str = ""
    tokens: list[str] = field(default_factory=list)  # readable, (T,)
    token_ids: list[int] = field(default_factory=list)
    model: str = ""
    text: str = ""

    @property
    def first_layer(self) -> int:
        return min(layer for layer, _ in self.removed)


def _alpha(output) -> np.ndarray:
    return np.stack([a[0].float().cpu().numpy() for a in output.attentions])  # (L, H, T, T)


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) of each element's next tokens: logits (B, T, V), ids (1, T) -> (B,)"""
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)  # (B, T-1, V)
    target = ids[:, 1:].expand(logp.shape[0], -1)  # (B, T-1)
    return -logp.gather(-1, target[..., None])[..., 0].mean(dim=-1)


def kl_rows(clean: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """KL(p_clean ‖ p_removed) per position, nats: logits (1, T, V) and (B, T, V) -> (B, T)"""
    lp, lq = torch.log_softmax(clean.double(), dim=-1), torch.log_softmax(removed.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(dim=-1)


def ablate(where: Site, inputs: dict, removed: Sequence[tuple[int, int]], *, mode: str = "zero",
           fills: list[torch.Tensor] | None = None, means_from: str = "the text") -> Ablation:
    """The text `inputs` (batch of 1) through the clean model and with the heads `removed` taken away."""
    if mode not in MODES:
        raise InputError(f"{arg('mode')} must be one of {', '.join(MODES)}, not {mode!r}")
    if not removed:
        raise InputError(f"no heads to remove: name them with {arg('heads')} 5.11,3.0, or {arg('layer')} and "
                         f"{arg('head')}", "heads")
    model = where.model
    causal = is_causal_lm(model)
    if mode == "mean" and fills is None:
        fills = head_means(where, [inputs])
    edit_fills = fills if mode == "mean" else None
    with torch.inference_mode():
        clean_out = _run(model, inputs, attentions=True)
        with editing(where, removal(removed, edit_fills)):
            removed_out = _run(model, inputs, attentions=True)
        with weights_removed(where, removed, edit_fills):
            edited = outputs_of(_run(model, inputs), causal)
    clean, after = outputs_of(clean_out, causal), outputs_of(removed_out, causal)
    result = Ablation(list(removed), mode, "causal" if causal else "encoder", _alpha(clean_out), _alpha(removed_out),
                      check=float((after - edited).abs().max()), scale=float(after.abs().max()),
                      means_from=means_from if mode == "mean" else "")
    if causal:
        ids = inputs["input_ids"]
        kl = kl_rows(clean, after)[0]
        p, q = torch.softmax(clean[0].double(), -1), torch.softmax(after[0].double(), -1)  # (T, V)
        top = p.argmax(-1)
        top5p, top5 = p.topk(5, dim=-1)
        top5q, top5_after = q.topk(5, dim=-1)
        loss = next_token_loss(torch.cat([clean, after]), ids) if ids.shape[1] > 1 else torch.zeros(2)
        result.kl = kl.cpu().numpy()
        result.top_before, result.top_after = top.cpu().numpy(), q.argmax(-1).cpu().numpy()
        result.p_top = torch.stack([p.gather(-1, top[:, None])[:, 0], q.gather(-1, top[:, None])[:, 0]],
                                   -1).cpu().numpy()
        result.loss = (float(loss[0]), float(loss[1]))
        result.top5 = torch.stack([top5, top5_after], 1).cpu().numpy()
        result.probs5 = torch.stack([top5p, top5q], 1).cpu().numpy()
    else:
        e0, e1 = embedding(clean), embedding(after)
        result.cosine = float((e0 * e1).sum())
        h0, h1 = clean[0].double(), after[0].double()  # (T, D)
        result.token_cosine = torch.nn.functional.cosine_similarity(h0, h1, dim=-1).cpu().numpy()
        result.token_change = ((h1 - h0).norm(dim=-1) / h0.norm(dim=-1).clamp_min(1e-12)).cpu().numpy()
    return result


# --- every head alone: importance ----------------------------------------------------------------------


@dataclass
class Importance:
    """Every head removed alone, over one or more texts (means over the texts).

    effect    (L, H): causal LM, the mean over positions of KL(p_clean ‖ p_removed), nats; encoder,
              ‖ê_removed − ê_clean‖ of the unit sentence embeddings (= √(2(1 − cos)))
    loss      (L, H) causal only: the next-token loss with the head removed minus the clean loss, nats
    gradient  (L, H): |∂loss/∂ξ_h| (causal) or ‖∂ê/∂ξ_h‖ (encoder) at ξ = 1, Michel et al. 2019
    estimated (L, H): what the gradient estimates to first order: |Δloss| (causal) or ‖Δê‖ (encoder)"""

    kind: str
    mode: str
    effect: np.ndarray
    gradient: np.ndarray
    estimated: np.ndarray
    loss: np.ndarray | None = None
    texts: int = 1
    tokens: int = 0
    clean_loss: float | None = None


def _pairs(L: int, H: int) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(L) for head in range(H)]


def removal_outputs(where: Site, inputs: dict, pairs: Sequence[tuple[int, int]],
                    fills: list[torch.Tensor] | None, causal: bool) -> torch.Tensor:
    """The outputs with each of `pairs` removed alone, in one forward pass: element 0 is the clean model,
    element 1 + n has pairs[n] removed (B = 1 + len(pairs), T, V or D). `pairs` must be in layer order. The
    batch grows at each layer block: a copy of the clean element per head of that layer, so the layers below
    run once."""
    order = [layer for layer, _ in pairs]
    if order != sorted(order):
        raise ValueError("pairs must be in layer order")
    start: dict[int, int] = {}
    by_layer: dict[int, list[int]] = {}
    for n, (layer, head) in enumerate(pairs):
        start.setdefault(layer, 1 + n)
        by_layer.setdefault(layer, []).append(head)

    def grow(module, args, kwargs):
        layer = blocks.index(module)
        if layer not in by_layer:
            return None
        if args:
            hidden = args[0]
            more = hidden[:1].expand(len(by_layer[layer]), *hidden.shape[1:])
            return (torch.cat([hidden, more]), *args[1:]), kwargs
        name = next(k for k in ("hidden_states", "x", "hidden_state") if k in kwargs)
        hidden = kwargs[name]
        more = hidden[:1].expand(len(by_layer[layer]), *hidden.shape[1:])
        return args, {**kwargs, name: torch.cat([hidden, more])}

    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        heads = by_layer.get(layer)
        if not heads:
            return z
        z = z.clone()
        rows = torch.arange(start[layer], start[layer] + len(heads), device=z.device)
        cols = torch.tensor(heads, device=z.device)
        z[rows, :, cols] = 0.0 if fills is None else fills[layer][cols].to(z.dtype)[:, None, :]
        return z

    blocks = where.blocks
    handles = [b.register_forward_pre_hook(grow, with_kwargs=True) for b in blocks]
    try:
        with editing(where, edit), torch.inference_mode():
            out = outputs_of(_run(where.model, inputs), causal)
    finally:
        for handle in handles:
            handle.remove()
    if out.shape[0] != 1 + len(pairs):
        raise UnsupportedArchitectureError(f"{type(where.model).__name__} did not keep the batch it was given "
                                           f"({out.shape[0]} outputs for {1 + len(pairs)})")
    return out


def _measures(clean: torch.Tensor, outs: torch.Tensor, causal: bool, ids: torch.Tensor
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(effect, Δloss, estimated) of each element of `outs` against `clean` (1, T, ·)."""
    if causal:
        kl = kl_rows(clean, outs).mean(dim=-1)
        if ids.shape[1] > 1:
            loss = next_token_loss(outs, ids) - next_token_loss(clean, ids)
        else:
            loss = torch.zeros(outs.shape[0], dtype=torch.float64)
        return kl.cpu().numpy(), loss.cpu().numpy(), loss.abs().cpu().numpy()
    change = (embedding(outs) - embedding(clean)).double().norm(dim=-1).cpu().numpy()
    return change, None, change


def importance(where: Site, texts: Sequence[dict], *, mode: str = "zero", fills: list[torch.Tensor] | None = None,
               batched: bool = True, gradient: bool = True, on_text: Callable[[int], None] | None = None
               ) -> Importance:
    """Every head removed alone on each input of `texts` (batches of 1), and (`gradient`) the gradient estimate,
    averaged over the texts. `batched=False` runs one forward pass per head (the loop the batched path must
    equal)."""
    causal = is_causal_lm(where.model)
    L, H = where.layers, where.heads
    if mode == "mean" and fills is None:
        fills = head_means(where, texts)
    used = fills if mode == "mean" else None
    pairs = _pairs(L, H)
    effect, estimated = np.zeros((L, H)), np.zeros((L, H))
    loss = np.zeros((L, H)) if causal else None
    scores = np.zeros((L, H))
    clean_losses, tokens = [], 0
    for inputs in texts:
        ids = inputs["input_ids"]
        T = ids.shape[1]
        tokens += T
        with torch.inference_mode():
            clean = outputs_of(_run(where.model, inputs), causal)
        if causal and T > 1:
            clean_losses.append(float(next_token_loss(clean, ids)[0]))
        values = []
        if batched:
            size = max(1, copies_that_fit(where, T, clean.shape[-1]) - 1)
            for at in range(0, len(pairs), size):
                chunk = pairs[at:at + size]
                outs = removal_outputs(where, inputs, chunk, used, causal)
                values.append(_measures(clean, outs[1:], causal, ids))
        else:
            for pair in pairs:
                with editing(where, removal([pair], used)), torch.inference_mode():
                    outs = outputs_of(_run(where.model, inputs), causal)
                values.append(_measures(clean, outs, causal, ids))
        effect += np.concatenate([v[0] for v in values]).reshape(L, H)
        estimated += np.concatenate([v[2] for v in values]).reshape(L, H)
        if loss is not None:
            loss += np.concatenate([v[1] for v in values if v[1] is not None]).reshape(L, H)
        if gradient:
            scores += gradient_scores(where, inputs, causal, used)
        if on_text is not None:
            on_text(1)
    n = max(len(texts), 1)
    return Importance("causal" if causal else "encoder", mode, effect / n, scores / n, estimated / n,
                      None if loss is None else loss / n, texts=len(texts), tokens=tokens,
                      clean_loss=float(np.mean(clean_losses)) if clean_losses else None)


def _gated(where: Site, gate: torch.Tensor, fills: list[torch.Tensor] | None) -> Edit:
    """z_h -> m_h + ξ_h (z_h − m_h) with a gate (B, L, H) per element (m = 0 for zero ablation)."""
    def edit(layer: int, z: torch.Tensor) -> torch.Tensor:
        xi = gate[:, layer][:, None, :, None].to(z.dtype)  # (B, 1, H, 1)
        if fills is None:
            return z * xi
        m = fills[layer].to(z.dtype)  # (H, d)
        return m + xi * (z - m)
    return edit


def gradient_scores(where: Site, inputs: dict, causal: bool, fills: list[torch.Tensor] | None) -> np.ndarray:
    """Michel et al. 2019's estimate, (L, H): |∂loss/∂ξ_h| for a causal LM's next-token loss; for an encoder,
    ‖∂ê/∂ξ_h‖ from the exact Jacobian of the unit sentence embedding ê (one backward pass per embedding
    dimension, JACOBIAN_BATCH of them batched)."""
    L, H = where.layers, where.heads
    model = where.model
    ids = inputs["input_ids"]
    with torch.enable_grad():
        if causal:
            if ids.shape[1] < 2:
                return np.zeros((L, H))
            gate = torch.ones(1, L, H, dtype=torch.float64, requires_grad=True)
            with editing(where, _gated(where, gate, fills)):
                loss = next_token_loss(outputs_of(_run(model, inputs), True), ids)[0]
            loss.backward()
            assert gate.grad is not None
            return gate.grad[0].abs().cpu().numpy()
        D = None
        squares = torch.zeros(L, H, dtype=torch.float64)
        done = 0
        fit = min(JACOBIAN_BATCH, copies_that_fit(where, int(ids.shape[1]), 1, backward=True))
        while D is None or done < D:
            n = fit if D is None else min(fit, D - done)
            batch = {k: v.expand(n, *v.shape[1:]) for k, v in inputs.items()}
            gate = torch.ones(n, L, H, dtype=torch.float64, requires_grad=True)
            with editing(where, _gated(where, gate, fills)):
                e = embedding(outputs_of(_run(model, batch), False))  # (n, D)
            D = D or e.shape[-1]
            n = min(n, D - done)
            picked = e[torch.arange(n), torch.arange(done, done + n)]  # element b: ê's dimension done + b
            picked.sum().backward()
            assert gate.grad is not None
            squares += gate.grad[:n].pow(2).sum(dim=0).cpu()
            done += n
        return squares.sqrt().numpy()


# --- detectors on controlled inputs ----------------------------------------------------------------------


@dataclass
class Repeated:
    """A random token sequence repeated (Olsson et al. 2022): [BOS] + s + s, s of n random ordinary tokens."""

    ids: list[int]
    n: int
    bos: bool
    seed: int

    @property
    def second_half(self) -> slice:
        """The positions of the repeat (whose next tokens an induction head can predict)."""
        first = 1 if self.bos else 0
        return slice(first + self.n, first + 2 * self.n)


def repeated_sequence(tokenizer, n: int, seed: int = 0) -> Repeated:
    """n distinct random tokens that are not special, not pieces of a multi-byte character, repeated once; BOS
    first where the tokenizer has one."""
    from attnviz.tokens import special_ids

    special = special_ids(tokenizer)
    vocab = len(tokenizer)
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    tries = 0
    while len(chosen) < n and tries < 50 * n + 1000:
        tries += 1
        i = int(rng.integers(0, vocab))
        if i in special or i in chosen:
            continue
        text = tokenizer.decode([i])
        if not text.strip() or "\ufffd" in text or not text.isprintable():
            continue
        chosen.append(i)
    if len(chosen) < n:
        raise InputError(f"the tokenizer has too few ordinary tokens for a random sequence of {n}")
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        bos = getattr(tokenizer, "cls_token_id", None)
    lead = [int(bos)] if isinstance(bos, int) else []
    return Repeated(lead + chosen + chosen, n, bool(lead), seed)


@dataclass
class Causal:
    """Removing detected heads against removing as many random heads: the loss on the repeated half."""

    heads: list[tuple[int, int]]
    clean: float
    removed: float
    random: list[float] = field(default_factory=list)
    random_heads: list[list[tuple[int, int]]] = field(default_factory=list)


def repeat_loss(where: Site, inputs: dict, half: slice, removed: Sequence[tuple[int, int]],
                fills: list[torch.Tensor] | None = None) -> float:
    """The mean next-token loss (nats) over the positions of the repeat, with `removed` taken away."""
    ids = inputs["input_ids"]
    with editing(where, removal(removed, fills)), torch.inference_mode():
        logits = outputs_of(_run(where.model, inputs), True)[0].double()  # (T, V)
    logp = torch.log_softmax(logits, -1)
    positions = torch.arange(half.start - 1, half.stop - 1)  # each predicts the next token, inside the repeat
    return float(-logp[positions, ids[0, positions + 1]].mean())


def causal_test(where: Site, inputs: dict, half: slice, heads: Sequence[tuple[int, int]], draws: int = 10,
                seed: int = 0, fills: list[torch.Tensor] | None = None) -> Causal:
    """The loss on the repeat: clean, with `heads` removed, and with as many random other heads removed
    (`draws` times); `fills` for mean ablation."""
    rng = np.random.default_rng(seed)
    others = [p for p in _pairs(where.layers, where.heads) if p not in set(heads)]
    result = Causal(list(heads), repeat_loss(where, inputs, half, []), repeat_loss(where, inputs, half, heads, fills))
    k = min(len(heads), len(others))
    for _ in range(draws if k else 0):
        picked = [others[i] for i in sorted(rng.choice(len(others), size=k, replace=False))]
        result.random_heads.append(picked)
        result.random.append(repeat_loss(where, inputs, half, picked, fills))
    return result


@dataclass
class Detection:
    """Previous-token, duplicate-token and induction scores of every head on repeated random sequences.

    scores    name -> (L, H): TransformerLens's head-detector score, Σ α⊙P / Σ α over the whole matrix (its
              defaults: error measure "mul", BOS and the current token not excluded), mean over the sequences
    shares    name -> (L, H): the same weight as a mean over the rows that have a target (what `heads` labels
              use; previous-token: over rows i ≥ 1)
    detected  name -> heads whose share passes the threshold, strongest first
    causal    the loss on the repeats with the detected induction heads removed, against random heads (causal
              LMs only)"""

    length: int
    sequences: int
    seed: int
    scores: dict[str, np.ndarray]
    shares: dict[str, np.ndarray]
    detected: dict[str, list[tuple[int, int]]]
    thresholds: dict[str, float]
    tokens: list[str]  # the first sequence, readable
    causal: Causal | None = None


def detection(loaded, where: Site, *, length: int = 50, sequences: int = 4, seed: int = 0, draws: int = 10,
              mode: str = "zero", on_step: Callable[[int], None] | None = None) -> Detection:
    """The three detectors on `sequences` random sequences of `length` tokens repeated once, and (for a causal
    LM) the causal test on the same sequences."""
    from attnviz.engine.loading import forward_args
    from attnviz.metrics import POSITIONAL_MIN, REPEAT_MIN, detector_scores

    thresholds = {"previous-token": POSITIONAL_MIN, "duplicate-token": REPEAT_MIN, "induction": REPEAT_MIN}
    causal_lm = is_causal_lm(where.model)
    device = next(where.model.parameters()).device
    runs = []
    score_sums: dict[str, np.ndarray] = {}
    share_sums: dict[str, np.ndarray] = {}
    for n in range(sequences):
        seq = repeated_sequence(loaded.tokenizer, length, seed + n)
        ids = torch.tensor([seq.ids], device=device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "token_type_ids" in forward_args(where.model):
            inputs["token_type_ids"] = torch.zeros_like(ids)
        with torch.inference_mode():
            alpha = _alpha(_run(where.model, inputs, attentions=True)).astype(np.float64)
        for name, (score, share) in detector_scores(alpha, np.asarray(seq.ids)).items():
            score_sums[name] = score_sums.get(name, 0) + score
            share_sums[name] = share_sums.get(name, 0) + share
        runs.append((seq, inputs))
        if on_step is not None:
            on_step(1)
    scores = {k: v / sequences for k, v in score_sums.items()}
    shares = {k: v / sequences for k, v in share_sums.items()}
    detected = {}
    for name, share in shares.items():
        passed = np.argwhere(share >= thresholds[name])
        detected[name] = sorted(((int(a), int(b)) for a, b in passed), key=lambda p: -share[p])
    first = runs[0][0]
    tokens = [loaded.tokenizer.decode([i]) for i in first.ids]
    result = Detection(length, sequences, seed, scores, shares, detected, thresholds, tokens)
    if causal_lm and detected["induction"]:
        fills = head_means(where, [inputs for _, inputs in runs]) if mode == "mean" else None
        # the same seed for every sequence: draw k removes the same random heads from each
        tests = [causal_test(where, inputs, seq.second_half, detected["induction"], draws, seed, fills)
                 for seq, inputs in runs]
        result.causal = Causal(detected["induction"], float(np.mean([t.clean for t in tests])),
                               float(np.mean([t.removed for t in tests])),
                               [float(np.mean([t.random[k] for t in tests])) for k in range(len(tests[0].random))],
                               tests[0].random_heads)
    return result

