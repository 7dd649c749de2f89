"""Corpus statistics: `attnviz corpus`'s local engine against a naive loop that runs one sentence at a time
through the single-text path (capture_text, then head_values, as `attnviz heads` does), and the Ray engine on
the same data, side by side in one run. Same model, same sentences, same statistics (checked to 1e-5).

    python benchmarks/bench_corpus.py                 # 1,000 sentences, the bundled MiniLM, CPU
    python benchmarks/bench_corpus.py --texts 200 --no-ray
    python benchmarks/bench_corpus.py --device cuda   # the GPU rows

Sentences are generated (seeded) with 5–60 words each from a small English vocabulary with punctuation.
The Ray engine's fixed start-up (ray.init, actors loading the model) is measured by a run over one sentence
and reported apart from its throughput.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORDS = ("the cat dog bird river town sat ran sang flows over under on by with while and but because small green "
         "old quickly slowly home park tree house people children teacher book read wrote saw heard").split()
MARKS = (",", ".", ";", "?", "!")


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 60))]
        for i in range(3, len(words) - 1, rng.randint(6, 12)):
            words[i] += rng.choice(MARKS[:3])
        out.append(" ".join(words).capitalize() + rng.choice(MARKS[1:]))
    return out


def naive(loaded, texts):
    """One text at a time through the single-text path; per-text values aggregated over texts."""
    from attnviz.corpora import Moments, corpus_metrics
    from attnviz.metrics import head_values
    from attnviz.engine.forward import capture_text

    metrics = corpus_metrics()  # the numeric ones: what a corpus aggregates
    values = [head_values(capture_text(text, loaded), metrics) for text in texts]
    return {m.name: Moments.of(np.stack([v[m.name] for v in values])) for m in metrics}


def local(loaded, texts, batch_size):
    from attnviz.corpora import Line
    from attnviz.engine.corpora.run import BatchRunner, run_local

    runner = BatchRunner(loaded, batch_size=batch_size)
    state = runner.new_state()
    run_local(runner, [Line("bench", n + 1, t) for n, t in enumerate(texts)], state)
    return state


def stages(loaded, texts, batch_size) -> dict[str, float]:
    """The local engine's seconds per stage, timed around its own functions (no copy of their code):
    tokenise (BatchRunner.prepare), forward (BatchRunner.run less the statistics in it), statistics
    (texts_stats, per batch), merge (CorpusState.add_texts)."""
    from attnviz.corpora import CorpusState, Line
    from attnviz.engine.corpora import run as corpus_run

    spent = {"tokenise": 0.0, "run": 0.0, "statistics": 0.0, "merge": 0.0}

    def timed(key, func):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        return wrapper

    saved = (corpus_run.BatchRunner.prepare, corpus_run.BatchRunner.run, corpus_run.texts_stats,
             CorpusState.add_texts)
    corpus_run.BatchRunner.prepare = timed("tokenise", saved[0])
    corpus_run.BatchRunner.run = timed("run", saved[1])
    corpus_run.texts_stats = timed("statistics", saved[2])
    CorpusState.add_texts = timed("merge", saved[3])
    try:
        runner = corpus_run.BatchRunner(loaded, batch_size=batch_size)
        corpus_run.run_local(runner, [Line("bench", n + 1, t) for n, t in enumerate(texts)], runner.new_state())
    finally:
        (corpus_run.BatchRunner.prepare, corpus_run.BatchRunner.run, corpus_run.texts_stats,
         CorpusState.add_texts) = saved
    return {"tokenise": spent["tokenise"], "forward": spent["run"] - spent["statistics"],
            "statistics": spent["statistics"], "merge": spent["merge"]}


def forward_only(loaded, texts, batch_size) -> float:
    """Seconds for the batched forward passes alone (same batches, no statistics): the floor of the local
    engine on this hardware."""
    import torch

    from attnviz.corpora import Line
    from attnviz.engine.corpora.run import BatchRunner

    runner = BatchRunner(loaded, batch_size=batch_size)
    ready, _ = runner.prepare([Line("bench", n + 1, t) for n, t in enumerate(texts)])
    batches = list(runner.batches(ready))
    start = time.perf_counter()
    for batch in batches:
        T = max(len(p.ids) for p in batch)
        ids = torch.zeros((len(batch), T), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(batch):
            ids[b, :len(p.ids)] = torch.tensor(p.ids)
            mask[b, :len(p.ids)] = 1
        with torch.inference_mode():
            loaded.model(input_ids=ids.to(loaded.device), attention_mask=mask.to(loaded.device),
                         output_attentions=True)
    if loaded.device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def worst_difference(reference: dict, state) -> float:
    worst = 0.0
    for name in state.metrics:
        a, b = reference[name], state.moments["texts"][name]
        for x, y in ((a.means(), b.means()), (a.std(), b.std())):
            both = np.isfinite(x) & np.isfinite(y)
            assert np.array_equal(np.isfinite(x), np.isfinite(y)), name
            if both.any():
                worst = max(worst, float(np.max(np.abs(x[both] - y[both]))))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()

    import torch

    from attnviz.engine.models import load

    texts = sentences(args.texts)
    loaded = load(None, device=args.device)
    print(f"{len(texts)} sentences, 5–60 words; model {loaded.name} on {loaded.device}, "
          f"torch threads {torch.get_num_threads()}", flush=True)
    local(loaded, texts[:64], args.batch_size)  # warm up both paths
    naive(loaded, texts[:16])

    start = time.perf_counter()
    reference = naive(loaded, texts)
    t_naive = time.perf_counter() - start
    start = time.perf_counter()
    state = local(loaded, texts, args.batch_size)
    t_local = time.perf_counter() - start
    difference = worst_difference(reference, state)
    t_forward = forward_only(loaded, texts, args.batch_size)
    rows = [("naive loop (one text at a time)", t_naive, None), (f"attnviz corpus, local, batch {args.batch_size}",
                                                                 t_local, difference)]
    rows.append(("(floor: the batched forward passes alone)", t_forward, None))
    if not args.no_ray:
        rows += ray_rows(texts, args, state)
    print(f"{'':42} {'seconds':>8} {'texts/s':>8} {'tokens/s':>9} {'× naive':>8} {'max |Δ| vs naive':>17}")
    for name, seconds, diff in rows:
        shown = "–" if diff is None else f"{diff:.1e}"
        print(f"{name:42} {seconds:8.2f} {len(texts) / seconds:8.1f} {state.tokens / seconds:9.0f} "
              f"{t_naive / seconds:8.2f} {shown:>17}")
    print(f"tokens: {state.tokens} ({state.tokens / len(texts):.1f} per text); statistics agree to 1e-5: "
          f"{'yes' if difference < 1e-5 else 'NO'}")
    split = stages(loaded, texts, args.batch_size)
    print("local engine by stage (a second run, timed around its functions): "
          + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in split.items())
          + f"; local throughput / floor's: {t_forward / t_local:.2f}")
    if difference >= 1e-5:
        sys.exit(1)


def ray_rows(texts, args, state) -> list:
    """Ray: one run over one sentence (start-up: ray.init, actors loading the model), one over all."""
    try:
        import ray  # noqa: F401
    except ImportError:
        print('(Ray rows skipped: pip install "attnviz[ray]")')
        return []
    from attnviz.api import ModelSpec
    from attnviz.engine.corpora.ray import run_ray

    folder = Path(tempfile.mkdtemp())
    one, every = folder / "one.txt", folder / "all.txt"
    one.write_text(texts[0] + "\n")
    every.write_text("\n".join(texts) + "\n")
    options = ModelSpec(device=args.device)
    kwargs = dict(fmt=None, field=None, batch_size=args.batch_size, max_length=None, address=None,
                  workers=args.workers)
    start = time.perf_counter()
    run_ray([str(one)], options, **kwargs)
    t_start = time.perf_counter() - start
    start = time.perf_counter()
    result, _ = run_ray([str(every)], options, **kwargs)
    t_all = time.perf_counter() - start
    worst = 0.0
    for name in state.metrics:
        worst = max(worst, float(np.nanmax(np.abs(result.moments["texts"][name].mean
                                                  - state.moments["texts"][name].mean))))
    print(f"Ray: start-up (one sentence) {t_start:.1f} s; Ray vs local engine max |Δ| {worst:.1e}")
    return [(f"Ray Data, {args.workers} actors, with start-up", t_all, None),
            (f"Ray Data, {args.workers} actors, less start-up", max(t_all - t_start, 1e-9), None)]


if __name__ == "__main__":
    main()
