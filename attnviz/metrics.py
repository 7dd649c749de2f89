"""Pure functions of a Capture: head statistics, pattern labels, rollout, model-vs-scratch differences.
Nothing here changes the capture; everything returns new numpy arrays or small records.

Definitions (α is one head's (T, T) matrix; row i is query i; n_i is the number of keys row i may
attend to: T for encoders, i + 1 for causal models):
    entropy            mean_i  -Σ_j α_ij ln α_ij                           nats, 0·ln 0 = 0
    normalised entropy mean_i  H_i / ln n_i   over rows with n_i > 1       0 = one-hot, 1 = uniform
    max weight         mean_i  max_j α_ij
    mean distance      mean_i  Σ_j α_ij |i - j|                            in tokens
    self / prev / next mean_i α_ii,  mean_{i≥1} α_i,i-1,  mean_{i<T-1} α_i,i+1
    mass on X          mean_i  Σ_{j ∈ X} α_ij   X = start ([CLS]/BOS), end ([SEP]/EOS), punctuation, first token
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass

import numpy as np

from attnviz.capture import Capture

# Pattern thresholds, after Clark et al. 2019 ("What does BERT look at?") and Kovaleva et al. 2019
# ("Revealing the dark secrets of BERT"). A head gets the first label whose test it passes, in this order.
POSITIONAL_MIN = 0.5  # previous-token / next-token / self: mean weight on that offset
VERTICAL_MIN = 0.5  # vertical: mean over rows of the weight on one single key column
BLOCK_MIN = 0.8  # block: mean mass on keys of the query's own segment (needs ≥ 2 segments)
BROAD_MIN = 0.85  # broad: normalised entropy
LABELS = ("previous-token", "next-token", "self", "vertical", "block", "broad", "mixed")
SENTENCE_END = {".", "!", "?", "。", "！", "？"}


def _row_key_counts(T: int, causal: bool) -> np.ndarray:
    return np.arange(1, T + 1) if causal else np.full(T, T)  # (T,)


def row_entropy(alpha: np.ndarray) -> np.ndarray:
    """-Σ_j α_ij ln α_ij for every row, nats. (..., T, T) -> (..., T)"""
    alpha = np.asarray(alpha, dtype=np.float64)
    logs = np.log(np.where(alpha > 0, alpha, 1.0))  # 0·ln 0 = 0
    return -(alpha * logs).sum(axis=-1)


def entropy(capture: Capture) -> np.ndarray:
    """Mean row entropy of every head, nats. (L, H)"""
    return row_entropy(capture.attentions).mean(axis=-1)


def normalised_entropy(capture: Capture) -> np.ndarray:
    """Mean of H_i / ln(n_i) over rows with more than one key. (L, H), in [0, 1]"""
    n = _row_key_counts(capture.n_tokens, capture.causal)
    rows = n > 1
    if not rows.any():
        return np.zeros(capture.attentions.shape[:2])
    return (row_entropy(capture.attentions)[..., rows] / np.log(n[rows])).mean(axis=-1)


def uniform_entropy(T: int) -> float:
    """The entropy of uniform attention over T keys: ln T nats (the encoder baseline)."""
    return float(np.log(T))


def token_distance(T: int) -> np.ndarray:
    """|i - j| for every query i and key j. (T, T)"""
    return np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])


def max_weight(capture: Capture) -> np.ndarray:
    return capture.attentions.max(axis=-1).mean(axis=-1)  # (L, H)


def mean_distance(capture: Capture) -> np.ndarray:
    return (capture.attentions * token_distance(capture.n_tokens)).sum(axis=-1).mean(axis=-1)  # (L, H)


def diagonal_score(capture: Capture, offset: int) -> np.ndarray:
    """mean_i α_i,i+offset over the rows where that key exists: 0 self, -1 previous, +1 next. (L, H)"""
    T = capture.n_tokens
    if abs(offset) >= T:
        return np.zeros(capture.attentions.shape[:2])
    return np.diagonal(capture.attentions, offset=offset, axis1=-2, axis2=-1).mean(axis=-1)


def is_punctuation(token: str) -> bool:
    text = token.removeprefix("##")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def token_groups(capture: Capture) -> dict[str, np.ndarray]:
    """Key groups for the mass metrics, each a bool (T,) mask. Special kinds come from the tokenizer."""
    kinds = np.array(capture.special_kind)
    first = np.zeros(capture.n_tokens, dtype=bool)
    first[0] = True
    return {
        "start": capture.special & (kinds == "start"),
        "end": capture.special & (kinds == "end"),
        "punct": ~capture.special & np.array([is_punctuation(t) for t in capture.tokens]),
        "first": first,
    }


def mass_on(capture: Capture, keys: np.ndarray) -> np.ndarray:
    """mean_i Σ_{j ∈ keys} α_ij. (L, H)"""
    return capture.attentions[..., keys].sum(axis=-1).mean(axis=-1)


def segments(capture: Capture) -> np.ndarray:
    """Segment id per token: a new segment starts after an [SEP]/EOS or a sentence-final mark. (T,)"""
    ids, current = [], 0
    for token, kind in zip(capture.tokens, capture.special_kind):
        ids.append(current)
        if kind == "end" or token.removeprefix("##") in SENTENCE_END:
            current += 1
    return np.array(ids)


def block_score(capture: Capture) -> np.ndarray:
    """Mean mass on keys of the query's own segment; NaN when the text has a single segment. (L, H)"""
    seg = segments(capture)
    if len(set(seg[~capture.special].tolist())) < 2:
        return np.full(capture.attentions.shape[:2], np.nan)
    same = seg[:, None] == seg[None, :]  # (T, T)
    return (capture.attentions * same).sum(axis=-1).mean(axis=-1)


