"""Export speed: attnviz's per-head PNG export against the naive matplotlib loop and the encode-only floor,
measured side by side in one run.

    python benchmarks/bench_export.py                 # T = 8, 64, 128; 12 layers x 12 heads
    python benchmarks/bench_export.py --naive-heads 24  # time the naive loop on 24 heads, scale to 144

For each T it builds a synthetic capture (fixed seed) and writes the same 144 labelled heatmaps
(tokens on both axes, colorbar, title; same figure size and dpi) three ways:
  naive   a new pyplot figure per head: imshow, tick labels, colorbar, title, savefig, close
  attnviz attnviz.export.render_heads (layout drawn once, α swapped in, workers = cores)
  floor   only PNG-encoding, in one process, 144 images of the same pixel size:
            frames   attnviz's own finished frames, with attnviz's encoder (the floor for these very files)
            cmapped  colour-mapped α filling the whole image, with Pillow at its default level
                     (the issue's "encode-only" floor; full-image heatmaps compress slower than labelled frames)
Both contenders run warm: one untimed figure is drawn first, so neither pays matplotlib's font loading.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from attnviz.capture import Capture
from attnviz.export import HeadImageWriter, Job, encode_png, render_heads
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = heatmap_figure(capture, 0, 0, vmax=vmax)  # only to use the same size and font size
    size = reference.get_size_inches()
    fontsize = LabelLayout.for_tokens(capture.n_tokens).fontsize
    T = capture.n_tokens
    for job in jobs:
        fig, ax = plt.subplots(figsize=size)
        image = ax.imshow(capture.attentions[job.layer, job.head], cmap="viridis", vmin=0, vmax=vmax)
        ax.set_xticks(range(T))
        ax.set_xticklabels(capture.tokens, rotation=90, fontsize=fontsize)
        ax.set_yticks(range(T))
        ax.set_yticklabels(capture.tokens, fontsize=fontsize)
        fig.colorbar(image, ax=ax)
        ax.set_title(f"bench · layer {job.layer} · head {job.head}")
        fig.savefig(folder / f"naive_{job.layer}_{job.head}.png", dpi=dpi)
        plt.close(fig)


def floors(capture: Capture, jobs, vmax: float, dpi: int) -> tuple[float, float, tuple[int, int]]:
    """Seconds to PNG-encode one image per job: attnviz's frames with its encoder; colour-mapped α with Pillow."""
    from matplotlib import colormaps
    from PIL import Image

    writer = HeadImageWriter(capture, vmaxes={"head": vmax}, dpi=dpi)
    frames = [writer.render(job) for job in jobs]  # rendering is not timed
    start = time.perf_counter()
    for frame in frames:
        encode_png(frame)
    ours = time.perf_counter() - start
    height, width = frames[0].shape[:2]
    T = capture.n_tokens
    rows = np.minimum(np.arange(height) * T // height, T - 1)
    cols = np.minimum(np.arange(width) * T // width, T - 1)
    cmapped = [colormaps["viridis"](capture.attentions[j.layer, j.head] / vmax, bytes=True)[..., :3][rows][:, cols]
               for j in jobs]
    start = time.perf_counter()
    for image in cmapped:
        Image.fromarray(image).save(io.BytesIO(), format="png")
    return ours, time.perf_counter() - start, (height, width)


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
    args = parser.parse_args()
    jobs = [Job(layer, head) for layer in range(L) for head in range(H)]
    heatmap_figure(synthetic_capture(8), 0, 0).savefig(io.BytesIO(), format="png")  # warm font caches for both
    print(f"{L}x{H} = {len(jobs)} heads, dpi {args.dpi}, attnviz workers {args.workers}, "
          f"{os.cpu_count()} cores; seconds for all {len(jobs)} labelled PNGs; floors: encoding only\n")
    header = (f"{'T':>4} {'image px':>11} {'naive':>8} {'attnviz':>8} {'frames':>7} {'cmapped':>8} "
              f"{'naive/attnviz':>13} {'attnviz/frames':>14} {'attnviz/cmapped':>15}")
    print(header)
    print("-" * len(header))
    for T in [int(t) for t in args.tokens.split(",")]:
        capture = synthetic_capture(T)
        vmax = float(capture.attentions.max())
        folder = Path(tempfile.mkdtemp(prefix=f"bench{T}_"))
        try:
            start = time.perf_counter()
            render_heads(capture, jobs, folder, dpi=args.dpi, workers=args.workers)
            ours = time.perf_counter() - start
            shape = png_shape(folder / "layer00_head00.png")
            sample = jobs[: args.naive_heads]
            start = time.perf_counter()
            naive_loop(capture, folder, sample, vmax, args.dpi)
            naive = (time.perf_counter() - start) * len(jobs) / len(sample)
            naive_shape = png_shape(folder / "naive_0_0.png")
            assert naive_shape == shape, f"naive images are {naive_shape}, attnviz's {shape}: not comparable"
            frames, cmapped, floor_shape = floors(capture, jobs, vmax, args.dpi)
            assert floor_shape == shape
            scaled = "*" if len(sample) < len(jobs) else " "
            print(f"{T:>4} {shape[1]:>5}x{shape[0]:<5} {naive:>7.2f}{scaled} {ours:>8.2f} {frames:>7.2f} "
                  f"{cmapped:>8.2f} {naive / ours:>12.1f}x {ours / frames:>13.2f}x {ours / cmapped:>14.2f}x",
                  flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if args.naive_heads < len(jobs):
        print(f"\n* naive timed on {args.naive_heads} heads and scaled to {len(jobs)}")


if __name__ == "__main__":
    main()
