"""Whether the memory estimates hold: each analysis whose check before the run estimates what it will hold is run
on a real model in a process of its own, and its peak resident memory above the warm model (weights paged in by
a short run of the same analysis first) is set beside the estimate its check computed. An estimate that holds
is at least the measured peak; the ratio says by how much it over-counts.

    python benchmarks/bench_estimates.py                 # every row
    python benchmarks/bench_estimates.py --only discover # the rows whose name holds this

Prints a Markdown table. Nothing here asserts (tests never assert on time or measured memory); the docs quote it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

FILLER = "The quick brown fox jumps over the lazy dog and then "
IOI = " When {} and Mary went to the store, John gave a drink to"

ROW = r'''
import json, resource, sys, warnings
warnings.simplefilter("ignore")
import attnviz
from attnviz.api.models import load_model

kind, T, arg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = load_model("smollm2", lm_head=True, memory_budget=1 << 40)
tok = model.tokenizer


def prompt(name, length):
    text = ""
    while len(tok(text)["input_ids"]) < length - 14:
        text += FILLER
    return tok.decode(tok(text)["input_ids"][:length - 14]) + IOI.format(name)


def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096


def call(length):
    clean, corrupt = prompt("John", length), prompt("Anna", length)
    if kind == "discover":
        steps = int(arg)
        return attnviz.discover(clean, corrupt, answers=(" Mary", " John"), model=model,
                                method="eap" if steps == 1 else "eap-ig", steps=max(steps, 1)), clean
    if kind == "atp*":  # prompts of different lengths, aligned
        corrupt = corrupt.replace(" When Anna", " so When Anna")
        return attnviz.patch(clean, corrupt, answers=(" Mary", " John"), model=model, method="atp*",
                             align="auto"), clean


def estimate(clean):
    from attnviz.engine.ablation import site
    from attnviz.engine.discovery import graph, scoring_bytes
    from attnviz.engine.memory import starred_bytes

    T = len(tok(clean)["input_ids"])
    if kind == "atp*":
        return T, sum(starred_bytes(site(model.model), T + 1, T).values())
    return T, sum(scoring_bytes(graph(model.model), T, int(arg)).values())


call(40)  # the weights paged in, the allocator warm
before = rss()
_, clean = call(T)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tokens, need = estimate(clean)
print(json.dumps({"tokens": tokens, "estimate": need, "measured": peak - before}))
'''.replace("FILLER", repr(FILLER)).replace("IOI", repr(IOI))

ROWS = [("discover EAP, SmolLM2", "discover", T, "1") for T in (64, 128, 256)] + \
       [("discover EAP-IG 5 steps, SmolLM2", "discover", T, "5") for T in (64, 128)] + \
       [("patch --method atp* --align auto, SmolLM2", "atp*", T, "") for T in (100, 161)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the rows whose name holds this")
    only = parser.parse_args().only
    print("| analysis | tokens | estimate | measured peak | estimate / measured |")
    print("|---|---:|---:|---:|---:|")
    for name, kind, T, arg in ROWS:
        if only not in name:
            continue
        done = subprocess.run([sys.executable, "-c", ROW, kind, str(T), arg], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"| {name} | {T} | failed: {done.stderr.strip().splitlines()[-1][:80]} | | |")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {name} | {row['tokens']} | {row['estimate'] / 1e9:.2f} GB | {row['measured'] / 1e9:.2f} GB | "
              f"{row['estimate'] / row['measured']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
