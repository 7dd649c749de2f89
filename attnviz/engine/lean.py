"""The long path: analyses that need no α run on the model's own memory-efficient attention, forward and backward.

The full path asks the model for α (eager attention), and a backward pass through eager attention keeps every
layer's softmax: L·H·T² numbers, 72 GB for SmolLM2 at 8,192 tokens. What patching, AtP and the gradient methods
read is not α but what the heads write (z, the output projection's input), the stream, and their gradients —
L·T·D numbers. `lean(model, blocks)` runs the model for the length of a `with` block:

- through its own scaled-dot-product attention (transformers' "sdpa": PyTorch's fused kernels, flash attention
  on CPU and GPU, which never hold a T × T matrix per head, forward or backward), put back as it was after;
- with each block recomputed in the backward pass instead of keeping its activations (activation
  checkpointing, PyTorch's non-reentrant `checkpoint`: the graph stays whole, so a gradient can still be asked
  of any tensor inside a block, a head's z included; only what a block saved for its backward pass is dropped
  and made again when the backward pass reaches it), where `grad` is asked;
- where the budget allows, with a recomputed block keeping its fused attention's output and log-sum-exp (T·(H·d
  + H) numbers, `attention_kept_bytes`; PyTorch's selective checkpointing): its recomputation then runs the
  block's projections and MLP but not the attention, which at long inputs is most of a block's forward pass
  (at 8,192 tokens on SmolLM2 4.6 of its 6.8 TFLOP). The attention's backward pass reads exactly what the
  recomputation would have made again, so the gradient is the same.

What it holds: the weights, each block's input (T·D) and what the analysis keeps (each layer's z and its
gradient: T·D each), and one block's activations at a time (`block_activation_bytes`); each analysis's
check names its own parts. What the budget holds beyond them goes first to the recomputed blocks' attention
outputs (the most recomputation saved per byte), then to whole blocks' activations (`recomputing`).

On glibc the long path also gives freed heap back to the system at every block, forward and backward
(`malloc_trim`, `give_back_memory`): glibc serves tensors of up to 32 MiB from its heap once large blocks have
been freed, and there the pass's long-lived tensors (each block's input, z) pin the transients freed between
them, so that the resident set would grow by a block's transients at every layer. Trimmed at each block, what a
block freed is returned before the next one runs, and the tensors within a block still reuse the heap's pages
(a fixed mmap threshold of 1 MiB, used before, bounded the memory as well but mapped every tensor of 1 MiB or
more afresh: at 8,192 tokens on SmolLM2, AtP took 20.5 M page faults against 11.2–11.8 M trimmed, and 10–15% more
time).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from attnviz.engine.hooks import Hook, hooked, on_gradient
from attnviz.errors import UnsupportedArchitectureError

IMPLEMENTATION = "sdpa"  # transformers' name for the model's own memory-efficient attention


def block_activation_bytes(config: Any, T: int) -> int:
    """What one block holds while its backward pass runs, float32: its input and output, the norms' outputs,
    Q, K, V and the attention output (about 8·T·D), and the MLP's hidden layer (about 4·T·I: gate, up, their
    product, the activation)."""
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    inner = int(getattr(config, "intermediate_size", 0) or getattr(config, "n_inner", 0) or 4 * D)
    return 4 * T * (8 * D + 4 * inner)


def attention_kept_bytes(config: Any, T: int) -> int:
    """What one recomputed block keeps so that its recomputation skips the attention, float32: the fused
    attention's output (T × H·d) and its log-sum-exp (H × T)."""
    H = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0) or 16)
    D = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    d = int(getattr(config, "head_dim", 0) or 0) or D // max(H, 1)
    return 4 * T * H * (d + 1)


