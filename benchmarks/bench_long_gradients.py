"""Gradient analyses at long inputs on real weights: `patch --method atp` over every head, `logit-attr`,
`faithfulness --methods grad-x-input`, `discover --method eap` and `importance` (every head removed alone, and
Michel et al.'s gradient estimate over every position's next-token loss) (the long path where α would not fit: the
model's own SDPA forward and backward, each block recomputed) against the floor — the
model's own SDPA forward and forward + backward at that length, in its own process — and against the peers
where they run, every contender a fresh process, side by side in one run: wall time and peak resident memory.

    python benchmarks/bench_long_gradients.py                     # SmolLM2, T = 512, 2048, 8192
    python benchmarks/bench_long_gradients.py --tokens 512,2048 --peers-python /path/to/python

The prompts are a retrieval task: a long story of common words with a fact near its start ("The secret colour is
red." / "... is blue."), asked at the end; the two differ in that one token, so they have the same length. The
metric is the logit difference of " red" and " blue" at the last position. attnviz's row is the whole command in Python
(`attnviz.patch(clean, corrupt, method="atp")`: tokenising, both runs, the backward pass, the result), timed
inside the process from after the model's load, as the floor's passes and the peers' are; the wall seconds and
the peak memory are of the whole process. The memory budget is raised (`memory_budget`, --max-memory on the
command line; --budgets, default 6 and 3 GiB) so that 8,192 tokens run: their recordings are about 2.6 GB, and
the default 2 GiB refuses in one line naming them; the rest of the budget keeps blocks' activations instead of
recomputing them. Peers (TransformerLens `run_with_cache` + backward; nnsight saving z and its gradient) run in
--peers-python, where they are installed; a peer that fails (out of memory, an error) is a row that says so. No
test runs this; tests never assert on wall time. `--repeat N` runs every contender N times, round after round, and
reports each one's fastest run (its other times beside it) and its largest peak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FILLER = ("The old man walked to the market and bought some bread and milk . The sun was warm and the birds sang in "
          "the trees . ")

MAKE = """
import json, sys
import attnviz
T = int(sys.argv[1])
loaded = attnviz.load_model("smollm2", lm_head=True)
tok = loaded.tokenizer
filler = sys.argv[2]
def prompt(number):  # the colour: one token, as the answer is
    head = f"The secret colour is{number}. "
    tail = " What is the secret colour? The secret colour is"
    n_fill = T - len(tok(head + tail)["input_ids"])
    unit = tok(filler)["input_ids"]
    ids = (unit * (n_fill // len(unit) + 1))[:n_fill]
    return head + tok.decode(ids) + tail
clean, corrupt = prompt(" red"), prompt(" blue")
print(json.dumps({"clean": clean, "corrupt": corrupt, "T": [len(tok(p)["input_ids"]) for p in (clean, corrupt)]}))
"""

ATTNVIZ = """
import json, sys, time
import attnviz
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
model = attnviz.load_model("smollm2", lm_head=True, memory_budget=int(float(sys.argv[2]) * 2**30))
start = time.perf_counter()
result = attnviz.patch(clean, corrupt, model=model, method="atp", answers=(" red", " blue"))
top = sorted(((abs(float(v)), n, h) for (n, h), v in __import__("numpy").ndenumerate(result.heads)), reverse=True)[:3]
print(json.dumps({"seconds": time.perf_counter() - start, "T": len(result.tokens), "lean": not result.patterns,
                  "top": [f"{n}.{h}" for _, n, h in top]}))
"""

LOGITS = """
import json, sys, time
import attnviz
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
model = attnviz.load_model("smollm2", lm_head=True, memory_budget=6 << 30)
start = time.perf_counter()
result = attnviz.logit_attr(clean, model=model, target=" red")
print(json.dumps({"seconds": time.perf_counter() - start, "T": len(result.tokens), "lean": result.by_input is None,
                  "top": [f"{e.layer}.{e.head}" for e in result.top[:3]]}))
"""

TIMING = """
import json, sys, time
import attnviz
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
model = attnviz.load_model("smollm2", lm_head=True, memory_budget=int(float(sys.argv[2]) * 2**30))
spent = []
def timing(module, name):  # each call of module.name timed into `spent`
    own = getattr(module, name)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return own(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)
    setattr(module, name, timed)
"""

FAITH = TIMING + """
import attnviz.engine.attribution.faithfulness as engine
timing(engine, "gradient_scores")  # the gradient step alone (the model's, then the randomised model's)
start = time.perf_counter()
result = attnviz.faithfulness(clean, model=model, methods=["grad-x-input"], target=" red")
m = result.methods[0]
print(json.dumps({"seconds": time.perf_counter() - start, "T": len(result.tokens), "lean": result.lean,
                  "gradient": spent[0], "sanity": m.sanity[-1][1], "aopc": [m.comprehensiveness_aopc,
                                                                          m.sufficiency_aopc]}))
"""

DISCOVER = TIMING + """
import attnviz.engine.discovery_lean as engine
timing(engine, "score_edges")  # scoring the edges alone (the corrupted run's forward, the clean run's and its backward)
start = time.perf_counter()
result = attnviz.discover(clean, corrupt, answers=(" red", " blue"), model=model, method="eap")
print(json.dumps({"seconds": time.perf_counter() - start, "T": -1, "lean": result.lean, "scoring": spent[0] if spent
                  else None, "passed": result.passed, "top": [f"{e['from']}>{e['to']}" for e in result.edges(3)]}))
"""

IMPORTANCE = TIMING + """
import attnviz.engine.ablation.ranking_lean as engine
timing(engine, "gradient_lean")  # Michel et al.'s gradient estimate alone: one forward + backward pass
start = time.perf_counter()
result = attnviz.importance(clean, model=model)
print(json.dumps({"seconds": time.perf_counter() - start, "T": result.tokens, "lean": result.lean,
                  "gradient": spent[0] if spent else None, "rho": result.spearman_estimated,
                  "top": [f"{r['layer']}.{r['head']}" for r in result.ranked[:3]]}))
"""

FLOOR = """
import json, sys, time
import torch
import attnviz
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
backward = sys.argv[2] == "backward"
loaded = attnviz.load_model("smollm2", lm_head=True)
model = loaded.model
model.set_attn_implementation("sdpa")
ids = loaded.tokenizer(clean, return_tensors="pt")["input_ids"]
start = time.perf_counter()
if backward:  # the gradient of the logit difference with respect to the embeddings: every block's backward pass
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeds, use_cache=False, logits_to_keep=1).logits[0, -1]
    torch.autograd.grad(logits[2382] - logits[4461], [embeds])  # " red" − " blue"
else:
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
print(json.dumps({"seconds": time.perf_counter() - start, "T": int(ids.shape[1])}))
"""

LENS = """
import json, sys, time
import torch
from transformer_lens.model_bridge import TransformerBridge
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
folder = sys.argv[2]
bridge = TransformerBridge.boot_transformers(folder, device="cpu")
tokens = bridge.to_tokens(clean)
start = time.perf_counter()
names = [f"blocks.{n}.attn.hook_z" for n in range(bridge.cfg.n_layers)]
logits, cache = bridge.run_with_cache(tokens, names_filter=lambda name: name in names)
(logits[0, -1, 2382] - logits[0, -1, 4461]).backward()  # " red" − " blue"
print(json.dumps({"seconds": time.perf_counter() - start, "T": int(tokens.shape[1])}))
"""

NNSIGHT = """
import json, sys, time
import torch
from nnsight import LanguageModel
clean, corrupt = json.load(open(sys.argv[1]))["pair"]
folder = sys.argv[2]
model = LanguageModel(folder, attn_implementation="eager", device_map="cpu", dispatch=True)
zs, grads = [], []
start = time.perf_counter()
with model.trace(clean):
    for layer in model.model.layers:
        z = layer.self_attn.o_proj.input
        zs.append(z.save())
        grads.append(z.grad.save())
    logits = model.lm_head.output
    (logits[0, -1, 2382] - logits[0, -1, 4461]).backward()  # " red" − " blue"
print(json.dumps({"seconds": time.perf_counter() - start, "T": -1}))
"""


def run(python: str, script: str, *args: str, timeout: float) -> tuple[float, int, dict | str]:
    """(wall seconds, peak RSS bytes, the printed JSON or the error's last line) of one fresh process."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    process = subprocess.Popen([python, "-c", script, *args], stdout=out, stderr=err,
                               env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    try:
        _, status, usage = os.wait4(process.pid, 0) if timeout <= 0 else _wait(process, timeout)
    except TimeoutError:
        return time.perf_counter() - start, 0, f"stopped after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    out.seek(0)
    err.seek(0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed: by the kernel's OOM killer when memory ran out
        return seconds, usage.ru_maxrss * 1024, (f"killed by signal {-code}" + (" (out of memory)" if code == -9
                                                                                  else ""))
    if code != 0:
        lines = [line for line in err.read().decode(errors="replace").splitlines()
                 if line.strip() and "Warning" not in line and "%|" not in line]
        return seconds, usage.ru_maxrss * 1024, (lines[-1][:120] if lines else f"exit {code}")
    return seconds, usage.ru_maxrss * 1024, json.loads(out.read().decode().strip().splitlines()[-1])


def _best(tries: list) -> tuple[float, int, dict | str]:
    """Of a contender's runs: the one fastest inside (a failure where any failed), with the largest peak of all."""
    failed = [t for t in tries if isinstance(t[2], str)]
    if failed:
        return failed[0]
    fastest = min(tries, key=lambda t: t[2]["seconds"])
    return fastest[0], max(t[1] for t in tries), fastest[2]


def _wait(process, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            return pid, status, usage
        time.sleep(0.5)
    process.kill()
    os.wait4(process.pid, 0)
    raise TimeoutError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="512,2048,8192")
    parser.add_argument("--peers-python", default=None, help="a Python with transformer-lens and nnsight")
    parser.add_argument("--peer-timeout", type=float, default=1800.0)
    parser.add_argument("--budgets", default="6,3", help="memory budgets for attnviz.patch, GiB: what the long path "
                                                         "may hold beside the weights (blocks beyond it recomputed)")
    parser.add_argument("--only", default="", help="run only the contenders whose names hold one of these words "
                                                   "(comma-separated: patch, logit_attr, faithfulness, discover, "
                                                   "importance); the floors always run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each contender, round after round; the "
                                                               "fastest is reported, with the largest peak")
    args = parser.parse_args()
    wanted = [w for w in args.only.split(",") if w]
    folder = Path(tempfile.mkdtemp(prefix="bench_long_gradients_"))
    smollm2 = None
    if args.peers_python:
        from attnviz.engine.offline import SMOLLM2
        from attnviz.engine.offline.build import folder_for

        smollm2 = str(folder_for(SMOLLM2))  # the converted folder (transformers' own files) the peers load
    print(f"patch --method atp over every head, SmolLM2-135M (30 layers × 9 heads), {os.cpu_count()} cores; "
          f"wall seconds and peak resident memory of each process (the model's load included); the ratio is of the "
          f"time inside, after the model's load\n", flush=True)
    header = f"{'T':>6}  {'contender':<50} {'s':>8} {'GiB':>6}  {'÷ floor fwd+bwd':>15}  note"
    print(header, flush=True)
    print("-" * len(header), flush=True)
    for T in [int(t) for t in args.tokens.split(",") if t]:
        seconds, _, made = run(sys.executable, MAKE, str(T), FILLER, timeout=0)
        if isinstance(made, str):
            sys.exit(f"making the prompts failed: {made}")
        pair = folder / f"pair{T}.json"
        pair.write_text(json.dumps({"pair": [made["clean"], made["corrupt"]]}), encoding="utf-8")
        planned = [*((f"attnviz.patch(method='atp'), budget {b}G", (ATTNVIZ, str(pair), b))
                     for b in args.budgets.split(",")),
                   ("attnviz.logit_attr (÷ the forward floor)", (LOGITS, str(pair))),
                   ("attnviz.faithfulness(grad-x-input), budget 3G", (FAITH, str(pair), "3")),
                   ("attnviz.discover(method='eap'), budget 3G", (DISCOVER, str(pair), "3")),
                   ("attnviz.importance (L·H removals), budget 3G", (IMPORTANCE, str(pair), "3"))]
        calls = [("floor: the model's SDPA forward", (FLOOR, str(pair), "forward")),
                 ("floor: the model's SDPA forward + backward", (FLOOR, str(pair), "backward")),
                 *((name, call) for name, call in planned if not wanted or any(w in name for w in wanted))]
        tries: dict[str, list] = {name: [] for name, _ in calls}
        for _ in range(args.repeat):  # round after round, so that a slow spell of the machine slows every contender
            for name, call in calls:
                tries[name].append(run(sys.executable, *call, timeout=0))
        rows = [(name, _best(tries[name])) for name, _ in calls]
        if args.peers_python and smollm2:
            rows += [("TransformerLens run_with_cache(hook_z) + backward",
                      run(args.peers_python, LENS, str(pair), smollm2, timeout=args.peer_timeout)),
                     ("nnsight trace: z and its gradient saved",
                      run(args.peers_python, NNSIGHT, str(pair), smollm2, timeout=args.peer_timeout))]
        floors = [row[1][2]["seconds"] if isinstance(row[1][2], dict) else None for row in rows[:2]]
        for name, (wall, peak, said) in rows:
            if isinstance(said, str):
                print(f"{T:>6}  {name:<50} {wall:>8.1f} {peak / 2**30:>6.2f}  {'':>15}  failed: {said}")
                continue
            inner = said["seconds"]
            floor_s = floors[0] if "forward floor" in name else floors[1]
            ratio = f"{inner / floor_s:.2f}×" if floor_s and "floor:" not in name else ""
            note = ("long path (no α)" if said.get("lean") else "full path (α)") if "lean" in said else ""
            note += f" top heads {', '.join(said['top'])}" if "top" in said else ""
            if said.get("scoring") and floors[1]:  # discover: scoring the edges beside the floor, then the curve
                note += (f" scoring {said['scoring']:.1f} s = {said['scoring'] / floors[1]:.2f}× the floor (a forward "
                         f"pass of the corrupted prompt included), the curve's 11 circuits the rest; check "
                         f"{'passed' if said['passed'] else 'FAILED'}")
            if said.get("gradient") and floors[1]:  # faithfulness, importance: the gradient step beside the floor's
                note += f" gradient step {said['gradient']:.1f} s = {said['gradient'] / floors[1]:.2f}× the floor;"
                note += (f" AOPC compr. {said['aopc'][0]:.3f} suff. {said['aopc'][1]:.3f}, sanity ρ "
                         f"{said['sanity']:.2f}" if "aopc" in said else
                         f" the rest: the L·H removals; Spearman ρ gradient vs |Δloss| {said['rho']:.2f}")
            others = ", ".join(f"{t[2]['seconds']:.1f}" for t in tries.get(name, [])
                               if isinstance(t[2], dict) and t[2] is not said)
            also = f"; the other runs: {others} s" if others else ""
            print(f"{T:>6}  {name:<50} {wall:>8.1f} {peak / 2**30:>6.2f}  {ratio:>15}  {note} "
                  f"(inside: {inner:.1f} s{also})", flush=True)
        print()


if __name__ == "__main__":
    main()
