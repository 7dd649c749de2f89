"""A Capture from a forward pass the user ran themselves (the essays' own code): the model's outputs, the
tokenizer's inputs and the tokenizer. On the model side because it asks the tokenizer how to read the tokens."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from attnviz.data.capture import Capture
from attnviz.data.npzformat import MAX_ATTENTION_BYTES, limit
from attnviz.errors import CaptureFormatError, InputError
from attnviz.base.tokens import describe_tokens


def capture_from_outputs(outputs, inputs, tokenizer, *, text: str | None = None,
                         model: str | None = None) -> Capture:
    """The Capture of the essays' own code: `out = model(**inputs, output_attentions=True)`, then
    `attnviz.from_outputs(out, inputs, tokenizer)`. `outputs` holds `.attentions` (one (1, H, T, T) tensor
    or array per layer), `inputs` the tokenizer's `input_ids` of one unpadded text; each is checked like
    a capture file (shapes, the α limit, rows sum to 1). Imports neither torch nor transformers itself."""
    if not all(callable(getattr(tokenizer, name, None)) for name in ("decode", "get_special_tokens_mask")):
        raise InputError("from_outputs needs the tokenizer that made the inputs: "
                         "attnviz.from_outputs(outputs, inputs, tokenizer)", "tokenizer")
    attentions = getattr(outputs, "attentions", None)
    if attentions is None and isinstance(outputs, dict):
        attentions = outputs.get("attentions")
    if isinstance(attentions, (str, bytes)) or not isinstance(attentions, (list, tuple)) or not attentions \
            or any(a is None for a in attentions):
        raise CaptureFormatError("these outputs hold no attention weights: run the model with "
                                 "output_attentions=True, loaded with attn_implementation='eager'")
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs are what the tokenizer returned (a mapping with input_ids), not a "
                         f"{type(inputs).__name__}", "inputs")
    ids = _plain(inputs["input_ids"] if "input_ids" in inputs else None, "input_ids")
    if ids is None or ids.ndim != 2 or ids.shape[0] != 1 or ids.dtype.kind not in "iu":
        raise CaptureFormatError("from_outputs takes the inputs of one text (input_ids: whole numbers, of shape "
                                 "(1, T))")
    vocabulary = len(tokenizer) if callable(getattr(tokenizer, "__len__", None)) else None
    outside = [int(i) for i in ids[0] if i < 0 or (vocabulary is not None and i >= vocabulary)]
    if outside:
        known = f"(0..{vocabulary - 1})" if vocabulary else "(token ids are not negative)"
        raise CaptureFormatError(f"input_ids hold {outside[0]}, outside the tokenizer's vocabulary {known}: these "
                                 f"inputs were not made by this tokenizer")
    mask = _plain(inputs["attention_mask"], "attention_mask") if "attention_mask" in inputs else None
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
        values = _plain(layer, f"layer {n} attention")
        if values.dtype.kind not in "fiu":
            raise CaptureFormatError(f"layer {n} attention holds {values.dtype} values, not numbers")
        layers.append(np.asarray(values, np.float32)[0])
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


def _plain(value, what: str = "a value"):
    """A tensor or array as a numpy array (torch tensors through .detach().cpu(), without importing torch);
    one that holds no values here (the meta device) or no numbers is a CaptureFormatError naming `what`."""
    if value is None:
        return None
    try:
        if hasattr(value, "detach"):
            value = value.detach().float().cpu().numpy() if getattr(value, "is_floating_point", lambda: False)() \
                else value.detach().cpu().numpy()
        return np.asarray(value)
    except (NotImplementedError, RuntimeError, TypeError, ValueError) as exc:
        device = getattr(getattr(value, "device", None), "type", None)
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        why = "it is on the 'meta' device, which holds no values" if device == "meta" else said
        raise CaptureFormatError(f"{what} cannot be read: {why}") from None


# --- limits on what a capture file may hold (see docs/errors.md) --------------------------------
