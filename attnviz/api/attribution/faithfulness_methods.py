"""faithfulness's methods: each attribution's scores for one prediction, integrated gradients' baseline token,
and f of every erased text run once (attnviz.faithfulness)."""

from __future__ import annotations

import numpy as np

from attnviz.errors import UnsupportedArchitectureError
from attnviz.progress import Reporter

__all__ = ["baseline_token", "distinct_f", "method_scores"]


def baseline_token(tokenizer) -> int | None:
    """Integrated gradients' baseline token: the padding token, else the unknown-word one, else the end of
    text (None: no such token; the zero vector then)."""
    for name in ("pad_token_id", "unk_token_id", "eos_token_id"):
        found = getattr(tokenizer, name, None)
        if isinstance(found, int) and 0 <= found < len(tokenizer):
            return found
    return None


def distinct_f(explained, subsets: list[np.ndarray], reporter: Reporter) -> np.ndarray:
    """f of every subset, each distinct one run once (bins of one size, and methods agreeing on their top
    tokens, erase the same ones), in batches of similar lengths (less padding)."""
    keys = [tuple(int(p) for p in subset) for subset in subsets]
    distinct = sorted(set(keys), key=len)
    with reporter.progress("Erasing tokens and running the model again", len(distinct), "texts") as step:
        found = explained.f([np.array(k, np.int64) for k in distinct], on_batch=step)
    value = dict(zip(distinct, found))
    return np.array([value[k] for k in keys])


def method_scores(name: str, explained, inputs: dict, erasable: np.ndarray,
                  steps: int) -> tuple[np.ndarray, tuple[float, float] | None]:
    """One method's scores (T,) for the model `explained` holds; for integrated gradients also completeness."""
    from attnviz.engine.attribution.faithfulness import (FLOW_ROWS, alti_logit_scores, contribution_layers,
                                                         gradient_scores)
    from attnviz.metrics.faithfulness import attention_flow, residual_attention, without

    rows = explained.rows()
    T = explained.T
    if name == "attention":
        return explained.alpha[-1].astype(np.float64).mean(0)[rows].mean(0), None
    if name in ("rollout", "flow"):
        layers = residual_attention(explained.alpha)
        if name == "flow":
            spread = rows if len(rows) <= FLOW_ROWS else \
                rows[np.unique(np.linspace(0, len(rows) - 1, FLOW_ROWS).round().astype(int))]
            return attention_flow(layers, spread), None
        total = np.eye(T)
        for layer in layers:
            total = layer @ total
        return total[rows].mean(0), None
    if name in ("alti", "value-zeroing"):
        total = np.eye(T)
        for layer in contribution_layers(explained.model, inputs, name):
            total = layer @ total
        return total[rows].mean(0), None
    if name == "alti-logit":
        found = alti_logit_scores(explained.model, inputs, explained.target)
        if found is None:
            raise UnsupportedArchitectureError("ALTI does not split this family's blocks")
        return found, None
    if name in ("grad-x-input", "integrated-gradients"):
        import importlib.util

        if importlib.util.find_spec("captum") is None:
            raise UnsupportedArchitectureError(f"{name} needs Captum: pip install \"attnviz[trust]\"")
        attributed, summed, gap = gradient_scores(explained, name, erasable, steps=steps,
                                                  baseline_id=explained.baseline_id)
        return attributed, (None if summed is None or gap is None else (summed, gap))
    assert name == "loo"
    values = np.zeros(T)
    values[erasable] = explained.f_full - explained.f([without(T, np.array([i])) for i in erasable])
    return values, None
