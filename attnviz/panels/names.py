"""Names and titles, display-safe: the model's short name, head labels and file names, token labels (the
special ones hidden on request), the part's title, the text under a picture.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz.data.capture import Capture
from attnviz.errors import SelectionError, arg
from attnviz.base.text import shorten, visible

from attnviz.panels.page import HeadChoice, Panel, Scale


# --- names and titles ------------------------------------------------------------------------------


def short_model(name: str) -> str:
    """The last part of a model id or folder: "sentence-transformers/all-MiniLM-L6-v2" -> "all-MiniLM-L6-v2"."""
    return visible(name.rstrip("/").split("/")[-1] or name)


def head_label(head: HeadChoice, n_heads: int) -> str:
    if head == "mean":
        return f"mean of {n_heads} heads"
    if head == "max":
        return f"max over {n_heads} heads"
    return f"head {head}"


def head_filename(layer: int, head: HeadChoice, fmt: str = "") -> str:
    """layer03_head07, layer03_mean (with ".fmt" when fmt is given)."""
    stem = f"layer{layer:02d}_{head if isinstance(head, str) else f'head{head:02d}'}"
    return f"{stem}.{fmt}" if fmt else stem


def token_labels(capture: Capture, keep: np.ndarray | None = None) -> tuple[str, ...]:
    """The tokens as labels, control characters made visible."""
    tokens = capture.tokens if keep is None else [t for t, k in zip(capture.tokens, keep) if k]
    return tuple(visible(t) for t in tokens)


def key_labels(capture: Capture, keep: np.ndarray | None = None) -> tuple[str, ...]:
    """The key tokens as labels: the tokens themselves, or the source of cross-attention."""
    tokens = capture.key_tokens if keep is None else [t for t, k in zip(capture.key_tokens, keep) if k]
    return tuple(visible(t) for t in tokens)


def kept_tokens(capture: Capture, hide_special: bool) -> np.ndarray:
    keep = capture.keep_mask(hide_special)
    if not keep.any() or not capture.key_keep_mask(hide_special).any():
        raise SelectionError(f"every token of this input is a special token, so {arg('hide_special')} leaves "
                             f"nothing to show; drop {arg('hide_special')}", "hide_special")
    return keep


PART_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention (target → source)"}


def generated_split(capture: Capture, positions: Sequence[int] | np.ndarray | None = None) -> int | None:
    """Where generated tokens begin among `positions` (token indices shown in order; default all): the index
    of the first generated one, or None when they are all prompt or all generated (no line to draw)."""
    if capture.generated is None:
        return None
    flags = capture.generated if positions is None else capture.generated[np.asarray(positions, dtype=np.intp)]
    if not flags.any() or flags.all():
        return None
    first = int(np.argmax(flags))
    return first if flags[first:].all() and not flags[:first].any() else None


def splits(capture: Capture, rows: Sequence[int] | np.ndarray | None = None,
           cols: Sequence[int] | np.ndarray | None = None) -> dict[str, int | None]:
    """Panel fields marking where the prompt ends, for the rows and columns shown."""
    return {"row_split": generated_split(capture, rows),
            "col_split": generated_split(capture, cols) if capture.square else None}


def grid_title(capture: Capture, panels: Sequence[Panel]) -> str:
    scale = panels[0].scale if panels else Scale()
    shared = all(p.scale == scale for p in panels)
    which = f"one colour scale (0–{scale.vmax:.2f}, {scale.describe().split(',')[0]})" if shared else \
        f"each head its own scale ({scale.describe().split(',')[0]})"
    return f"{short_model(capture.model)} · every head · T = {capture.input_tokens} · {which}"


def text_subtitle(capture: Capture, limit: int = 400) -> str:
    """The input text as one display-safe line in quotes (a renderer shortens it to its width)."""
    half = max(limit // 2, 20)
    if capture.part is not None:  # an encoder-decoder model: the source, and the target read or written
        source, target = str(capture.meta.get("source_text", "")), str(capture.meta.get("target_text", ""))
        how = "generated " if capture.meta.get("target_source") == "generated" else ""
        return f"“{visible(shorten(source, half))}” → {how}“{visible(shorten(target, half))}”"
    prompt, written = capture.meta.get("prompt"), capture.meta.get("generated_text")
    if capture.generated is not None and isinstance(prompt, str) and isinstance(written, str):
        return f"“{visible(shorten(prompt, half))}” → generated “{visible(shorten(written, half))}”"
    text = str(capture.meta.get("text") or " ".join(capture.tokens))
    dropped = capture.meta.get("dropped_tokens")
    cut = (f"cut to the model's {capture.input_tokens} tokens, the last {dropped} dropped: "
           if isinstance(dropped, int) and dropped > 0 else "")
    return cut + "“" + visible(shorten(text, limit)) + "”"


