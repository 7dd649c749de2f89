"""Head statistics over a corpus: many texts through the model in padded, length-sorted batches, each text's
head-table metrics computed from its own unpadded α, folded into a mergeable state.

The state is a set of moments (count, mean, M2: Chan et al.'s parallel variance) per metric, layer and head,
kept two ways:

texts   each text's head-table value (exactly what `attnviz heads` shows for that text) is one sample;
        mean and standard deviation over texts.
tokens  each query row is one sample (token-weighted): long texts count more. A column metric (vertical,
        sink) has one value per text, counted once per row of that text.

Merging two states gives what one run over both corpora gives (to rounding), so shards can be computed
anywhere (`attnviz corpus merge`, or Ray workers) and combined. Pure numpy: the model runs in
`attnviz.engine.corpora.run`.

One job a module: lines (reading), moments, texts (one text's statistics), state (stats.json, merging),
report (tables, summary). The model's side is in attnviz.engine.corpora: run (batched) and ray (a Ray
cluster).
"""

from __future__ import annotations

from attnviz.corpora.lines import corpus_format, Line, MAX_BAD_LISTED, MAX_LINE_BYTES, read_lines
from attnviz.corpora.moments import Moments
from attnviz.corpora.texts import (BatchStats, corpus_metrics, pack, ROWS_BYTES, text_stats, texts_stats, TextStats,
                                   unpack)
from attnviz.corpora.state import (CLARK_GROUPS, CorpusState, load_state, MAX_COUNT, MAX_STATE_BYTES, MAX_STATE_CELLS,
                                   MAX_STATE_CONTAINERS, MAX_VALUE, merge_states, STATE_FILE, STATE_KIND, STATE_VERSION,
                                   WEIGHTINGS)
from attnviz.corpora.report import summary_lines, table_records

__all__ = [
    "BatchStats", "CLARK_GROUPS", "corpus_format", "corpus_metrics", "CorpusState", "Line", "load_state",
    "MAX_BAD_LISTED", "MAX_COUNT", "MAX_LINE_BYTES", "MAX_STATE_BYTES", "MAX_STATE_CELLS", "MAX_STATE_CONTAINERS",
    "MAX_VALUE", "merge_states", "Moments", "pack", "read_lines", "ROWS_BYTES", "STATE_FILE", "STATE_KIND",
    "STATE_VERSION", "summary_lines", "table_records", "text_stats", "texts_stats", "TextStats", "unpack",
    "WEIGHTINGS",
]
