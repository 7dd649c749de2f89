"""attnviz from Python and notebooks: load a model once, capture a text, look at it.

    import attnviz
    model = attnviz.load_model("minilm")                  # or "multilingual", "smollm2", a folder, a .gguf
    cap = attnviz.capture("The cat sat on the mat", model=model)
    cap                                                   # in Jupyter / VS Code: the interactive viewer
    cap.heatmap(layer=0, head=2)                          # a matplotlib Figure
    cap.heads()                                           # the head statistics (HTML table; .to_records())

    out = hf_model(**inputs, output_attentions=True)      # the essays' own code
    cap = attnviz.Capture.from_outputs(out, inputs, tokenizer)

This module sits above the renderers (it registers the views a Capture shows) and below the CLI. Importing
it imports neither torch nor transformers; they load with the first model.
"""

from __future__ import annotations

import contextlib
import html
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz import capture as capture_module
from attnviz.capture import Capture, Parts
from attnviz.errors import InputError


def load_model(name: str | None = None, *, device: str = "auto", dtype: str = "float32", revision: str | None = None,
               trust_remote_code: bool = False, memory_budget: int | None = None, lm_head: bool = False):
    """Load a model once for many captures: an offline name (minilm, multilingual, smollm2), a Hugging Face
    id, a local folder or a .gguf file, with eager attention, in eval mode, on `device`."""
    from attnviz.model import load

    return load(name, revision=revision, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                memory_budget=memory_budget, lm_head=lm_head)


class Reporter:
    """What long work tells whoever called it: the command line shows it (a spinner, a progress bar, a note on
    stderr); from Python nothing is shown. Subclass and override what you want to see."""

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def progress(self, what: str, total: int, unit: str) -> Iterator[Callable[[int], None]]:
        yield lambda n: None

    def note(self, text: str) -> None:
        pass


def capture(text: str, model: Any = None, tokenizer: Any = None, *, words: bool = False, stream: bool | None = None,
            part: str | None = None, target: str | None = None, max_new_tokens: int | None = None,
            truncate: bool = True, pool: int = 512, device: str = "auto", dtype: str = "float32",
            window: tuple | None = None, rollout_token: str | None = None, pictures: bool = True,
            decoding: Any = None, reporter: Reporter | None = None) -> Capture | Parts:
    """The attention of `text`: the one place that chooses how it is computed.

    model      a name or folder (loaded here), a model from load_model(), or a Hugging Face model object
               with its `tokenizer` (switched to eager attention in place if it was loaded with SDPA)
    words      attention between words instead of sub-word tokens
    stream     True: a block of query rows at a time (exact statistics, pooled pictures); None: only when the
               full α would pass the memory budget; False: never
    part       an encoder-decoder model's encoder, decoder or cross attention; None gives all three (Parts)
    target     an encoder-decoder model's decoder reads this text; without it the decoder writes
               (`max_new_tokens`, default 20)
    streamed runs also take: `window` (rows, cols, layers: selections with .indices(n)) kept exactly,
    `rollout_token` (a token spec) whose rollout row is kept, `pictures=False` (statistics only), `pool`
    `decoding` (attnviz.generate.Decoding): how an encoder-decoder model's decoder writes (default greedy)
    `reporter` hears of long work (the command line shows it)
    """
    from attnviz.model import LoadedModel, check_text

    check_text(text)
    if part is not None and part not in capture_module.PART_NAMES:
        raise InputError(f"part must be one of {', '.join(capture_module.PART_NAMES)}, not {part!r}")
    if isinstance(model, LoadedModel):
        loaded = model
    elif model is None or isinstance(model, (str, os.PathLike)):
        loaded = load_model(None if model is None else str(model), device=device, dtype=dtype)
    else:
        from attnviz.model import wrap

        loaded = wrap(model, tokenizer)
    training = bool(getattr(loaded.model, "training", False))
    loaded.model.eval()  # dropout off while capturing; the model's own mode is put back
    try:
        return _capture(loaded, text, words=words, stream=stream, part=part, target=target,
                        max_new_tokens=max_new_tokens, truncate=truncate, pool=pool, window=window,
                        rollout_token=rollout_token, pictures=pictures, decoding=decoding,
                        reporter=reporter or Reporter())
    finally:
        loaded.model.train(training)


