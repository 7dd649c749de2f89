"""The mergeable state of a corpus run (stats.json): moments by text and by token, label counts, bad lines;
written, read back (checked against limits: it may come from someone else) and merged.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnviz._version import __version__
from attnviz.errors import CaptureFormatError, InputError
from attnviz.metrics import BLOCK, LABELS, Metric, all_metrics
from attnviz.corpora.lines import Line, MAX_BAD_LISTED
from attnviz.corpora.moments import Moments
from attnviz.corpora.texts import BatchStats, TextStats
from attnviz.base.files import read_regular


STATE_KIND = "attnviz-corpus"
STATE_VERSION = 1
STATE_FILE = "stats.json"
WEIGHTINGS = ("texts", "tokens")
MAX_STATE_BYTES = 64 << 20  # a stats.json to merge
MAX_STATE_CONTAINERS = 2_000_000  # JSON lists and objects in it (each costs ~60 bytes parsed)
MAX_STATE_CELLS = 65_536  # layers × heads
MAX_COUNT = 2 ** 53  # texts, tokens, lines, label counts: exact in float64 and summed without overflow
MAX_VALUE = 1e9  # |mean| of a statistic (entropies, distances in tokens and shares are far below it)
CLARK_GROUPS = (("start_mass", "[CLS]/BOS"), ("end_mass", "[SEP]/EOS"), ("punct_mass", "punctuation"))
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


