"""Running a corpus through a model: texts tokenised in chunks, sorted by length into batches (so little
compute goes to padding), right-padded, one forward pass per batch, and each text's statistics computed from
its own rows and columns of α (the attention mask keeps padding at exactly zero weight, and padded query
rows are never read). The state it fills is attnviz.corpora.CorpusState; the Ray engine runs the same
BatchRunner in each worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnviz.engine.families import has_sinks, layer_windows
from attnviz.corpora import BatchStats, CorpusState, Line, corpus_metrics, pack, texts_stats, unpack
from attnviz.data.capture import Capture
from attnviz.errors import AttentionCheckError, InputError, arg, UsageError
from attnviz.metrics import Tokens
from attnviz.base.tokens import Described, describe_tokens
from attnviz.engine.models import LoadedModel, first_line, forward_args, layers_and_heads
from attnviz.engine.memory import attention_bytes, memory_budget
from attnviz.engine.early import stopped_attentions
from attnviz.engine.forward import attentions_of
from attnviz.data.words import to_words

CHUNK_BATCHES = 16  # texts are read and length-sorted this many batches at a time


@dataclass
class Prepared:
    """One tokenised text, ready to batch."""

    line: Line
    ids: list[int]
    tokens: Tokens
    truncated: bool
    unknown: bool  # holds the unknown-word token
    described: Described
    offsets: list[tuple[int, int]] | None  # each token's span of the text, (-1, -1) for none


class BatchRunner:
    """Tokenises, batches and runs texts through one loaded model; computes each text's statistics."""

    def __init__(self, loaded: LoadedModel, max_length: int | None = None, batch_size: int = 32,
                 truncate: bool = True, words: bool = False):
        if loaded.seq2seq:
            raise InputError(f"{loaded.name} is an encoder-decoder model; attnviz corpus reads encoder or decoder-only "
                             f"models (the heads of one self-attention stack)")
        if batch_size < 1:
            raise UsageError(f"{arg('batch_size')} must be at least 1", "batch_size")
        limit = loaded.max_positions
        if max_length is not None and max_length < 1:
            raise UsageError(f"{arg('max_length')} must be at least 1 token", "max_length")
        if max_length is not None and limit and max_length > limit:
            raise InputError(f"{arg('max_length')} {max_length} is more than {loaded.name} takes ({limit} tokens)")
        self.loaded, self.batch_size, self.truncate, self.words = loaded, batch_size, truncate, words
        self.max_length = max_length or limit or 512
        self.metrics = corpus_metrics()
        self.sinks = has_sinks(loaded.model_type)  # statistics of each row's shares, as the heads table
        self.windows = layer_windows(loaded.model.config, layers_and_heads(loaded.model.config)[0])
        tok = loaded.tokenizer
        self.fast = bool(getattr(tok, "is_fast", False))
        self.pad_id = next((i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None), 0)
        self.forward_args = forward_args(loaded.model)
        # only where the tokenizer makes them (GPT-2's forward takes token_type_ids, its tokenizer gives none,
        # and zeros there would add token 0's embedding to every position)
        self.segment_ids = ("token_type_ids" in self.forward_args
                            and "token_type_ids" in getattr(tok, "model_input_names", ()))
        self.unk_id = getattr(tok, "unk_token_id", None)
        self.decode = functools.lru_cache(maxsize=1 << 16)(lambda i: tok.decode([i]))
        # α without the work after the last attention (engine/early.py), on a model attnviz loaded itself; a model
        # object handed in is run whole, so that hooks of its own after the last attention fire as they would
        self.stop_early = loaded.revision != "object"

    def new_state(self) -> CorpusState:
        L, H = layers_and_heads(self.loaded.model.config)
        return CorpusState.empty(model=self.loaded.name, revision=self.loaded.revision,
                                 model_type=self.loaded.model_type, causal=bool(self.loaded.causal), layers=L,
                                 heads=H, max_length=self.max_length, metrics=self.metrics, dtype=self.loaded.dtype,
                                 level="word" if self.words else "token")

    # tokenising
    def prepare(self, lines: Sequence[Line]) -> tuple[list[Prepared], list[Line]]:
        """Tokenise texts; those that tokenise to nothing but special tokens come back as bad lines."""
        tok = self.loaded.tokenizer
        texts = [line.text or "" for line in lines]
        if not texts:
            return [], []
        options = dict(return_special_tokens_mask=True, return_offsets_mapping=self.fast)
        enc = tok(texts, truncation=False, **options)
        long = [b for b, ids in enumerate(enc["input_ids"]) if len(ids) > self.max_length]
        cut = tok([texts[b] for b in long], truncation=True, max_length=self.max_length, **options) if long else None
        where: dict[int, tuple[Any, int]] = {b: (cut, k) for k, b in enumerate(long)}
        ready, bad = [], []
        for b, line in enumerate(lines):
            if b in where and not self.truncate:
                bad.append(Line(line.source, line.number, None, f"longer than {self.max_length} tokens"))
                continue
            source, k = where.get(b, (enc, b))
            ids = list(source["input_ids"][k])
            offsets = source["offset_mapping"][k] if self.fast else [None] * len(ids)
            word_ids = source.word_ids(k) if self.fast else None
            try:
                described = describe_tokens(tok, texts[b], ids, source["special_tokens_mask"][k], offsets, word_ids,
                                            decode=self.decode)
            except InputError:
                bad.append(Line(line.source, line.number, None, "no tokens besides special ones"))
                continue
            tokens = Tokens(tuple(described.tokens), np.asarray(described.special, bool),
                            np.array(described.kinds), bool(self.loaded.causal), ids=tuple(int(i) for i in ids))
            unknown = self.unk_id is not None and any(i == self.unk_id and not special
                                                      for i, special in zip(ids, described.special))
            spans = [(int(o[0]), int(o[1])) if o and o[1] > o[0] and not sp else (-1, -1)
                     for o, sp in zip(offsets, described.special)] if self.fast else None
            ready.append(Prepared(line, ids, tokens, b in where, unknown, described, spans))
        return ready, bad

    def batches(self, ready: Sequence[Prepared]) -> Iterator[list[Prepared]]:
        """Length-sorted batches of at most batch_size texts, fewer where the attention of a full batch of
        long texts would pass the memory budget."""
        ordered = sorted(ready, key=lambda p: len(p.ids))
        budget = self.loaded.memory_budget or _budget()
        start = 0
        while start < len(ordered):
            end = min(start + self.batch_size, len(ordered))
            per_text = attention_bytes(self.loaded, len(ordered[end - 1].ids), copies=2.0)
            end = min(end, start + max(1, budget // max(per_text, 1)))
            yield ordered[start:end]
            start = end

    # running
    def run(self, batch: Sequence[Prepared]) -> BatchStats:
        """One forward pass over a right-padded batch; each text's statistics from its own rows and keys of α."""
        packed, H = self.attention(batch)
        lengths = [len(p.ids) for p in batch]
        if self.words:
            starts = np.cumsum([0, *lengths])
            words = [self.as_words(unpack(packed, int(starts[b]), n, H), p) for b, (p, n) in
                     enumerate(zip(batch, lengths))]
            return texts_stats(pack([w.attentions for w in words]), [w.n_tokens for w in words],
                               [Tokens.of(w) for w in words], H, self.metrics, self.sinks)
        return texts_stats(packed, lengths, [p.tokens for p in batch], H, self.metrics, self.sinks, self.windows)

    def attention(self, batch: Sequence[Prepared]) -> tuple[np.ndarray, int]:
        """The batch's α, its texts' real query rows as attnviz.corpora.pack lays them out (T, R, L·H), and H."""
        import torch

        T = max(len(p.ids) for p in batch)
        ids = torch.full((len(batch), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for b, p in enumerate(batch):
            ids[b, :len(p.ids)] = torch.tensor(p.ids)
            mask[b, :len(p.ids)] = 1
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self.segment_ids:  # one sentence: segment 0, as the tokenizer gives it for one text
            inputs["token_type_ids"] = torch.zeros_like(ids)
        inputs = {k: v.to(self.loaded.device) for k, v in inputs.items() if k in self.forward_args}
        try:
            with torch.inference_mode():
                layers = stopped_attentions(self.loaded.model, inputs) if self.stop_early else None
                if layers is None:  # the full pass, its weights collected by transformers
                    out = self.loaded.model(**inputs, output_attentions=True)
                    layers = list(attentions_of(out, self.loaded.model, self.loaded.name))
                    del out
                shapes = {tuple(layer.shape) for layer in layers}
                if len(shapes) != 1 or len(layers[0].shape) != 4 or layers[0].shape[0] != len(batch) \
                        or layers[0].shape[-2:] != (T, T):
                    raise AttentionCheckError(f"attention of shapes {sorted(shapes)}, expected "
                                              f"(L × ({len(batch)}, H, {T}, {T}))")
                H = layers[0].shape[1]
                packed = self.gather(layers, mask.to(layers[0].device).bool())
                del layers
        except (ValueError, TypeError, RuntimeError, IndexError) as exc:
            raise AttentionCheckError(f"{self.loaded.name} could not run on this batch: {first_line(exc)}") from None
        return packed, H

    @staticmethod
    def gather(layers: list, real) -> np.ndarray:
        """Every layer's α (B, H, T, T) as attnviz.corpora.pack lays texts out: the real query rows of every
        text (real (B, T) bool), keys first, (T, R, L·H) float32; one gather per layer, on the model's device,
        each layer dropped from `layers` once gathered (so at most one copy of α more than the model's)."""
        import torch

        L, (_, H, _, T) = len(layers), layers[0].shape
        out = torch.empty((T, int(real.sum()), L, H), dtype=torch.float32, device=layers[0].device)
        for n in range(L):
            out[:, :, n] = layers[n].permute(3, 0, 2, 1)[:, real]  # (T, R, H)
            layers[n] = None
        return out.cpu().numpy().reshape(T, out.shape[1], L * H)

    def as_words(self, alpha: np.ndarray, p: Prepared):
        """One text's attention between words (attnviz.data.words, as `--words` gives for one text)."""

        d = p.described
        capture = Capture(attentions=np.ascontiguousarray(alpha), tokens=tuple(d.tokens), token_ids=np.asarray(p.ids),
                          special=np.asarray(d.special, bool), special_kind=tuple(d.kinds),
                          subword=np.asarray(d.subword, bool),
                          meta={"model": self.loaded.name, "causal": bool(self.loaded.causal), "text": p.line.text},
                          offsets=np.asarray(p.offsets, np.int64) if p.offsets is not None else None)
        return to_words(capture)

    def fold(self, state: CorpusState, lines: Sequence[Line], on_batch: Callable[[int, int], None] | None = None,
             stop: Callable[[], bool] | None = None) -> bool:
        """Tokenise, batch and run `lines` (texts and bad lines), folding everything into `state`, one whole
        batch at a time. `on_batch(texts, tokens)` after each batch; `stop()` is asked before each batch, and a
        True answer ends the work there (returns False: the state is partial)."""
        state.lines += len(lines)
        for line in lines:
            if line.text is None:
                state.add_bad(line)
        ready, bad = self.prepare([line for line in lines if line.text is not None])
        for line in bad:
            state.add_bad(line)
        if on_batch and bad:
            on_batch(len(bad), 0)
        for batch in self.batches(ready):
            if stop and stop():
                return False
            stats = self.run(batch)
            state.add_texts(stats)
            state.truncated += sum(p.truncated for p in batch)
            state.unknown += sum(p.unknown for p in batch)
            if on_batch:
                on_batch(len(batch), int(stats.tokens.sum()))
        return True

    def chunk(self) -> int:
        return self.batch_size * CHUNK_BATCHES


def _budget() -> int:
    return memory_budget()


def chunks(lines: Iterable[Line], size: int) -> Iterator[list[Line]]:
    block: list[Line] = []
    for line in lines:
        block.append(line)
        if len(block) >= size:
            yield block
            block = []
    if block:
        yield block


def run_local(runner: BatchRunner, lines: Iterable[Line], state: CorpusState,
              on_batch: Callable[[int, int], None] | None = None, stop: Callable[[], bool] | None = None) -> bool:
    """Every line through `runner` into `state`; False when `stop()` ended it early (the state then
    holds every whole batch folded so far)."""
    for block in chunks(lines, runner.chunk()):
        if not runner.fold(state, block, on_batch, stop):
            return False
    return not (stop and stop())  # the reader may have stopped first (a signal during an endless line)
