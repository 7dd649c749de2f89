"""When each word was said, from a speech model's cross-attention (attnviz.align, `attnviz align`): the
alignment heads' cross-attention through whisper's timing.py recipe (metrics/timing.py), the words' start and
end times, the path, and how much of each cross-attention head's weight lies on that path; which heads align
(attnviz.detect of a sound, `attnviz detect --audio`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.data.parts import heard, heard_text, Parts
from attnviz.render.tables import records_html
from attnviz.errors import InputError, UsageError, arg
from attnviz.metrics.timing import alignment_matrix, dtw, MEDIAN_WIDTH, on_path, UNSPACED, word_times
from attnviz.panels import short_model
from attnviz.progress import Reporter
from attnviz.base.selection import head_pairs, pair_form

__all__ = ["align", "ALIGNMENT_TOLERANCE", "WordTimings", "alignment_heads", "AlignmentHeads", "LISTED_SHARE"]

ALIGNMENT_TOLERANCE = 0.1  # seconds: each word's start and end against faster-whisper's word_timestamps
LISTED_SHARE = 0.5  # a head "aligns" when at least this share of its weight lies on the path


@dataclass(frozen=True, eq=False)
class WordTimings(Result):
    """Word timings from cross-attention (whisper's timing.py): `words` one record each (word, start, end in
    seconds, tokens: the indices of its tokens in the text); `matrix` (rows, N) the alignment matrix (a row per
    step that wrote the text, from <|notimestamps|> to the last text token; a column per frame with sound);
    `path` the DTW path (rows, columns); `heads` the (layer, head) pairs used and `listed` whether they are the
    model's own alignment heads; `scores` (L, H): each cross-attention head's share of weight within `band`
    frames of the path; `capture` the Parts it was read from."""

    command: ClassVar[str] = "align"
    model: str
    words: tuple[dict, ...]
    matrix: np.ndarray
    path: tuple[np.ndarray, np.ndarray]
    heads: tuple[tuple[int, int], ...]
    listed: bool
    scores: np.ndarray
    band: int
    capture: Parts
    top: int = 8  # heads the report lists

    figure_name: ClassVar[str] = "attnviz_align.png"

    def to_rows(self) -> list[dict]:
        return self.records()

    def report(self, **style: Any) -> list:
        """The words' table, the heads' table and which heads align."""
        from attnviz.render.tables import records_table

        return [Line(describe(self), style="bold"),
                records_table(self.records(), [("word", "word", ""), ("start", "start (s)", ".2f"),
                                               ("end", "end (s)", ".2f")], title="words"),
                *heads_report(self, self.top)]

    @property
    def frame_seconds(self) -> float:
        return self.capture.part("cross").frame_seconds

    def records(self) -> list[dict]:
        """One record per word: word (as written, leading space dropped), start, end (s, two decimals)."""
        return [{"word": w["word"].strip(), "start": round(w["start"], 2), "end": round(w["end"], 2)}
                for w in self.words]

    def head_records(self) -> list[dict]:
        """Every cross-attention head by its share on the path, highest first, with whether the model lists it."""
        L, H = self.scores.shape
        listed = set(self.model_heads)
        order = np.argsort(-self.scores, axis=None, kind="stable")
        return [{"layer": int(i // H), "head": int(i % H), "on_path": round(float(self.scores.flat[i]), 4),
                 "listed": (int(i // H), int(i % H)) in listed} for i in order]

    @property
    def model_heads(self) -> tuple[tuple[int, int], ...]:
        """The alignment heads the model lists (its generation config), or () where it lists none."""
        return _listed(self.capture)

    def aligning(self, share: float = LISTED_SHARE) -> list[tuple[int, int]]:
        """The heads with at least `share` of their weight on the path."""
        return [(r["layer"], r["head"]) for r in self.head_records() if r["on_path"] >= share]

    def to_dict(self) -> dict:
        return {"model": self.model, **heard(self.capture.meta),
                "text": self.capture.meta.get("target_text", "").strip(),
                "audio": self.capture.meta.get("audio_name"), "seconds": self.capture.meta.get("audio_seconds"),
                "words": self.records(), "heads": [list(h) for h in self.heads], "listed": self.listed,
                "band_frames": self.band, "head_scores": self.head_records(),
                "path": {"rows": self.path[0].tolist(), "frames": self.path[1].tolist()}}

    def _repr_html_(self) -> str:
        return records_html(self.records(), ["word", "start", "end"], f"{self.model}: word timings from attention")

    def page(self):
        """The picture: the alignment matrix over the spectrogram, the path drawn over it, each word's span."""
        from attnviz.panels.sound import alignment_page

        return alignment_page(self)

    def figure(self, *, ax=None):
        from attnviz.render.sound import sound_figure

        return sound_figure(self.page(), ax=ax)


