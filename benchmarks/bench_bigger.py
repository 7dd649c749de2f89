"""The bigger offline models against the bare transformers run a user would write instead, side by side in one
run, each row a fresh process as a user meets it (the model's converted folder already in the cache):

    python benchmarks/bench_bigger.py                          # qwen2.5-coder-1.5b, T = 32 and 256
    python benchmarks/bench_bigger.py -m qwen2.5-coder-0.5b --lengths 32,256,1024
    python benchmarks/bench_bigger.py --commands capture,heads --no-bare

For each row: the wall time of the whole process, its peak resident memory (VmHWM: weights read through a memory
map count here as they are touched) and its peak anonymous memory (RssAnon sampled every 20 ms: what the process
itself allocated, the part the system cannot drop), each beside the weights' size in the dtype that runs.

Rows:
- bare load + forward: a plain script that loads the same folder with transformers (eager attention) and runs
  one forward pass with output_attentions, against `attnviz capture TEXT -o x.npz` (ratio);
- bare generate: model.generate(greedy, N new tokens) against `attnviz generate TEXT --max-new-tokens N -o g.npz`
  (which keeps every step's attention): tokens per second and their ratio;
- each command of --commands at each length of --lengths: seconds and memory (the table of
  docs/guide/bigger.md);
- --dtype bfloat16: capture on CPU in bfloat16, memory against the bfloat16 weights.

No test runs this; tests never assert on wall time.
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
ATTNVIZ = [sys.executable, "-m", "attnviz"]
SENTENCE = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"

BARE_FORWARD = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, path, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path, encoding="utf-8").read()
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=getattr(torch, dtype)).eval()
inputs = tokenizer(text, return_tensors="pt")
with torch.inference_mode():
    out = model(**inputs, output_attentions=True)
print(len(out.attentions), inputs["input_ids"].shape[1])
"""

BARE_GENERATE = """
import sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, text, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
inputs = tokenizer(text, return_tensors="pt")
start = time.perf_counter()
with torch.inference_mode():
    out = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
seconds = time.perf_counter() - start
print(out.shape[1] - inputs["input_ids"].shape[1], seconds)
"""


def measure(command: list[str], **kwargs) -> dict:
    """Run `command` to its end: wall seconds, peak resident and peak anonymous memory (bytes), stdout."""
    start = time.perf_counter()
    sink = tempfile.TemporaryFile("w+")  # a file, not a pipe: a --json of 336 heads would fill a pipe and wait
    errors = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, stdout=sink, stderr=errors, text=True, **kwargs)
    peaks = {"VmHWM:": 0, "RssAnon:": 0}
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:  # read while the process lives (its status is gone once it is reaped)
        try:
            for line in status.read_text().splitlines():
                key = line.split(maxsplit=1)[0] if line else ""
                if key in peaks:
                    peaks[key] = max(peaks[key], int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.02)
    hwm, peak_anon = peaks["VmHWM:"], peaks["RssAnon:"]
    process.wait()
    sink.seek(0)
    errors.seek(0)
    out, err = sink.read(), errors.read()
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        last = (err.strip().splitlines() or ["?"])[-1]
        return {"seconds": seconds, "peak": hwm, "anon": peak_anon, "error": last[:200], "out": out}
    return {"seconds": seconds, "peak": hwm, "anon": peak_anon, "out": out}


