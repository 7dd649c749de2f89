"""Export speed: attnviz's per-head PNG export against the naive matplotlib loop and the encode-only floor,
measured side by side in one run; then the whole process, `attnviz export --from` against a naive script.

    python benchmarks/bench_export.py                 # T = 8, 64, 128; 12 layers x 12 heads; whole process at 128
    python benchmarks/bench_export.py --naive-heads 24  # time the naive loop on 24 heads, scale to 144

In process, for each T it builds a synthetic capture (fixed seed) and writes the same 144 labelled heatmaps
(tokens on both axes, colorbar, title; same figure size and dpi):
  naive   a new pyplot figure per head: imshow, tick labels, colorbar, title, savefig, close
  attnviz attnviz.api.gallery.render_panels (layout drawn once, α swapped in, workers = cores)
  floor   only PNG-encoding, in one process, 144 images of the same pixel size:
            frames    attnviz's own finished frames with attnviz's encoder (ISA-L deflate, level 2)
            zlib-3    the same frames with the previous encoder (zlib level 3), for comparison
            cmapped   colour-mapped α filling the whole image, with Pillow at its default level
Both contenders run warm: one untimed figure is drawn first, so neither pays matplotlib's font loading.
Both draw the same linear colour scale (attnviz's default for T > 64 is log; --norm linear here).
per-head/frame: the marginal time of one more head ((all 144 − one layer of 12) / 132, with the workers)
against encoding one frame in one process; attnviz/frames includes the one-time layout (~0.35 s: drawing
2T tick labels once), which the marginal cost leaves out.

Whole process (--whole T, default 128): `attnviz export --from capture.npz` (every head, 12 layer means, the
grid, heads.csv/json, index.html) against a separate Python process running the naive loop over the same 156
images (144 heads + 12 means), every token labelled; both timed from process start to exit.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from attnviz.data.capture import Capture
from attnviz.api.gallery import HeadImageWriter, render_panels
from attnviz.render.encode import encode_scanlines
from attnviz.panels import ScaleChoice, attention_panels, text_subtitle
from attnviz.render.png import LabelLayout, heatmap_figure

L = H = 12


def synthetic_capture(T: int, seed: int = 0) -> Capture:
    rng = np.random.default_rng(seed)
    alpha = rng.dirichlet(np.full(T, 0.3), size=(L, H, T)).astype(np.float32)  # (L, H, T, T)
    words = ["the", "cat", "sat", "on", "mat", "and", "a", "dog", "ran", "in", "park", "."]
    tokens = [words[i % len(words)] + (str(i // len(words)) if i >= len(words) else "") for i in range(T)]
    return Capture(attentions=alpha, tokens=tokens, token_ids=np.arange(T), special=np.zeros(T, bool),
                   special_kind=[""] * T, subword=np.zeros(T, bool), meta={"model": "synthetic/bench"})


def naive_loop(capture: Capture, folder: Path, jobs, vmax: float, dpi: int) -> None:
    """jobs: (layer, head) with head an index or "mean"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = heatmap_figure(capture, 0, 0, vmax=vmax)  # only to use the same size and font size
    size = reference.figure.get_size_inches()
    fontsize = LabelLayout.for_tokens(capture.n_tokens).fontsize
    T = capture.n_tokens
    for layer, head in jobs:
        fig, ax = plt.subplots(figsize=size)
        alpha = capture.head_matrix(layer, head)
        image = ax.imshow(alpha, cmap="viridis", vmin=0, vmax=vmax)
        ax.set_xticks(range(T))
        ax.set_xticklabels(capture.tokens, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(T))
        ax.set_yticklabels(capture.tokens, fontsize=fontsize)
        fig.colorbar(image, ax=ax)
        ax.set_title(f"bench · layer {layer} · head {head}")
        fig.savefig(folder / f"naive_{layer}_{head}.png", dpi=dpi)
        plt.close(fig)


