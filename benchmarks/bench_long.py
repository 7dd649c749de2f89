"""Long inputs: `attnviz heads` through the full path (the model's output_attentions, L·H·T² weights) against
the streamed path (attention a block of query rows at a time) and against the floor, each in its own process,
side by side in one run: peak resident memory, wall time, and whether the numbers agree.

The floor is what any exact streamed statistics must at least do: the model's own forward pass (SDPA, no
weights kept) plus one blockwise recomputation of softmax(Q·Kᵀ/√d_k) from the recorded layer inputs (a causal
model's rows over the keys up to the block's last row), nothing folded; it runs in its own process like the two
paths (imports and the model's load included).

    python benchmarks/bench_long.py                    # T = 1024, 2048, 4096 both ways; 8192 streamed
    python benchmarks/bench_long.py --tokens 1024,2048 --streamed-only 4096
    python benchmarks/bench_long.py --model qwen2.5-coder-0.5b --streamed-only 8192,32768 \
        --commands heads,entropy,sinks                # a real model at its window, streamed rows only

The model is a random BERT-like one (12 layers, 12 heads, hidden 768, 8192 positions; the bundled MiniLM's
tokenizer), built once into a temporary folder. The text is common one-token words, so T is exact.
Peak memory is the child process's maximum resident set (wait4's ru_maxrss), model weights included.

With --model (an offline model's name) the rows are streamed only (`sinks` streams by itself beyond the budget),
on that model's converted folder, the text
attnviz's own source code cut to exactly T of the model's tokens (a long code file), each of --commands a row
beside the floor on the same folder; the weights' size (float32) is printed so that "the weights + N GB" can be
read off. `--commands ""` runs the floor's row alone (for a length whose command rows were run earlier).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["the", "cat", "sat", "on", "mat", "and", "a", "dog", "ran", "in", "park", "of", "to", "is", "it", "was"]


def build_model(folder: Path) -> Path:
    import torch
    import transformers as tf

    from attnviz.engine.models import bundled_model_dir

    torch.manual_seed(0)
    tokenizer = tf.AutoTokenizer.from_pretrained(str(bundled_model_dir()))
    tokenizer.model_max_length = 8192
    config = tf.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=768, num_hidden_layers=12,
                           num_attention_heads=12, intermediate_size=3072, max_position_embeddings=8192)
    tf.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def text_file(folder: Path, T: int) -> Path:
    """A text of exactly T tokens with [CLS] and [SEP] (every word is one token of the MiniLM vocabulary)."""
    path = folder / f"text{T}.txt"
    path.write_text(" ".join(WORDS[i % len(WORDS)] for i in range(T - 2)), encoding="utf-8")
    return path


def measure(args: list[str]) -> tuple[float, int, str, str]:
    """(seconds, peak RSS bytes, stdout, stderr) of one attnviz process."""
    exe = shutil.which("attnviz", path=str(Path(sys.executable).parent)) or "attnviz"
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    process = subprocess.Popen([exe, *args], stdout=out, stderr=err, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    out.seek(0)
    err.seek(0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return seconds, usage.ru_maxrss * 1024, out.read().decode(), err.read().decode()


FLOOR = """
import sys, time
import torch
from transformers import AutoModel, AutoTokenizer
from attnviz.engine.scratch.adapters import adapter_for
from attnviz.engine.hooks import recording_inputs
from attnviz.engine.models import ENCODER_MODEL_TYPES

folder, path = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
inputs = tokenizer(open(path, encoding="utf-8").read(), return_tensors="pt")
adapter = adapter_for(model)
causal = model.config.model_type not in ENCODER_MODEL_TYPES
modules = adapter.modules(model)
with torch.inference_mode():
    with recording_inputs(modules) as seen:
        model(**inputs)  # SDPA: no weights returned or kept
    for n, (module, record) in enumerate(zip(modules, seen)):
        qkv = adapter.qkv(module, record, n, model.config)
        q, k = qkv.q[0], qkv.k[0]  # (H, T, d)
        scale = q.shape[-1] ** -0.5
        for start in range(0, q.shape[1], 256):  # one blockwise softmax of every row, nothing folded
            keys = k[:, :start + 256] if causal else k  # a causal row's keys after the block: masked, not made
            torch.softmax(q[:, start:start + 256] @ keys.transpose(-2, -1) * scale, dim=-1)
