"""Text to Capture on the full path: tokenise, run the model once with output_attentions, check what it
returns, wrap it in a validated Capture.

    text --tokenizer--> input_ids (1, T) --model(eager, output_attentions)--> L x (1, H, T, T) --> Capture
"""

from __future__ import annotations


import numpy as np

from attnviz._version import __version__
from attnviz.data.capture import Capture
from attnviz.engine.encoded import Encoded
from attnviz.engine.families import has_sinks, layer_windows
from attnviz.engine.models import LoadedModel, first_line, forward_args
from attnviz.engine.memory import check_memory
from attnviz.errors import AttentionCheckError, InputError, ModelLoadError, arg, warn
from attnviz.base.text import check_text
from attnviz.base.tokens import describe_tokens, special_ids

def encode(loaded: LoadedModel, text: str, *, truncate: bool = True, target: bool = False) -> Encoded:
    """Tokenise `text` for `loaded`; truncate (with a warning) past the model's maximum positions.
    `target`: as an encoder-decoder model's target text (Marian has a vocabulary of its own for it)."""
    check_text(text)
    if getattr(text, "is_picture", False):
        from attnviz.engine.pictures import encode_picture

        return encode_picture(loaded, text)  # type: ignore[arg-type]
    if getattr(loaded, "vision", False):
        raise InputError(f"{loaded.name} is a vision model: it reads a picture, not text (give "
                         f"{arg('image', 'FILE')})", "image")
    if getattr(loaded, "speech", False) and not target:
        raise InputError(f"{loaded.name} is a speech model: it reads a sound, not text (give "
                         f"{arg('audio', 'FILE')})", "audio")
    tok = loaded.tokenizer
    fast = bool(getattr(tok, "is_fast", False))

    def _call(**extra):
        given = {"text_target": text} if target else {"text": text}
        try:
            return tok(**given, return_tensors="pt", return_special_tokens_mask=True,
                       return_offsets_mapping=fast, **extra)
        except Exception as exc:  # a foreign model folder's tokenizer fails in its own ways (bare Exception too)
            raise ModelLoadError(f"{loaded.name}'s tokenizer cannot read this text: {first_line(exc)}") from None

    enc = _call(truncation=False)
    n = int(enc["input_ids"].shape[1])
    limit = loaded.max_positions
    dropped = 0
    if limit and n > limit:
        if not truncate:
            raise InputError(f"the text is {n} tokens long but {loaded.name} takes at most {limit}; "
                             f"shorten it, or drop {arg('no_truncate')} to cut it")
        enc = _call(truncation=True, max_length=limit)
        dropped = n - int(enc["input_ids"].shape[1])
        warn(f"the text is {n} tokens long; {loaded.name} takes at most {limit}, "
                      f"so the last {dropped} tokens were dropped")
    ids = enc["input_ids"][0].tolist()
    word_ids = enc.word_ids(0) if fast else None
    offsets = enc["offset_mapping"][0].tolist() if fast else [None] * len(ids)
    described = describe_tokens(tok, text, ids, enc["special_tokens_mask"][0].tolist(), offsets, word_ids)
    tokens = _label_unknown(loaded, text, described.tokens, ids, described.special, offsets, word_ids)

    inputs = {k: v for k, v in enc.items() if k in forward_args(loaded.model)}
    inputs = {k: v.to(loaded.device) for k, v in inputs.items()}
    spans = [(int(o[0]), int(o[1])) if o and o[1] > o[0] and not s else (-1, -1)
             for o, s in zip(offsets, described.special)]
    return Encoded(inputs=inputs, tokens=tokens, token_ids=ids, special=described.special,
                   special_kind=described.kinds, offsets=spans, subword=described.subword, dropped=dropped)


UNKNOWN_HINT = f"{arg('model', 'multilingual')} reads them (about 100 languages, offline)"


def _label_unknown(loaded: LoadedModel, text: str, tokens: list[str], ids: list[int], special: list[bool],
                   offsets: list, word_ids: list | None) -> list[str]:
    """Each unknown-word token labelled with the text it replaced ([UNK:먹었다]), and one warning saying how
    many words the model cannot read."""
    unk = getattr(loaded.tokenizer, "unk_token_id", None)
    positions = [n for n, (i, s) in enumerate(zip(ids, special)) if i == unk and not s]
    if unk is None or not positions:
        return tokens
    out = list(tokens)
    lost_text = []
    for n in positions:
        span = offsets[n]
        source = text[span[0]:span[1]] if span and span[1] > span[0] else ""
        if source:
            base = out[n][:-1] if out[n].endswith("]") else out[n] + "["
            out[n] = f"{base}:{source}]"
            lost_text.append(source)
    if word_ids is not None:
        words = {w for w, s in zip(word_ids, special) if w is not None and not s}
        lost = {word_ids[n] for n in positions if word_ids[n] is not None}
        share = f"{len(lost)} of {len(words)} words"
    else:
        share = f"{len(positions)} of {sum(1 for s in special if not s)} tokens"
    examples = ", ".join(dict.fromkeys(lost_text[:5]))
    warn(f"{share} became {loaded.tokenizer.unk_token} ({examples}): {loaded.name} does not know them, so "
                  f"they carry no meaning here; {UNKNOWN_HINT}")
    return out


def model_attentions(loaded: LoadedModel, encoded: Encoded) -> np.ndarray:
    """Run the model and return its α, checked, as float32 numpy. (L, H, T, T)"""
    import torch

    check_memory(loaded, len(encoded.token_ids), streams=True)
    try:
        with torch.inference_mode():
            out = loaded.model(**encoded.inputs, output_attentions=True)
    except (ValueError, TypeError, RuntimeError, IndexError) as exc:
        raise AttentionCheckError(f"{loaded.name} could not run on this input: {first_line(exc)}") from None
    attentions = list(attentions_of(out, loaded.model, loaded.name))
    del out
    return alpha_array(attentions, len(encoded.token_ids))


