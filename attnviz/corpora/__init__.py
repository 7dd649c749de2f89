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
`attnviz.corpora.run`.
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from attnviz._version import __version__
from attnviz.errors import CaptureFormatError, InputError
from attnviz.blocks import row_shares
from attnviz.parallel import run_all
from attnviz.metrics import BLOCK, LABELS, Metric, Rows, Tokens, all_metrics, label_heads

STATE_KIND = "attnviz-corpus"
STATE_VERSION = 1
STATE_FILE = "stats.json"
WEIGHTINGS = ("texts", "tokens")
MAX_LINE_BYTES = 1 << 20  # a longer line is counted as bad ("longer than 1 MiB") and skipped, unread
MAX_BAD_LISTED = 1000  # bad lines listed by number; beyond, only counted
MAX_STATE_BYTES = 64 << 20  # a stats.json to merge
MAX_STATE_CONTAINERS = 2_000_000  # JSON lists and objects in it (each costs ~60 bytes parsed)
MAX_STATE_CELLS = 65_536  # layers × heads
MAX_COUNT = 2 ** 53  # texts, tokens, lines, label counts: exact in float64 and summed without overflow
MAX_VALUE = 1e9  # |mean| of a statistic (entropies, distances in tokens and shares are far below it)
CLARK_GROUPS = (("start_mass", "[CLS]/BOS"), ("end_mass", "[SEP]/EOS"), ("punct_mass", "punctuation"))


# --- reading a corpus: one text per line, or JSON lines ------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One text of the corpus, or (text None) a line that is not one, with why."""

    source: str
    number: int  # 1-based
    text: str | None
    reason: str = ""


def corpus_format(path: str, fmt: str | None, field_name: str | None) -> str:
    """txt or jsonl: as asked, else jsonl for .jsonl/.json files or when --field is given, else txt."""
    if fmt is not None:
        return fmt
    if field_name is not None or path.lower().endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    return "txt"


def read_lines(stream: IO[bytes], source: str, fmt: str = "txt", field_name: str = "text",
               stop: Callable[[], bool] | None = None) -> Iterator[Line]:
    """The texts of a corpus, one per line, as Line records; bad lines (empty, not UTF-8, not JSON, no such
    field, longer than MAX_LINE_BYTES) come as Line(text=None, reason=...) and never stop the reading.
    `stop()` is asked before every read, so Ctrl-C or SIGTERM ends even an endless line (`cat /dev/zero`)."""
    number = 0
    while not (stop and stop()):
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line a block at a time
                if stop and stop():
                    return
                raw = stream.readline(MAX_LINE_BYTES)
            yield Line(source, number, None, "longer than 1 MiB")
            continue
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
        yield _parse(raw.rstrip(b"\r\n"), source, number, fmt, field_name)


def _parse(raw: bytes, source: str, number: int, fmt: str, field_name: str) -> Line:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Line(source, number, None, "not UTF-8")
    if fmt == "jsonl":
        if not text.strip():
            return Line(source, number, None, "empty")
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            return Line(source, number, None, "not JSON")
        value = record.get(field_name) if isinstance(record, dict) else None
        if not isinstance(value, str):
            what = "not a JSON object" if not isinstance(record, dict) else (
                f"no field {field_name!r}" if field_name not in record else f"field {field_name!r} is not a string")
            return Line(source, number, None, what[:120])
        text = value
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            return Line(source, number, None, "not valid Unicode (a lone surrogate escape)")
    if not text.strip():
        return Line(source, number, None, "empty")
    return Line(source, number, text)


# --- moments that merge --------------------------------------------------------------------------------


