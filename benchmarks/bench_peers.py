"""attnviz against what a user would write instead, side by side in one run: every contender a fresh process,
the rounds interleaved (contender A, B, C, then A, B, C again …), the minimum of the rounds kept (the run least
disturbed by the rest of the machine), the load average printed before and after.

    python benchmarks/bench_peers.py                  # 3 rounds, MiniLM, 500 sentences for the corpus rows
    python benchmarks/bench_peers.py --rounds 5 --texts 200

Two tasks, each contender doing the same work from start to exit:

- **one sentence to α in memory**: a plain transformers script (load the folder with eager attention, one
  forward pass with output_attentions, α as numpy), `attnviz capture TEXT -o x.npz`, `attnviz heatmap TEXT -o
  x.png` beside the plain script that also draws it (imshow, savefig), the Python API (`attnviz.capture`),
  nnsight and TransformerLens when installed;
- **α and per-head entropy over a corpus**: `attnviz corpus FILE` (every statistic of the heads table, not only
  entropy) against the plain transformers loop batched 32 (length-sorted, padded, masked: what a careful user
  writes) and the same one text at a time; nnsight and TransformerLens one at a time when installed.

A contender that is not installed is a line saying so. No test runs this; tests never assert on wall time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from bench_corpus import sentences  # noqa: E402  (the same generated corpus as bench_corpus.py)

TEXT = "The cat sat on the mat"

PLAIN = """
import sys, torch
from transformers import AutoModel, AutoTokenizer
folder, text = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
with torch.inference_mode():
    out = model(**tokenizer(text, return_tensors="pt"), output_attentions=True)
alpha = torch.cat(out.attentions).numpy()
"""

PLAIN_DRAWN = PLAIN + """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.imshow(alpha[0].mean(0))
plt.savefig(sys.argv[3])
"""

API = """
import sys
import attnviz
capture = attnviz.capture(sys.argv[2])
alpha = capture.attentions
"""

NNSIGHT = """
import sys, torch
from nnsight import NNsight
from transformers import AutoModel, AutoTokenizer
folder, text = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = NNsight(AutoModel.from_pretrained(folder, attn_implementation="eager").eval())
inputs = tokenizer(text, return_tensors="pt")
with model.trace(**inputs, output_attentions=True):
    saved = model.output.attentions.save()
alpha = torch.cat(list(saved)).detach().numpy()
"""

LENS = """
import sys, torch
from transformer_lens.model_bridge import TransformerBridge
folder, text = sys.argv[1], sys.argv[2]
bridge = TransformerBridge.boot_transformers(folder, device="cpu")
_, cache = bridge.run_with_cache(text)
alpha = torch.stack([cache[f"blocks.{n}.attn.hook_pattern"][0] for n in range(bridge.cfg.n_layers)]).numpy()
"""

NNSIGHT_CORPUS = """
import sys, torch
from nnsight import NNsight
from transformers import AutoModel, AutoTokenizer
folder, path = sys.argv[1], sys.argv[2]
texts = [line for line in open(path, encoding="utf-8").read().splitlines() if line.strip()]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = NNsight(AutoModel.from_pretrained(folder, attn_implementation="eager").eval())
total, rows = None, 0
for text in texts:
    inputs = tokenizer(text, return_tensors="pt", truncation=True)
    with model.trace(**inputs, output_attentions=True):
        saved = model.output.attentions.save()
    alpha = torch.cat(list(saved)).detach()  # (L, H, T, T)
    entropy = -(alpha * torch.log(alpha.clamp_min(1e-12))).sum(-1).sum(-1)  # (L, H)
    total = entropy if total is None else total + entropy
    rows += alpha.shape[-1]
print((total / rows).mean().item())
"""

LENS_CORPUS = """
import sys, torch
from transformer_lens.model_bridge import TransformerBridge
folder, path = sys.argv[1], sys.argv[2]
texts = [line for line in open(path, encoding="utf-8").read().splitlines() if line.strip()]
bridge = TransformerBridge.boot_transformers(folder, device="cpu")
names = [f"blocks.{n}.attn.hook_pattern" for n in range(bridge.cfg.n_layers)]
total, rows = None, 0
with torch.inference_mode():
    for text in texts:
        _, cache = bridge.run_with_cache(text, names_filter=lambda name: name in names)
        alpha = torch.stack([cache[name][0] for name in names])  # (L, H, T, T)
        entropy = -(alpha * torch.log(alpha.clamp_min(1e-12))).sum(-1).sum(-1)
        total = entropy if total is None else total + entropy
        rows += alpha.shape[-1]
