"""Where the seconds of one `attnviz heatmap TEXT` (and `capture`) go, and what the ways of looking again cost,
side by side in one run, each in a fresh process as a user meets it:

    python benchmarks/bench_startup.py               # 3 runs of each row, the median shown
    python benchmarks/bench_startup.py --repeats 5

Rows (every one the wall time of a new interpreter, start to exit):

- `python -c "import torch"` and `import torch, transformers` with BertModel: what any script pays first;
- a plain transformers script: load MiniLM from its folder, one forward pass with output_attentions, one
  imshow saved as a PNG (what a user would write without attnviz); the same script ending with os._exit,
  which shows what Python's teardown of torch and transformers costs (attnviz's command line skips it:
  attnviz/cli/ending.py);
- `attnviz heatmap TEXT -o x.png` and `attnviz capture TEXT -o x.npz` (the whole command: load, forward, write);
- `attnviz heatmap --from c.npz -o x.png` (a capture saved once: no torch, no model);

then, inside one process, the phases of a heatmap: importing torch and transformers, importing attnviz's command
line (Typer and Rich), loading the tokenizer, loading the model (transformers imports the model's modules here),
the forward pass, drawing and writing the PNG; and, where `-m multilingual` is installed, its 17 MB
tokenizer.json loaded from the converted folder against the same folder without the added tokens that attnviz
records in tokenizer_config.json (transformers 5 then reads the whole file a second time, in Python).
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

ROOT = Path(__file__).resolve().parents[1]
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

QUICK_END = """
import os
sys.stdout.flush()
os._exit(0)
"""

PHASES = """
import json, sys, time
marks = [time.perf_counter()]
import torch, transformers
from transformers import AutoModel, AutoTokenizer
marks.append(time.perf_counter())
import attnviz, attnviz.cli, attnviz.cli.capturing, rich.console
marks.append(time.perf_counter())
folder = sys.argv[3]
AutoTokenizer.from_pretrained(folder)
marks.append(time.perf_counter())
loaded = attnviz.load_model("minilm", device="cpu")
marks.append(time.perf_counter())
capture = attnviz.capture(sys.argv[1], model=loaded)
marks.append(time.perf_counter())
from attnviz.render.png import save_figure
save_figure(attnviz.heatmap(capture).figure(), sys.argv[2])
marks.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(marks, marks[1:])]))
"""

TOKENIZER = """
import json, sys, time
from transformers import AutoTokenizer
import transformers.tokenization_utils_tokenizers
found = []
for folder in sys.argv[1:] * 3:
    start = time.perf_counter()
    AutoTokenizer.from_pretrained(folder)
    found.append((folder, time.perf_counter() - start))
print(json.dumps({folder: min(t for f, t in found if f == folder) for folder in sys.argv[1:]}))
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


def compiled() -> None:
    """attnviz's modules compiled to .pyc, as pip compiles a package it installs: an editable install run
    under PYTHONDONTWRITEBYTECODE would otherwise compile them from source in every process (0.06–0.1 s) while
    torch and transformers, installed, read theirs."""
    import compileall

    compileall.compile_dir(str(ROOT / "attnviz"), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for

    folder = str(folder_for(offline.MINILM))
    compiled()
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
            ("the same script ending with os._exit (no teardown)",
             seconds([python, "-c", PLAIN + QUICK_END, folder, TEXT, str(out / "plain.png")], args.repeats)),
            ("attnviz heatmap TEXT -o x.png", seconds([*attnviz, "heatmap", TEXT, "-o", str(out / "x.png")],
                                                       args.repeats)),
            ("attnviz capture TEXT -o x.npz", seconds([*attnviz, "capture", TEXT, "-o", str(out / "x.npz")],
                                                       args.repeats)),
            ("attnviz heatmap --from c.npz -o x.png",
             seconds([*attnviz, "heatmap", "--from", str(out / "c.npz"), "-o", str(out / "y.png")], args.repeats)),
        ]
        phases = json.loads(subprocess.run([python, "-c", PHASES, TEXT, str(out / "z.png"), folder],
                                           capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        tokenizers = multilingual_tokenizer(out)
    whole = dict(rows)["attnviz heatmap TEXT -o x.png"]
    plain = dict(rows)["a plain transformers script: load, forward, imshow, savefig"]
    print(f"{'row':<62} {'seconds':>8} {'× plain script':>15}")
    for name, value in rows:
        print(f"{name:<62} {value:8.2f} {value / plain:15.2f}")
    print(f"\nattnviz heatmap TEXT against the plain script: {whole / plain:.2f}×; "
          f"--from a saved capture against TEXT: {dict(rows)['attnviz heatmap --from c.npz -o x.png'] / whole:.2f}×")
    teardown = plain - dict(rows)["the same script ending with os._exit (no teardown)"]
    print(f"Python's teardown at the end of the plain script (attnviz skips it): {teardown:.2f} s")
    names = ("import torch and transformers", "import attnviz's command line (Typer, Rich)", "load the tokenizer",
             "load the model (transformers imports its modules)", "forward pass", "draw and write the PNG")
    total = sum(phases)
    print("\nphases of one heatmap, in one process:")
    for name, value in zip(names, phases):
        print(f"  {name:<52} {value:6.2f} s  {100 * value / total:5.1f}%")
    if tokenizers:
        recorded, bare = tokenizers
        print(f"\nmultilingual's tokenizer (17 MB tokenizer.json), the best of 3: {recorded:.2f} s from attnviz's "
              f"converted folder, {bare:.2f} s without the added tokens it records ({bare / recorded:.2f}×)")


def multilingual_tokenizer(out: Path) -> tuple[float, float] | None:
    """Loading multilingual's tokenizer from attnviz's converted folder, and from a copy without the
    `added_tokens_decoder` attnviz records; None where the model is not installed."""
    import shutil

    from attnviz.engine import offline
    from attnviz.engine.offline.build import folder_for
    from attnviz.errors import ModelLoadError

    try:
        folder = folder_for(offline.MULTILINGUAL)
    except ModelLoadError:
        return None
    bare = out / "bare"
    bare.mkdir()
    for name in ("tokenizer.json", "config.json"):
        shutil.copyfile(folder / name, bare / name)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("added_tokens_decoder", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    found = json.loads(subprocess.run([sys.executable, "-c", TOKENIZER, str(folder), str(bare)], capture_output=True,
                                      text=True, check=True).stdout.strip().splitlines()[-1])
    return found[str(folder)], found[str(bare)]


if __name__ == "__main__":
    main()
