"""What attention over a sound shows: the transcript's cross-attention over time, a row per step that wrote a
token, under the log-mel spectrogram it heard (or the encoder's self-attention, time against time); and the
word timings' alignment matrix with its path. The silence after the sound is left out of the picture (its share
is in the notes). numpy only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnviz.data.capture import Capture
from attnviz.data.parts import heard_text
from attnviz.errors import SelectionError, arg
from attnviz.panels.names import head_filename, head_label, short_model
from attnviz.panels.page import HeadChoice, Page, Panel, Scale
from attnviz.base.text import shorten, visible

END = "(end)"  # the last row writes <|endoftext|> (or follows a given transcript's end)
NEXT = "(next)"  # the last row of a transcript cut by --max-new-tokens: it writes what was not kept


def written_labels(capture: Capture) -> tuple[int, tuple[str, ...]]:
    """(the first row drawn, a label per row from it): each row is the step that wrote the next token, so it is
    labelled with what it wrote — the row of <|notimestamps|> writes the first word, the last writes the end
    (or, where --max-new-tokens cut the transcript, the next token, not kept)."""
    first = max(int(capture.meta.get("prompt_tokens", 1)) - 1, 0)
    tokens = capture.tokens
    last = END if capture.meta.get("stopped") != "max_new_tokens" else NEXT
    labels = tuple(visible(tokens[i + 1]) if i + 1 < len(tokens) else last for i in range(first, len(tokens)))
    return first, labels


def frame_labels(capture: Capture) -> tuple[str, ...]:
    return tuple(capture.key_tokens[:capture.frames])


def sound_page(capture: Capture, layers: Sequence[int], heads: Sequence[HeadChoice]) -> Page:
    """A panel per layer and head over the frames with sound, under the spectrogram: cross-attention (a row per
    token written) or the encoder's self-attention (frames × frames). One scale per panel, from 0 to its
    largest weight: a row's weight is spread over many frames."""
    if capture.mel is None:
        raise SelectionError(f"this capture is not of a sound: give {arg('audio', 'FILE')}", "audio")
    N = capture.frames
    cross = capture.part == "cross"
    if cross:
        first, rows = written_labels(capture)
    elif capture.part == "encoder":
        first, rows = 0, frame_labels(capture)
    else:
        raise SelectionError(f"the decoder reads tokens, not the sound: its heatmap is the ordinary one "
                             f"({arg('part', 'decoder')} without the sound's picture)", "part")
    panels = []
    silence = []
    for layer in layers:
        for head in heads:
            alpha = capture.head_matrix(layer, head)
            block = np.asarray(alpha[first:first + len(rows), :N], np.float32)
            if capture.n_keys > N:
                silence.append(float(alpha[first:first + len(rows), N:].sum(axis=-1).mean()))
            label = head_label(head, capture.n_heads)
            what = "cross-attention over time" if cross else "encoder self-attention, time × time"
            panels.append(Panel(
                matrix=block, rows=rows, cols=frame_labels(capture), hidden=None,
                scale=Scale(0.0, max(float(block.max()), 1e-9), "α", shared=False),
                title=(f"{short_model(capture.model)} · layer {layer} · {label}: {what}",),
                name=f"attnviz_{capture.part}_{head_filename(layer, head)}", short=f"layer {layer}, {label}",
                layer=layer, head=head, row_axis="token written" if cross else "query frame (s)",
                col_axis="time (s)"))
    notes = [f"{N} frames of {capture.frame_seconds * 1000:.0f} ms; each panel to its own largest weight"]
    if cross:
        notes.append("a row is the step that wrote its token (the row of <|notimestamps|> writes the first word)")
    if silence:
        notes.append(f"the padding to 30 s (not drawn) takes {100 * float(np.mean(silence)):.0f}% of a row on "
                     f"average")
    title = (panels[0].title_text if len(panels) == 1 else
             f"{short_model(capture.model)} · {'cross-attention over time' if cross else 'encoder self-attention'}")
    return Page(panels=tuple(panels), title=title, name=panels[0].name if len(panels) == 1 else
                f"attnviz_{capture.part}_sound", notes=tuple(notes), subtitle=_subtitle(capture),
                spectrogram=capture.mel, frame_seconds=capture.frame_seconds)


def _subtitle(capture: Capture) -> str:
    text = str(capture.meta.get("target_text", "")).strip()
    name = visible(str(capture.meta.get("audio_name", "")))
    seconds = capture.meta.get("audio_seconds", 0)
    said = heard_text(capture.meta)
    head = f"{name} ({seconds:.2f} s{', ' + said if said else ''})"
    return f"{head}: “{shorten(visible(text), 160)}”" if text else head


def alignment_page(timings: Any) -> Page:
    """An attnviz.WordTimings' picture: the alignment matrix (rows: the steps that wrote the text, then the end;
    columns: frames) with the DTW path over it, under the spectrogram with each word's span marked."""
    cross = timings.capture.part("cross")
    first, rows = written_labels(cross)
    matrix = timings.matrix
    low, high = float(matrix.min()), float(matrix.max())
    heads = ", ".join(f"{n}.{h}" for n, h in timings.heads)
    which = "the model's alignment heads" if timings.listed else "heads"
    panel = Panel(matrix=matrix, rows=rows[:matrix.shape[0]], cols=frame_labels(cross), hidden=None,
                  scale=Scale(low, max(high, low + 1e-9), "standardised α (mean of the heads)", shared=False),
                  title=(f"{short_model(timings.model)} · word timings from {which} {shorten(heads, 60)}",),
                  name="attnviz_align", short="alignment", row_axis="token written", col_axis="time (s)",
                  path=timings.path)
    notes = (f"cross-attention of {len(timings.heads)} heads, renormalised over the sound, standardised over the "
             f"tokens, median-filtered (7 frames), averaged; the line is the dynamic-time-warping path",)
    words = tuple((visible(w["word"].strip()), float(w["start"]), float(w["end"])) for w in timings.words)
    return Page(panels=(panel,), title=panel.title_text, name="attnviz_align", notes=notes, subtitle=_subtitle(cross),
                spectrogram=cross.mel, frame_seconds=cross.frame_seconds, words=words)