print((total / rows).mean().item())
"""

CORPUS_PLAIN = """
import sys, torch
from transformers import AutoModel, AutoTokenizer
folder, path, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
texts = [line for line in open(path, encoding="utf-8").read().splitlines() if line.strip()]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
total, rows = None, 0
with torch.inference_mode():
    for start in range(0, len(order), batch):
        chunk = [texts[i] for i in order[start:start + batch]]
        inputs = tokenizer(chunk, return_tensors="pt", padding=True, truncation=True)
        alpha = torch.stack(model(**inputs, output_attentions=True).attentions)  # (L, B, H, T, T)
        mask = inputs["attention_mask"].bool()  # (B, T): real query rows
        entropy = -(alpha * torch.log(alpha.clamp_min(1e-12))).sum(-1)  # (L, B, H, T)
        per_head = (entropy * mask[None, :, None, :]).sum((1, 3))  # (L, H)
        total = per_head if total is None else total + per_head
        rows += int(mask.sum())
print((total / rows).mean().item())
"""


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(command: list[str]) -> float | str:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["failed"])[-1][:120]
    return time.perf_counter() - start


def statistic_costs(texts: list[str], repeats: int = 5) -> list[tuple[str, float]]:
    """What each statistic of `attnviz corpus` costs alone, in nanoseconds per attention weight: each metric's
    function over the rows of one batch of 32 texts (every layer and head at once, as the corpus computes them;
    the minimum of `repeats`), divided by the weights it reads (Σ n² over the texts, times layers × heads); and
    the whole of the statistics (texts_stats: every metric, the moments per text, the labels). The forward pass
    is not counted."""
    import numpy as np

    from attnviz.corpora import Line, texts_stats
    from attnviz.engine.corpora.run import BatchRunner
    from attnviz.engine.models import load
    from attnviz.metrics.rows import Rows

    runner = BatchRunner(load("minilm", device="cpu"))
    ready, _ = runner.prepare([Line("bench", n, text, None) for n, text in enumerate(texts)])
    batch = next(iter(runner.batches(ready)))
    packed, H = runner.attention(batch)
    lengths = [len(p.ids) for p in batch]
    tokens = [p.tokens for p in batch]
    weights = sum(n * n for n in lengths) * packed.shape[-1]
    width = max(lengths)
    queries = np.concatenate([np.arange(n) for n in lengths])

    def rows() -> Rows:  # new each time: a Rows keeps what its metrics share (the entropy, the float64 copy)
        return Rows(packed[:width].transpose(2, 1, 0), queries, tokens[0], None, texts=tuple(tokens),
                    counts=tuple(lengths))

    def best(work) -> float:
        found = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            found = min(found, time.perf_counter() - start)
        return found / weights * 1e9

    costs = [(m.name, best(lambda m=m: m.rows(rows()))) for m in runner.metrics if m.rows is not None]
    costs.append(("every statistic, per text", best(lambda: texts_stats(packed, lengths, tokens, H, runner.metrics,
                                                                       runner.sinks, runner.windows))))
    # the whole corpus, as `attnviz corpus` computes it: the statistics of every batch, against the forward passes
    forward = statistics = 0.0
    read = 0
    for batch in runner.batches(ready):
        start = time.perf_counter()
        packed, H = runner.attention(batch)
        middle = time.perf_counter()
        lengths = [len(p.ids) for p in batch]
        texts_stats(packed, lengths, [p.tokens for p in batch], H, runner.metrics, runner.sinks, runner.windows)
        forward, statistics = forward + middle - start, statistics + time.perf_counter() - middle
        read += sum(n * n for n in lengths) * packed.shape[-1]
    print(f"  over the whole corpus ({read / 1e6:.1f} M weights): forward passes with α gathered {forward:.2f} s, "
          f"every statistic {statistics:.2f} s ({statistics / read * 1e9:.1f} ns per weight)")
    return costs


def compiled() -> None:
    """attnviz's modules compiled to .pyc, as pip compiles a package it installs: an editable install run
    under PYTHONDONTWRITEBYTECODE would otherwise compile them from source in every process (0.06–0.1 s) while
    torch and transformers, installed, read theirs."""
    import compileall

    compileall.compile_dir(str(ROOT / "attnviz"), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=500)
    parser.add_argument("--peers-python", default=sys.executable, metavar="PYTHON",
                        help="the interpreter that has nnsight and TransformerLens (another virtual environment: "
                             "they pull in packages attnviz does not use); default this one")
    args = parser.parse_args()
    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for

    folder = str(folder_for(offline.MINILM))
    compiled()
    python, attnviz = sys.executable, [sys.executable, "-m", "attnviz"]
    peers = args.peers_python
    installed = {name: subprocess.run([peers, "-c", f"import {name}"], capture_output=True).returncode == 0
                 for name in ("nnsight", "transformer_lens")}
    print(f"machine: {os.cpu_count()} cores, load average {load_average()} (1, 5, 15 min); MiniLM "
          f"(all-MiniLM-L6-v2, 6 × 12), CPU; {args.rounds} rounds interleaved, the minimum of each")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        corpus = out / "corpus.txt"
        corpus.write_text("\n".join(sentences(args.texts)) + "\n", encoding="utf-8")
        one = {
            "plain transformers script (α in memory)": [python, "-c", PLAIN, folder, TEXT],
            "attnviz capture TEXT -o x.npz": [*attnviz, "capture", TEXT, "-o", str(out / "x.npz")],
            "attnviz.capture(TEXT) (Python)": [python, "-c", API, folder, TEXT],
            "plain script + imshow, savefig": [python, "-c", PLAIN_DRAWN, folder, TEXT, str(out / "p.png")],
            "attnviz heatmap TEXT -o x.png": [*attnviz, "heatmap", TEXT, "-o", str(out / "x.png")],
        }
        many = {
            f"plain transformers loop, batched 32 ({args.texts} texts)": [python, "-c", CORPUS_PLAIN, folder,
                                                                          str(corpus), "32"],
            f"attnviz corpus FILE ({args.texts} texts, every statistic)": [*attnviz, "corpus", str(corpus)],
            f"plain transformers loop, one at a time ({args.texts} texts)": [python, "-c", CORPUS_PLAIN, folder,
                                                                             str(corpus), "1"],
        }
        if peers != python and any(installed.values()):  # the same plain script where the peers run: that
            # environment holds fewer packages that transformers imports when present (scipy, Pillow, accelerate)
            one["plain script in the peers' environment"] = [peers, "-c", PLAIN, folder, TEXT]
            many[f"plain loop, batched 32, in the peers' environment ({args.texts} texts)"] = [
                peers, "-c", CORPUS_PLAIN, folder, str(corpus), "32"]
        if installed["nnsight"]:
            one["nnsight 0.8 (α in memory)"] = [peers, "-c", NNSIGHT, folder, TEXT]
            many[f"nnsight 0.8, one at a time ({args.texts} texts)"] = [peers, "-c", NNSIGHT_CORPUS, folder,
                                                                        str(corpus)]
        if installed["transformer_lens"]:
            one["TransformerLens 4.3 TransformerBridge (α in memory)"] = [peers, "-c", LENS, folder, TEXT]
            many[f"TransformerLens 4.3, one at a time ({args.texts} texts)"] = [peers, "-c", LENS_CORPUS, folder,
                                                                                str(corpus)]
        subprocess.run(one["attnviz capture TEXT -o x.npz"], capture_output=True)  # caches warm, once
        for title, table, base in (("one sentence to α", one, "plain transformers script (α in memory)"),
                                   ("a corpus: α and per-head entropy", many,
                                    f"plain transformers loop, batched 32 ({args.texts} texts)")):
            best: dict[str, float | str] = {}
            for _ in range(args.rounds):
                for name, command in table.items():
                    found = timed(command)
                    if isinstance(found, str) or isinstance(best.get(name), str):
                        best[name] = found if isinstance(found, str) else best[name]
                    else:
                        best[name] = min(found, best.get(name, float("inf")))  # type: ignore[type-var]
            print(f"\n{title}")
            print(f"  {'contender':<62}{'seconds':>9}{'× ' + 'base':>9}")
            for name, value in best.items():
                if isinstance(value, str):
                    print(f"  {name:<62}{'failed':>9}  {value}")
                    continue
                other = "plain script + imshow, savefig" if "heatmap" in name else base
                ratio = value / best[other] if not isinstance(best[other], str) else float("nan")
                print(f"  {name:<62}{value:>9.2f}{ratio:>8.2f}×" + ("  (against the drawing script)"
                                                                    if other != base else ""))
        print("\nwhat each statistic of attnviz corpus costs alone (one batch of 32 texts; the forward pass not "
              "counted)")
        costs = statistic_costs(sentences(args.texts))
        for name, cost in costs:
            print(f"  {name:<24}{cost:>8.2f} ns per weight")
        for name, there in installed.items():
            if not there:
                print(f"\n{name} is not installed: its rows are skipped (pip install "
                      f"{'nnsight==0.8.1' if name == 'nnsight' else 'transformer-lens==4.3.0'} to add them)")
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