@dataclass
class Moments:
    """count, mean and M2 (sum of squared deviations from the mean) per layer and head, merged with Chan et
    al.'s formula: merging the moments of two sets gives the moments of their union."""

    count: np.ndarray  # (L, H) float64
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> Moments:
        return cls(np.zeros(shape), np.zeros(shape), np.zeros(shape))

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        """The moments of samples (N, ...), NaN samples left out."""
        values = np.asarray(values, np.float64)
        w = np.isfinite(values).astype(np.float64)
        x = np.where(w > 0, values, 0.0)
        count = w.sum(axis=0)
        mean = np.divide(x.sum(axis=0), count, out=np.zeros_like(count), where=count > 0)
        m2 = (w * (x - mean) ** 2).sum(axis=0)
        return cls(count, mean, m2)

    @classmethod
    def combine(cls, counts: np.ndarray, means: np.ndarray, m2s: np.ndarray) -> Moments:
        """The moments of the union of N sets given each set's moments (N, ...)."""
        count = counts.sum(axis=0)
        mean = np.divide((counts * means).sum(axis=0), count, out=np.zeros_like(count), where=count > 0)
        m2 = m2s.sum(axis=0) + (counts * (means - mean) ** 2).sum(axis=0)
        return cls(count, mean, m2)

    def merge(self, other: Moments) -> Moments:
        n = self.count + other.count
        delta = other.mean - self.mean
        safe = np.where(n > 0, n, 1.0)
        mean = np.where(n > 0, self.mean + delta * other.count / safe, 0.0)
        m2 = self.m2 + other.m2 + delta ** 2 * self.count * other.count / safe
        return Moments(n, mean, m2)

    def std(self) -> np.ndarray:
        """Sample standard deviation (n − 1); NaN with fewer than two samples."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 1, np.sqrt(np.maximum(self.m2, 0.0) / (self.count - 1)), np.nan)

    def means(self) -> np.ndarray:
        """The mean; NaN where there was no sample."""
        return np.where(self.count > 0, self.mean, np.nan)


# --- one text's statistics -----------------------------------------------------------------------------


def corpus_metrics() -> list[Metric]:
    """The numeric metrics of the head table, and the label inputs (block)."""
    return [m for m in all_metrics() if m.kind == "number"]


@dataclass
class TextStats:
    """One text's contribution: per-text head values, per-text row moments, its labels. Shapes (L, H)."""

    values: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # metric -> (count, mean, m2) over query rows
    labels: np.ndarray  # (L, H) index into LABELS
    tokens: int


@dataclass
class BatchStats:
    """Several texts' contributions at once: TextStats stacked along a first axis of texts, (B, L, H) each."""

    values: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    labels: np.ndarray
    tokens: np.ndarray  # (B,) int

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, b: int) -> TextStats:
        return TextStats({name: v[b] for name, v in self.values.items()},
                         {name: (c[b], m[b], m2[b]) for name, (c, m, m2) in self.rows.items()},
                         self.labels[b], int(self.tokens[b]))

    def __iter__(self) -> Iterator[TextStats]:
        return (self[b] for b in range(len(self)))

    @classmethod
    def stack(cls, stats: Sequence[TextStats]) -> BatchStats:
        names = list(stats[0].values)
        return cls({name: np.stack([s.values[name] for s in stats]) for name in names},
                   {name: tuple(np.stack([s.rows[name][i] for s in stats]) for i in range(3))  # type: ignore[misc]
                    for name in names},
                   np.stack([s.labels for s in stats]), np.array([s.tokens for s in stats], np.int64))


ROWS_BYTES = 4 << 20  # α of the texts whose statistics are computed together, as float64: kept in cache
# (at least one layer of one text)


def pack(alphas: Sequence[np.ndarray]) -> np.ndarray:
    """Texts' α (L, H, n, n) each, as one array of all their query rows, keys first: (W, R, L·H) float32 with W
    the longest n and R = Σ n (text k's rows after text k − 1's; keys beyond a text's own hold 0)."""
    L, H = alphas[0].shape[:2]
    W, R = max(a.shape[-1] for a in alphas), sum(a.shape[-1] for a in alphas)
    out = np.zeros((W, R, L * H), np.float32)
    r = 0
    for a in alphas:
        n = a.shape[-1]
        out[:n, r:r + n] = np.asarray(a).reshape(L * H, n, n).transpose(2, 1, 0)
        r += n
    return out


def unpack(packed: np.ndarray, start: int, n: int, heads: int) -> np.ndarray:
    """One text's α (L, H, n, n) back from pack()'s layout: its n rows from row `start`."""
    block = packed[:n, start:start + n]  # (keys, queries, L·H)
    return np.ascontiguousarray(block.reshape(n, n, -1, heads).transpose(2, 3, 1, 0))


def text_stats(alpha: np.ndarray, tokens: Tokens, metrics: Sequence[Metric], sinks: bool = False,
               windows: Sequence[int] | None = None) -> TextStats:
    """The statistics of one text from its own α (L, H, n, n), padding already cut away (texts_stats)."""
    return texts_stats(pack([alpha]), [alpha.shape[-1]], [tokens], alpha.shape[1], metrics, sinks, windows)[0]


