"""The offline models: how long the first load (the conversion into the cache) and a cached load take,
beside MiniLM's load, each in a fresh process; and generation on SmolLM2 with its attention kept against the
model's own `generate` without it (greedy, same tokens), side by side in one run.

    python benchmarks/bench_offline.py                  # loads, and generate -n 50
    python benchmarks/bench_offline.py --new-tokens 50  # the longer generation row
    python benchmarks/bench_offline.py --device cuda    # the GPU rows

A load is `attnviz.engine.models.load(name)` in a new interpreter, timed inside it from before the import of attnviz
(so torch's and transformers' import is part of every row, as it is for a user). The first load uses an
empty cache folder made for the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LOAD = """
import json, sys, time
start = time.perf_counter()
from attnviz.engine.models import load
loaded = load(sys.argv[1], device=sys.argv[2], lm_head=sys.argv[1] == "smollm2")
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def load_seconds(name: str, device: str, cache: str) -> float:
    env = {**os.environ, "ATTNVIZ_CACHE_DIR": cache, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD, name, device], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"loading {name} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def generation(device: str, new_tokens: int, repeats: int) -> tuple[float, float, list[int], list[int]]:
    import torch

    from attnviz.engine.generation import Decoding, generate_capture
    from attnviz.engine.forward import encode
    from attnviz.engine.models import load

    loaded = load("smollm2", device=device, lm_head=True)
    prompt = "Once upon a time, in a small town by the sea, there lived a cat who"  # a story: it goes on
    ids = encode(loaded, prompt).inputs["input_ids"]
    ours, theirs = [], []
    kept: list[int] = []
    plain: list[int] = []
    for _ in range(repeats + 1):  # the first round warms up
        start = time.perf_counter()
        capture = generate_capture(loaded, prompt, Decoding(max_new_tokens=new_tokens))
        ours.append(time.perf_counter() - start)
        written = capture.n_tokens - capture.prompt_length  # it may stop at the end-of-sequence token first
        start = time.perf_counter()
        with torch.inference_mode():
            out = loaded.model.generate(ids, max_new_tokens=written, min_new_tokens=written, do_sample=False,
                                        attention_mask=torch.ones_like(ids))
        theirs.append(time.perf_counter() - start)
        kept = [int(i) for i in capture.token_ids[capture.prompt_length:]]
        plain = [int(i) for i in out[0, ids.shape[1]:]]
    return statistics.median(ours[1:]), statistics.median(theirs[1:]), kept, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--new-tokens", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-loads", action="store_true", help="only the generation rows")
    args = parser.parse_args()
    if not args.no_loads:
        loads(args.device)
    generating(args)


def loads(device: str) -> None:

    from attnviz.engine.offline.cache import cache_root

    warm = str(cache_root())
    rows = []
    with tempfile.TemporaryDirectory() as empty:
        for name in ("multilingual", "smollm2"):
            rows.append((name, "first load (conversion)", load_seconds(name, device, empty)))
    for name in ("minilm", "multilingual", "smollm2"):
        load_seconds(name, device, warm)  # the cache is built, the files are in the page cache
        rows.append((name, "cached load", statistics.median(load_seconds(name, device, warm) for _ in range(3))))
    minilm = next(s for n, kind, s in rows if n == "minilm")
    print("| model | load | seconds | × MiniLM's load |")
    print("|---|---|---|---|")
    for name, kind, seconds in rows:
        print(f"| {name} | {kind} | {seconds:.2f} | {seconds / minilm:.2f} |")
    print()


def generating(args) -> None:
    ours, theirs, kept, plain = generation(args.device, args.new_tokens, args.repeats)
    print(f"generate -n {args.new_tokens} on smollm2 ({args.device}, greedy, median of {args.repeats}; "
          f"{len(kept)} tokens written before it stopped):")
    print("| path | seconds | × model.generate |")
    print("|---|---|---|")
    print(f"| model.generate, no attention kept | {theirs:.3f} | 1.00 |")
    print(f"| attnviz generate_capture, every row kept | {ours:.3f} | {ours / theirs:.2f} |")
    print(f"same tokens: {kept == plain}")


if __name__ == "__main__":
    main()
