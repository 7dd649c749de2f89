"""When each word was said, from a speech model's cross-attention, as whisper's timing.py does it (and
faster-whisper through CTranslate2): pure numpy.

    cross α of the alignment heads, rows of the steps that wrote the text (from <|notimestamps|> to the last
    text token, which writes <|endoftext|>), columns the N frames with sound
      -> each row renormalised over those frames (timing.py re-softmaxes the logits over them)
      -> standardised per head and frame over the rows: (w − mean) / std
      -> median filter of width 7 along time (reflected at the ends)
      -> mean over the heads: the alignment matrix M (rows × N)
      -> dynamic time warping on −M: a monotonic path from (0, 0) to (rows − 1, N − 1)
      -> a token's time: the frame where the path first reaches its row; a word runs from its first token's
         time to the next word's (words split at spaces and punctuation, punctuation merged into its word)
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np

MEDIAN_WIDTH = 7
PREPENDED = "\"'“¿([{-"
APPENDED = "\"'.。,，!！?？:：”)]}、"
SENTENCE_ENDS = ".。!！?？"


def median_filter(x: np.ndarray, width: int = MEDIAN_WIDTH) -> np.ndarray:
    """The median over a window of `width` (odd) along the last axis, the ends reflected (not repeated)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., pad]


def alignment_matrix(weights: np.ndarray, width: int = MEDIAN_WIDTH) -> np.ndarray:
    """(heads, rows, N) cross-attention over the frames with sound -> (rows, N): renormalised over the frames,
    standardised over the rows, median-filtered along time, averaged over the heads."""
    w = np.asarray(weights, np.float64)
    w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-30)
    mean = w.mean(axis=-2, keepdims=True)
    std = w.std(axis=-2, keepdims=True)
    w = (w - mean) / np.where(std > 0, std, 1.0)
    return median_filter(w, width).mean(axis=0)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `cost` (R, C) from (0, 0) to (R − 1, C − 1), moving down-right,
    down or right; ties go right, as timing.py's dtw does. (row indices, column indices) along the path."""
    R, C = cost.shape
    total = np.full((R + 1, C + 1), np.inf)
    total[0, 0] = 0.0
    trace = np.full((R + 1, C + 1), -1, np.int8)
    for j in range(1, C + 1):
        for i in range(1, R + 1):
            c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
            if c0 < c1 and c0 < c2:
                best, move = float(c0), 0
            elif c1 < c0 and c1 < c2:
                best, move = float(c1), 1
            else:
                best, move = float(c2), 2
            total[i, j] = cost[i - 1, j - 1] + best
            trace[i, j] = move
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = R, C
    rows, cols = [], []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        move = int(trace[i, j])
        if move == 0:
            i, j = i - 1, j - 1
        elif move == 1:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1], np.int64), np.array(cols[::-1], np.int64)


def token_times(rows: np.ndarray, cols: np.ndarray, frame_seconds: float) -> np.ndarray:
    """For each row of the matrix, the time (s) at which the path first reaches it."""
    jumps = np.concatenate([[True], np.diff(rows) > 0])
    return cols[jumps] * frame_seconds


UNSPACED = ("zh", "ja", "th", "lo", "my", "yue")  # languages written without spaces between words (whisper's list)


def split_words(pieces: list[str], by_character: bool = False) -> list[tuple[str, list[int]]]:
    """The text's words as (text, token indices): a word starts at a piece with a leading space, at a
    punctuation piece, and at the first piece; with `by_character` (a language written without spaces:
    UNSPACED) at every piece that holds whole characters, as whisper's split_tokens_on_unicode does. A piece
    that is no whole character (a multi-byte letter split over tokens) comes as "" and joins the one before."""
    words: list[tuple[str, list[int]]] = []
    for n, piece in enumerate(pieces):
        if not words or piece.startswith(" ") or (piece.strip() and piece.strip() in string.punctuation) or (
                by_character and piece):
            words.append((piece, [n]))
        else:
            text, ids = words[-1]
            words[-1] = (text + piece, ids + [n])
    return words


def merge_punctuation(words: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Opening punctuation joins the word after it, closing punctuation the word before (timing.py's rule),
    the joined word keeping the times of the word it joins; empty entries are dropped."""
    words = [dict(w) for w in words]
    i, j = len(words) - 2, len(words) - 1
    while i >= 0:
        before, after = words[i], words[j]
        if before["word"].startswith(" ") and before["word"].strip() in PREPENDED:
            after["word"] = before["word"] + after["word"]
            after["tokens"] = before["tokens"] + after["tokens"]
            before["word"], before["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(words):
        before, after = words[i], words[j]
        if not before["word"].endswith(" ") and after["word"] in APPENDED:
            before["word"] = before["word"] + after["word"]
            before["tokens"] = before["tokens"] + after["tokens"]
            after["word"], after["tokens"] = "", []
        else:
            i = j
        j += 1
    return [w for w in words if w["word"]]


def word_times(pieces: list[str], rows: np.ndarray, cols: np.ndarray, frame_seconds: float,
               by_character: bool = False) -> list[dict[str, Any]]:
    """Each word's start and end (s) from the path: the time its first token's row is reached, and the next
    word's (the last word's: the row of <|endoftext|>). Words longer than twice the median word (at most
    1.4 s) at a sentence's end are cut to that, as timing.py does; then punctuation is merged."""
    times = token_times(rows, cols, frame_seconds)  # one per row: the text's tokens, then <|endoftext|>
    split = split_words(pieces, by_character)
    bounds = np.cumsum([0] + [len(ids) for _, ids in split])
    words: list[dict[str, Any]] = [{"word": text, "tokens": ids, "start": float(times[a]), "end": float(times[b])}
             for (text, ids), a, b in zip(split, bounds[:-1], bounds[1:])]
    durations = np.array([w["end"] - w["start"] for w in words])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = 2 * median
    if len(durations):
        for i in range(1, len(words)):
            if words[i]["end"] - words[i]["start"] > longest:
                if words[i]["word"] in SENTENCE_ENDS:
                    words[i]["end"] = words[i]["start"] + longest
                elif words[i - 1]["word"] in SENTENCE_ENDS:
                    words[i]["start"] = words[i]["end"] - longest
    words = merge_punctuation(words)
    if words and median > 0:  # the first word after silence is not longer than twice the median
        first = words[0]
        if first["end"] > 4 * median and (first["end"] - first["start"] > longest or (
                len(words) > 1 and words[1]["end"] - first["start"] > 2 * longest)):
            if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
                boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
                first["end"] = words[1]["start"] = boundary
            first["start"] = max(0.0, first["end"] - longest)
    return words


def on_path(weights: np.ndarray, rows: np.ndarray, cols: np.ndarray, band: int = 1) -> np.ndarray:
    """(layers, heads, rows, N) cross-attention over the frames with sound -> (layers, heads): the share of
    each head's weight (renormalised over the frames, averaged over the rows) that falls within `band` frames
    of the frames the path gives each row."""
    w = np.asarray(weights, np.float64)
    w = w / np.maximum(w.sum(axis=-1, keepdims=True), 1e-30)
    R, N = w.shape[-2:]
    mask = np.zeros((R, N), bool)
    for r, c in zip(rows, cols):
        mask[r, max(0, c - band):c + band + 1] = True
    return (w * mask).sum(axis=-1).mean(axis=-1)