def vertical_score(capture: Capture) -> tuple[np.ndarray, np.ndarray]:
    """For each head, the key column with the most mean weight, and that weight. (L, H) each"""
    column_mass = capture.attentions.mean(axis=-2)  # (L, H, T)
    return column_mass.argmax(axis=-1), column_mass.max(axis=-1)


@dataclass(frozen=True)
class HeadStats:
    layer: int
    head: int
    entropy: float
    norm_entropy: float
    max_weight: float
    mean_distance: float
    self: float
    prev: float
    next: float
    start_mass: float
    end_mass: float
    punct_mass: float
    first_mass: float
    vertical_token: str
    label: str

    def as_dict(self) -> dict:
        return asdict(self)


NUMERIC_COLUMNS = ("entropy", "norm_entropy", "max_weight", "mean_distance", "self", "prev", "next",
                   "start_mass", "end_mass", "punct_mass", "first_mass")
COLUMNS = ("layer", "head", *NUMERIC_COLUMNS, "vertical_token", "label")


def label_heads(prev, nxt, self_, vertical, block, broad) -> np.ndarray:
    """The pattern label of each head from its scores, first match in LABELS order. (L, H) str"""
    tests = [prev >= POSITIONAL_MIN, nxt >= POSITIONAL_MIN, self_ >= POSITIONAL_MIN, vertical >= VERTICAL_MIN,
             np.nan_to_num(block, nan=0.0) >= BLOCK_MIN, broad >= BROAD_MIN]
    labels = np.full(prev.shape, "mixed", dtype=object)
    for label, passed in reversed(list(zip(LABELS, tests))):
        labels[passed] = label
    return labels


def head_stats(capture: Capture) -> list[HeadStats]:
    """Every metric for every head, one record per (layer, head), in layer-major order."""
    groups = token_groups(capture)
    ent, norm = entropy(capture), normalised_entropy(capture)
    mx, dist = max_weight(capture), mean_distance(capture)
    self_, prev, nxt = diagonal_score(capture, 0), diagonal_score(capture, -1), diagonal_score(capture, 1)
    masses = {name: mass_on(capture, keys) for name, keys in groups.items()}
    column, vertical = vertical_score(capture)
    labels = label_heads(prev, nxt, self_, vertical, block_score(capture), norm)
    L, H = capture.attentions.shape[:2]
    return [HeadStats(layer, head, float(ent[layer, head]), float(norm[layer, head]), float(mx[layer, head]),
                      float(dist[layer, head]), float(self_[layer, head]), float(prev[layer, head]),
                      float(nxt[layer, head]), float(masses["start"][layer, head]),
                      float(masses["end"][layer, head]), float(masses["punct"][layer, head]),
                      float(masses["first"][layer, head]), capture.tokens[column[layer, head]],
                      str(labels[layer, head]))
            for layer in range(L) for head in range(H)]


def matrix_summary(alpha: np.ndarray, special: np.ndarray) -> tuple[float, float, float]:
    """For one shown matrix (T, T): mean row entropy (nats), mean mass on special keys, mean distance."""
    return (float(row_entropy(alpha).mean()), float(alpha[:, special].sum(-1).mean()),
            float((alpha * token_distance(alpha.shape[-1])).sum(-1).mean()))


# --- attention rollout (Abnar & Zuidema 2020) -----------------------------------------------------


def rollout(capture: Capture) -> np.ndarray:
    """Attention rollout: Â_l = rownorm(mean_h α_l + I) (the identity stands for the residual stream),
    R = Â_{L-1} ··· Â_1 Â_0. R[i, j] = how much of input token j reaches position i at the top. (T, T)"""
    T = capture.n_tokens
    result = np.eye(T)
    for layer in range(capture.n_layers):
        a = capture.attentions[layer].astype(np.float64).mean(axis=0) + np.eye(T)  # (T, T)
        a /= a.sum(axis=-1, keepdims=True)
        result = a @ result
    return result


# --- model vs. from-scratch -----------------------------------------------------------------------


@dataclass(frozen=True)
class LayerDifference:
    layer: int
    max_abs: float
    mean_abs: float
    worst_head: int


def differences(reported: Capture, recomputed: Capture) -> list[LayerDifference]:
    """Per layer: max and mean |Δα| between two captures of the same input, and the head with the largest."""
    if reported.attentions.shape != recomputed.attentions.shape:
        raise ValueError(f"shapes differ: {reported.attentions.shape} vs {recomputed.attentions.shape}")
    delta = np.abs(reported.attentions.astype(np.float64) - recomputed.attentions)  # (L, H, T, T)
    per_head = delta.max(axis=(-2, -1))  # (L, H)
    return [LayerDifference(n, float(per_head[n].max()), float(delta[n].mean()), int(per_head[n].argmax()))
            for n in range(delta.shape[0])]
