"""Faithfulness of attributions, on numpy: the bins of erased tokens, the order a method's scores give,
comprehensiveness and sufficiency (DeYoung et al. 2020, ERASER), Kendall's τ-b, and attention flow (Abnar &
Zuidema 2020). No torch here."""

from __future__ import annotations

import math

import numpy as np

BINS = (0.01, 0.05, 0.10, 0.20, 0.50)  # ERASER's bins: fractions of the erasable tokens
BEATS_SD = 2.0  # a method beats random when it is this many of the random orders' sd better than their mean
SANITY_MAX_RHO = 0.3  # a method passes the sanity check when |ρ| with the randomised model's scores is at most this
TIE = 1e-12  # AOPCs this close are one result (the same tokens erased): a tie, said as one
SIGNIFICANCE = 0.05  # over a corpus, a lead is significant when the paired test's p-value is below this
# the exact sign-flip test over n texts cannot give a p below 2 / 2ⁿ (the observed signs and their mirror): 6 texts
# are the fewest whose test can reach SIGNIFICANCE (5 give 0.0625 at best)
MIN_SIGNIFICANT_TEXTS = next(n for n in range(1, 64) if 2.0 ** (1 - n) < SIGNIFICANCE)
MIN_INTERVAL_TEXTS = 10  # fewer texts give no bootstrap interval: a percentile interval of so few is too narrow


def sanity_layers(L: int, depths: int) -> list[int]:
    """The blocks from which the copy is randomised, top first: `depths` of them spread from L−1 down to 0."""
    if depths <= 0:
        return []
    if depths == 1:  # one depth: the whole model randomised
        return [0]
    if depths >= L:
        return list(range(L - 1, -1, -1))
    return sorted({int(round(x)) for x in np.linspace(L - 1, 0, depths)}, reverse=True)


def bin_sizes(n: int, fractions: tuple[float, ...] = BINS) -> list[int]:
    """How many tokens each bin erases (or keeps): ⌈fraction · n⌉, at least one."""
    return [max(1, math.ceil(fraction * n - 1e-9)) for fraction in fractions]


def ranked(scores: np.ndarray, erasable: np.ndarray) -> np.ndarray:
    """The erasable positions, highest score first; ties in the text's order."""
    erasable = np.asarray(erasable, np.int64)
    values = np.asarray(scores, np.float64)[erasable]
    return erasable[np.lexsort((erasable, -values))]


def without(T: int, erased: np.ndarray) -> np.ndarray:
    """The positions of a T-token text kept when `erased` are deleted, in order."""
    keep = np.ones(T, bool)
    keep[np.asarray(erased, np.int64)] = False
    return np.flatnonzero(keep)


