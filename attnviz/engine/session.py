"""The torch side of a Run: the first forward pass of one text, which keeps its α and, where they fit, the named
points the analyses read (attnviz.engine.points), and the one more pass an analysis makes when the first kept
too little.

What the first pass keeps beside α, per layer: the attention module's input and Q, K, V recomputed from the
weights (4 × T·D), and the points blocks.N.{resid.pre, attn.out, resid.mid, mlp.out} (4 × T·D); with the
final norm's input and output, 4·(8·L + 2)·T·D bytes in float32 (`parts_bytes`). They are kept when α and they
together fit the memory budget; otherwise the run keeps α alone (streamed where the full α does not fit) and an
analysis that needs more records it then.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import torch

from attnviz.engine.forward import Encoded, alpha_array, attentions_of, encode, make_capture
from attnviz.engine.memory import attention_bytes, memory_budget
from attnviz.engine.modelfiles import WIDTH_KEYS
from attnviz.engine.models import LoadedModel, layers_and_heads
from attnviz.engine.points import Recording, every_point, record
from attnviz.errors import AttentionCheckError, UnsupportedArchitectureError


KEPT_LOGITS = 64 << 20  # bytes of the first pass's logits (T × V) a run keeps


def hidden_size(config) -> int:
    """The model's width D (of a multimodal config, its language model's), by the keys config.json spells it."""
    for part in (config, getattr(config, "text_config", None)):
        for key in WIDTH_KEYS:
            value = getattr(part, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def parts_bytes(loaded: LoadedModel, T: int) -> int:
    """What the first pass keeps beside α: 4·(8·L + 2)·T·D bytes (the module docstring)."""
    L, _ = layers_and_heads(loaded.model.config)
    return 4 * (8 * L + 2) * T * hidden_size(loaded.model.config)


def first_pass(loaded: LoadedModel, text: str, *, truncate: bool, parts: bool
               ) -> tuple[Encoded, Any, Recording | None]:
    """(the encoded text, its Capture, the Recording of every point or None): one forward pass. None where the
    parts were not asked for, do not fit beside α, or the family has no adapter to recompute its Q, K, V; the
    capture is then made as attnviz.capture makes it (see attnviz.engine.capturing.run_capture)."""
    encoded = encode(loaded, text, truncate=truncate)
    T = len(encoded.token_ids)
    budget = loaded.memory_budget or memory_budget()
    if not parts or attention_bytes(loaded, T) + parts_bytes(loaded, T) > budget:
        return encoded, None, None
    try:
        names = every_point(loaded.model)
        recording = record(loaded.model, encoded.inputs, names)
    except UnsupportedArchitectureError:
        return encoded, None, None
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        from attnviz.engine.models import first_line

        raise AttentionCheckError(f"{loaded.name} could not run on this input: {first_line(exc)}") from None
    output = recording.run.output
    logits = getattr(output, "logits", None)
    attentions = list(attentions_of(output, loaded.model, loaded.name))
    recording.run.output = output = None
    capture = make_capture(loaded, encoded, alpha_array(attentions, T), text)
    # α is held once, in the capture: the recording's output keeps views of it and the logits
    with warnings.catch_warnings():  # read-only views: nothing writes to them
        warnings.simplefilter("ignore", UserWarning)
        views = tuple(torch.from_numpy(capture.attentions[n][None]) for n in range(capture.n_layers))
    if logits is not None and logits.numel() * logits.element_size() > KEPT_LOGITS:
        logits = None  # logit attribution applies the head to the final norm's output at its one position
    recording.run.output = SimpleNamespace(attentions=views, logits=logits)
    return encoded, capture, recording


def more_points(loaded: LoadedModel, encoded: Encoded, names: list[str]) -> Recording:
    """One more pass (a Run whose first pass kept α alone), recording `names` and, where they fit the memory
    budget beside α, every point: so that a Run makes at most this one more pass for what the analyses read."""
    T = len(encoded.token_ids)
    budget = loaded.memory_budget or memory_budget()
    if attention_bytes(loaded, T) + parts_bytes(loaded, T) <= budget:
        names = sorted({*names, *every_point(loaded.model)})
    return record(loaded.model, encoded.inputs, names)
