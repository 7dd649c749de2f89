"""Pattern labels of heads (after Clark et al. 2019 and Kovaleva et al. 2019) and head records: one dict per
(layer, head) with every registered metric and its label, computed or read back (checked) from a pooled
capture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import CaptureFormatError, SelectionError, arg

from attnviz.metrics.rows import Tokens
from attnviz.metrics.registry import METRICS, MIN_REPEATS, all_metrics, by_layer, head_values


# Pattern thresholds, after Clark et al. 2019 ("What does BERT look at?") and Kovaleva et al. 2019
# ("Revealing the dark secrets of BERT"). A head gets the first label whose test it passes, in this order.
POSITIONAL_MIN = 0.5  # previous-token / next-token / self: mean weight on that offset
VERTICAL_MIN = 0.5  # vertical: mean over rows of the weight on one single key column
BLOCK_MIN = 0.8  # block: mean mass on keys of the query's own segment (needs ≥ 2 segments)
BROAD_MIN = 0.85  # broad: normalised entropy
# induction / duplicate-token (Olsson et al. 2022; TransformerLens's head detector): mean over the rows that have
# a target (an earlier occurrence of the query's token) of the weight on the targets
REPEAT_MIN = 0.4
LABELS = ("induction", "duplicate-token", "previous-token", "next-token", "self", "vertical", "block", "broad",
          "mixed")
def vertical_score(capture: Capture) -> tuple[np.ndarray, np.ndarray]:
    """For each head, the key column with the most mean weight, and that weight. (L, H) each"""
    column_mass = capture.attentions.mean(axis=-2)  # (L, H, T)
    return column_mass.argmax(axis=-1), column_mass.max(axis=-1)


def segments(capture: Capture) -> np.ndarray:
    return Tokens.of(capture).segments


def repeats(capture: Capture) -> int:
    """How many query rows repeat an earlier token (the rows induct and dup average): a pooled capture's blocks
    are not tokens, so 0 for one."""
    if capture.pooled or not capture.square:
        return 0
    keys = Tokens.of(capture).keys  # what "the same token" compares, (T,)
    seen: set = set()
    count = 0
    for key in keys.tolist():
        count += key in seen
        seen.add(key)
    return count


def repeats_note(capture: Capture) -> str:
    """A line for a text with some repeated tokens but fewer than the induction and duplicate tests need."""
    n = repeats(capture)
    if 0 < n < MIN_REPEATS:
        return (f"induct, dup: not enough repeats to test ({n} token{'s' * (n != 1)} of the text occurred before; "
                f"the tests need {MIN_REPEATS})")
    return ""


def label_heads(values: dict[str, np.ndarray], block: np.ndarray) -> np.ndarray:
    """The pattern label of each head from its scores, first match in LABELS order. (L, H) str"""
    def at_least(name: str, minimum: float) -> np.ndarray:
        value = values.get(name)
        return np.zeros(values["prev"].shape, bool) if value is None else np.nan_to_num(value, nan=0.0) >= minimum

    # a stripe first: a head that gives one key column most of every row is vertical, whatever the few
    # repeated tokens' rows say
    stripe = values["vertical"] >= VERTICAL_MIN
    tests = [at_least("induction", REPEAT_MIN) & ~stripe, at_least("duplicate", REPEAT_MIN) & ~stripe,
             values["prev"] >= POSITIONAL_MIN, values["next"] >= POSITIONAL_MIN, values["self"] >= POSITIONAL_MIN,
             values["vertical"] >= VERTICAL_MIN, np.nan_to_num(block, nan=0.0) >= BLOCK_MIN,
             values["norm_entropy"] >= BROAD_MIN]
    labels = np.full(values["prev"].shape, "mixed", dtype=object)
    for label, passed in reversed(list(zip(LABELS, tests))):
        labels[passed] = label
    return labels


def records_from_values(values: dict[str, np.ndarray]) -> list[dict]:
    """Head records (one dict per layer and head, keys in the order of columns()) from metric values
    (L, H) each, however they were computed."""
    block = values.get("block")
    labels = label_heads(values, block if block is not None else np.full(values["prev"].shape, np.nan))
    L, H = values["prev"].shape
    records = []
    for layer in range(L):
        for head in range(H):
            record: dict = {"layer": layer, "head": head}
            for m in METRICS:
                if m.optional and not np.isfinite(values[m.name]).any():
                    continue  # does not apply to this model
                value = values[m.name][layer, head]
                record[m.name] = str(value) if m.kind == "text" else float(value)
            record["label"] = str(labels[layer, head])
            records.append(record)
    return records


def _stored_stats(capture: Capture, queries: Sequence[int] | None) -> list | None:
    """The head records a pooled capture carries (statistics of every row: they cannot be narrowed), checked
    against the capture's shape and the metric registry."""
    stored = capture.meta.get("head_stats")
    if isinstance(stored, list) and queries is not None:
        raise SelectionError(f"this capture is pooled (a long input) and holds statistics of all rows; "
                             f"{arg('rows')} needs the text run again", "rows")
    if not isinstance(stored, list):
        return None
    check_head_stats(stored, capture.n_layers, capture.n_heads)
    return stored