def texts_stats(packed: np.ndarray, lengths: Sequence[int], tokens: Sequence[Tokens], heads: int,
                metrics: Sequence[Metric], sinks: bool = False, windows: Sequence[int] | None = None) -> BatchStats:
    """The statistics of several texts at once from their query rows as pack() lays them out (W, R, L·H): for
    each text the values the head table shows for it (head_values) and moments over its query rows. The
    metrics run on the rows of many texts together (metrics.Rows with texts), each row with its own text's
    tokens; a text's values are then reduced over its own rows. `sinks`: the family's sink logits take part
    of each row; the statistics then use each row's shares, and 'kept' what it kept. `windows`: each layer's
    sliding window (then one layer at a time, each counting keys within its own)."""
    G = packed.shape[-1]
    L, H, B = G // heads, heads, len(lengths)
    sizes = np.asarray(lengths, np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    queries = np.concatenate([np.arange(n) for n in sizes])
    row_metrics = [m for m in metrics if m.rows is not None]
    row_functions = [m.rows for m in row_metrics if m.rows is not None]
    column_metrics = [m for m in metrics if m.rows is None]
    M = len(row_metrics)
    moments = np.zeros((3, M, G, B))  # count, mean, m2 of each row metric, head (layer-major) and text
    columns = np.zeros((len(column_metrics), G, B))

    def chunk(t0: int, t1: int) -> None:  # the texts t0..t1; writes only their columns of the results
        r0, r1 = int(starts[t0]), int(starts[t1])
        width, counts = int(sizes[t0:t1].max()), sizes[t0:t1]
        text_of = np.zeros((r1 - r0, t1 - t0))  # each row's text, one-hot: sums over a text's rows as matmuls
        text_of[np.arange(r1 - r0), np.repeat(np.arange(t1 - t0), counts)] = 1.0
        per = 1 if windows else max(1, ROWS_BYTES // max(width * (r1 - r0) * H * 8, 1))  # layers at a time
        for l0 in range(0, L, per):
            l1 = min(L, l0 + per)
            g0, g1 = l0 * H, l1 * H
            alpha = packed[:width, r0:r1, g0:g1].transpose(2, 1, 0)  # (kH, rows, width), a view
            kept = None
            if sinks:  # as head_values does: each row's shares, and what it kept
                kept = alpha.sum(axis=-1, dtype=np.float64)
                alpha = row_shares(alpha)
            texts = tuple(t.at_layer(windows, l0) for t in tokens[t0:t1])
            rows = Rows(alpha, queries[r0:r1], texts[0], kept, texts=texts, counts=tuple(int(c) for c in counts))
            if row_metrics:  # every row metric's moments at once, each text's over its own rows
                v = np.stack([np.asarray(of(rows), np.float64) for of in row_functions])  # (M, kH, rows)
                finite = np.isfinite(v)
                x = np.where(finite, v, 0.0)
                # count, Σx and Σx² over each text's rows in one product; M2 = Σx² − (Σx)²/count
                sums = np.stack([finite.astype(np.float64), x, x * x]) @ text_of  # (3, M, kH, texts)
                count = sums[0]
                mean = np.divide(sums[1], count, out=np.zeros_like(count), where=count > 0)
                m2 = np.maximum(sums[2] - mean * sums[1], 0.0)
                moments[:, :, g0:g1, t0:t1] = count, mean, m2
            if column_metrics:  # each text's mean over its rows of α, (kH, n), and its column statistics
                column_sums = np.matmul(text_of.T, rows.alpha64.transpose(2, 1, 0))  # (width, texts, kH)
                for k, (n, text) in enumerate(zip(counts, texts)):
                    column_mean = column_sums[:n, k].T / n
                    for c, m in enumerate(column_metrics):
                        assert m.columns is not None
                        columns[c, g0:g1, t0 + k] = np.asarray(m.columns(column_mean, text), np.float64)

    run_all([functools.partial(chunk, t0, t1) for t0, t1 in _text_chunks(sizes, G)])
    values, out_moments = {}, {}
    for i, m in enumerate(row_metrics):
        count, mean, m2 = (_by_text(part, H) for part in moments[:, i])
        values[m.name] = np.where(count > 0, mean, m.when_empty)
        out_moments[m.name] = (count, mean, m2)
    for c, m in enumerate(column_metrics):  # a column statistic counts once per row of its text
        value = _by_text(columns[c], H)
        values[m.name] = value
        out_moments[m.name] = (np.broadcast_to(sizes[:, None, None], value.shape).astype(np.float64), value,
                               np.zeros_like(value))
    block = values.get(BLOCK.name, np.full((B, L, H), np.nan))
    named = label_heads(values, block)
    labels = np.zeros((B, L, H), np.int64)
    for i, label in enumerate(LABELS):
        labels[named == label] = i
    return BatchStats({m.name: values[m.name] for m in metrics}, {m.name: out_moments[m.name] for m in metrics},
                      labels, sizes)


def _by_text(part: np.ndarray, H: int) -> np.ndarray:
    """(L·H, texts) -> (texts, L, H)."""
    return np.ascontiguousarray(part.T).reshape(part.shape[1], -1, H)


def _text_chunks(lengths: np.ndarray, G: int) -> Iterator[tuple[int, int]]:
    """Runs of consecutive texts whose rows, over every layer and head, fit ROWS_BYTES in float64 (at least
    one text each)."""
    t0 = 0
    while t0 < len(lengths):
        t1, rows, width = t0 + 1, int(lengths[t0]), int(lengths[t0])
        while t1 < len(lengths):
            wider, more = max(width, int(lengths[t1])), rows + int(lengths[t1])
            if wider * more * G * 8 > ROWS_BYTES:
                break
            t1, rows, width = t1 + 1, more, wider
        yield t0, t1
        t0 = t1


# --- the mergeable state -------------------------------------------------------------------------------


@dataclass
class CorpusState:
    """Everything `attnviz corpus` learned, and all that merging needs."""

    model: str
    revision: str
    model_type: str
    causal: bool
    layers: int
    heads: int
    max_length: int
    metrics: list[str]
    moments: dict[str, dict[str, Moments]]  # weighting -> metric -> moments
    label_counts: np.ndarray  # (L, H, len(LABELS)) int64
    texts: int = 0
    tokens: int = 0
    truncated: int = 0
    lines: int = 0
    unknown: int = 0  # texts with a word the model does not know (its unknown-word token)
    bad: dict[str, int] = field(default_factory=dict)  # reason -> count
    bad_lines: list[list] = field(default_factory=list)  # [source, line, reason], the first MAX_BAD_LISTED
    sources: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    partial: bool = False
    dtype: str = "float32"
    level: str = "token"  # "word": statistics of attention between words (--words)

    @classmethod
    def empty(cls, *, model: str, revision: str, model_type: str, causal: bool, layers: int, heads: int,
              max_length: int, metrics: Sequence[Metric | str], dtype: str = "float32",
              level: str = "token") -> CorpusState:
        names = [m if isinstance(m, str) else m.name for m in metrics]
        shape = (layers, heads)
        return cls(model=model, revision=revision, model_type=model_type, causal=causal, layers=layers, heads=heads,
                   max_length=max_length, metrics=names,
                   moments={w: {name: Moments.zeros(shape) for name in names} for w in WEIGHTINGS},
                   label_counts=np.zeros((layers, heads, len(LABELS)), np.int64), runs=[uuid.uuid4().hex],
                   dtype=dtype, level=level)

    # folding in
    def add_texts(self, stats: BatchStats | Sequence[TextStats]) -> None:
        """Fold in the statistics of some texts."""
        if not len(stats):
            return
        batch = stats if isinstance(stats, BatchStats) else BatchStats.stack(stats)
        for name in self.metrics:
            texts = Moments.of(batch.values[name])
            rows = Moments.combine(*batch.rows[name])
            self.moments["texts"][name] = self.moments["texts"][name].merge(texts)
            self.moments["tokens"][name] = self.moments["tokens"][name].merge(rows)
        for i in range(len(LABELS)):
            self.label_counts[..., i] += (batch.labels == i).sum(axis=0)
        self.texts += len(batch)
        self.tokens += int(batch.tokens.sum())

    def add_bad(self, line: Line) -> None:
        self.bad[line.reason] = self.bad.get(line.reason, 0) + 1
        if len(self.bad_lines) < MAX_BAD_LISTED:
            self.bad_lines.append([line.source, line.number, line.reason])

    @property
    def bad_total(self) -> int:
        return sum(self.bad.values())

    # merging
    def compatible(self, other: CorpusState) -> str | None:
        """Why the two cannot be merged, or None."""
        for key in ("model", "revision", "layers", "heads", "max_length", "metrics", "causal", "dtype", "level"):
            if getattr(self, key) != getattr(other, key):
                return f"they differ in {key.replace('_', ' ')} ({_short(getattr(self, key))} against " \
                       f"{_short(getattr(other, key))})"
        shared = set(self.runs) & set(other.runs)
        if shared:
            return "they share a run (the same shard given twice, or a merge of it): it would be counted twice"
        return None

    def merge(self, other: CorpusState) -> CorpusState:
        why = self.compatible(other)
        if why is not None:
            raise InputError(f"cannot merge these statistics: {why}")
        moments = {w: {name: self.moments[w][name].merge(other.moments[w][name]) for name in self.metrics}
                   for w in WEIGHTINGS}
        bad = dict(self.bad)
        for reason, count in other.bad.items():
            bad[reason] = bad.get(reason, 0) + count
        return CorpusState(
            model=self.model, revision=self.revision, model_type=self.model_type, causal=self.causal,
            layers=self.layers, heads=self.heads, max_length=self.max_length, metrics=list(self.metrics),
            moments=moments, label_counts=self.label_counts + other.label_counts, texts=self.texts + other.texts,
            tokens=self.tokens + other.tokens, truncated=self.truncated + other.truncated,
            lines=self.lines + other.lines, unknown=self.unknown + other.unknown,
            bad=bad, bad_lines=(self.bad_lines + other.bad_lines)[:MAX_BAD_LISTED],
            sources=self.sources + other.sources, runs=self.runs + other.runs,
            partial=self.partial or other.partial, dtype=self.dtype, level=self.level)

    # results
    def records(self) -> list[dict]:
        """One record per head: for each metric its mean and standard deviation over texts
        (name, name_std) and token-weighted over query rows (name_tokens, name_tokens_std); the most
        frequent label and the share of texts that gave it; and each label's count."""
        records = []
        stats = {(w, name): (self.moments[w][name].means(), self.moments[w][name].std())
                 for w in WEIGHTINGS for name in self.metrics}
        total = self.label_counts.sum(axis=-1)
        for layer in range(self.layers):
            for head in range(self.heads):
                record: dict = {"layer": layer, "head": head}
                for name in self.reported():
                    for w, suffix in (("texts", ""), ("tokens", "_tokens")):
                        mean, std = stats[(w, name)]
                        record[name + suffix] = float(mean[layer, head])
                        record[name + suffix + "_std"] = float(std[layer, head])
                counts = self.label_counts[layer, head]
                top = int(counts.argmax())
                record["label"] = LABELS[top] if total[layer, head] else ""
                record["label_share"] = float(counts[top] / total[layer, head]) if total[layer, head] else math.nan
                for label, count in zip(LABELS, counts):
                    record[f"label_{label}"] = int(count)
                records.append(record)
        return records

    def reported(self) -> list[str]:
        """The metrics shown: all but the label input block (not a head-table column) and an optional metric
        that does not apply to this model (no finite value anywhere: 'kept' without sink logits)."""
        optional = {m.name for m in all_metrics() if m.optional}
        return [name for name in self.metrics if name != BLOCK.name
                and not (name in optional and not np.isfinite(self.moments["texts"][name].means()).any())]

    def grid(self, name: str, weighting: str = "texts") -> np.ndarray:
        return self.moments[weighting][name].means()

    def layer_records(self) -> list[dict]:
        """Clark et al. 2019 style: per layer, the mean over its heads of the attention on [CLS]/BOS,
        [SEP]/EOS and punctuation, over texts and token-weighted."""
        records = []
        for layer in range(self.layers):
            record: dict = {"layer": layer}
            for name, _ in CLARK_GROUPS:
                if name in self.metrics:
                    record[name] = _nanmean(self.grid(name)[layer])
                    record[name + "_tokens"] = _nanmean(self.grid(name, "tokens")[layer])
            records.append(record)
        return records

    def summary(self) -> dict:
        return {"model": self.model, "level": self.level, "texts": self.texts, "tokens": self.tokens,
                "lines": self.lines,
                "bad_lines": self.bad_total, "bad_reasons": dict(self.bad), "truncated": self.truncated,
                "texts_with_unknown_words": self.unknown,
                "max_length": self.max_length, "partial": self.partial, "sources": list(self.sources)}

    # saving and loading (stats.json is untrusted on the way in)
    def to_json(self) -> dict:
        return {
            "kind": STATE_KIND, "version": STATE_VERSION, "attnviz_version": __version__, "model": self.model,
            "revision": self.revision, "model_type": self.model_type, "causal": self.causal, "dtype": self.dtype,
            "level": self.level,
            "layers": self.layers, "heads": self.heads, "max_length": self.max_length, "metrics": self.metrics,
            "labels": list(LABELS), "texts": self.texts, "tokens": self.tokens, "truncated": self.truncated,
            "lines": self.lines, "unknown": self.unknown, "bad": self.bad, "bad_lines": self.bad_lines,
            "sources": self.sources, "runs": self.runs, "partial": self.partial,
            "moments": {w: {name: {"count": m.count.tolist(), "mean": m.mean.tolist(), "m2": m.m2.tolist()}
                            for name, m in per.items()} for w, per in self.moments.items()},
            "label_counts": self.label_counts.tolist(),
        }

    @classmethod
    def from_json(cls, data, where: str) -> CorpusState:
        """A state from parsed stats.json, every field checked: CaptureFormatError names the first wrong one."""
        def bad(what: str) -> CaptureFormatError:
            return CaptureFormatError(f"{where} is not attnviz corpus statistics: {what}")

        if not isinstance(data, dict) or data.get("kind") != STATE_KIND:
            raise bad("no 'kind': 'attnviz-corpus'")
        if data.get("version") != STATE_VERSION:
            raise bad(f"format version {_short(data.get('version'))}, this attnviz reads {STATE_VERSION}")

        def get(key: str, kind, check=lambda v: True):
            value = data.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) and kind is int or not check(value):
                raise bad(f"{key!r} is missing or wrong")
            return value

        layers = get("layers", int, lambda v: 0 < v <= 4096)
        heads = get("heads", int, lambda v: 0 < v <= 4096)
        if layers * heads > MAX_STATE_CELLS:
            raise bad(f"{layers} × {heads} heads is over the limit of {MAX_STATE_CELLS:,}")
        metrics = get("metrics", list, lambda v: len(v) <= 1000 and all(isinstance(x, str) for x in v))
        if get("labels", list) != list(LABELS):
            raise bad("its pattern labels are not this attnviz's")
        counts = [get(key, int, lambda v: 0 <= v <= MAX_COUNT)
                  for key in ("texts", "tokens", "truncated", "lines", "unknown")]
        shape = (layers, heads)

        def grid(value, key: str) -> np.ndarray:
            try:
                array = np.array(value, dtype=np.float64)
            except (TypeError, ValueError):
                raise bad(f"{key} is not numbers") from None
            if array.shape != shape or not np.isfinite(array).all():
                raise bad(f"{key} is not {layers} × {heads} finite numbers")
            return array

        raw_moments = get("moments", dict)
        moments: dict[str, dict[str, Moments]] = {}
        for w in WEIGHTINGS:
            per = raw_moments.get(w)
            if not isinstance(per, dict) or set(per) != set(metrics):
                raise bad(f"moments of {w} do not match its metrics")
            moments[w] = {}
            for name in metrics:
                entry = per[name]
                if not isinstance(entry, dict):
                    raise bad(f"moments of {name}")
                m = Moments(*(grid(entry.get(k), f"{w}/{name}/{k}") for k in ("count", "mean", "m2")))
                if (m.count < 0).any() or (m.m2 < 0).any():
                    raise bad(f"negative counts or M2 in {w}/{name}")
                if (m.count > MAX_COUNT).any() or (np.abs(m.mean) > MAX_VALUE).any() or \
                        (m.m2 > m.count * (2 * MAX_VALUE) ** 2).any():
                    raise bad(f"counts, means or M2 in {w}/{name} out of range (counts at most 2⁵³, |means| at "
                              f"most {MAX_VALUE:g})")
                moments[w][name] = m
        try:
            label_counts = np.array(data.get("label_counts"), dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise bad("label_counts is not integers") from None
        if label_counts.shape != (*shape, len(LABELS)):
            raise bad("label_counts has the wrong shape")
        if (label_counts < 0).any() or (label_counts > MAX_COUNT).any():
            raise bad("label_counts out of range (0 to 2⁵³)")
        raw_bad = get("bad", dict)
        if len(raw_bad) > 1000 or not all(isinstance(k, str) and len(k) <= 200 and isinstance(v, int)
                                          and not isinstance(v, bool) and 0 <= v <= MAX_COUNT
                                          for k, v in raw_bad.items()):
            raise bad("'bad' is not counts")
        bad_lines = get("bad_lines", list)
        if not all(isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and isinstance(x[1], int)
                   and isinstance(x[2], str) for x in bad_lines):
            raise bad("'bad_lines' is not [source, line, reason] lists")
        return cls(model=get("model", str), revision=get("revision", str), model_type=get("model_type", str),
                   causal=get("causal", bool), layers=layers, heads=heads,
                   max_length=get("max_length", int, lambda v: v > 0), metrics=list(metrics), moments=moments,
                   label_counts=label_counts, texts=counts[0], tokens=counts[1], truncated=counts[2],
                   lines=counts[3], unknown=counts[4], bad=dict(raw_bad), bad_lines=bad_lines[:MAX_BAD_LISTED],
                   sources=[s for s in get("sources", list) if isinstance(s, str)],
                   runs=[r for r in get("runs", list) if isinstance(r, str)], partial=get("partial", bool),
                   dtype=get("dtype", str), level=get("level", str, lambda v: v in ("token", "word")))


def _nanmean(values: np.ndarray) -> float:
    """The mean of the finite values, NaN when there are none (an empty or partial state), without a warning."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "…"


def load_state(folder: str | Path) -> CorpusState:
    """The statistics saved in `folder`/stats.json (or a stats.json path), checked."""
    path = Path(folder)
    path = path / STATE_FILE if path.is_dir() else path
    from attnviz.files import read_regular

    try:
        raw = read_regular(path, MAX_STATE_BYTES, "corpus statistics")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_STATE_BYTES:
        raise CaptureFormatError(f"{path} is larger than {MAX_STATE_BYTES >> 20} MiB; it is not corpus statistics")
    if raw.count(b"[") + raw.count(b"{") > MAX_STATE_CONTAINERS:  # counted before parsing: memory stays bounded
        raise CaptureFormatError(f"{path} holds more than {MAX_STATE_CONTAINERS:,} JSON lists and objects; it is not "
                                 f"corpus statistics")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise CaptureFormatError(f"{path} is not valid JSON; it is not corpus statistics") from None
    return CorpusState.from_json(data, str(path))


def _no_constant(name: str):
    raise ValueError(name)


def merge_states(states: Iterable[CorpusState]) -> CorpusState:
    it = iter(states)
    merged = next(it)
    for state in it:
        merged = merged.merge(state)
    return merged


def table_records(state: CorpusState, weighting: str = "texts") -> list[dict]:
    """Records shaped like the heads table's (layer, head, each metric, label), holding the means over texts
    or the token-weighted means; top_key, which has no mean, is "–"; the label is the most frequent one."""
    suffix = "" if weighting == "texts" else "_tokens"
    out = []
    for record in state.records():
        row: dict = {"layer": record["layer"], "head": record["head"]}
        for m in all_metrics():
            if m.kind == "text":
                row[m.name] = "–"
            elif m.name in record:
                row[m.name] = record[m.name + suffix]
        row["label"] = record["label"]
        out.append(row)
    return out


def summary_lines(state: CorpusState, shown_bad: int = 10) -> list[str]:
    """What a run read, in words: texts, tokens, truncation, and the bad lines by number."""
    unit = "words" if state.level == "word" else "tokens"
    lines = [f"{state.texts:,} texts, {state.tokens:,} {unit} from {state.lines:,} lines"
             + (f"; {state.truncated:,} cut at {state.max_length} tokens" if state.truncated else "")
             + ("; PARTIAL (stopped early)" if state.partial else "")]
    if state.unknown:
        have = "text has" if state.unknown == 1 else "texts have"
        lines.append(f"{state.unknown:,} {have} words {state.model} does not know (its unknown-word token stands "
                     f"for them, so they carry no meaning here); a multilingual model reads them")
    if state.bad:
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(state.bad.items(), key=lambda x: -x[1]))
        lines.append(f"{state.bad_total:,} lines skipped: {reasons}")
        for source, number, reason in state.bad_lines[:shown_bad]:
            lines.append(f"  {source}:{number}: {reason}")
        if state.bad_total > shown_bad:
            lines.append(f"  … {state.bad_total - shown_bad:,} more (bad_lines.csv in the -o folder lists up to "
                         f"{MAX_BAD_LISTED})")
    return lines
