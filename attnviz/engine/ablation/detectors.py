"""Induction, duplicate-token and previous-token heads found on repeated random sequences, then tested
by removing them (a causal test against random heads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.errors import InputError

from attnviz.engine.ablation.seam import Site, editing, every_head, removal
from attnviz.engine.ablation.runs import alpha_of, head_means, is_causal_lm, outputs_of, run_model
from attnviz.engine.models import forward_args
from attnviz.metrics import detector_scores, POSITIONAL_MIN, REPEAT_MIN
from attnviz.progress import Reporter
from attnviz.base.tokens import special_ids


# --- detectors on controlled inputs ----------------------------------------------------------------------


@dataclass
class Repeated:
    """A random token sequence repeated (Olsson et al. 2022): [BOS] + s + s, s of n random ordinary tokens."""

    ids: list[int]
    n: int
    bos: bool
    seed: int

    @property
    def second_half(self) -> slice:
        """The positions of the repeat (whose next tokens an induction head can predict)."""
        first = 1 if self.bos else 0
        return slice(first + self.n, first + 2 * self.n)


def repeated_sequence(tokenizer, n: int, seed: int = 0) -> Repeated:
    """n distinct random tokens that are not special, not pieces of a multi-byte character, repeated once; BOS
    first where the tokenizer has one."""

    special = special_ids(tokenizer)
    vocab = len(tokenizer)
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    tries = 0
    while len(chosen) < n and tries < 50 * n + 1000:
        tries += 1
        i = int(rng.integers(0, vocab))
        if i in special or i in chosen:
            continue
        text = tokenizer.decode([i])
        if not text.strip() or "\ufffd" in text or not text.isprintable():
            continue
        chosen.append(i)
    if len(chosen) < n:
        raise InputError(f"the tokenizer has too few ordinary tokens for a random sequence of {n}")
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        bos = getattr(tokenizer, "cls_token_id", None)
    lead = [int(bos)] if isinstance(bos, int) else []
    return Repeated(lead + chosen + chosen, n, bool(lead), seed)


@dataclass
class Causal:
    """Removing detected heads against removing as many random heads: the loss on the repeated half."""

    heads: list[tuple[int, int]]
    clean: float
    removed: float
    random: list[float] = field(default_factory=list)
    random_heads: list[list[tuple[int, int]]] = field(default_factory=list)


def repeat_loss(where: Site, inputs: dict, half: slice, removed: Sequence[tuple[int, int]],
                fills: list[torch.Tensor] | None = None) -> float:
    """The mean next-token loss (nats) over the positions of the repeat, with `removed` taken away."""
    ids = inputs["input_ids"]
    with editing(where, removal(removed, fills)), torch.inference_mode():
        logits = outputs_of(run_model(where.model, inputs), True)[0].double()  # (T, V)
    logp = torch.log_softmax(logits, -1)
    positions = torch.arange(half.start - 1, half.stop - 1)  # each predicts the next token, inside the repeat
    return float(-logp[positions, ids[0, positions + 1]].mean())


def causal_test(where: Site, inputs: dict, half: slice, heads: Sequence[tuple[int, int]], draws: int = 10,
                seed: int = 0, fills: list[torch.Tensor] | None = None,
                on_run: Callable[[int], None] | None = None) -> Causal:
    """The loss on the repeat: clean, with `heads` removed, and with as many random other heads removed
    (`draws` times); `fills` for mean ablation. `on_run(1)` after each of its 2 + draws forward passes."""
    def ran(loss: float) -> float:
        if on_run is not None:
            on_run(1)
        return loss

    rng = np.random.default_rng(seed)
    others = [p for p in every_head(where.layers, where.heads) if p not in set(heads)]
    result = Causal(list(heads), ran(repeat_loss(where, inputs, half, [])),
                    ran(repeat_loss(where, inputs, half, heads, fills)))
    k = min(len(heads), len(others))
    for _ in range(draws if k else 0):
        picked = [others[i] for i in sorted(rng.choice(len(others), size=k, replace=False))]
        result.random_heads.append(picked)
        result.random.append(ran(repeat_loss(where, inputs, half, picked, fills)))
    if not k and on_run is not None:
        on_run(draws)  # no other heads to draw: the bar still ends
    return result


@dataclass
class DetectionRun:
    """Previous-token, duplicate-token and induction scores of every head on repeated random sequences.

    scores    name -> (L, H): TransformerLens's head-detector score, Σ α⊙P / Σ α over the whole matrix (its
              defaults: error measure "mul", BOS and the current token not excluded), mean over the sequences
    shares    name -> (L, H): the same weight as a mean over the rows that have a target (what `heads` labels
              use; previous-token: over rows i ≥ 1)
    detected  name -> heads whose share passes the threshold, strongest first
    causal    the loss on the repeats with the detected induction heads removed, against random heads (causal
              LMs only)"""

    length: int
    sequences: int
    seed: int
    scores: dict[str, np.ndarray]
    shares: dict[str, np.ndarray]
    detected: dict[str, list[tuple[int, int]]]
    thresholds: dict[str, float]
    tokens: list[str]  # the first sequence, readable
    causal: Causal | None = None


def detection(loaded, where: Site, *, length: int = 50, sequences: int = 4, seed: int = 0, draws: int = 10,
              mode: str = "zero", reporter: Reporter | None = None) -> DetectionRun:
    """The three detectors on `sequences` random sequences of `length` tokens repeated once, and (for a causal
    LM) the causal test on the same sequences; each phase a bar on `reporter`."""
    reporter = reporter or Reporter()

    thresholds = {"previous-token": POSITIONAL_MIN, "duplicate-token": REPEAT_MIN, "induction": REPEAT_MIN}
    causal_lm = is_causal_lm(where.model)
    device = next(where.model.parameters()).device
    runs = []
    score_sums: dict[str, np.ndarray] = {}
    share_sums: dict[str, np.ndarray] = {}
    with reporter.progress("Scoring the heads", sequences, "sequences") as step:
        for n in range(sequences):
            seq = repeated_sequence(loaded.tokenizer, length, seed + n)
            ids = torch.tensor([seq.ids], device=device)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            if "token_type_ids" in forward_args(where.model):
                inputs["token_type_ids"] = torch.zeros_like(ids)
            with torch.inference_mode():
                alpha = alpha_of(run_model(where.model, inputs, attentions=True)).astype(np.float64)
            for name, (score, share) in detector_scores(alpha, np.asarray(seq.ids)).items():
                score_sums[name] = score_sums.get(name, 0) + score
                share_sums[name] = share_sums.get(name, 0) + share
            runs.append((seq, inputs))
            step(1)
    scores = {k: v / sequences for k, v in score_sums.items()}
    shares = {k: v / sequences for k, v in share_sums.items()}
    detected = {}
    for name, share in shares.items():
        passed = np.argwhere(share >= thresholds[name])
        detected[name] = sorted(((int(a), int(b)) for a, b in passed), key=lambda p: -share[p])
    first = runs[0][0]
    tokens = [loaded.tokenizer.decode([i]) for i in first.ids]
    result = DetectionRun(length, sequences, seed, scores, shares, detected, thresholds, tokens)
    if causal_lm and detected["induction"]:
        fills = head_means(where, [inputs for _, inputs in runs]) if mode == "mean" else None
        # the same seed for every sequence: draw k removes the same random heads from each
        with reporter.progress("Removing the induction heads, then as many random heads", len(runs) * (2 + draws),
                               "runs") as step:
            tests = [causal_test(where, inputs, seq.second_half, detected["induction"], draws, seed, fills,
                                 on_run=step) for seq, inputs in runs]
        result.causal = Causal(detected["induction"], float(np.mean([t.clean for t in tests])),
                               float(np.mean([t.removed for t in tests])),
                               [float(np.mean([t.random[k] for t in tests])) for k in range(len(tests[0].random))],
                               tests[0].random_heads)
    return result