def text_of(tokens: int) -> str:
    """About `tokens` tokens of code (Qwen's tokenizer: the sentence is about 22 tokens)."""
    return (SENTENCE * (tokens // 22 + 1))


def gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--lengths", default="32,256")
    parser.add_argument("--commands", default="capture,heads,heatmap,logit-attr,contributions,patch")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare transformers rows")
    args = parser.parse_args()
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}

    sys.path.insert(0, str(ROOT))
    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for

    model = offline.find(args.model)
    if model is None:
        sys.exit(f"{args.model} is not an offline model")
    folder = folder_for(model)  # converted once, before anything is timed
    config = json.loads((folder / "config.json").read_text())
    stored = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    lm_head = config["vocab_size"] * config["hidden_size"] * 4
    print(f"{model.shown}: {config['num_hidden_layers']} layers x {config['num_attention_heads']} heads "
          f"({config.get('num_key_value_heads')} key/value), float32 weights {gb(stored)} GB on disk "
          f"({gb(stored - lm_head)} GB without the output layer)")
    print(f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} "
          f"GiB, load average {os.getloadavg()[0]:.2f}\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lengths = [int(x) for x in args.lengths.split(",")]
        if not args.no_bare:
            path = work / "text.txt"
            path.write_text(text_of(lengths[0]), encoding="utf-8")
            bare = measure([sys.executable, "-c", BARE_FORWARD, str(folder), str(path), "float32"], env=env)
            ours = measure(ATTNVIZ + ["capture", "--text-file", str(path), "-m", args.model, "-o",
                                      str(work / "c.npz")], env=env, cwd=tmp)
            print(f"load + one forward with attention, T ~ {lengths[0]}: bare transformers {bare['seconds']:.1f} s "
                  f"(peak {gb(bare['peak'])} GB, anonymous {gb(bare['anon'])} GB); attnviz capture "
                  f"{ours['seconds']:.1f} s (peak {gb(ours['peak'])} GB, anonymous {gb(ours['anon'])} GB): "
                  f"{ours['seconds'] / bare['seconds']:.2f}x the time")
            n = args.new_tokens
            bare = measure([sys.executable, "-c", BARE_GENERATE, str(folder), "def fib(n):", str(n)], env=env)
            ours = measure(ATTNVIZ + ["generate", "def fib(n):", "-m", args.model, "--max-new-tokens", str(n),
                                      "-o", str(work / "g.npz"), "--json"], env=env, cwd=tmp)
            if "error" in bare or "error" in ours:
                print("generate:", bare.get("error") or ours.get("error"))
            else:
                made, seconds = bare["out"].split()
                print(f"generate {n} tokens, whole process: bare model.generate {bare['seconds']:.1f} s "
                      f"({int(made) / float(seconds):.1f} tokens/s once loaded); attnviz generate, every step's "
                      f"attention kept, {ours['seconds']:.1f} s: {ours['seconds'] / bare['seconds']:.2f}x the time "
                      f"(peak {gb(bare['peak'])} and {gb(ours['peak'])} GB)")
            print()
        print(f"{'command':<14}{'T':>6}{'seconds':>9}{'peak GB':>9}{'anon GB':>9}  note")
        for T in lengths:
            path = work / f"t{T}.txt"
            path.write_text(text_of(T), encoding="utf-8")
            for command in args.commands.split(","):
                extra = {"heatmap": ["-o", str(work / "h.png")], "capture": ["-o", str(work / "c.npz")],
                         "heads": ["--json"], "contributions": ["--json"], "logit-attr": ["--json"],
                         "patch": ["--json", "--method", "atp"]}.get(command, ["--json"])
                if command == "patch":  # the same code, then which sum it asserts: add(2, 3) or add(4, 5)
                    prompt = text_of(T - 12) + "x = add(2, 3)\nassert x =="
                    cmd = ATTNVIZ + ["patch", prompt, prompt.replace("add(2, 3)", "add(4, 5)"), "--answers", "5,9"]
                else:
                    cmd = ATTNVIZ + [command, "--text-file", str(path)]
                found = measure(cmd + ["-m", args.model] + extra, env=env, cwd=tmp)
                note = found.get("error", "")
                rows.append((command, T, found))
                print(f"{command:<14}{T:>6}{found['seconds']:>9.1f}{gb(found['peak']):>9}{gb(found['anon']):>9}  "
                      f"{note}", flush=True)
        bf = measure(ATTNVIZ + ["capture", "--text-file", str(work / f"t{lengths[0]}.txt"), "-m", args.model,
                                "--dtype", "bfloat16", "-o", str(work / "b.npz")], env=env, cwd=tmp)
        print(f"\ncapture --dtype bfloat16, T ~ {lengths[0]}: {bf['seconds']:.1f} s, peak {gb(bf['peak'])} GB, "
              f"anonymous {gb(bf['anon'])} GB (bfloat16 weights without the output layer: "
              f"{gb((stored - lm_head) // 2)} GB) {bf.get('error', '')}")


if __name__ == "__main__":
    main()
