"""One run asked six questions against six top-level calls, side by side in one process.

    python benchmarks/bench_session.py [--model smollm2] [--repeats 3] [--device cpu]

The same model object (loaded once, with its head) is handed to attnviz.heads, entropy, rollout, sinks, norms and
logit_attr on a 104-token text (each runs the model again), and to attnviz.load(...).run(text), whose six methods
read one forward pass; then the same without logit_attr. Printed: the median seconds of each side over `repeats`,
the ratio run / top-level, and the forward passes each side made (a hook on the model counts its calls).
contributions (ALTI) is measured apart: its cost is its own arithmetic, not the pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

import attnviz

TEXT = ("Attention lets each token gather information from the other tokens of the text. A query is compared with "
        "every key, the "
        "scores are scaled and turned into weights by a softmax, and the weights mix the values. In a decoder a "
        "token sees only the tokens before it, so the first token often collects the weight no other token wants. "
        "Heads differ: some look at the previous token, some at a matching earlier token, some spread their weight "
        "evenly, and a few seem to do nothing at all until one removes them.")
SIX = ("heads", "entropy", "rollout", "sinks", "norms", "logit_attr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args()
    loaded = attnviz.load_model(options.model, lm_head=True, device=options.device)
    model, tokenizer = loaded.model, loaded.tokenizer
    calls = [0]
    handle = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    T = len(attnviz.capture(TEXT, model=model, tokenizer=tokenizer).tokens)

    def top_level(names) -> None:
        for name in names:
            getattr(attnviz, name)(TEXT, model=model, tokenizer=tokenizer)

    def one_run(names) -> None:
        run = attnviz.load(model, tokenizer=tokenizer).run(TEXT)
        for name in names:
            getattr(run, name)()

    print(f"{loaded.name}, {T} tokens, device {options.device}, median of {options.repeats}")
    print("| analyses | top-level calls, s (passes) | one run, s (passes) | run / top-level |\n|---|---|---|---|")
    for names in (SIX, SIX[:-1]):
        timings: dict[str, list[float]] = {"top-level": [], "run": []}
        passes = {}
        for _ in range(options.repeats):
            for side, work in (("top-level", top_level), ("run", one_run)):
                calls[0] = 0
                start = time.perf_counter()
                work(names)
                timings[side].append(time.perf_counter() - start)
                passes[side] = calls[0]
        top, run = (statistics.median(timings[k]) for k in ("top-level", "run"))
        print(f"| {', '.join(names)} | {top:.2f} ({passes['top-level']}) | {run:.2f} ({passes['run']}) | "
              f"{run / top:.2f} |")
    handle.remove()
    start = time.perf_counter()
    attnviz.contributions(TEXT, model=model, tokenizer=tokenizer)
    alone = time.perf_counter() - start
    runs = attnviz.load(model, tokenizer=tokenizer).run(TEXT)
    runs.heads()
    start = time.perf_counter()
    runs.contributions()
    print(f"contributions (ALTI): {alone:.2f} s alone, {time.perf_counter() - start:.2f} s on a run already made")


if __name__ == "__main__":
    main()
