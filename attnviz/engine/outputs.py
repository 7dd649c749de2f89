"""A Capture from a forward pass the user ran themselves (the essays' own code): the model's outputs, the
tokenizer's inputs and the tokenizer. On the model side because it asks the tokenizer how to read the tokens."""

from __future__ import annotations

import numpy as np

from attnviz.data.capture import Capture
from attnviz.data.npzformat import MAX_ATTENTION_BYTES, limit
from attnviz.errors import CaptureFormatError
from attnviz.tokens import describe_tokens


def capture_from_outputs(outputs, inputs, tokenizer, *, text: str | None = None,
                         model: str | None = None) -> Capture:
    """The Capture of the essays' own code: `out = model(**inputs, output_attentions=True)`, then
    `attnviz.from_outputs(out, inputs, tokenizer)`. `outputs` holds `.attentions` (one (1, H, T, T) tensor
    or array per layer), `inputs` the tokenizer's `input_ids` of one unpadded text; each is checked like
    a capture file (shapes, the α limit, rows sum to 1). Imports neither torch nor transformers itself."""
    attentions = getattr(outputs, "attentions", None)
    if attentions is None and isinstance(outputs, dict):
        attentions = outputs.get("attentions")
    if not attentions or any(a is None for a in attentions):
        raise CaptureFormatError("these outputs hold no attention weights: run the model with "
                                 "output_attentions=True, loaded with attn_implementation='eager'")
    ids = _plain(inputs["input_ids"] if "input_ids" in inputs else None)
    if ids is None or ids.ndim != 2 or ids.shape[0] != 1:
        raise CaptureFormatError("from_outputs takes the inputs of one text (input_ids of shape (1, T))")
    mask = _plain(inputs["attention_mask"]) if "attention_mask" in inputs else None
    if mask is not None and not np.all(mask == 1):
        raise CaptureFormatError("the inputs are padded; give one unpadded text")
    T = ids.shape[1]
    most = limit("ATTNVIZ_MAX_CAPTURE_BYTES", MAX_ATTENTION_BYTES)
    layers: list[np.ndarray] = []
    for n, layer in enumerate(attentions):
        shape = tuple(getattr(layer, "shape", ()))
        if len(shape) != 4 or shape[0] != 1 or shape[2:] != (T, T) or (layers and shape[1] != layers[0].shape[0]):
            raise CaptureFormatError(f"layer {n} attention has shape {shape}, expected (1, H, {T}, {T})")
        if 4 * shape[1] * T * T * (len(attentions)) > most:
            raise CaptureFormatError(f"these attentions would take more than {most:,} bytes (the capture "
                                     f"limit, ATTNVIZ_MAX_CAPTURE_BYTES)")
        layers.append(np.asarray(_plain(layer), np.float32)[0])
    token_ids = [int(i) for i in ids[0]]
    shown_text = text if text is not None else str(tokenizer.decode(token_ids, skip_special_tokens=True))
    added = tokenizer.get_special_tokens_mask(token_ids, already_has_special_tokens=True)
    described = describe_tokens(tokenizer, shown_text, token_ids, added, [None] * T, None)
    alpha = np.stack(layers)  # (L, H, T, T)
    causal = bool(T > 1 and np.abs(np.triu(alpha, k=1)).max() < 1e-6)
    meta = {"model": model or "a model's own outputs", "causal": causal, "text": shown_text,
            "source": "outputs"}
    half = any("16" in str(getattr(a, "dtype", "")) for a in attentions)  # float16 / bfloat16 runs
    return Capture(attentions=alpha, tokens=tuple(described.tokens), token_ids=np.asarray(token_ids),
               special=np.asarray(described.special, bool), special_kind=tuple(described.kinds),
               subword=np.asarray(described.subword, bool), meta=meta).validate(atol=2e-2 if half else 1e-4)


def _plain(value):
    """A tensor or array as a numpy array (torch tensors through .detach().cpu(), without importing torch)."""
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().numpy() if getattr(value, "is_floating_point", lambda: False)() \
            else value.detach().cpu().numpy()
    return np.asarray(value)


# --- limits on what a capture file may hold (see docs/errors.md) --------------------------------