def _capture(loaded, text: str, *, words: bool, stream: bool | None, part: str | None, target: str | None,
             max_new_tokens: int | None, truncate: bool, pool: int, window: tuple | None, rollout_token: str | None,
             pictures: bool, decoding: Any, reporter: Reporter) -> Capture | Parts:
    from attnviz.model import attention_bytes, check_memory, encode, make_capture, memory_budget, model_attentions
    from attnviz.words import to_words

    if loaded.seq2seq:
        whole = _parts(loaded, text, target, max_new_tokens, truncate, decoding, reporter)
        if words:
            whole = Parts({name: to_words(c) for name, c in whole.captures.items()})
        return whole.part(part) if part is not None else whole
    if part is not None or target is not None:
        raise InputError(f"part and target are for encoder-decoder models; {loaded.name} has one kind of attention")
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.token_ids)
    budget = loaded.memory_budget or memory_budget()
    if stream is False or not (stream or attention_bytes(loaded, T) > budget):
        check_memory(loaded, T, streams=stream is not False)
        with reporter.status("Running the model…"):
            full = make_capture(loaded, encoded, model_attentions(loaded, encoded), text)
        return to_words(full) if words else full
    from attnviz.sizes import size_text
    from attnviz.stream import streamed_words

    if words:
        from attnviz.words import word_edges

        W = len(word_edges(encoded.tokens, encoded.subword, encoded.special)) - 1
        reporter.note(f"Streamed: {T} tokens in {W} words, attention computed a block of query rows at a time "
                      f"({'--stream' if stream else 'over --max-memory'}).")
        return streamed_words(loaded, encoded, text, budget)
    why = "--stream" if stream else (f"the full attention would take {size_text(attention_bytes(loaded, T))}, "
                                     f"over --max-memory {size_text(budget)}")
    reporter.note(f"Streamed: {T} tokens, attention computed a block of query rows at a time ({why}); pictures "
                  f"show block means.")
    return _streamed(loaded, encoded, text, window, rollout_token, pictures, pool, reporter)


def _parts(loaded, text: str, target: str | None, max_new_tokens: int | None, truncate: bool, decoding: Any,
           reporter: Reporter) -> Parts:
    """An encoder-decoder model's three parts: the decoder reads `target`, or writes (greedy)."""
    from attnviz.generate import Decoding
    from attnviz.model import check_text
    from attnviz.seq2seq import parts_capture

    if target is not None and max_new_tokens is not None:
        raise InputError("give either target (the decoder reads it) or max_new_tokens (the decoder writes), not both")
    if target is not None:
        check_text(target)
        with reporter.status("Running the model…"):
            return parts_capture(loaded, text, target=target, truncate=truncate)
    decoding = decoding or Decoding(max_new_tokens=max_new_tokens or 20)
    with reporter.progress("Writing", decoding.max_new_tokens, "tokens") as step:
        parts = parts_capture(loaded, text, decoding=decoding, truncate=truncate, on_step=step)
    from attnviz.text import visible

    reporter.note(f"Decoder input: written by the model ({decoding.describe()}, "
                  f"{len(parts.part('decoder').tokens) - 1} tokens): “{visible(parts.meta.get('target_text', ''))}”; "
                  f"--target gives your own.")
    return parts


