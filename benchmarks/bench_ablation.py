"""Every head removed alone (`attnviz importance`): the batched path against one ablated forward pass per head
in a loop, on the real models, side by side in one run; the effects must be equal.

    python benchmarks/bench_ablation.py                     # MiniLM and SmolLM2 (when installed), CPU
    python benchmarks/bench_ablation.py --device cuda       # the GPU rows

Both paths compute only the removals (no gradient estimate); each is timed as the best of `--repeats` runs
after one warm-up. The batched path grows its batch layer by layer (engine/ablation/ranking.py), so the layers below a
head run once, not once per head, and the copies run together.
"""

from __future__ import annotations

import argparse
import time

TEXT = "The cat sat on the mat because it was tired, and then it slept for the rest of the afternoon."


def best(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def row(name: str, device: str, repeats: int) -> dict:
    import numpy as np

    import attnviz
    from attnviz.api import _ablation_model
    from attnviz.engine.ablation import importance
    from attnviz.engine.forward import encode

    loaded, where = _ablation_model(attnviz.load_model(name, device=device, lm_head="auto"))
    inputs = encode(loaded, TEXT).inputs
    got = {}

    def batched():
        got["batched"] = importance(where, [inputs], gradient=False)

    def loop():
        got["loop"] = importance(where, [inputs], gradient=False, batched=False)

    t_batched, t_loop = best(batched, repeats), best(loop, repeats)
    diff = float(np.abs(got["batched"].effect - got["loop"].effect).max())
    return {"model": loaded.name, "heads": where.layers * where.heads, "tokens": int(inputs["input_ids"].shape[1]),
            "loop": t_loop, "batched": t_batched, "speedup": t_loop / t_batched, "max_diff": diff,
            "largest": float(got["loop"].effect.max()), "flops": flops(loop) / flops(batched)}


def flops(run) -> float:
    """The matrix arithmetic one run does (torch's FlopCounterMode: matmuls and linear layers), so that the
    speed-up can be read against how much less arithmetic the batched path does: batching removes the layers
    below each head, not the layers above it nor the output head (the LM head's vocabulary product per copy)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return float(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="minilm,smollm2")
    args = parser.parse_args()
    from attnviz.engine import offline
    from attnviz.errors import ModelLoadError

    print("| model | heads | tokens | one pass per head | batched | speed-up | arithmetic, loop / batched | "
          "max \\|Δ effect\\| (largest effect) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        known = offline.find(name)
        if known is not None and known is not offline.MINILM:
            try:
                offline.sources(known)
            except ModelLoadError as exc:
                print(f"| {name} | not installed: {exc} |")
                continue
        r = row(name, args.device, args.repeats)
        print(f"| {r['model']} | {r['heads']} | {r['tokens']} | {r['loop']:.2f} s | {r['batched']:.2f} s | "
              f"{r['speedup']:.1f}× | {r['flops']:.2f}× | {r['max_diff']:.1e} ({r['largest']:.3f}) |", flush=True)


if __name__ == "__main__":
    main()
