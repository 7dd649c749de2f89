"""Attention rollout (Abnar & Zuidema 2020).
"""

from __future__ import annotations


import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import SelectionError, arg



# --- attention rollout (Abnar & Zuidema 2020) -----------------------------------------------------


def rollout(capture: Capture) -> np.ndarray:
    """Attention rollout: Â_l = rownorm(mean_h α_l + I) (the identity stands for the residual stream),
    R = Â_{L-1} ··· Â_1 Â_0. R[i, j] = how much of input token j reaches position i at the top. (T, T)
    For value-weighted norms each row is first made a distribution (its shares)."""
    if not capture.square:
        raise SelectionError("rollout follows self-attention through the layers; cross-attention has none to follow: "
                             f"use {arg('part')} encoder or {arg('part')} decoder", "part")
    capture = capture.as_distribution()
    T = capture.n_tokens
    result = np.eye(T)
    for layer in range(capture.n_layers):
        result = rollout_rows(capture.attentions[layer], np.arange(T)) @ result
    return result


def rollout_rows(alpha_rows: np.ndarray, at: np.ndarray) -> np.ndarray:
    """One layer's step of rollout for the query rows at positions `at`: Â = rownorm(mean_h α + I), the
    identity standing for the residual stream. The full rollout multiplies all of Â; the streamed path
    multiplies these rows a block at a time. α rows (H, b, T) -> Â rows (b, T), float64."""
    a = np.asarray(alpha_rows, np.float64).mean(axis=0)  # (b, T)
    a[np.arange(len(at)), at] += 1.0
    return a / a.sum(axis=-1, keepdims=True)




def strongest_paths(layers: np.ndarray, token: int, top: int = 5) -> list[tuple[float, tuple[int, ...]]]:
    """The `top` strongest paths through a stack of token-to-token matrices (L, T, T) into `token` at the top:
    each path is (weight, (j_0, j_1, …, j_L)) with j_0 the input token, j_L = `token`, and weight the product of
    the matrices' entries layers[l][j_(l+1), j_l] along it (a contribution graph's edges, ALTI's layers). Exact:
    every layer keeps, for each token, its `top` strongest paths from the input (a product only grows with its
    prefix, so the strongest paths extend the strongest prefixes). Strongest first."""
    L, T, _ = layers.shape
    best: list[list[tuple[float, tuple[int, ...]]]] = [[(1.0, (j,))] for j in range(T)]
    for layer in layers.astype(np.float64):
        grown = []
        for i in range(T):
            candidates = [(weight * float(layer[i, j]), (*path, i)) for j in range(T) if layer[i, j] > 0
                          for weight, path in best[j]]
            candidates.sort(key=lambda pair: -pair[0])
            grown.append(candidates[:top])
        best = grown
    return best[token]
