"""Heads removed from one text: the next-token distributions or the embedding before and after, and Δα of
every later layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from attnviz.errors import InputError, arg, UsageError

from attnviz.engine.ablation.seam import MODES, Site, editing, removal, weights_removed
from attnviz.engine.ablation.runs import (alpha_of, embedding, head_means, is_causal_lm, last_logits, outputs_of,
                                        run_model)


@dataclass
class AblationRun:
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
    alpha_clean: np.ndarray | None  # None: ran without α (ablate_lean)
    alpha_removed: np.ndarray | None
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
           fills: list[torch.Tensor] | None = None, means_from: str = "the text") -> AblationRun:
    """The text `inputs` (batch of 1) through the clean model and with the heads `removed` taken away."""
    if mode not in MODES:
        raise UsageError(f"{arg('mode')} must be one of {', '.join(MODES)}, not {mode!r}", "mode")
    if not removed:
        raise InputError(f"no heads to remove: name them with {arg('heads')} 5.11,3.0, or {arg('layer')} and "
                         f"{arg('head')}", "heads")
    model = where.model
    causal = is_causal_lm(model)
    if mode == "mean" and fills is None:
        fills = head_means(where, [inputs])
    edit_fills = fills if mode == "mean" else None
    with torch.inference_mode():
        clean_out = run_model(model, inputs, attentions=True)
        with editing(where, removal(removed, edit_fills)):
            removed_out = run_model(model, inputs, attentions=True)
        with weights_removed(where, removed, edit_fills):
            edited = outputs_of(run_model(model, inputs), causal)
    clean, after = outputs_of(clean_out, causal), outputs_of(removed_out, causal)
    result = AblationRun(list(removed), mode, "causal" if causal else "encoder", alpha_of(clean_out),
                      alpha_of(removed_out), check=float((after - edited).abs().max()), scale=float(after.abs().max()),
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




DISTRIBUTION_BYTES = 16 << 20  # the long path: each (positions, V) float64 tensor of next-token distributions made
                               # at once holds about this much


def distribution_positions(V: int) -> int:
    """How many positions' next-token distributions the long path makes at once."""
    return max(1, DISTRIBUTION_BYTES // (8 * V))


def ablate_lean(where: Site, inputs: dict, removed: Sequence[tuple[int, int]], *, mode: str = "zero",
                fills: list[torch.Tensor] | None = None, means_from: str = "the text") -> AblationRun:
    """ablate() on the long path (engine/lean.py): the three runs (clean, heads removed, weights edited) on the
    model's own SDPA attention, each keeping only its final states (a causal LM's final norm output, (T, D),
    its logits made at the last position only; an encoder's last hidden state), the next-token distributions
    then made a block of positions at a time. No α: `alpha_clean` and `alpha_removed` are None (no Δα)."""
    import contextlib

    from attnviz.engine.attribution.lens import _head
    from attnviz.engine.hooks import Hook, hooked
    from attnviz.engine.lean import lean
    from attnviz.engine.points import final_norm

    if not removed:
        raise InputError(f"no heads to remove: name them with {arg('heads')} 5.11,3.0, or {arg('layer')} and "
                         f"{arg('head')}", "heads")
    model = where.model
    causal = is_causal_lm(model)
    states: list[torch.Tensor] = []
    kept: dict = {}
    norm = final_norm(getattr(model, "base_model", model)) if causal else None

    def keep(module, args, output):
        kept["x"] = (output[0] if isinstance(output, tuple) else output)[0]

    with lean(model), torch.inference_mode():
        if mode == "mean" and fills is None:
            fills = head_means(where, [inputs])
        edit_fills = fills if mode == "mean" else None
        for intervention in (contextlib.nullcontext(), editing(where, removal(removed, edit_fills)),
                             weights_removed(where, removed, edit_fills)):
            with intervention, hooked([Hook(norm, "forward", keep)] if causal else []):
                out = run_model(model, {**inputs, **(last_logits(model) if causal else {})})
            states.append(kept.pop("x") if causal else outputs_of(out, False)[0])
    clean, after, edited = states
    result = AblationRun(list(removed), mode, "causal" if causal else "encoder", None, None,
                         check=0.0, scale=0.0, means_from=means_from if mode == "mean" else "")
    if not causal:
        result.check, result.scale = float((after - edited).abs().max()), float(after.abs().max())
        e0, e1 = embedding(clean[None]), embedding(after[None])
        result.cosine = float((e0 * e1).sum())
        h0, h1 = clean.double(), after.double()
        result.token_cosine = torch.nn.functional.cosine_similarity(h0, h1, dim=-1).cpu().numpy()
        result.token_change = ((h1 - h0).norm(dim=-1) / h0.norm(dim=-1).clamp_min(1e-12)).cpu().numpy()
        return result
    head = _head(model, normed=True)
    ids = inputs["input_ids"][0]
    T = int(ids.shape[0])
    lm: Any = model
    V = int(lm.get_output_embeddings().weight.shape[0])
    step = distribution_positions(V)
    kl, top, top_after = np.zeros(T), np.zeros(T, np.int64), np.zeros(T, np.int64)
    p_top, top5, probs5 = np.zeros((T, 2)), np.zeros((T, 2, 5), np.int64), np.zeros((T, 2, 5))
    losses = [0.0, 0.0]
    check = scale = 0.0
    with torch.inference_mode():
        for start in range(0, T, step):
            at = slice(start, min(T, start + step))
            a, b = head(clean[at]), head(after[at])  # (c, V) float64
            check = max(check, float((b - head(edited[at])).abs().max()))
            scale = max(scale, float(b.abs().max()))
            lp, lq = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
            p, q = lp.exp(), lq.exp()
            kl[at] = (p * (lp - lq)).sum(-1).cpu().numpy()
            best = p.argmax(-1)
            top[at], top_after[at] = best.cpu().numpy(), q.argmax(-1).cpu().numpy()
            p_top[at] = torch.stack([p.gather(-1, best[:, None])[:, 0], q.gather(-1, best[:, None])[:, 0]],
                                    -1).cpu().numpy()
            for k, dist in enumerate((p, q)):
                values, which = dist.topk(5, dim=-1)
                top5[at, k], probs5[at, k] = which.cpu().numpy(), values.cpu().numpy()
            rows = torch.arange(at.start, at.stop, device=ids.device)
            rows = rows[rows < T - 1]  # the positions whose next token the text has
            if len(rows):
                nxt = ids[rows + 1].to(lp.device)
                for k, logp in enumerate((lp, lq)):
                    losses[k] -= float(logp[rows - at.start, nxt].sum())
    result.kl, result.top_before, result.top_after, result.p_top = kl, top, top_after, p_top
    result.loss = (losses[0] / (T - 1), losses[1] / (T - 1)) if T > 1 else (0.0, 0.0)
    result.top5, result.probs5 = top5, probs5
    result.check, result.scale = check, scale
    return result