def alpha_array(attentions: list, T: int) -> np.ndarray:
    """A forward pass's α, one tensor per layer, as checked float32 numpy (L, H, T, T); the list's entries are
    dropped as they are copied, so that where it holds the only reference one copy of α is held at most."""
    for i, layer in enumerate(attentions):
        if layer.ndim != 4 or layer.shape[0] != 1 or tuple(layer.shape[2:]) != (T, T):
            raise AttentionCheckError(f"layer {i} attention has shape {tuple(layer.shape)}, expected (1, H, {T}, {T})")
    result = np.empty((len(attentions), *attentions[0].shape[1:]), np.float32)  # (L, H, T, T)
    for i in range(len(attentions)):  # one layer at a time, each freed once copied: one copy of α at most
        result[i] = attentions[i][0].float().cpu().numpy()
        attentions[i] = None
    return result


def attentions_of(output, model, name: str) -> tuple:
    """The per-layer attention weights of a forward pass with output_attentions=True, or AttentionCheckError
    when there are none (SDPA and flash attention return an empty tuple or None)."""
    attentions = getattr(output, "attentions", None)
    impl = getattr(model.config, "_attn_implementation", "?")
    if not attentions or any(layer is None for layer in attentions):
        raise AttentionCheckError(f"{name} returned no attention weights (attention implementation {impl!r}); "
                                  f"attnviz needs a model loaded with attn_implementation='eager'")
    return _one_per_layer(tuple(attentions), declared_layers(model), name)


def declared_layers(model) -> int | None:
    """How many layers the model's config says it has (its language model's, in a multimodal config)."""
    config = getattr(model, "config", None)
    for part in (config, getattr(config, "text_config", None)):
        value = getattr(part, "num_hidden_layers", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _one_per_layer(attentions: tuple, layers: int | None, name: str) -> tuple:
    """One attention tensor per layer the config declares. A model another library has rewired (hooks that
    record a layer's weights again, as TransformerLens's TransformerBridge does) can return each layer's
    tensor more than once: then each is taken once, with a warning saying so, where the repeats are the very
    same tensors; any other count is refused."""
    if layers is None or len(attentions) == layers:
        return attentions
    unique = tuple({id(t): t for t in attentions}.values())  # the same tensor object, returned again
    if len(unique) != layers and len(attentions) % layers == 0:
        k = len(attentions) // layers
        groups = [attentions[i * k:(i + 1) * k] for i in range(layers)]  # each layer's repeats, side by side
        if all(g[0].shape == t.shape and bool((g[0] == t).all()) for g in groups for t in g[1:]):
            unique = tuple(g[0] for g in groups)
    if len(unique) == layers:
        warn(f"{name} returned {len(attentions)} attention tensors for its {layers} layers, each layer's more than "
             f"once (another library's hooks on the model?): each layer is taken once")
        return unique
    raise AttentionCheckError(f"{name} returned {len(attentions)} attention tensors for the {layers} layers its "
                              f"config declares (another library rewired the model?): give attnviz the model as "
                              f"transformers loads it")


def make_capture(loaded: LoadedModel, encoded: Encoded, attentions: np.ndarray, text: str, *,
                 source: str = "model") -> Capture:
    """Wrap α and the token information in a validated Capture."""
    causal = loaded.causal
    T = attentions.shape[-1]
    if causal is None:  # unknown family: judge from α
        causal = bool(T > 1 and np.abs(np.triu(attentions, k=1)).max() < 1e-6)
    meta = {
        "model": loaded.name, "model_source": loaded.source, "revision": loaded.revision, "device": loaded.device,
        "dtype": loaded.dtype, "model_type": loaded.model_type, "causal": causal, "text": text, "source": source,
        "attnviz_version": __version__, "dropped_tokens": encoded.dropped,
    }
    if has_sinks(loaded.model_type):
        meta["sinks"] = True
    if encoded.image is not None and encoded.grid is not None:
        meta.update(text=encoded.image_name, image_grid=list(encoded.grid), image_patch=encoded.patch,
                    image_name=encoded.image_name)
    windows = layer_windows(loaded.model.config, attentions.shape[0])
    if windows is not None:
        meta["windows"] = windows
    unk = getattr(loaded.tokenizer, "unk_token_id", None)
    if isinstance(unk, int) and unk not in special_ids(loaded.tokenizer):  # so word labels can say [UNK:…] too
        meta["unk_token_id"] = unk
    capture = Capture(attentions=attentions, tokens=tuple(encoded.tokens), token_ids=np.asarray(encoded.token_ids),
                      special=np.asarray(encoded.special, bool), special_kind=tuple(encoded.special_kind),
                      subword=np.asarray(encoded.subword, bool), meta=meta,
                      offsets=np.asarray(encoded.offsets, np.int64) if encoded.offsets else None,
                      image=encoded.image)
    return capture.validate(atol=row_sum_tolerance(loaded.dtype))


def row_sum_tolerance(dtype: str) -> float:
    """How far a row of α may be from summing to 1: 1e-4 in float32, looser in half precision."""
    return 1e-4 if dtype == "float32" else 2e-2


def capture_text(text: str, loaded: LoadedModel, *, truncate: bool = True) -> Capture:
    """text -> Capture with the model's own attention weights."""
    encoded = encode(loaded, text, truncate=truncate)
    return make_capture(loaded, encoded, model_attentions(loaded, encoded), text)
