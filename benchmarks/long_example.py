"""The long-inputs guide's worked example, on real weights: which heads SmolLM2 uses to fetch a fact from about
6,000 tokens back. Two analyses, each in its own process (its time after the model's load, its peak memory):

1. `patch --method atp` over every head: a story of about 6,000 tokens that begins "The secret colour is red."
   and ends "What is the secret colour? The secret colour is", against the same with "blue"; the metric the
   logit difference of " red" and " blue". Above the default 2 GiB budget, so it runs without α (`--max-memory
   3G`: the recordings are about 1.7 GB).
2. `retrieval` at the same length with the needle near the start (depth 0.05): each head's share of the needle
   it copies while the model writes the answer, and the causal test (the top 10 heads removed against random
   heads).

    python benchmarks/long_example.py                # T = 6000
    python benchmarks/long_example.py --tokens 2000  # a shorter run

It prints each analysis's top heads and the heads both name. No test runs this.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_long_gradients import FILLER, MAKE, run

PATCH = """
import json, sys, time
import numpy as np
import attnviz
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
model = attnviz.load_model("smollm2", lm_head=True, memory_budget=3 << 30)
start = time.perf_counter()
result = attnviz.patch(clean, corrupt, model=model, method="atp", answers=(" red", " blue"))
order = np.argsort(-np.abs(result.heads), axis=None)[:10]
H = result.heads.shape[1]
print(json.dumps({"seconds": time.perf_counter() - start, "T": len(result.tokens), "lean": result.lean,
                  "clean": result.clean_diff, "corrupt": result.corrupt_diff,
                  "top": [[int(i // H), int(i % H), float(result.heads.flat[i])] for i in order]}))
"""

RETRIEVAL = """
import json, sys, time
import attnviz
T = int(sys.argv[1])
model = attnviz.load_model("smollm2", lm_head=True, memory_budget=3 << 30)
start = time.perf_counter()
result = attnviz.retrieval(model=model, lengths=(T,), depths=(0.05,), remove=10, draws=3, top=10)
data = result.to_dict()
print(json.dumps({"seconds": time.perf_counter() - start, "T": T, "data": data}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=6000)
    args = parser.parse_args()
    _, _, made = run(sys.executable, MAKE, str(args.tokens), FILLER, timeout=0)
    if isinstance(made, str):
        sys.exit(f"making the prompts failed: {made}")
    folder = Path(tempfile.mkdtemp(prefix="long_example_"))
    pair = folder / "pair.json"
    pair.write_text(json.dumps({"pair": [made["clean"], made["corrupt"]]}), encoding="utf-8")
    wall, peak, patched = run(sys.executable, PATCH, str(pair), timeout=0)
    if isinstance(patched, str):
        sys.exit(f"patch failed: {patched}")
    print(f"patch --method atp, {patched['T']:,} tokens, {'without α' if patched['lean'] else 'with α'}: "
          f"{patched['seconds']:.1f} s after the load, peak {peak / 2**30:.2f} GiB; logit difference clean "
          f"{patched['clean']:+.3f}, corrupted {patched['corrupt']:+.3f}")
    for n, h, v in patched["top"]:
        print(f"  head {n}.{h}  AtP {v:+.3f}")
    wall, peak, found = run(sys.executable, RETRIEVAL, str(args.tokens), timeout=0)
    if isinstance(found, str):
        sys.exit(f"retrieval failed: {found}")
    data = found["data"]
    print(f"\nretrieval, {args.tokens:,} tokens, needle at depth 0.05: {found['seconds']:.1f} s after the load, peak "
          f"{peak / 2**30:.2f} GiB")
    print(json.dumps({k: v for k, v in data.items() if k not in ("scores", "prompts")}, indent=1)[:3000])
    atp = {f"{n}.{h}" for n, h, _ in patched["top"]}
    heads = [f"{h['layer']}.{h['head']}" for h in data["top"]][:10]
    print(f"\nin both top 10s: {', '.join(sorted(atp & set(heads))) or 'none'}")


if __name__ == "__main__":
    main()
