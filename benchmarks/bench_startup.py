"""Where the seconds of one `attnviz heatmap TEXT` go, and what the ways of looking again cost, side by side in
one run, each in a fresh process as a user meets it:

    python benchmarks/bench_startup.py               # 3 runs of each row, the median shown
    python benchmarks/bench_startup.py --repeats 5

Rows (every one the wall time of a new interpreter, start to exit):

- `python -c "import torch"` and `import torch, transformers` with BertModel: what any script pays first;
- a plain transformers script: load MiniLM from its folder, one forward pass with output_attentions, one
  imshow saved as a PNG (what a user would write without attnviz);
- `attnviz heatmap TEXT -o x.png` (the whole command: load, forward, draw);
- `attnviz heatmap --from c.npz -o x.png` (a capture saved once: no torch, no model);

and, inside one process, the same command's phases: importing torch and transformers, loading the model
(transformers imports the model's modules here), the forward pass, drawing and writing the PNG.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = "The cat sat on the mat"

PLAIN = """
import sys
from transformers import AutoModel, AutoTokenizer
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
folder = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
inputs = tokenizer(sys.argv[2], return_tensors="pt")
alpha = model(**inputs, output_attentions=True).attentions[-1][0].mean(0).detach().numpy()
plt.imshow(alpha)
plt.savefig(sys.argv[3])
"""

PHASES = """
import json, sys, time
marks = [time.perf_counter()]
import torch, transformers
from transformers import AutoModel
marks.append(time.perf_counter())
import attnviz
loaded = attnviz.load_model("minilm", device="cpu")
marks.append(time.perf_counter())
capture = attnviz.capture(sys.argv[1], model=loaded)
marks.append(time.perf_counter())
from attnviz.render.png import save_figure
save_figure(attnviz.heatmap(capture).figure(), sys.argv[2])
marks.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(marks, marks[1:])]))
"""


def seconds(command: list[str], repeats: int) -> float:
    """The median wall time of `command` in a fresh process."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for

    folder = str(folder_for(offline.MINILM))
    python, attnviz = sys.executable, [sys.executable, "-m", "attnviz"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        subprocess.run([*attnviz, "capture", TEXT, "-o", str(out / "c.npz")], check=True, capture_output=True)
        rows = [
            ("import torch", seconds([python, "-c", "import torch"], args.repeats)),
            ("import torch, transformers (BertModel)",
             seconds([python, "-c", "import torch, transformers; from transformers import BertModel"], args.repeats)),
            ("a plain transformers script: load, forward, imshow, savefig",
             seconds([python, "-c", PLAIN, folder, TEXT, str(out / "plain.png")], args.repeats)),
            ("attnviz heatmap TEXT -o x.png", seconds([*attnviz, "heatmap", TEXT, "-o", str(out / "x.png")],
                                                       args.repeats)),
            ("attnviz heatmap --from c.npz -o x.png",
             seconds([*attnviz, "heatmap", "--from", str(out / "c.npz"), "-o", str(out / "y.png")], args.repeats)),
        ]
        phases = json.loads(subprocess.run([python, "-c", PHASES, TEXT, str(out / "z.png")], capture_output=True,
                                           text=True, check=True).stdout.strip().splitlines()[-1])
    whole = dict(rows)["attnviz heatmap TEXT -o x.png"]
    plain = dict(rows)["a plain transformers script: load, forward, imshow, savefig"]
    print(f"{'row':<62} {'seconds':>8} {'× plain script':>15}")
    for name, value in rows:
        print(f"{name:<62} {value:8.2f} {value / plain:15.2f}")
    print(f"\nattnviz heatmap TEXT against the plain script: {whole / plain:.2f}×; "
          f"--from a saved capture against TEXT: {dict(rows)['attnviz heatmap --from c.npz -o x.png'] / whole:.2f}×")
    names = ("import torch and transformers", "load the model (transformers imports its modules)", "forward pass",
             "draw and write the PNG")
    total = sum(phases)
    print("\nphases of one heatmap, in one process:")
    for name, value in zip(names, phases):
        print(f"  {name:<52} {value:6.2f} s  {100 * value / total:5.1f}%")


if __name__ == "__main__":
    main()
