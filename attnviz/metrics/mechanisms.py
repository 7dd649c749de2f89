"""What happens inside a model, as pure functions of its arrays: massive activations (Sun et al. 2024) and the
model-level attention sink rate (Gu et al. 2024).

    massive_entries   hidden (L, T, D) -> each layer's median |h|, and the entries above both `minimum` and
                      `ratio` times that median (Sun et al.: over 100, and about 1000× the median)
    key_importance    α (…, T, T) -> per key the mean weight it receives from the queries that can see it
                      (causal: the T − j queries at or after it), Gu et al.'s compute_attention_sink
    sink_rate         the share of heads whose first key's importance passes ε: Sink₁^ε
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASSIVE_RATIO = 1000.0  # Sun et al. 2024: "about 1,000 times larger than the median"
MASSIVE_MINIMUM = 100.0  # and over 100 in magnitude
SINK_EPSILON = 0.3  # Gu et al. 2024's ε
TOP_ENTRIES = 3  # each layer's largest entries kept, massive or not


@dataclass(frozen=True)
class Entry:
    """One entry of a layer's hidden state: layer, token position, dimension, its value and |value| / median."""

    layer: int
    position: int
    dim: int
    value: float
    ratio: float


def layer_medians(hidden: np.ndarray) -> np.ndarray:
    """The median of |h| over every token and dimension of each layer. (L,) float64"""
    return np.median(np.abs(hidden.reshape(hidden.shape[0], -1)), axis=1).astype(np.float64)


def massive_entries(hidden: np.ndarray, ratio: float = MASSIVE_RATIO,
                    minimum: float = MASSIVE_MINIMUM) -> tuple[np.ndarray, list[Entry], list[list[Entry]]]:
    """hidden (L, T, D): each layer's hidden state (a block's output). (medians (L,), the massive entries —
    |h| > minimum and |h| > ratio × the layer's median — layer by layer, largest first, and each layer's
    TOP_ENTRIES largest entries whatever they are)."""
    L, T, D = hidden.shape
    medians = layer_medians(hidden)
    found: list[Entry] = []
    tops: list[list[Entry]] = []
    for n in range(L):
        size = np.abs(hidden[n]).astype(np.float64)  # (T, D)
        floor = max(medians[n], np.finfo(np.float64).tiny)
        order = np.argsort(-size, axis=None, kind="stable")
        tops.append([Entry(n, int(i // D), int(i % D), float(hidden[n].flat[i]), float(size.flat[i] / floor))
                     for i in order[:TOP_ENTRIES]])
        for i in order:
            if not (size.flat[i] > minimum and size.flat[i] > ratio * medians[n]):
                break
            found.append(Entry(n, int(i // D), int(i % D), float(hidden[n].flat[i]), float(size.flat[i] / floor)))
    return medians, found, tops


def key_importance(alpha: np.ndarray, causal: bool) -> np.ndarray:
    """α (…, T, T) -> (…, T): per key j the mean weight it receives from the queries that can see it: all T
    queries for an encoder, the T − j at or after it for a causal model (Gu et al. 2024, divided by
    arange(T, 0, −1))."""
    T = alpha.shape[-1]
    seen = np.arange(T, 0, -1, dtype=np.float64) if causal else np.full(T, float(T))
    return alpha.astype(np.float64).sum(axis=-2) / seen


def sink_rate(alpha: np.ndarray, causal: bool, epsilon: float = SINK_EPSILON, key: int = 0) -> np.ndarray:
    """α (L, H, T, T) -> (L, H) bool: the heads whose key `key` (the first token) has importance above ε. Its
    mean over heads (and texts) is Gu et al.'s Sink_k^ε."""
    return key_importance(alpha, causal)[..., key] > epsilon