print("ok")
"""


def code_file(folder: Path, tokenizer, T: int) -> Path:
    """attnviz's own source, cut to exactly T of `tokenizer`'s tokens (checked)."""
    source = "".join(p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("attnviz/**/*.py")))
    ids = tokenizer(source)["input_ids"]
    if len(ids) < T + 64:
        sys.exit(f"attnviz's source is {len(ids):,} tokens, fewer than {T:,}")
    for extra in range(64):  # attnviz strips the file's text; cut where the stripped text is T tokens again
        text = tokenizer.decode(ids[:T + extra]).strip()
        if len(tokenizer(text)["input_ids"]) == T:
            break
    else:
        sys.exit(f"no cut of attnviz's source is {T:,} tokens")
    path = folder / f"code{T}.txt"
    path.write_text(text, encoding="utf-8")
    return path


def named_rows(name: str, lengths: list[int], commands: list[str], floor_too: bool = True) -> None:
    """Streamed rows of an offline model: each command at each length beside the floor, fresh processes."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for

    found = offline.find(name)
    if found is None:
        sys.exit(f"{name} is not an offline model")
    model = folder_for(found)  # converted once, before anything is timed
    config = json.loads((model / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(model)
    weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    print(f"attnviz COMMAND --stream on {name} ({config['num_hidden_layers']} layers × "
          f"{config['num_attention_heads']} heads, hidden {config['hidden_size']}; weights {weights / 2**30:.2f} "
          f"GiB as stored), attnviz's source cut to T tokens; {os.cpu_count()} cores\n")
    header = (f"{'T':>6} {'command':>8} {'GiB':>6} {'s':>8} {'floor GiB':>10} {'floor s':>8} {'÷ floor':>8} "
              f"{'above floor':>12}")
    print(header)
    print("-" * len(header))
    folder = Path(tempfile.mkdtemp(prefix="bench_long_"))
    try:
        for T in lengths:
            path = code_file(folder, tokenizer, T)
            floor: tuple[float, int] | None = None
            for command in commands:
                streamed = ["--stream"] if command != "sinks" else []  # sinks streams by itself beyond the budget
                seconds, peak, stdout, stderr = measure([command, "--text-file", str(path), "-m", name, "--json",
                                                         "--device", "cpu", *streamed])
                if not stdout.strip():
                    sys.exit(f"{command} failed at T={T}: {stderr[-400:]}")
                if not floor_too:
                    print(f"{T:>6} {command:>8} {peak / 2**30:>6.2f} {seconds:>8.1f} {'—':>10} {'—':>8} {'—':>8} "
                          f"{(peak - weights) / 2**30:>+11.2f}G above the weights as stored", flush=True)
                    continue
                floor = floor or measure_floor(model, path)  # after the first command: its row shows first
                print(f"{T:>6} {command:>8} {peak / 2**30:>6.2f} {seconds:>8.1f} {floor[1] / 2**30:>10.2f} "
                      f"{floor[0]:>8.1f} {seconds / floor[0]:>7.2f}x {(peak - floor[1]) / 2**30:>+11.2f}G",
                      flush=True)
            if not commands and floor_too:  # the floor's row alone (--commands ""), beside rows run earlier
                floor = measure_floor(model, path)
                print(f"{T:>6} {'(floor)':>8} {'—':>6} {'—':>8} {floor[1] / 2**30:>10.2f} {floor[0]:>8.1f} {'—':>8} "
                      f"{(floor[1] - weights) / 2**30:>+11.2f}G above the weights as stored", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure_floor(model: Path, text: Path) -> tuple[float, int]:
    """(seconds, peak RSS bytes) of the floor's process."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", FLOOR, str(model), str(text)], stdout=out, stderr=err,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        err.seek(0)
        sys.exit(f"the floor failed: {err.read().decode()[-400:]}")
    return seconds, usage.ru_maxrss * 1024


def worst_difference(a: list[dict], b: list[dict]) -> float:
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if (x["label"], x["top_key"]) != (y["label"], y["top_key"]):
            return float("inf")
        worst = max(worst, max(abs(x[k] - y[k]) for k in x if isinstance(x[k], float)))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1024,2048,4096", help="T values for both paths")
    parser.add_argument("--streamed-only", default="8192", help="T values for the streamed path alone")
    parser.add_argument("--model", help="an offline model's name: streamed rows of it alone (see above)")
    parser.add_argument("--commands", default="heads",
                        help='with --model: the commands, comma-separated ("" for the floor\'s row alone)')
    parser.add_argument("--no-floor", action="store_true", help="with --model: the commands' rows alone")
    args = parser.parse_args()
    if args.model:
        if not args.commands.strip(",") and args.no_floor:
            parser.error('--commands "" with --no-floor leaves no row to run')
        named_rows(args.model, [int(t) for t in args.streamed_only.split(",") if t],
                   [c for c in args.commands.split(",") if c], floor_too=not args.no_floor)
        return
    folder = Path(tempfile.mkdtemp(prefix="bench_long_"))
    try:
        model = build_model(folder / "model")
        print("attnviz heads --json on a random 12-layer × 12-head BERT-like model (hidden 768, 8192 positions); "
              f"{os.cpu_count()} cores\n")
        header = (f"{'T':>5} {'full GiB':>9} {'full s':>7} {'stream GiB':>11} {'stream s':>9} {'floor GiB':>10} "
                  f"{'floor s':>8} {'memory full/stream':>19} {'time stream/full':>17} {'stream/floor':>13} "
                  f"{'max |Δ|':>9}")
        print(header)
        print("-" * len(header))
        for T in [int(t) for t in args.tokens.split(",") if t]:
            path = str(text_file(folder, T))
            common = ["heads", "--text-file", path, "-m", str(model), "--json", "--device", "cpu"]
            full = measure([*common, "--max-memory", "1T"])
            streamed = measure([*common, "--stream"])
            floor = measure_floor(model, Path(path))
            for name, result in (("full", full), ("streamed", streamed)):
                if not result[2].strip():
                    sys.exit(f"the {name} path failed at T={T}: {result[3][-400:]}")
            diff = worst_difference(json.loads(full[2]), json.loads(streamed[2]))
            print(f"{T:>5} {full[1] / 2**30:>9.2f} {full[0]:>7.1f} {streamed[1] / 2**30:>11.2f} {streamed[0]:>9.1f} "
                  f"{floor[1] / 2**30:>10.2f} {floor[0]:>8.1f} {full[1] / streamed[1]:>18.1f}x "
                  f"{streamed[0] / full[0]:>16.2f}x {streamed[0] / floor[0]:>12.2f}x {diff:>9.1e}", flush=True)
        for T in [int(t) for t in args.streamed_only.split(",") if t]:
            path = str(text_file(folder, T))
            seconds, peak, stdout, stderr = measure(["heads", "--text-file", path, "-m", str(model), "--json",
                                                     "--device", "cpu", "--stream"])
            if not stdout.strip():
                sys.exit(f"the streamed path failed at T={T}: {stderr[-400:]}")
            need = (12 + 4) * 12 * T * T * 4 / 2**30
            floor = measure_floor(model, Path(path))
            print(f"{T:>5} {'—':>9} {'—':>7} {peak / 2**30:>11.2f} {seconds:>9.1f} {floor[1] / 2**30:>10.2f} "
                  f"{floor[0]:>8.1f}   stream/floor {seconds / floor[0]:.2f}x (the full path would hold about "
                  f"{need:.0f} GiB of attention)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