def _listed(parts: Parts) -> tuple[tuple[int, int], ...]:
    """The alignment heads a capture's metadata lists ("1.0,2.0,…"); () where it lists none or cannot be read."""
    from attnviz.errors import AttnvizError

    text = str(parts.meta.get("alignment_heads", "") or "")
    cross = parts.captures.get("cross")
    if not text or cross is None:
        return ()
    try:
        return tuple(head_pairs(text, cross.n_layers, cross.n_heads))
    except AttnvizError:
        return ()


def text_pieces(parts: Parts) -> list[str]:
    """The text of each row's token, from its span of the transcript: "" for a prompt token, and for a token
    with no span of its own or sharing the span of the one before (a piece of a character: it joins the word
    before)."""
    cross = parts.part("cross")
    text = str(cross.meta.get("text", ""))
    spans = cross.offsets if cross.offsets is not None else np.full((cross.n_tokens, 2), -1)
    pieces, before = [], (-1, -1)
    for a, b in spans.tolist():
        pieces.append(text[a:b] if a >= 0 and (a, b) != before else "")
        before = (a, b)
    return pieces


def windows_of(parts: Parts) -> list[tuple[int, int, int, int]]:
    """(first row, rows, first frame, frames) of each 30-s window of the capture (one for a sound of 30 s or
    less); a saved capture's metadata checked against its shape."""
    cross = parts.part("cross")
    rows, frames = parts.meta.get("window_rows"), parts.meta.get("window_frames")
    if rows is None and frames is None:
        return [(0, cross.n_tokens, 0, cross.frames)]
    if not (isinstance(rows, list) and isinstance(frames, list) and len(rows) == len(frames) >= 1
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in rows + frames)
            and sum(rows) == cross.n_tokens and sum(frames) == cross.frames):
        raise InputError("the capture's windows (window_rows, window_frames) do not add up to its rows and frames: "
                         "damaged or forged", "audio")
    row_starts, frame_starts = np.cumsum([0] + rows[:-1]), np.cumsum([0] + frames[:-1])
    return [(int(r), n, int(f), m) for r, n, f, m in zip(row_starts, rows, frame_starts, frames)]


