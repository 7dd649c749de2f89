"""Retrieval heads (Wu et al. 2024, nightdessert/Retrieval_Head `retrieval_calculate`): needle-in-a-haystack
prompts made here, the model's greedy answer decoded token by token with the KV cache, and at each step a head
scores when its most-attended key lies in the needle and holds the token just written (it copies from the
needle). A head's score on a prompt is its hits over the needle's length in tokens; only prompts the model
answers correctly count. The causal test removes heads and measures how many answer tokens the model still
predicts (teacher-forced).

    haystacks(tokenizer, lengths, depths, seed)   the prompts, each with its needle and answer
    retrieval_hits(model, ids, span, …)           one prompt: the answer written, and hits (L, H)
    answer_accuracy(where, ids, answer, removed)  the share of answer tokens predicted with `removed` taken away
"""

from __future__ import annotations

import contextlib

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnviz.engine.ablation.runs import last_logits, run_model
from attnviz.engine.ablation.seam import editing, removal, Site
from attnviz.engine.generation import cache_argument
from attnviz.errors import UnsupportedArchitectureError

# The haystack: plain sentences on nothing in particular, none holding a number or a name.
FILLER = (
    "The weather in the valley changed slowly over the course of the year.",
    "Farmers planted wheat in the spring and harvested it in late summer.",
    "Many travellers stopped at the inn on their way to the coast.",
    "The old bridge was repaired twice during the last century.",
    "Children walked to school along the river path every morning.",
    "The market opened early and closed before the evening rain.",
    "A small library kept records of every family in the town.",
    "Boats carried wool and timber down the river to the sea.",
    "In the winter the roads were often closed by snow.",
    "The baker sold bread, cakes and honey at the square.",
    "Most houses in the village were built from grey stone.",
    "A choir sang in the church on the first day of each month.",
    "The forest to the north was home to deer, foxes and owls.",
    "Merchants from the city came to buy cheese and apples.",
    "The mill turned all day when the river was high.",
    "Letters arrived by coach once a week, weather permitting.",
)
NAMES = ("Anna", "Tom", "Maria", "Ivan", "Sofia", "Omar", "Lena", "Jonas", "Clara", "Pablo", "Yuki", "Amir")


@dataclass(frozen=True)
class Haystack:
    """One prompt: filler sentences with the needle at `depth` (0 first, 1 last), then the question; `answer` is
    what a correct continuation starts with (" 48213")."""

    prompt: str
    needle: str
    answer: str
    name: str
    length: int  # the length asked for, in tokens
    depth: float
    needle_at: int  # the needle's first character in the prompt


def haystacks(tokenizer, lengths: Sequence[int], depths: Sequence[float], seed: int = 0) -> list[Haystack]:
    """A prompt for each length (tokens, about) and depth, with a name and a five-digit number drawn from `seed`."""
    rng = np.random.default_rng(seed)
    per_sentence = np.mean([len(tokenizer.encode(" " + s, add_special_tokens=False)) for s in FILLER])
    made = []
    for length in lengths:
        for depth in depths:
            name = NAMES[int(rng.integers(len(NAMES)))]
            number = int(rng.integers(10000, 100000))
            needle = f"The secret number of {name} is {number}."
            question = f"\nQuestion: What is the secret number of {name}?\nAnswer: The secret number of {name} is"
            count = max(2, int(round((length - 40) / per_sentence)))
            sentences = [FILLER[int(i) % len(FILLER)] for i in rng.permutation(max(count, len(FILLER)))[:count]]
            at = int(round(depth * count))
            before = " ".join(sentences[:at])
            prompt = (before + " " if before else "") + needle + (" " + " ".join(sentences[at:]) if sentences[at:]
                                                                  else "") + question
            made.append(Haystack(prompt, needle, f" {number}", name, int(length), float(depth),
                                 len(before) + (1 if before else 0)))
    return made


def needle_span(offsets: Sequence, start: int, stop: int) -> tuple[int, int]:
    """The tokens (first, last + 1) whose characters lie within [start, stop): the needle's tokens."""
    inside = [n for n, (a, b) in enumerate(offsets) if a >= 0 and b > a and a >= start - 1 and b <= stop]
    if not inside:
        raise UnsupportedArchitectureError("the tokenizer gives no character offsets to find the needle by")
    return inside[0], inside[-1] + 1


def retrieval_hits(model, ids: torch.Tensor, span: tuple[int, int], *, max_new: int = 12,
                   stop: Sequence[int] = (), lean: bool = False) -> tuple[list[int], np.ndarray, list[np.ndarray]]:
    """Greedy decoding of the prompt `ids` (1, T) with the KV cache; at each step every head's most-attended key
    (of the step's query) is checked: in the needle span and the same token as the one just written is a hit.
    (the tokens written, hits (L, H), each step's most-attended keys (L, H)). `lean`: the prompt fills the cache
    on the model's own SDPA attention (a long prompt: no layer's T × T), the steps' one row each on eager."""
    from attnviz.engine.lean import lean as on_sdpa

    prompt = ids[0].tolist()
    written: list[int] = []
    hits = None
    tops = []
    with torch.inference_mode():
        # the prompt fills the KV cache; no weights kept, and no logits but the last (none of them is read)
        with on_sdpa(model) if lean else contextlib.nullcontext():
            out = model(input_ids=ids[:, :-1], use_cache=True, **last_logits(model))
        step = ids[:, -1:]
        for _ in range(max_new):
            out = model(input_ids=step, use_cache=True, output_attentions=True, **cache_argument(out))
            new = int(out.logits[0, -1].argmax())
            attentions = getattr(out, "attentions", None)
            if not attentions or any(a is None for a in attentions):
                raise UnsupportedArchitectureError(f"{type(model).__name__} returned no attention weights")
            top = torch.stack([a[0, :, -1].argmax(-1) for a in attentions]).cpu().numpy()  # (L, H)
            keys = np.array(prompt + written)
            hit = (top >= span[0]) & (top < span[1]) & (keys[np.minimum(top, len(keys) - 1)] == new)
            hits = hit.astype(np.int64) if hits is None else hits + hit
            tops.append(top)
            written.append(new)
            if new in stop:
                break
            step = torch.tensor([[new]], device=ids.device)
    if hits is None:
        raise UnsupportedArchitectureError("nothing was decoded")
    return written, hits, tops


def answer_accuracy(where: Site, ids: torch.Tensor, answer: Sequence[int],
                    removed: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """The prompt followed by its answer's tokens, teacher-forced, with the heads `removed` zeroed: (the share of
    answer tokens the model predicts as its top token, their mean log-probability). On the long path
    (`where.lean`) on the model's own SDPA attention."""
    from attnviz.engine.lean import lean as on_sdpa

    full = torch.cat([ids, torch.tensor([list(answer)], device=ids.device)], dim=1)
    n = len(answer)
    with editing(where, removal(list(removed), None)), torch.inference_mode(), \
            (on_sdpa(where.model) if where.lean else contextlib.nullcontext()):
        # the logits of the last n + 1 positions only: those before each answer token, and the last (not read)
        logits = run_model(where.model, {"input_ids": full, **last_logits(where.model, n + 1)}).logits[0]
    logits = logits[-(n + 1):-1].double()  # (n, V): each predicts the next token, the answer's
    target = full[0, -n:]
    logp = torch.log_softmax(logits, -1)
    right = (logits.argmax(-1) == target).double().mean()
    return float(right), float(logp[torch.arange(len(answer)), target].mean())
