"""Pure functions of a Capture: head statistics, pattern labels, rollout, model-vs-scratch differences.
Nothing here changes the capture; everything returns new numpy arrays or small records.

α is one head's (T, T) matrix; row i is query i; n_i is the number of keys row i may attend to: T for
encoders, i + 1 for causal models. Every per-head statistic is one function here plus one row of the
metric registry (METRICS, below), which holds its definition and feeds every table and caption.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from attnviz.capture import Capture
from attnviz.errors import CaptureMismatchError

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


# --- the metric registry ---------------------------------------------------------------------------
# One row per head metric. The heads table, --json/--csv, the export's heads.csv/heads.json, the gallery
# captions and glossary, `attnviz explain` and the README's definition table are all made from it: a new
# metric is one function above and one register() call below.


@dataclass(frozen=True)
class Metric:
    """One per-head statistic.

    name        key in JSON/CSV and the long --sort key ("norm_entropy")
    header      the column header in terminal tables, also accepted by --sort ("norm_ent")
    definition  one line, shown by `attnviz explain`, the README and the gallery glossary
    compute     Capture -> (L, H) array: floats, or strings when kind == "text"
    fmt         how a value is written in tables and captions"""

    name: str
    header: str
    definition: str
    compute: Callable[[Capture], np.ndarray]
    fmt: str = "{:.2f}"
    kind: str = "number"  # "number" | "text"

    def format(self, value) -> str:
        if self.kind == "text":
            return str(value)
        return "–" if value is None or not np.isfinite(value) else self.fmt.format(value)


METRICS: list[Metric] = []


def register(metric: Metric) -> Metric:
    """Add a metric to every head table. Names and headers must be new."""
    taken = {key for m in METRICS for key in (m.name, m.header)} | set(FIXED_COLUMNS)
    if metric.name in taken or metric.header in taken:
        raise ValueError(f"a metric or column named {metric.name!r}/{metric.header!r} exists already")
    METRICS.append(metric)
    return metric


def unregister(name: str) -> None:
    METRICS[:] = [m for m in METRICS if m.name != name]


def find_metric(key: str) -> Metric | None:
    """The metric whose name or header is `key`."""
    return next((m for m in METRICS if key in (m.name, m.header)), None)


FIXED_COLUMNS = ("layer", "head", "label")


def columns() -> list[str]:
    """Record keys in order: layer, head, every registered metric, label."""
    return ["layer", "head", *(m.name for m in METRICS), "label"]


def _top_key(capture: Capture) -> np.ndarray:
    column, _ = vertical_score(capture)
    return np.array(capture.tokens, dtype=object)[column]  # (L, H) str


for _metric in (
    Metric("entropy", "entropy", "mean over rows of −Σ_j α_ij ln α_ij, in nats (0·ln 0 = 0); uniform over T keys "
           "= ln T", entropy),
    Metric("norm_entropy", "norm_ent", "mean over rows with n_i > 1 of H_i / ln n_i: 0 one-hot, 1 uniform",
           normalised_entropy),
    Metric("max_weight", "max", "mean over rows of max_j α_ij", max_weight),
    Metric("mean_distance", "dist", "mean over rows of Σ_j α_ij·|i − j|, in tokens", mean_distance, "{:.1f}"),
    Metric("prev", "prev", "mean of α_i,i−1 over i ≥ 1: weight on the previous token",
           lambda c: diagonal_score(c, -1)),
    Metric("self", "self", "mean of α_ii: weight on the token itself", lambda c: diagonal_score(c, 0)),
    Metric("next", "next", "mean of α_i,i+1 over i < T−1: weight on the next token", lambda c: diagonal_score(c, 1)),
    Metric("start_mass", "start", "mean over rows of the weight on [CLS]/BOS keys",
           lambda c: mass_on(c, token_groups(c)["start"])),
    Metric("end_mass", "end", "mean over rows of the weight on [SEP]/EOS keys",
           lambda c: mass_on(c, token_groups(c)["end"])),
    Metric("vertical", "vert", "the largest mean weight one key column gets (a vertical stripe in the heatmap)",
           lambda c: vertical_score(c)[1]),
    Metric("top_key", "top_key", "the key that column belongs to", _top_key, kind="text"),
    Metric("punct_mass", "punct", "mean over rows of the weight on punctuation tokens",
           lambda c: mass_on(c, token_groups(c)["punct"])),
    Metric("first_mass", "first", "mean over rows of the weight on token 0",
           lambda c: mass_on(c, token_groups(c)["first"])),
):
    register(_metric)


# what the pattern labels are computed from (also when a caller has unregistered the metric)
_LABEL_INPUTS: dict[str, Callable[[Capture], np.ndarray]] = {
    "prev": lambda c: diagonal_score(c, -1), "next": lambda c: diagonal_score(c, 1),
    "self": lambda c: diagonal_score(c, 0), "vertical": lambda c: vertical_score(c)[1],
    "norm_entropy": normalised_entropy}


def label_heads(values: dict[str, np.ndarray], block: np.ndarray) -> np.ndarray:
    """The pattern label of each head from its scores, first match in LABELS order. (L, H) str"""
    tests = [values["prev"] >= POSITIONAL_MIN, values["next"] >= POSITIONAL_MIN, values["self"] >= POSITIONAL_MIN,
             values["vertical"] >= VERTICAL_MIN, np.nan_to_num(block, nan=0.0) >= BLOCK_MIN,
             values["norm_entropy"] >= BROAD_MIN]
    labels = np.full(values["prev"].shape, "mixed", dtype=object)
    for label, passed in reversed(list(zip(LABELS, tests))):
        labels[passed] = label
    return labels


def by_layer(compute: Callable[[Capture], np.ndarray], capture: Capture) -> np.ndarray:
    """A per-head metric computed one layer at a time, so its float64 temporaries stay the size of one
    layer (H·T²) even for the largest capture accepted. (L, H)"""
    return np.concatenate([np.asarray(compute(capture.layer_slice(n, n + 1))) for n in range(capture.n_layers)])


def head_records(capture: Capture) -> list[dict]:
    """Every registered metric and the pattern label of every head, one dict per (layer, head), in
    layer-major order, keys in the order of columns()."""
    values = {m.name: by_layer(m.compute, capture) for m in METRICS}
    inputs = {key: values[key] if key in values else by_layer(compute, capture)
              for key, compute in _LABEL_INPUTS.items()}
    labels = label_heads(inputs, by_layer(block_score, capture))
    L, H = capture.attentions.shape[:2]
    records = []
    for layer in range(L):
        for head in range(H):
            record: dict = {"layer": layer, "head": head}
            for m in METRICS:
                value = values[m.name][layer, head]
                record[m.name] = str(value) if m.kind == "text" else float(value)
            record["label"] = str(labels[layer, head])
            records.append(record)
    return records


def label_definitions() -> dict[str, str]:
    """Each pattern label and the test that gives it (the first that applies wins)."""
    return {
        "previous-token": f"prev ≥ {POSITIONAL_MIN}: most queries look at the token before them",
        "next-token": f"next ≥ {POSITIONAL_MIN}: most queries look at the token after them",
        "self": f"self ≥ {POSITIONAL_MIN}: most queries look at themselves",
        "vertical": f"vert ≥ {VERTICAL_MIN}: one key column (often [CLS] or [SEP]) holds half the weight",
        "block": f"≥ {BLOCK_MIN} of the weight stays in the query's own segment (segments end at [SEP]/EOS or "
                 f". ! ?; the text needs two)",
        "broad": f"norm_ent ≥ {BROAD_MIN}: attention spread nearly evenly",
        "mixed": "none of the above",
    }


TERMS: dict[str, str] = {
    "alpha": "α, the attention weights: softmax(Q·Kᵀ/√d_k) with masked keys at −∞. Row i (a query) says how "
             "much token i looks at each key j; every row sums to 1.",
    "label": "the pattern label of a head, after Clark et al. 2019 and Kovaleva et al. 2019: the first of "
             + ", ".join(LABELS) + " whose test passes (see `attnviz explain <label>`).",
    "rollout": "attention rollout (Abnar & Zuidema 2020): per layer Â = rownorm(mean over heads of α + I), the "
               "identity standing for the residual stream, multiplied through the layers. Row i says how much "
               "of each input token reaches position i at the top.",
    "scale": "the colour scale: 0 to the largest weight shown, one scale for every panel of a picture; the "
             "legend and the colorbar give its end.",
    "entropy baseline": "ln T nats: the entropy of uniform attention over T keys. 0 is one-hot.",
    "causal": "decoder models (GPT-2, Llama) attend only to earlier tokens: α is lower-triangular and the "
              "future cells are drawn blank.",
    "special tokens": "[CLS], [SEP], <s>, </s>, … as the tokenizer's own special-token ids say; "
                      "--hide-special leaves them out of pictures (rows are not renormalised).",
}


def glossary() -> list[tuple[str, str, str]]:
    """(term, other name, definition) for every metric, label and term, for `attnviz explain`."""
    rows = [(m.header, m.name if m.name != m.header else "", m.definition) for m in METRICS]
    rows += [(label, "label", text) for label, text in label_definitions().items()]
    rows += [(term, "", text) for term, text in TERMS.items()]
    return rows


def definitions_markdown() -> str:
    """The README's metric table, from the registry."""
    rows = ["| metric | column | definition |", "|---|---|---|"]
    rows += [f"| `{m.name}` | `{m.header}` | {m.definition.replace('|', chr(92) + '|')} |" for m in METRICS]
    return "\n".join(rows) + "\n"


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
        raise CaptureMismatchError(f"the captures cannot be compared: shapes {reported.attentions.shape} and "
                                   f"{recomputed.attentions.shape} differ")
    delta = np.abs(reported.attentions.astype(np.float64) - recomputed.attentions)  # (L, H, T, T)
    per_head = delta.max(axis=(-2, -1))  # (L, H)
    return [LayerDifference(n, float(per_head[n].max()), float(delta[n].mean()), int(per_head[n].argmax()))
            for n in range(delta.shape[0])]
