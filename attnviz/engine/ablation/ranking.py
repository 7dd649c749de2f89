"""Every head removed alone, batched layer by layer, beside the gradient estimate of Michel et al. 2019.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnviz.engine.hooks import Hook, hooked
from attnviz.errors import UnsupportedArchitectureError

from attnviz.engine.ablation.seam import Site, copies_that_fit, editing, every_head, gated, removal
from attnviz.engine.ablation.runs import embedding, head_means, is_causal_lm, outputs_of, run_model
from attnviz.engine.ablation.removing import kl_rows, next_token_loss
from attnviz.progress import Reporter

if TYPE_CHECKING:
    from attnviz.engine.ablation.ranking_lean import LeanPlan

JACOBIAN_BATCH = 64  # copies per backward pass for an encoder's embedding Jacobian, at most



# --- every head alone: importance ----------------------------------------------------------------------


@dataclass
class ImportanceRun:
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
    lean: bool = False  # ran on the long path: without α (engine/ablation/ranking_lean.py)


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
    with hooked([Hook(b, "pre_kwargs", grow) for b in blocks]):
        with editing(where, edit), torch.inference_mode():
            out = outputs_of(run_model(where.model, inputs), causal)
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
               batched: bool = True, gradient: bool = True, reporter: Reporter | None = None,
               plan: LeanPlan | None = None) -> ImportanceRun:
    """Every head removed alone on each input of `texts` (batches of 1), and (`gradient`) the gradient estimate,
    averaged over the texts; each phase a bar on `reporter` (the removals counted in heads). `batched=False`
    runs one forward pass per head (the loop the batched path must equal). With `plan`, the long path
    (engine/ablation/ranking_lean.py): no α, the model's own SDPA attention, no T·V logits."""
    from attnviz.engine.ablation.ranking_lean import gradient_lean, removals_lean

    reporter = reporter or Reporter()
    causal = is_causal_lm(where.model)
    L, H = where.layers, where.heads
    if mode == "mean" and fills is None:
        if plan is not None:
            from attnviz.engine.lean import lean

            with lean(where.model):
                fills = head_means(where, texts)
        else:
            fills = head_means(where, texts)
    used = fills if mode == "mean" else None
    pairs = every_head(L, H)
    effect, estimated = np.zeros((L, H)), np.zeros((L, H))
    loss = np.zeros((L, H)) if causal else None
    scores = np.zeros((L, H))
    clean_losses, tokens = [], 0
    with reporter.progress("Removing every head", len(texts) * len(pairs), "heads") as step:
        for inputs in texts:
            ids = inputs["input_ids"]
            T = ids.shape[1]
            tokens += T
            if plan is not None:
                run_effect, run_loss, run_estimated, clean_loss = removals_lean(where, inputs, used, causal, plan,
                                                                                step)
                effect += run_effect
                estimated += run_estimated
                if loss is not None and run_loss is not None:
                    loss += run_loss
                if causal and T > 1 and clean_loss is not None:
                    clean_losses.append(clean_loss)
                continue
            with torch.inference_mode():
                clean = outputs_of(run_model(where.model, inputs), causal)
            if causal and T > 1:
                clean_losses.append(float(next_token_loss(clean, ids)[0]))
            values = []
            if batched:
                size = max(1, copies_that_fit(where, T, clean.shape[-1]) - 1)
                for at in range(0, len(pairs), size):
                    chunk = pairs[at:at + size]
                    outs = removal_outputs(where, inputs, chunk, used, causal)
                    values.append(_measures(clean, outs[1:], causal, ids))
                    step(len(chunk))
            else:
                for pair in pairs:
                    with editing(where, removal([pair], used)), torch.inference_mode():
                        outs = outputs_of(run_model(where.model, inputs), causal)
                    values.append(_measures(clean, outs, causal, ids))
                    step(1)
            effect += np.concatenate([v[0] for v in values]).reshape(L, H)
            estimated += np.concatenate([v[2] for v in values]).reshape(L, H)
            if loss is not None:
                loss += np.concatenate([v[1] for v in values if v[1] is not None]).reshape(L, H)
    if gradient:
        with reporter.progress("The gradient estimate (Michel et al.)", len(texts), "texts") as step:
            for inputs in texts:
                if plan is None:
                    scores += gradient_scores(where, inputs, causal, used)
                elif causal:
                    scores += gradient_lean(where, inputs, used, plan.recomputed, plan.keeping)
                else:  # an encoder's exact Jacobian, on SDPA with every block recomputed
                    from attnviz.engine.lean import lean

                    with lean(where.model, where.blocks, grad=True, keeping=plan.keeping):
                        scores += gradient_scores(where, inputs, causal, used)
                step(1)
    n = max(len(texts), 1)
    return ImportanceRun("causal" if causal else "encoder", mode, effect / n, scores / n, estimated / n,
                         None if loss is None else loss / n, texts=len(texts), tokens=tokens,
                         clean_loss=float(np.mean(clean_losses)) if clean_losses else None, lean=plan is not None)


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
            with editing(where, gated(where, gate, fills)):
                loss = next_token_loss(outputs_of(run_model(model, inputs), True), ids)[0]
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
            with editing(where, gated(where, gate, fills)):  # the backward pass inside: on the long path the
                e = embedding(outputs_of(run_model(model, batch), False))  # (n, D)  recomputed blocks meet the gate
                D = D or e.shape[-1]
                n = min(n, D - done)
                picked = e[torch.arange(n), torch.arange(done, done + n)]  # element b: ê's dimension done + b
                picked.sum().backward()
            assert gate.grad is not None
            squares += gate.grad[:n].pow(2).sum(dim=0).cpu()
            done += n
        return squares.sqrt().numpy()