@checked
def align(audio: Any, *, model: Any = "whisper", tokenizer: Any = None, target: str | None = None,
          heads: str | Sequence[tuple[int, int]] | None = None, band: int = 1, top: int = 8, device: str = "auto",
          dtype: str = "float32", reporter: Reporter | None = None) -> WordTimings:
    """Each word's start and end in `audio` from a speech model's cross-attention, as whisper's timing.py does:
    `audio` a sound (as attnviz.capture_audio takes it) or the Parts of a capture of sound (nothing is run);
    the transcript the model writes, or `target` read against the sound (forced alignment). `heads` the
    cross-attention heads to use, "3.4,2.5" or (layer, head) pairs; default the model's own alignment heads,
    else every head of the decoder's second half (timing.py's default). `band`: frames either side of the path
    that count as on it for each head's score; `top`: the heads the report lists."""
    if not 0 <= band <= 50:
        raise UsageError(f"{arg('band')} takes 0 to 50 frames", "band")
    if not 0 <= top <= 10_000:
        raise UsageError(f"{arg('top')} takes 0 to 10,000 heads", "top")
    if heads is not None:
        pair_form(heads)  # "x.y" or "" refused before the model loads and the sound is read
    if isinstance(audio, Parts):
        if target is not None:
            raise UsageError(f"{arg('target')} chooses what the model reads; a capture has read it already",
                             "target")
        parts = audio
    else:
        from attnviz.api.capturing import capture_audio

        parts = capture_audio(audio, model=model, tokenizer=tokenizer, target=target, device=device, dtype=dtype,
                              reporter=reporter)
    if "cross" not in parts.captures or parts.part("cross").mel is None:
        raise InputError("align reads a capture of sound, and this one holds none (capture a sound: "
                         f"{arg('audio', 'FILE')})", "audio")
    cross = parts.part("cross")
    prompt = int(parts.meta.get("prompt_tokens", 0))
    L, H = cross.n_layers, cross.n_heads
    chosen = tuple(head_pairs(heads, L, H)) if heads is not None else (_listed(parts) or tuple(
        (n, h) for n in range(L // 2, L) for h in range(H)))
    pieces, by_character = text_pieces(parts), parts.meta.get("language") in UNSPACED
    words: list[dict] = []
    blocks, path_rows, path_cols, scores, counted, written = [], [], [], np.zeros((L, H)), 0, 0
    for row, size, frame, N in windows_of(parts):  # each 30-s window's rows over its own frames
        first = row + prompt - 1  # the row of <|notimestamps|>: it writes the window's first word
        if prompt < 1 or size - prompt < 1:
            continue
        weights = cross.attentions[:, :, first:row + size, frame:frame + N]  # (L, H, rows, N)
        matrix = alignment_matrix(np.stack([weights[n, h] for n, h in chosen]), MEDIAN_WIDTH)
        rows, cols = dtw(-matrix)
        for word in word_times(pieces[row + prompt:row + size], rows, cols, cross.frame_seconds, by_character):
            words.append({**word, "tokens": [t + written for t in word["tokens"]],  # on the whole transcript
                          "start": word["start"] + frame * cross.frame_seconds,
                          "end": word["end"] + frame * cross.frame_seconds})
        written += size - prompt
        scores += on_path(weights, rows, cols, band) * len(matrix)
        path_rows.append(rows + counted)
        path_cols.append(cols + frame)
        blocks.append((counted, frame, matrix))
        counted += len(matrix)
    if not words:
        raise InputError("the transcript is empty: there are no words to time")
    matrix = np.zeros((counted, cross.frames))
    for first_row, first_frame, block in blocks:
        matrix[first_row:first_row + len(block), first_frame:first_frame + block.shape[1]] = block
    rows, cols = np.concatenate(path_rows), np.concatenate(path_cols)
    return WordTimings(model=parts.model, words=tuple(words), matrix=matrix.astype(np.float32), path=(rows, cols),
                       heads=chosen, listed=not heads and bool(_listed(parts)), scores=scores / counted,
                       band=band, capture=parts, top=top)


def describe(timings: WordTimings) -> str:
    """One line: how many words over how long, from which heads."""
    which = "the model's alignment heads" if timings.listed else f"{len(timings.heads)} heads"
    said = heard_text(timings.capture.meta)
    return (f"{short_model(timings.model)} · {len(timings.words)} words over "
            f"{timings.capture.meta.get('audio_seconds', 0):.2f} s, from {which}{' · ' + said if said else ''}")


def heads_report(timings: WordTimings, top: int) -> list:
    """The heads' table (the `top` by share on the path) and which heads align, listed or not."""
    from attnviz.render.tables import records_table

    items: list = []
    if top:
        rows = [{**r, "listed": "✓" if r["listed"] else ""} for r in timings.head_records()[:top]]
        columns = [("layer", "layer", "d"), ("head", "head", "d"), ("on_path", "on the path", ".1%"),
                   ("listed", "listed", "")]
        items.append(records_table(rows, columns, title=f"cross-attention heads by their share within "
                                                        f"{timings.band} frame{'s' if timings.band != 1 else ''} of "
                                                        f"the path"))
    found = timings.aligning()
    listed = set(timings.model_heads)
    named = ", ".join(f"{n}.{h}{' (listed)' if (n, h) in listed else ''}" for n, h in found) or "none"
    items.append(Line(f"heads with at least {LISTED_SHARE:.0%} of their weight on the path: {named}", wrap=False))
    if listed:
        items.append(Line(f"{len(set(found) & listed)} of the model's {len(listed)} listed alignment heads are among "
                          f"them", wrap=False))
    return items


@dataclass(frozen=True, eq=False)
class AlignmentHeads(Result):
    """Every cross-attention head of a speech model by its share of weight on the word-timing path of one sound,
    and whether the model lists it as an alignment head (attnviz detect --audio)."""

    command: ClassVar[str] = "detect"
    timings: WordTimings

    figure_name: ClassVar[str] = "attnviz_detect_alignment.png"

    def to_dict(self) -> dict:
        """What `attnviz detect --audio --json` prints."""
        t = self.timings
        return {"model": t.model, **heard(t.capture.meta), "band_frames": t.band, "threshold": LISTED_SHARE,
                "aligning": [list(p) for p in t.aligning()], "listed": [list(p) for p in t.model_heads],
                "heads": t.head_records()}

    def to_rows(self) -> list[dict]:
        return self.timings.head_records()

    def report(self, **style: Any) -> list:
        return [Line(describe(self.timings), style="bold"),
                *heads_report(self.timings, len(self.timings.head_records()))]

    def figure(self, *, ax=None):
        """Each cross-attention head's share on the path, layers × heads."""
        from attnviz.panels import Scale, head_grid_panel
        from attnviz.render.png import panel_figure

        panel = head_grid_panel(self.timings.scores, Scale(0.0, 1.0, "share of weight on the path"),
                                f"{short_model(self.timings.model)} · cross-attention heads on the word-timing path",
                                "attnviz_detect_alignment")
        return panel_figure(panel, ax=ax)


def alignment_heads(audio: Any, *, model: Any = "whisper", tokenizer: Any = None, device: str = "auto",
                    dtype: str = "float32", reporter: Reporter | None = None) -> AlignmentHeads:
    """Which cross-attention heads of a speech model align with `audio` (a sound, or a capture of one): each
    head's share of weight on the word-timing path, and whether the model lists it."""
    return AlignmentHeads(align(audio, model="whisper" if model is None else model, tokenizer=tokenizer,
                                device=device, dtype=dtype, reporter=reporter))