def check_head_stats(records: list, layers: int, heads: int) -> None:
    """A pooled capture's head records come from a file: exactly one per (layer, head) in range, every
    registered metric present as a number (a finite one or NaN; text metrics as text), a known label.
    CaptureFormatError names the first record that is not."""
    def bad(n: int, what: str) -> CaptureFormatError:
        return CaptureFormatError(f"this capture's head statistics are damaged: record {n} {what}")

    if len(records) != layers * heads:
        raise CaptureFormatError(f"this capture's head statistics hold {len(records)} records, not one for each of "
                                 f"its {layers} × {heads} heads")
    seen = set()
    for n, record in enumerate(records):
        if not isinstance(record, dict):
            raise bad(n, "is not a record")
        layer, head = record.get("layer"), record.get("head")
        if not (isinstance(layer, int) and isinstance(head, int) and not isinstance(layer, bool)
                and not isinstance(head, bool) and 0 <= layer < layers and 0 <= head < heads):
            raise bad(n, f"names layer {layer!r}, head {head!r}: the capture has layers 0..{layers - 1}, heads "
                         f"0..{heads - 1}")
        if (layer, head) in seen:
            raise bad(n, f"repeats layer {layer}, head {head}")
        seen.add((layer, head))
        for m in METRICS:
            if m.optional and (m.name in record) != (m.name in records[0]):
                raise bad(n, f"has {m.name!r} where record 0 has not, or the other way round")
            if m.optional and m.name not in record:
                continue  # a metric that does not apply to this model
            value = record.get(m.name)
            if m.kind == "text":
                if not isinstance(value, str):
                    raise bad(n, f"has no text {m.name!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value):
                raise bad(n, f"has no number {m.name!r} (it holds {str(value)[:40]!r})")
        if record.get("label") not in LABELS:
            raise bad(n, f"has the unknown label {str(record.get('label'))[:40]!r}")


def value_grid(capture: Capture, name: str, queries: Sequence[int] | None = None) -> np.ndarray:
    """One metric of every head (the stored value for a pooled long input), over the query rows `queries`
    when given. (L, H)"""
    if _stored_stats(capture, queries) is not None:
        grid = np.zeros((capture.n_layers, capture.n_heads))
        for record in capture.meta["head_stats"]:
            grid[record["layer"], record["head"]] = float(record.get(name) or 0.0)
        return grid
    metric = next(m for m in all_metrics() if m.name == name)
    return by_layer(lambda layer: head_values(layer, [metric], queries)[metric.name], capture)


def head_records(capture: Capture, queries: Sequence[int] | None = None) -> list[dict]:
    """Every registered metric and the pattern label of every head, one dict per (layer, head), in
    layer-major order, over the query rows `queries` when given. A pooled capture of a long input carries
    the records its streamed pass computed."""
    stored = _stored_stats(capture, queries)
    if stored is not None:
        return [dict(r) for r in stored]
    return records_from_values(head_values(capture, queries=queries))


def label_definitions() -> dict[str, str]:
    """Each pattern label and the test that gives it (the first that applies wins)."""
    return {
        "induction": f"induct ≥ {REPEAT_MIN} and not a stripe (vert < {VERTICAL_MIN}): where a token occurred "
                     f"before, the query looks at the token that followed it (… A B … A → B; Olsson et al. 2022); "
                     f"needs at least {MIN_REPEATS} tokens that occurred before",
        "duplicate-token": f"dup ≥ {REPEAT_MIN} and not a stripe: where a token occurred before, the query looks "
                           f"at its earlier occurrences; needs at least {MIN_REPEATS} tokens that occurred before",
        "previous-token": f"prev ≥ {POSITIONAL_MIN}: most queries look at the token before them",
        "next-token": f"next ≥ {POSITIONAL_MIN}: most queries look at the token after them",
        "self": f"self ≥ {POSITIONAL_MIN}: most queries look at themselves",
        "vertical": f"vert ≥ {VERTICAL_MIN}: one key column (often [CLS] or [SEP]) holds half the weight",
        "block": f"≥ {BLOCK_MIN} of the weight stays in the query's own segment (segments end at [SEP]/EOS or "
                 f". ! ?; the text needs two)",
        "broad": f"norm_ent ≥ {BROAD_MIN}: attention spread nearly evenly",
        "mixed": "none of the above",
    }