def _streamed(loaded, encoded, text: str, window: tuple | None, rollout_token: str | None, pictures: bool,
              pool: int, reporter: Reporter) -> Capture:
    """The streamed path: statistics exact, pictures pooled, the rollout row of the first token (the last for
    causal models) and of `rollout_token`, and the exact `window` (rows, cols, layers) asked for."""
    from dataclasses import replace

    import numpy as np

    from attnviz.model import layers_and_heads
    from attnviz.selection import Selection, find_token
    from attnviz.stream import Window, streamed_capture

    T = len(encoded.token_ids)
    L, H = layers_and_heads(loaded.model.config)
    starts = [n for n, kind in enumerate(encoded.special_kind) if kind == "start"]
    rollout = [T - 1 if loaded.causal or not starts else starts[0]]
    if rollout_token is not None:
        rollout.append(find_token(encoded.tokens, rollout_token))
    spec = None
    if window is not None:
        rows, cols, layers = window
        rows = rows or Selection.everything("row", "--rows")
        cols = cols or Selection.everything("col", "--cols")
        spec = Window(rows=np.asarray(rows.indices(T)), cols=np.asarray(cols.indices(T)),
                      layers=tuple(layers.indices(L)))
    with reporter.progress("Streaming", L * H, "heads") as step:
        pooled, kept = streamed_capture(loaded, encoded, text,
                                        rollout_tokens=list(dict.fromkeys(rollout)) if pictures else [],
                                        window=spec, pool=pool if pictures else 1, on_layer_done=step)
    if spec is not None and pooled.long is not None:
        pooled = replace(pooled, long=replace(pooled.long, window=kept, window_rows=spec.rows,
                                              window_cols=spec.cols, window_layers=spec.layers))
    return pooled


# --- what a Capture shows in a notebook ---------------------------------------------------------------------


FRAME_HEIGHT_PX = 760


def inline_html(whole: Capture | Parts) -> str:
    """The interactive viewer as one sandboxed frame: its own document (scripts, styles, data and the page's
    Content-Security-Policy inside), so several views in one notebook never share an id or a script."""
    from attnviz.render.viewer import viewer_data, viewer_html

    page = viewer_html(viewer_data(whole, command="attnviz in a notebook"))
    return (f'<iframe class="attnviz-view" srcdoc="{html.escape(page, quote=True)}" sandbox="allow-scripts" '
            f'style="width: 100%; height: {FRAME_HEIGHT_PX}px; border: 0" title="attnviz view"></iframe>')


def heatmap_figure(whole: Capture, layer: int = -1, head: int | str = "mean", *, cmap: str = "viridis"):
    """α of one layer and head (an index, "mean" or "max") as a matplotlib Figure."""
    from attnviz.panels import heatmap_page
    from attnviz.render.png import page_figure

    layer_index = whole.layer_index(layer)
    return page_figure(heatmap_page(whole, [layer_index], [head]), cmap=cmap).figure


@dataclass(frozen=True)
class HeadTable:
    """The head statistics of a capture: one record per layer and head, every registered metric and the
    pattern label. Shown as an HTML table in a notebook; `to_records()` for data."""

    records: tuple[dict, ...]

    def to_records(self) -> list[dict]:
        return [dict(r) for r in self.records]

    def __len__(self) -> int:
        return len(self.records)

    def _repr_html_(self) -> str:
        from attnviz.metrics import METRICS

        columns = ["layer", "head", "label", *(m.name for m in METRICS)]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)

        def cell(value) -> str:
            return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))

        rows = "".join("<tr>" + "".join(f"<td>{cell(r.get(c, ''))}</td>" for c in columns) + "</tr>"
                       for r in self.records)
        return f'<table class="attnviz-heads"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def head_table(whole: Capture) -> HeadTable:
    from attnviz.metrics import head_records

    return HeadTable(tuple(head_records(whole)))


def write_view(whole: Capture | Parts, path: str | os.PathLike, *, layers: Sequence[int] | None = None) -> Path:
    """The interactive page as one offline HTML file at `path`, written atomically."""
    from attnviz.files import atomic_output
    from attnviz.render.viewer import viewer_data, viewer_html

    target = Path(path).expanduser()
    with atomic_output(target) as tmp:
        tmp.write_text(viewer_html(viewer_data(whole, layers=layers, command="attnviz in Python")), encoding="utf-8")
    return target


capture_module.VIEWS.update(html=inline_html, heatmap=heatmap_figure, heads=head_table, view=write_view)