def floors(panels, dpi: int, subtitle: str) -> tuple[float, float, float, tuple[int, int]]:
    """Seconds to PNG-encode one image per panel: attnviz's frames with its encoder and with zlib level 3;
    colour-mapped α with Pillow."""
    from matplotlib import colormaps
    from PIL import Image

    writer = HeadImageWriter(panels, dpi=dpi, subtitle=subtitle)
    frames = [writer.render_scanlines(panel) for panel in panels]  # rendering is not timed
    start = time.perf_counter()
    for frame in frames:
        encode_scanlines(frame)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    for frame in frames:
        zlib.compress(frame, 3)
    old = time.perf_counter() - start
    height, width = len(frames[0]), (frames[0].shape[1] - 1) // 3
    T = panels[0].matrix.shape[0]
    rows = np.minimum(np.arange(height) * T // height, T - 1)
    cols = np.minimum(np.arange(width) * T // width, T - 1)
    vmax = panels[0].scale.vmax
    cmapped = [colormaps["viridis"](p.matrix / vmax, bytes=True)[..., :3][rows][:, cols] for p in panels]
    start = time.perf_counter()
    for image in cmapped:
        Image.fromarray(image).save(io.BytesIO(), format="png")
    return ours, old, time.perf_counter() - start, (height, width)


def whole_process(T: int, workers: int, dpi: int) -> None:
    """`attnviz export --from` against a naive script, each a separate process, timed start to exit."""
    folder = Path(tempfile.mkdtemp(prefix=f"benchwhole{T}_"))
    try:
        capture = synthetic_capture(T)
        path = capture.save(folder / "capture.npz")
        exe = shutil.which("attnviz", path=str(Path(sys.executable).parent)) or "attnviz"
        start = time.perf_counter()
        subprocess.run([exe, "export", "--from", str(path), "--out-dir", str(folder / "ours"), "--workers",
                        str(workers), "--dpi", str(dpi), "--norm", "linear"], check=True, stderr=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL)
        ours = time.perf_counter() - start
        images = len(list((folder / "ours").glob("layer*.png")))
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--naive-process", str(path), str(folder / "naive"),
                        "--dpi", str(dpi)], check=True)
        naive = time.perf_counter() - start
        print(f"\nwhole process, T = {T}: attnviz export --from {ours:.2f} s ({images} images + grid, data, "
              f"gallery); naive script {naive:.2f} s ({len(list((folder / 'naive').glob('*.png')))} images); "
              f"naive / attnviz = {naive / ours:.1f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def png_shape(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        return im.height, im.width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="8,64,128", help="comma-separated T values")
    parser.add_argument("--naive-heads", type=int, default=L * H,
                        help="time the naive loop on this many heads and scale to 144 (default: all 144)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--dpi", type=int, default=100)
    parser.add_argument("--whole", type=int, default=128, help="T of the whole-process row (0: skip it)")
    parser.add_argument("--naive-process", nargs=2, metavar=("CAPTURE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_process:  # the naive contender of the whole-process row, in its own process
        capture = Capture.load(args.naive_process[0])
        folder = Path(args.naive_process[1])
        folder.mkdir()
        jobs = [(layer, head) for layer in range(capture.n_layers) for head in [*range(capture.n_heads), "mean"]]
        naive_loop(capture, folder, jobs, float(capture.attentions.max()), args.dpi)
        return
    jobs = [(layer, head) for layer in range(L) for head in range(H)]
    heatmap_figure(synthetic_capture(8), 0, 0).figure.savefig(io.BytesIO(), format="png")  # warm font caches for both
    print(f"{L}x{H} = {len(jobs)} heads, dpi {args.dpi}, attnviz workers {args.workers}, "
          f"{os.cpu_count()} cores; seconds for all {len(jobs)} labelled PNGs; floors: encoding only\n")
    header = (f"{'T':>4} {'image px':>11} {'naive':>8} {'attnviz':>8} {'frames':>7} {'zlib-3':>7} {'cmapped':>8} "
              f"{'naive/attnviz':>13} {'attnviz/frames':>14} {'per-head/frame':>14}")
    print(header)
    print("-" * len(header))
    for T in [int(t) for t in args.tokens.split(",")]:
        capture = synthetic_capture(T)
        panels = attention_panels(capture, range(L), range(H), scale=ScaleChoice(norm="linear"))  # as the naive
        vmax = panels[0].scale.vmax
        folder = Path(tempfile.mkdtemp(prefix=f"bench{T}_"))
        try:
            start = time.perf_counter()
            subtitle = text_subtitle(capture)  # as `attnviz heatmap` draws it, so sizes match the naive loop's
            render_panels(panels[:H], folder, dpi=args.dpi, workers=args.workers, subtitle=subtitle)  # fixed costs
            one_layer = time.perf_counter() - start
            start = time.perf_counter()
            render_panels(panels, folder, dpi=args.dpi, workers=args.workers, subtitle=subtitle)
            ours = time.perf_counter() - start
            per_head = (ours - one_layer) / (len(panels) - H)  # the marginal cost of one more head
            shape = png_shape(folder / "layer00_head00.png")
            sample = jobs[: args.naive_heads]
            start = time.perf_counter()
            naive_loop(capture, folder, sample, vmax, args.dpi)
            naive = (time.perf_counter() - start) * len(jobs) / len(sample)
            naive_shape = png_shape(folder / "naive_0_0.png")
            assert naive_shape == shape, f"naive images are {naive_shape}, attnviz's {shape}: not comparable"
            frames, old, cmapped, floor_shape = floors(panels, args.dpi, subtitle)
            assert floor_shape == shape
            scaled = "*" if len(sample) < len(jobs) else " "
            print(f"{T:>4} {shape[1]:>5}x{shape[0]:<5} {naive:>7.2f}{scaled} {ours:>8.2f} {frames:>7.2f} {old:>7.2f} "
                  f"{cmapped:>8.2f} {naive / ours:>12.1f}x {ours / frames:>13.2f}x "
                  f"{per_head / (frames / len(panels)):>13.2f}x", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if args.naive_heads < len(jobs):
        print(f"\n* naive timed on {args.naive_heads} heads and scaled to {len(jobs)}")
    if args.whole:
        whole_process(args.whole, args.workers, args.dpi)


if __name__ == "__main__":
    main()
