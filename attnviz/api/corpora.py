"""Head statistics over many texts: corpus (batched, mergeable) and merge."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from attnviz.base.arguments import checked
from attnviz.api.models import borrows, resolve_model
from attnviz.corpora import CorpusState, Line, merge_states
from attnviz.engine.corpora.run import BatchRunner, run_local
from attnviz.progress import Reporter

__all__ = ["corpus", "merge", "CorpusState"]


@borrows
@checked
def corpus(texts: Iterable[str], *, model: Any = None, tokenizer: Any = None, batch_size: int = 32,
           max_length: int | None = None, words: bool = False, truncate: bool = True, device: str = "auto",
           dtype: str = "float32", reporter: Reporter | None = None) -> CorpusState:
    """Head statistics over `texts`, in padded, length-sorted batches: every metric of the head table per head,
    as mean and standard deviation over texts and token-weighted over query rows, pattern-label counts and
    per-layer mass on [CLS]/[SEP]/punctuation. An empty text is counted, not run. The result merges with
    others (merge) into what one run over all of them gives; `.records()`, `.layer_records()`, `.summary()`."""

    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype)
    runner = BatchRunner(loaded, max_length=max_length, batch_size=batch_size, truncate=truncate, words=words)
    state = runner.new_state()
    state.sources = ["texts"]
    given = list(texts)
    lines = (Line(text=t, number=n + 1, source="texts") for n, t in enumerate(given))
    with (reporter or Reporter()).progress("Reading texts", len(given), "texts") as step:
        complete = run_local(runner, lines, state, lambda done, tokens: step(done))
    state.partial = not complete
    return state


@checked
def merge(states: Sequence[CorpusState]) -> CorpusState:
    """Runs over parts of a corpus combined into what one run over all of it gives."""
    return merge_states(list(states))
