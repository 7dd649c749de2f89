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
    going down from `token`, every level keeps, for each token, the `top` strongest paths from it up to
    `token` (a product only grows with its suffix, so the strongest paths extend the strongest suffixes);
    about T² work a level. Strongest first; paths of weight 0 are left out."""
    L, T, _ = layers.shape
    top = max(1, int(top))
    weights = np.zeros((T, 1))  # (T, k): the strongest suffixes from each token at this level up to `token`
    weights[token, 0] = 1.0
    links = []  # per level going down: for each token and suffix (T, k), the token above and its suffix
    for layer in layers[::-1]:
        # a suffix from j here: an edge j -> i into the level above, then one of i's suffixes. Only the i whose
        # best suffix, times the edge, is among j's `top` largest can carry j's `top` strongest suffixes.
        k_above = weights.shape[1]
        edges = np.asarray(layer, np.float64).T  # (T_j, T_i)
        bound = edges * weights[None, :, 0]  # (T_j, T_i): each i's best suffix through the edge j -> i
        n = min(top, T)
        near = np.argpartition(-bound, n - 1, axis=1)[:, :n] if n < T else np.tile(np.arange(T), (T, 1))  # (T, n)
        grown = np.take_along_axis(edges, near, axis=1)[:, :, None] * weights[near]  # (T_j, n, k_above)
        flat = grown.reshape(T, -1)
        k = min(top, flat.shape[1])
        order = np.argsort(-flat, axis=1, kind="stable")[:, :k]  # (T, k), strongest first
        weights = np.take_along_axis(flat, order, axis=1)
        pick, kept = np.divmod(order, k_above)
        links.append((np.take_along_axis(near, pick, axis=1), kept))  # (token above, its suffix) per (j, slot)
    found = []
    for j in range(T):
        for slot in range(weights.shape[1]):
            if weights[j, slot] > 0:
                found.append((float(weights[j, slot]), j, slot))
    found.sort(key=lambda item: -item[0])
    paths = []
    for weight, j, slot in found[:top]:
        path = [j]
        for above, suffix in reversed(links):  # up from the input: which token above, and which of its suffixes
            j, slot = int(above[path[-1], slot]), int(suffix[path[-1], slot])
            path.append(j)
        paths.append((weight, tuple(path)))
    return paths
