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

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnviz.capture import PART_NAMES, VIEWS, Capture, Parts
from attnviz.errors import InputError
from attnviz.progress import Reporter


def load_model(name: str | None = None, *, device: str = "auto", dtype: str = "float32", revision: str | None = None,
               trust_remote_code: bool = False, memory_budget: int | None = None, lm_head: bool | str = False):
    """Load a model once for many captures: an offline name (minilm, multilingual, smollm2), a Hugging Face
    id, a local folder or a .gguf file, with eager attention, in eval mode, on `device`."""
    from attnviz.engine.loading import load

    return load(name, revision=revision, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                memory_budget=memory_budget, lm_head=lm_head)


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
    `decoding` (attnviz.engine.generate.Decoding): how an encoder-decoder model's decoder writes (default greedy)
    `reporter` hears of long work (the command line shows it)
    """
    from attnviz.engine.loading import LoadedModel
    from attnviz.engine.forward import check_text

    check_text(text)
    if part is not None and part not in PART_NAMES:
        raise InputError(f"part must be one of {', '.join(PART_NAMES)}, not {part!r}")
    if isinstance(model, LoadedModel):
        loaded = model
    elif model is None or isinstance(model, (str, os.PathLike)):
        loaded = load_model(None if model is None else str(model), device=device, dtype=dtype)
    else:
        from attnviz.engine.loading import wrap

        loaded = wrap(model, tokenizer)
    training = bool(getattr(loaded.model, "training", False))
    loaded.model.eval()  # dropout off while capturing; the model's own mode is put back
    from attnviz.engine.entry import run_capture

    try:
        return run_capture(loaded, text, words=words, stream=stream, part=part, target=target,
                           max_new_tokens=max_new_tokens, truncate=truncate, pool=pool, window=window,
                           rollout_token=rollout_token, pictures=pictures, decoding=decoding,
                           reporter=reporter or Reporter())
    finally:
        loaded.model.train(training)


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

        present = self.records[0] if self.records else {}
        columns = ["layer", "head", "label", *(m.name for m in METRICS if m.name in present)]
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


VIEWS.update(html=inline_html, heatmap=heatmap_figure, heads=head_table, view=write_view)


# --- what a head does, tested by removing it ---------------------------------------------------------------


MAX_MEAN_TEXTS = 10_000  # texts a mean ablation averages over
MAX_IMPORTANCE_TEXTS = 1_000  # texts importance runs every head's removal on


def _ablation_model(model: Any, tokenizer: Any = None, *, device: str = "auto", dtype: str = "float32"):
    """A LoadedModel with its causal-LM head where it is a decoder, and where its heads can be removed."""
    from attnviz.engine.ablation import is_causal_lm, site
    from attnviz.engine.loading import LoadedModel, load, wrap

    if isinstance(model, LoadedModel):
        loaded = model
    elif model is None or isinstance(model, (str, os.PathLike)):
        loaded = load(None if model is None else str(model), device=device, dtype=dtype, lm_head="auto")
    else:
        loaded = wrap(model, tokenizer)
    if loaded.seq2seq:
        raise InputError(f"{loaded.name} is an encoder-decoder model; removing heads is shown for encoder-only "
                         f"and decoder-only models")
    if loaded.causal and not is_causal_lm(loaded.model):
        raise InputError(f"{loaded.name} is a decoder without its language-model head: load it with "
                         f"attnviz.load_model(name, lm_head=True) to see the next-token distributions")
    loaded.model.eval()
    return loaded, site(loaded.model)


def _encoded_inputs(loaded, texts: Sequence[str], truncate: bool) -> list[dict]:
    from attnviz.engine.forward import encode

    return [encode(loaded, text, truncate=truncate).inputs for text in texts]


def _head_pairs(heads: Any, L: int, H: int) -> list[tuple[int, int]]:
    from attnviz.selection import parse_pairs, resolve_pairs

    if isinstance(heads, str):
        pairs = parse_pairs(heads)
    else:
        pairs = tuple((int(layer), head if head == "all" else int(head)) for layer, head in heads)
    return resolve_pairs(pairs, L, H)


def ablate(text: str, heads: Any, model: Any = None, tokenizer: Any = None, *, mode: str = "zero",
           mean_over: Sequence[str] | None = None, truncate: bool = True, device: str = "auto",
           dtype: str = "float32"):
    """The model on `text` with `heads` removed ("5.11,3.0", or (layer, head) pairs) against the clean model:
    next-token distributions (a causal LM) or the sentence embedding and each token's hidden state (an
    encoder), and every later layer's Δα. `mode`: "zero", or "mean" (each head's mean output over the text's
    tokens, or over the texts `mean_over`). Returns an attnviz.engine.ablation.Ablation."""
    from attnviz.engine.ablation import ablate as run_ablation, head_means
    from attnviz.engine.forward import check_text, encode
    from attnviz.engine.memory import check_memory

    check_text(text)
    loaded, where = _ablation_model(model, tokenizer, device=device, dtype=dtype)
    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.tokens), copies=2.0)
    removed = _head_pairs(heads, where.layers, where.heads)
    fills, source = None, "the text"
    if mode == "mean" and mean_over is not None:
        texts = [t for t in mean_over if t.strip()][:MAX_MEAN_TEXTS]
        if not texts:
            raise InputError("the texts to average each head's output over are all empty")
        fills, source = head_means(where, _encoded_inputs(loaded, texts, truncate)), f"{len(texts)} texts"
    result = run_ablation(where, encoded.inputs, removed, mode=mode, fills=fills, means_from=source)
    result.tokens, result.token_ids = list(encoded.tokens), list(encoded.token_ids)
    result.model, result.text = loaded.name, text
    return result


def importance(texts: str | Sequence[str], model: Any = None, tokenizer: Any = None, *, mode: str = "zero",
               truncate: bool = True, device: str = "auto", dtype: str = "float32", batched: bool = True,
               reporter: Reporter | None = None):
    """Every head removed alone (batched), ranked by its effect, beside Michel et al.'s gradient estimate;
    averaged over `texts` (one text or several). Returns an attnviz.engine.ablation.Importance."""
    from attnviz.engine.ablation import importance as run_importance
    from attnviz.engine.forward import check_text
    from attnviz.engine.memory import check_memory

    given = [texts] if isinstance(texts, str) else list(texts)
    if not given:
        raise InputError("no texts to remove heads on")
    if len(given) > MAX_IMPORTANCE_TEXTS:
        raise InputError(f"{len(given):,} texts: importance takes at most {MAX_IMPORTANCE_TEXTS:,} (each runs every "
                         f"head's removal)")
    for text in given:
        check_text(text)
    loaded, where = _ablation_model(model, tokenizer, device=device, dtype=dtype)
    inputs = _encoded_inputs(loaded, given, truncate)
    check_memory(loaded, max(int(i["input_ids"].shape[1]) for i in inputs), copies=3.0)
    reporter = reporter or Reporter()
    with reporter.progress("Removing every head", len(inputs), "texts") as step:
        return run_importance(where, inputs, mode=mode, batched=batched, on_text=step)


def detect(model: Any = None, tokenizer: Any = None, *, length: int = 50, sequences: int = 4, seed: int = 0,
           draws: int = 10, mode: str = "zero", device: str = "auto", dtype: str = "float32",
           reporter: Reporter | None = None):
    """Previous-token, duplicate-token and induction heads on random token sequences repeated once, scored as
    TransformerLens's head detector does; for a causal LM, the loss on the repeats with the detected induction
    heads removed against as many random heads. Returns an attnviz.engine.ablation.Detection."""
    from attnviz.engine.ablation import detection

    loaded, where = _ablation_model(model, tokenizer, device=device, dtype=dtype)
    if loaded.max_positions and 2 * length + 1 > loaded.max_positions:
        raise InputError(f"{loaded.name} takes at most {loaded.max_positions} positions: give a length of at most "
                         f"{(loaded.max_positions - 1) // 2}")
    reporter = reporter or Reporter()
    with reporter.progress("Scoring the heads", sequences, "sequences") as step:
        return detection(loaded, where, length=length, sequences=sequences, seed=seed, draws=draws, mode=mode,
                         on_step=step)
