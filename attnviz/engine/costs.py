"""What attention costs as the input grows, measured: the full path (the model's α kept, L·H·T² weights, and the
head statistics computed from it) against the streamed path (α a block of query rows at a time, folded into
the same statistics and dropped, as FlashAttention tiles it), at growing T.

Each run's time is wall-clock; its memory is the peak resident memory above what the process held before the
run (Linux: the high-water mark reset through /proc/self/clear_refs before each run; elsewhere unmeasured), or on
a GPU the peak allocated by torch. The input is a text repeated and cut to exactly T tokens.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from attnviz.engine.families import can

from attnviz.engine.forward import encode, make_capture, model_attentions

from attnviz.engine.models import layers_and_heads

from attnviz.engine.memory import attention_bytes, memory_budget

from attnviz.engine.lean import give_back_memory
from attnviz.engine.stream import streamed_capture

from attnviz.metrics import head_values

from attnviz.base.sizes import size_text

TEXT = ("Attention lets every token look at every other token, and the cost of looking grows with the square of "
        "the length. ")


@dataclass
class CostRow:
    """One length: seconds and peak bytes of each path (None: not run — over the memory budget, or a family
    that does not stream), and the bytes the full α alone takes."""

    T: int
    full_seconds: float | None
    full_bytes: int | None
    stream_seconds: float | None
    stream_bytes: int | None
    alpha_bytes: int
    full_note: str = ""


def _status(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class PeakMemory:
    """Peak memory of a block above what was held when it began: torch's allocator on CUDA, else the resident
    set's high-water mark (reset first); None where neither can be read."""

    def __init__(self, device: str):
        self.device = device
        self.peak: int | None = None
        self.base: int | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()

        give_back_memory()
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = int(torch.cuda.memory_allocated())
            return self
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
                handle.write("5")  # resets VmHWM to the current resident set
            self.base = _status("VmRSS")
        except OSError:
            self.base = None
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated() - (self.base or 0))
            return
        high = _status("VmHWM")
        self.peak = None if self.base is None or high is None else max(high - self.base, 0)


def input_of(loaded, T: int):
    """An Encoded input of exactly T tokens: TEXT repeated, tokenised once, cut to T."""

    text = (TEXT * (T // 10 + 2)).strip()  # TEXT is over 10 tokens in every tokenizer tested
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cut to the model's maximum positions: fine, it is cut to T below
        encoded = encode(loaded, text)
    if len(encoded.token_ids) < T:
        raise ValueError(f"only {len(encoded.token_ids)} tokens for T = {T}")
    inputs = {k: v[:, :T] for k, v in encoded.inputs.items()}
    return replace(encoded, inputs=inputs, tokens=encoded.tokens[:T], token_ids=encoded.token_ids[:T],
                   special=encoded.special[:T], special_kind=encoded.special_kind[:T], subword=encoded.subword[:T],
                   offsets=encoded.offsets[:T] if encoded.offsets else None), text


def _full(loaded, encoded, text: str) -> None:
    capture = make_capture(loaded, encoded, model_attentions(loaded, encoded), text)
    head_values(capture)


def _streamed(loaded, encoded, text: str) -> None:
    streamed_capture(loaded, encoded, text, rollout_tokens=[], window=None, pool=1)


def measure(loaded, lengths: Sequence[int], *, repeats: int = 1, on_step: Callable[[int], None] | None = None
            ) -> list[CostRow]:
    """Both paths at each length (the fastest of `repeats` runs, the largest peak), shortest first."""

    budget = loaded.memory_budget or memory_budget()
    streams = can(loaded, "stream")
    device = "cuda" if str(loaded.device).startswith("cuda") else "cpu"
    L, H = layers_and_heads(loaded.model.config)
    rows = []
    warm, warm_text = input_of(loaded, min(lengths))
    if attention_bytes(loaded, min(lengths)) <= budget:  # the first run of each path pays for set-up: not measured
        _full(loaded, warm, warm_text)
    if streams:
        _streamed(loaded, warm, warm_text)
    for T in sorted(lengths):
        encoded, text = input_of(loaded, T)
        need = attention_bytes(loaded, T)
        alpha_bytes = L * H * T * T * 4
        results: dict[str, tuple[float | None, int | None]] = {}
        for name, run, allowed in (("full", _full, need <= budget), ("stream", _streamed, streams)):
            if not allowed:
                results[name] = (None, None)
                continue
            seconds, peaks = float("inf"), []
            for _ in range(repeats):
                with PeakMemory(device) as memory:
                    start = time.perf_counter()
                    run(loaded, encoded, text)
                    seconds = min(seconds, time.perf_counter() - start)
                peaks.append(memory.peak)
            known = [p for p in peaks if p is not None]
            results[name] = (seconds, max(known) if known else None)  # None: memory cannot be read here
            if on_step is not None:
                on_step(1)
        note = "" if need <= budget else f"needs {size_text(need)}, over the budget of {size_text(budget)}"
        rows.append(CostRow(T, *results["full"], *results["stream"], alpha_bytes, note))
    return rows
