"""Activation patching (`attnviz patch`): the batched path against one patched forward pass per patch in a loop,
on SmolLM2, side by side in one run; the patched logits must be equal.

    python benchmarks/bench_patch.py                     # CPU
    python benchmarks/bench_patch.py --device cuda       # the GPU row

Every head (at every position), every layer's attention output and residual stream at each position: L·H +
2·L·T patches. Each path is timed as the best of `--repeats` runs after one warm-up. The batched path grows its
batch layer by layer (engine/patching.py), so the layers below a patch run once for all the patches above them.

Then attribution patching (`patch --method atp`): every head's effect from one forward and one backward pass,
against exact patching of every head (batched, and one pass per head), with Pearson's r of the two estimates
of each head's effect (normalised as `patch` does) and the heads each ranks first.
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
    import numpy as np

    from attnviz.api.patching.prompts import Metric
    from attnviz.api.patching.activation import _star
    from attnviz.engine.patching import attributed, donor_run, every_patch, run_patches
    from attnviz.engine.starred import starred

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

    ids = [loaded.tokenizer.encode(a, add_special_tokens=False)[0] for a in (" Paris", " Rome")]
    metric = Metric(answers=(ids[0], ids[1]))
    receiver = donor_run(where, corrupt.inputs)
    gap = float(metric(donor.reading)) - float(metric(receiver.reading))
    heads = every_patch("head", where.layers, where.heads, T)

    def exact_heads():
        got["exact"] = run_patches(where, corrupt.inputs, donor, heads)

    def exact_loop():
        got["exact_loop"] = run_patches(where, corrupt.inputs, donor, heads, batched=False)

    def atp():
        got["atp"] = attributed(where, corrupt.inputs, donor, range(T), metric.tensor)

    def atp_star():
        got["atp*"] = starred(where, corrupt.inputs, donor, range(T), metric.tensor)

    t_atp, t_exact, t_exact_loop = best(atp, args.repeats), best(exact_heads, args.repeats), best(exact_loop, 1)
    t_star = best(atp_star, args.repeats)
    exact = (metric(got["exact"]) - float(metric(receiver.reading))) / gap  # (L·H,)
    H = where.heads
    print(f"\nEvery head ({len(heads)}), ' Paris' against ' Rome': exact patching against AtP (one forward and one "
          f"backward pass) and AtP* (L + 1)\n")
    print("| exact, one pass per head | exact, batched | estimate | its time | against batched | against one pass "
          "per head | Pearson r | first head: exact, estimate |")
    print("|---|---|---|---|---|---|---|---|")
    for name, seconds, estimate in (("AtP", t_atp, got["atp"][0].sum(1).numpy().ravel() / gap),
                                    ("AtP*", t_star, _star(got["atp*"], where.layers)["heads"].ravel() / gap)):
        r = float(np.corrcoef(exact, estimate)[0, 1])
        first = [f"{int(i) // H}.{int(i) % H}" for i in (np.argmax(np.abs(exact)), np.argmax(np.abs(estimate)))]
        print(f"| {t_exact_loop:.2f} s | {t_exact:.2f} s | {name} | {seconds:.3f} s | {t_exact / seconds:.1f}× | "
              f"{t_exact_loop / seconds:.1f}× | {r:.3f} | {first[0]}, {first[1]} |")


if __name__ == "__main__":
    main()
