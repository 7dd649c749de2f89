"""Heads removed from one text: the next-token distributions or the embedding before and after, and Δα of
every later layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.errors import InputError, arg, UsageError

from attnviz.engine.ablation.seam import MODES, Site, editing, removal, weights_removed
from attnviz.engine.ablation.runs import alpha_of, embedding, head_means, is_causal_lm, outputs_of, run_model


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