def only(T: int, erasable: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The positions kept when, of the erasable ones, only `kept` stay (the others: special tokens and the
    explained position, always stay)."""
    erased = np.setdiff1d(np.asarray(erasable, np.int64), np.asarray(kept, np.int64))
    return without(T, erased)


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's τ-b (ties in either counted as neither concordant nor discordant, the denominator adjusted);
    NaN where either has no two different values. O(n²): n is a text's tokens."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n = len(x)
    if n < 2:
        return float("nan")
    sx = np.sign(x[:, None] - x[None, :])[np.triu_indices(n, 1)]
    sy = np.sign(y[:, None] - y[None, :])[np.triu_indices(n, 1)]
    pairs = n * (n - 1) / 2
    untied_x, untied_y = pairs - float((sx == 0).sum()), pairs - float((sy == 0).sum())
    if untied_x == 0 or untied_y == 0:
        return float("nan")
    return float((sx * sy).sum() / math.sqrt(untied_x * untied_y))


def residual_attention(alpha: np.ndarray) -> np.ndarray:
    """Per layer the attention graph's edges as Abnar & Zuidema build them: Â = rownorm(mean_h α + I), the
    identity standing for the residual connection. (L, H, T, T) -> (L, T, T) float64."""
    mean = np.asarray(alpha, np.float64).mean(axis=1)
    mean = mean + np.eye(mean.shape[-1])[None]
    return mean / mean.sum(axis=-1, keepdims=True)


FLOW_SCALE = 1 << 30  # capacities in units of 2⁻³⁰ (the max-flow solver takes integers; int32 holds the sums)


def attention_flow(layers: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Attention flow (Abnar & Zuidema 2020): the layered graph with a node per token and layer boundary, an
    edge from token i above layer l to token j below it of capacity Â_l[i, j] (`layers` (L, T, T), rows of
    residual_attention); the maximum flow from the top node of each row in `rows` to each input token, each
    row's flows normalised to sum to 1, then averaged over `rows`. (T,)."""
    L, T, _ = layers.shape
    total = np.zeros(T)
    for row in rows:
        flows = max_flows(layers, int(row))
        total += flows / flows.sum() if flows.sum() > 0 else flows
    return total / len(rows)


def max_flows(layers: np.ndarray, row: int) -> np.ndarray:
    """The maximum flow from the top node of `row` to each input token (T,), each a max-flow on the layered DAG
    itself: the graph of layers L…1 is built once in compressed rows, and the input tokens are one sink whose
    edges from layer 1 carry token j's column of Â_0 — per token only those T capacities change. Solved by
    Dinic's algorithm (scipy) on capacities floored to multiples of 2⁻³⁰: each value is at most the exact one
    and below it by less than (edges of the minimum cut) × 2⁻³⁰, at most L·T²·2⁻³⁰ (4·10⁻⁴ at 6 layers and 256
    tokens; tests compare with networkx's float max-flow). Cost: T max-flows per row on L·T² edges (a causal
    model half), about 9 ms each at 6 layers and 256 tokens."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    L, T, _ = layers.shape
    sink = (L + 1) * T  # node (n, i) is n·T + i for n = 1…L; layer 0 is the sink
    sources, targets, capacities = [np.arange(T) + T], [np.full(T, sink)], [np.ones(T, np.int64)]
    for n in range(1, L):
        above, below = np.nonzero(layers[n] > 0)
        sources.append((n + 1) * T + above)
        targets.append(n * T + below)
        capacities.append(np.floor(layers[n][above, below] * FLOW_SCALE).astype(np.int64))
    graph = csr_matrix((np.concatenate(capacities).astype(np.int32),
                        (np.concatenate(sources), np.concatenate(targets))), shape=(sink + 1, sink + 1))
    graph.sort_indices()
    into_sink = np.array([graph.indptr[T + i] + np.searchsorted(graph.indices[graph.indptr[T + i]:
                                                                              graph.indptr[T + i + 1]], sink)
                          for i in range(T)])
    flows = np.zeros(T)
    for j in range(T):
        graph.data[into_sink] = np.floor(layers[0][:, j] * FLOW_SCALE).astype(np.int32)
        flows[j] = maximum_flow(graph, L * T + row, sink, method="dinic").flow_value / FLOW_SCALE
    return flows


def aopc(f_full: float, f_values: np.ndarray) -> float:
    """The area over the perturbation curve: the mean over the bins of f_full − f."""
    return float(np.mean(f_full - np.asarray(f_values, np.float64)))


def bootstrap_interval(values: np.ndarray, *, level: float = 0.95, resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `values` (texts resampled with replacement)."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float(values.mean()), float(values.mean())
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)


def paired_sign_flip(differences: np.ndarray, *, resamples: int = 10_000, seed: int = 0) -> float:
    """The two-sided p-value of a paired test that the mean of `differences` (one per text: method A's value
    minus method B's) is 0: each difference's sign flipped at random (exactly, over every pattern, for up to 16
    texts), the share of means at least as far from 0 as the one observed."""
    d = np.asarray(differences, np.float64)
    n = len(d)
    if n == 0 or not np.any(d):
        return 1.0
    observed = abs(d.mean())
    if n <= 16:  # every sign pattern, the observed one among them: exact
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1)
        means = np.abs((signs * d[None, :]).mean(axis=1))
        return float((means >= observed - 1e-12).mean())
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(resamples, n))
    means = np.abs((signs * d[None, :]).mean(axis=1))
    return float(((means >= observed - 1e-12).sum() + 1) / (resamples + 1))  # the observed counted once
