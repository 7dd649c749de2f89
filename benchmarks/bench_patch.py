"""Activation patching (`attnviz patch`): the batched path against one patched forward pass per patch in a loop,
on SmolLM2, side by side in one run; the patched logits must be equal.

    python benchmarks/bench_patch.py                     # CPU
    python benchmarks/bench_patch.py --device cuda       # the GPU row

Every head (at every position), every layer's attention output and residual stream at each position: L·H +
2·L·T patches. Each path is timed as the best of `--repeats` runs after one warm-up. The batched path grows its
batch layer by layer (engine/patching.py), so the layers below a patch run once for all the patches above them.
"""

from __future__ import annotations

import argparse

from bench_ablation import best  # the best of `repeats` runs after a warm-up, as the ablation benchmark times

CLEAN, CORRUPT = "The capital of France is", "The capital of Italy is"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch

    import attnviz
    from attnviz.engine.ablation import site
    from attnviz.engine.forward import encode
    from attnviz.engine.patching import donor_run, every_patch, run_patches

    loaded = attnviz.load_model("smollm2", device=args.device, lm_head=True)
    where = site(loaded.model)
    clean, corrupt = encode(loaded, CLEAN), encode(loaded, CORRUPT)
    donor = donor_run(where, clean.inputs)
    T = len(clean.tokens)
    patches = [p for kind in ("head", "attention", "residual") for p in every_patch(kind, where.layers, where.heads, T)]
    got = {}

    def batched():
        got["batched"] = run_patches(where, corrupt.inputs, donor, patches)

    def loop():
        got["loop"] = run_patches(where, corrupt.inputs, donor, patches, batched=False)

    t_batched, t_loop = best(batched, args.repeats), best(loop, args.repeats)
    diff = float((got["batched"] - got["loop"]).abs().max())
    scale = float(got["loop"].abs().max())
    print(f"SmolLM2, {T} tokens, {len(patches)} patches ({where.layers} × {where.heads} heads + 2 × {where.layers} "
          f"× {T} positions), {args.device}, {torch.get_num_threads()} threads\n")
    print("| one pass per patch | batched | speed-up | max \\|Δ logit\\| (largest \\|logit\\|) |")
    print("|---|---|---|---|")
    print(f"| {t_loop:.2f} s | {t_batched:.2f} s | {t_loop / t_batched:.1f}× | {diff:.1e} ({scale:.1f}) |")


if __name__ == "__main__":
    main()