def recomputing(layers: int, spare: int, block: int, kept: int) -> tuple[int, int]:
    """(recomputed, keeping): how many of `layers` blocks (the first ones) the backward pass recomputes, and of
    those how many (the first ones) keep their attention's output, within `spare` bytes beyond what the analysis
    holds anyway; `block` is what a block keeps for its backward pass, `kept` what a block keeping its attention
    holds. The attention outputs come first: per byte they save the most recomputation (a block's attention is
    most of its forward pass at long inputs, at a few percent of its activations' bytes); then whole blocks."""
    spare = max(0, spare)
    kept = max(1, min(kept, block))
    keeping = min(layers, spare // kept)
    if keeping < layers:
        return layers, keeping
    whole = min(layers, (spare - layers * kept) // max(1, block - kept))
    return layers - whole, layers - whole


@functools.cache
def _fused_attention() -> frozenset:
    """PyTorch's fused attention kernels (CPU flash, CUDA flash, memory-efficient, cuDNN): each returns the
    output and a log-sum-exp of T numbers a head, never a T × T matrix (the math fallback, which makes α, is
    not among them)."""
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    return frozenset(op.default for op in (getattr(torch.ops.aten, name, None) for name in names) if op is not None)


def _keep_attention(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _fused_attention() else CheckpointPolicy.PREFER_RECOMPUTE


def _attention_kept() -> Any:
    """The contexts of a checkpoint that keeps its fused attention's outputs and recomputes the rest."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_keep_attention)


def give_back_memory() -> None:
    """Return freed heap to the system (glibc keeps it per thread arena; torch's threads allocate in
    several), so that memory stays flat over layers instead of creeping up. A no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def model_blocks(model) -> torch.nn.ModuleList:
    """The model's blocks, in layer order (a family without an adapter: UnsupportedArchitectureError)."""
    from attnviz.engine.scratch.adapters import adapter_for, layer_blocks

    base = getattr(model, "base_model", model)
    return layer_blocks(base, adapter_for(base).modules(base))


def _every_block(model) -> list:
    """The model's blocks (none found: [])."""
    try:
        return list(model_blocks(model))
    except UnsupportedArchitectureError:
        return []


def _giving_back(module, args, kwargs) -> None:
    """Before a block runs: the heap freed so far given back; and where its input takes a gradient, again when
    the backward pass has gone through the block (the gradient of its input is made last)."""
    give_back_memory()
    hidden = args[0] if args else next((kwargs[k] for k in ("hidden_states", "x", "hidden_state") if k in kwargs),
                                       None)
    if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
        on_gradient(hidden, lambda gradient: give_back_memory())


def _switch(model, implementation: str) -> None:
    try:
        model.set_attn_implementation(implementation)
    except (ValueError, ImportError, AttributeError, KeyError, NotImplementedError) as exc:
        kind = getattr(model.config, "model_type", None) or type(model).__name__
        raise UnsupportedArchitectureError(f"{kind} models do not run their attention through PyTorch's "
                                           f"memory-efficient kernels here ({str(exc).splitlines()[0][:160]}), so "
                                           f"a long input cannot run without α; shorten it") from None


def _put_back(swapped: list[tuple[Any, Any]]) -> None:
    """Each block's forward method as it was: the one set on the instance, else the class's."""
    for block, own in reversed(swapped):
        if own is None:
            del block.__dict__["forward"]
        else:
            block.forward = own


@contextlib.contextmanager
def lean(model, blocks: Sequence[Any] = (), *, grad: bool = False, keeping: int = 0) -> Iterator[None]:
    """`model` on its own memory-efficient attention for the block, and with `grad`, each of `blocks` recomputed
    in the backward pass, the first `keeping` of them keeping their fused attention's outputs (not recomputed);
    the attention implementation and the blocks' forward methods put back as they were, however the block
    ends."""
    before = getattr(model.config, "_attn_implementation", None) or "eager"
    _switch(model, IMPLEMENTATION)
    swapped: list[tuple[Any, Any]] = []
    try:
        with hooked([Hook(block, "pre_kwargs", _giving_back) for block in _every_block(model) or blocks]):
            if grad:
                for n, block in enumerate(blocks):
                    own = block.__dict__.get("forward")  # a forward set on the instance (rare), else the class's
                    swapped.append((block, own))
                    selective: dict[str, Any] = {"context_fn": _attention_kept} if n < keeping else {}
                    block.forward = functools.partial(torch.utils.checkpoint.checkpoint, own or block.forward,
                                                      use_reentrant=False, **selective)
            yield
    finally:
        _put_back(swapped)
        _switch(model, before)


@contextlib.contextmanager
def replayed(blocks: Sequence[Any], output: Any) -> Iterator[None]:
    """Each of `blocks` returns `output` (what the last of them returned in an earlier run) instead of running,
    for the length of a `with` block: a run that starts higher up skips the blocks below, whose result it has.
    The forward methods are put back as they were, however the block ends. (Where the long path swaps forward
    methods, as `lean` does for checkpointing; no hook can skip a module.)"""
    swapped: list[tuple[Any, Any]] = []
    try:
        for block in blocks:
            swapped.append((block, block.__dict__.get("forward")))
            block.forward = lambda *args, **kwargs: output
        yield
    finally:
        _put_back(swapped)

