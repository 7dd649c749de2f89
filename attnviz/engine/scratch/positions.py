"""positions: what position embeddings do — the same words in another order, with and without the
model's position embeddings, and how alike the embeddings of nearby positions are."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.engine.forward import encode, model_attentions
from attnviz.errors import InputError, UnsupportedArchitectureError


@dataclass
class PositionsResult:
    """The same text in two word orders, run with the model's position embeddings and with them zeroed.

    permutation (T,): shuffled position p holds the original token permutation[p]. alpha_* are (L, H, T, T):
    the original order, and the shuffled order re-ordered back to the original positions."""

    words: list[str]
    shuffled: list[str]
    tokens: list[str]
    permutation: np.ndarray
    alpha_with: np.ndarray
    back_with: np.ndarray
    alpha_without: np.ndarray
    back_without: np.ndarray
    similarity: np.ndarray | None = None  # (P, P) cosine similarity of position embeddings 0..P-1

    @staticmethod
    def _per_layer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.abs(a - b).reshape(len(a), -1).max(axis=-1)  # (L,)

    @property
    def diff_with(self) -> np.ndarray:
        return self._per_layer(self.alpha_with, self.back_with)

    @property
    def diff_without(self) -> np.ndarray:
        return self._per_layer(self.alpha_without, self.back_without)


def position_embeddings(loaded):
    """The learned position-embedding table of an encoder, or UnsupportedArchitectureError (one line)."""
    base = getattr(loaded.model, "base_model", loaded.model)
    if loaded.causal:
        raise UnsupportedArchitectureError(
            f"{loaded.name} is causal: it also sees word order through its mask (each token looks only back), so "
            f"removing its positions cannot make α a set; `positions` works with encoders (BERT, RoBERTa, …)")
    table = getattr(getattr(base, "embeddings", None), "position_embeddings", None)
    if not isinstance(table, torch.nn.Embedding):
        raise UnsupportedArchitectureError(
            f"{loaded.name} adds positions in a way attnviz cannot switch off (rotary or relative positions); "
            f"`positions` works with models that add learned position embeddings (BERT, RoBERTa, DistilBERT)")
    return table


def _word_spans(text_words: list[str]) -> tuple[str, list[tuple[int, int]]]:
    spans, at = [], 0
    for word in text_words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    return " ".join(text_words), spans


def _tokens_by_word(loaded, words: list[str]):
    """Encode the words joined by spaces; return (encoded, for each word its token positions, the special
    token positions in order)."""

    text, spans = _word_spans(words)
    encoded = encode(loaded, text, truncate=False)
    offsets = loaded.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    by_word: list[list[int]] = [[] for _ in words]
    specials = []
    for position, ((start, end), special) in enumerate(zip(offsets, encoded.special)):
        if special or end <= start:
            specials.append(position)
            continue
        # a SentencePiece "▁" piece starts on the space before its word: it belongs to the next word
        word = next(n for n, (_, b) in enumerate(spans) if start < b)
        by_word[word].append(position)
    return encoded, by_word, specials


def positions_experiment(loaded, text: str, *, seed: int = 0) -> PositionsResult:
    """Shuffle the words of `text`; run the model on both orders with its position embeddings and with them
    zeroed. Without positions self-attention sees a set: α of the shuffled text is exactly the same
    permutation of α. With them it is not."""

    table = position_embeddings(loaded)
    if not getattr(loaded.tokenizer, "is_fast", False):
        raise UnsupportedArchitectureError(f"{loaded.name} has a slow tokenizer; `positions` needs token offsets")
    words = text.split()
    if len(set(words)) < 2:
        raise InputError("the text needs at least two different words to shuffle")
    rng = np.random.default_rng(seed)
    order = np.arange(len(words))
    while (order == np.arange(len(words))).all() or [words[i] for i in order] == words:
        order = rng.permutation(len(words))
    shuffled = [words[i] for i in order]
    original, orig_words, orig_special = _tokens_by_word(loaded, words)
    moved, moved_words, moved_special = _tokens_by_word(loaded, shuffled)
    T = len(original.token_ids)
    permutation = np.full(T, -1)
    for p, o in zip(moved_special, orig_special):
        permutation[p] = o
    for new_index, old_index in enumerate(order):
        old, new = orig_words[old_index], moved_words[new_index]
        if len(old) != len(new) or [original.token_ids[i] for i in old] != [moved.token_ids[i] for i in new]:
            raise UnsupportedArchitectureError(f"{loaded.name}'s tokenizer splits {words[old_index]!r} differently "
                                               f"once it moves, so the two orders cannot be compared token by token")
        permutation[new] = old
    if len(moved.token_ids) != T or len(moved_special) != len(orig_special) or (permutation < 0).any():
        raise UnsupportedArchitectureError("the shuffled text does not tokenise into the same tokens")

    def both() -> tuple[np.ndarray, np.ndarray]:
        a = model_attentions(loaded, original)  # (L, H, T, T)
        b = model_attentions(loaded, moved)
        inverse = np.argsort(permutation)  # original position -> shuffled position
        return a, b[:, :, inverse][:, :, :, inverse]  # the shuffled run, back in the original order

    alpha_with, back_with = both()
    saved = table.weight.detach().clone()
    try:
        with torch.no_grad():
            table.weight.zero_()
        alpha_without, back_without = both()
    finally:
        with torch.no_grad():
            table.weight.copy_(saved)
    return PositionsResult(words, shuffled, original.tokens, permutation, alpha_with, back_with, alpha_without,
                           back_without, position_similarity(saved, SIMILARITY_POSITIONS))


SIMILARITY_POSITIONS = 64  # positions shown in the similarity picture


def position_similarity(weight: torch.Tensor, n: int) -> np.ndarray:
    """Cosine similarity of the first n position embeddings with each other: how alike the vectors the model
    adds at positions i and j are. (n, n), 1 on the diagonal."""
    table = weight[:n].detach().double()  # (n, D)
    unit = table / table.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (unit @ unit.T).float().cpu().numpy()
