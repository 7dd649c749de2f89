"""Faithfulness's erasures: every erased text of a sentence (each method's bins, comprehensiveness and
sufficiency, 20 random orders, leave-one-out) run as attnviz runs them — each distinct erased text once, in
padded batches of similar lengths — against one forward pass per erasure, side by side in one run, on the
sentences of scripts/faithfulness_corpus.txt. Both give the same f (checked, within 1e-5).

    python benchmarks/bench_faithfulness.py                  # minilm and smollm2, the first 10 sentences
    python benchmarks/bench_faithfulness.py --models minilm --texts 30

Prints per model the erasures, the distinct ones, the seconds of each way (one forward pass per erasure; one
per distinct erasure; attnviz's batches) and the ratios: against one pass per erasure, and batching alone.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

CORPUS = Path(__file__).resolve().parent.parent / "scripts" / "faithfulness_corpus.txt"
METHODS = ("attention", "rollout", "flow", "alti", "value-zeroing", "grad-x-input", "loo")


def erasures(model, text: str, seed: int = 0) -> tuple[object, list[np.ndarray]]:
    """The Explained text and every subset faithfulness runs for it (with its repeats, as a naive loop would)."""
    from attnviz.api.attribution.faithfulness_methods import method_scores as _scores
    from attnviz.engine.ablation.runs import is_causal_lm
    from attnviz.engine.attribution.faithfulness import Explained
    from attnviz.engine.forward import encode
    from attnviz.metrics.faithfulness import bin_sizes, only, ranked, without

    encoded = encode(model, text)
    causal = is_causal_lm(model.model)
    explained = Explained(model.model, encoded.inputs, causal=causal, target=None)
    T = explained.T
    ok = ~np.asarray(encoded.special, bool)
    if causal:
        ok[T - 1] = False
    erasable = np.flatnonzero(ok)
    sizes = bin_sizes(len(erasable))
    subsets: list[np.ndarray] = []
    for name in METHODS:
        order = ranked(_scores(name, explained, encoded.inputs, erasable, 20)[0], erasable)
        subsets += [without(T, order[:k]) for k in sizes] + [only(T, erasable, order[:k]) for k in sizes]
    rng = np.random.default_rng(seed)
    for _ in range(20):
        order = rng.permutation(erasable)
        subsets += [without(T, order[:k]) for k in sizes] + [only(T, erasable, order[:k]) for k in sizes]
    subsets += [without(T, np.array([i])) for i in erasable]
    return explained, subsets


def main() -> None:
    import torch

    import attnviz
    from attnviz.api.attribution.faithfulness_methods import distinct_f
    from attnviz.progress import Reporter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,smollm2")
    parser.add_argument("--texts", type=int, default=10)
    args = parser.parse_args()
    texts = [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()][:args.texts]
    print(f"torch threads: {torch.get_num_threads()}; {len(texts)} sentences of {CORPUS.name}")
    print(f"{'model':10} {'erasures':>9} {'distinct':>9} {'one pass each s':>16} {'distinct, one each s':>21} "
          f"{'attnviz s':>10} {'× one each':>11} {'× batching alone':>17}")
    for name in args.models.split(","):
        model = attnviz.load_model(name, lm_head="auto")
        total = distinct = 0
        naive = unique = ours = 0.0
        for text in texts:
            explained, subsets = erasures(model, text)
            total += len(subsets)
            kinds = sorted({tuple(s.tolist()) for s in subsets}, key=len)
            distinct += len(kinds)
            start = time.perf_counter()
            one_by_one = np.array([explained.f([s])[0] for s in subsets])
            naive += time.perf_counter() - start
            start = time.perf_counter()
            for kind in kinds:
                explained.f([np.array(kind)])
            unique += time.perf_counter() - start
            start = time.perf_counter()
            batched = distinct_f(explained, subsets, Reporter())
            ours += time.perf_counter() - start
            assert np.abs(one_by_one - batched).max() < 1e-5, np.abs(one_by_one - batched).max()
        print(f"{name:10} {total:9,} {distinct:9,} {naive:16.2f} {unique:21.2f} {ours:10.2f} {naive / ours:11.1f} "
              f"{unique / ours:17.1f}")


if __name__ == "__main__":
    main()
