"""Pure functions of a Capture: head statistics, pattern labels, rollout, model-vs-scratch differences.
Nothing here changes the capture; everything returns new numpy arrays or small records.

One job a module: rows (what a metric sees, the per-row kernels), registry (one Metric row per head
statistic; head_values), labels (pattern labels, head records), propagation (rollout), compare (model vs.
scratch; a shown matrix's summary), mechanisms (massive activations, the sink rate), terms (the glossary of
`attnviz explain`). This package re-exports their public names.
"""

from __future__ import annotations

from attnviz.metrics.rows import (detector_scores, DETECTORS, distance_rows, normalised_entropy_rows, own_segment_rows,
                                  repeat_rows, repeat_targets, row_entropy, Rows, SENTENCE_END, spearman,
                                  token_distance, Tokens, uniform_entropy, Weighting, WEIGHTINGS, WIDE_BYTES)
from attnviz.metrics.registry import (Accumulator, all_metrics, BLOCK, BLOCK_ROWS_BYTES, block_score, by_layer, columns,
                                      DISTANCE, DUPLICATE, ENTROPY, entropy, find_metric, FIXED_COLUMNS, head_values,
                                      INDUCTION, KEPT, LABEL_INPUTS, list_metrics, MAX_WEIGHT, max_weight,
                                      mean_distance, Metric, METRICS, MIN_REPEATS, NEXT, NORM_ENTROPY,
                                      normalised_entropy, PREV, register, register_metric, row_blocks, SELF, SINK_MIN,
                                      sink_scores, unregister, VERTICAL)
from attnviz.metrics.labels import (BLOCK_MIN, BROAD_MIN, check_head_stats, head_records, label_definitions,
                                    label_heads, LABELS, POSITIONAL_MIN, records_from_values, REPEAT_MIN, repeats,
                                    repeats_note, segments, value_grid, VERTICAL_MIN, vertical_score)
from attnviz.metrics.propagation import rollout, rollout_rows, strongest_paths
from attnviz.metrics.compare import differences, LayerDifference, matrix_summary
from attnviz.metrics.mechanisms import (Entry, key_importance, layer_medians, MASSIVE_MINIMUM, MASSIVE_RATIO,
                                        massive_entries, SINK_EPSILON, sink_rate)
from attnviz.metrics.terms import definitions_markdown, glossary, lookup, TERM_ALIASES, TERMS

__all__ = [
    "Accumulator", "all_metrics", "Entry", "key_importance", "layer_medians", "MASSIVE_MINIMUM", "MASSIVE_RATIO",
    "massive_entries", "SINK_EPSILON", "sink_rate", "BLOCK", "BLOCK_MIN", "BLOCK_ROWS_BYTES", "block_score",
    "BROAD_MIN", "by_layer",
    "check_head_stats", "columns", "definitions_markdown", "detector_scores", "DETECTORS", "differences",
    "DISTANCE", "distance_rows", "DUPLICATE", "ENTROPY", "entropy", "find_metric", "FIXED_COLUMNS", "glossary",
    "head_records", "head_values", "INDUCTION", "KEPT", "label_definitions", "label_heads", "LABEL_INPUTS",
    "LABELS", "LayerDifference", "list_metrics", "lookup", "matrix_summary", "MAX_WEIGHT", "max_weight",
    "mean_distance", "Metric", "METRICS", "MIN_REPEATS", "NEXT", "NORM_ENTROPY", "normalised_entropy",
    "normalised_entropy_rows", "own_segment_rows", "POSITIONAL_MIN", "PREV", "records_from_values", "register",
    "register_metric", "REPEAT_MIN", "repeat_rows", "repeat_targets", "repeats", "repeats_note", "rollout",
    "rollout_rows", "row_blocks", "row_entropy", "Rows", "segments", "SELF", "SENTENCE_END", "SINK_MIN",
    "sink_scores", "spearman", "strongest_paths", "TERM_ALIASES", "TERMS", "token_distance", "Tokens",
    "uniform_entropy", "unregister",
    "value_grid", "VERTICAL", "VERTICAL_MIN", "vertical_score", "Weighting", "WEIGHTINGS", "WIDE_BYTES",
]
