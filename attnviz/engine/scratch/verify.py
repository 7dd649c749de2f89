"""verify: α recomputed from the model's own weights in one forward pass, beside the α the model reports.

A pre-hook records what each attention module receives; the family's adapter projects it to Q, K, V; the
formula gives α. The result is a second producer of the same Capture (or, for an encoder-decoder model, of
each part), so the two can be compared."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np
import torch

from attnviz.data.capture import Capture
from attnviz.data.parts import Parts
from attnviz.metrics import differences
from attnviz.progress import Reporter
from attnviz.engine.forward import attentions_of, encode, make_capture
from attnviz.engine.scratch.adapters import QKV, adapter_for, layer_qkv, seq2seq_adapter_for
from attnviz.engine.scratch.formula import attention_mask, attention_weights
from attnviz.engine.hooks import Seen, recording_inputs
from attnviz.engine.models import forward_args, layers_and_heads
from attnviz.engine.memory import check_memory, check_parts_memory
from attnviz.errors import arg, InputError, UnsupportedArchitectureError
from attnviz.base.text import visible


def part_masks(source_mask: torch.Tensor, T: int) -> dict[str, torch.Tensor]:
    """Which keys each query may see in each part, (B, 1, rows, cols) bool: the encoder and cross-attention
    hide source padding; the decoder is causal."""
    B, S = source_mask.shape
    keys = source_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    causal = torch.ones(T, T, dtype=torch.bool, device=source_mask.device).tril()  # (T, T)
    return {"encoder": keys.expand(B, 1, S, S), "decoder": causal[None, None].expand(B, 1, T, T),
            "cross": keys.expand(B, 1, T, S)}


def scratch_parts(loaded, inputs: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For an encoder-decoder model and inputs (input_ids, attention_mask, decoder_input_ids), one forward
    pass: per part, (α from the formula, α the model reports), float32, (L, H, rows, cols) each."""

    model = loaded.model
    adapter = seq2seq_adapter_for(model)
    groups = adapter.parts(model)
    modules = [m for part in ("encoder", "decoder", "cross") for m in groups[part]]
    T = inputs["decoder_input_ids"].shape[1]
    if "input_features" in inputs:  # a speech model: the encoder's positions come from the spectrogram
        S = int(getattr(model.config, "max_source_positions", inputs["input_features"].shape[-1] // 2))
        source_mask = torch.ones(1, S, dtype=torch.long, device=inputs["input_features"].device)
    else:
        S = inputs["input_ids"].shape[1]
        given = inputs.get("attention_mask")
        source_mask = torch.ones_like(inputs["input_ids"]) if given is None else given
    check_parts_memory(loaded, S, T, copies=3.0)
    with recording_inputs(modules) as seen, torch.inference_mode():
        output = model(**inputs, output_attentions=True)
    masks = part_masks(source_mask, inputs["decoder_input_ids"].shape[1])
    reported = {"encoder": output.encoder_attentions, "decoder": output.decoder_attentions,
                "cross": output.cross_attentions}
    results, at = {}, 0
    for part in ("encoder", "decoder", "cross"):
        alphas = []
        for n, module in enumerate(groups[part]):
            record = seen[at + n]
            if record is None:
                raise UnsupportedArchitectureError(f"the {part} attention module of layer {n} was not called")
            if next(module.parameters()).dtype != torch.float32:  # half precision: reference in float32
                module = copy.deepcopy(module).float()
                record = Seen(record.hidden.float(), None,
                              None if record.keys_from is None else record.keys_from.float())
            with torch.inference_mode():
                qkv = adapter.qkv(module, record, n, model, part)
                alphas.append(attention_weights(qkv.q, qkv.k, masks[part], qkv.bias)[0].cpu().numpy())
        at += len(groups[part])
        if not reported[part] or any(a is None for a in reported[part]):
            raise UnsupportedArchitectureError(f"{loaded.name} returned no {part} attention weights")
        model_alpha = np.stack([a[0].float().cpu().numpy() for a in reported[part]])
        results[part] = (np.stack(alphas).astype(np.float32), model_alpha)
    return results


@dataclass
class Recomputed:
    """One forward pass of the model, and per layer the Q, K, V recomputed from what each attention
    module received."""

    output: object  # the model's own output (with .attentions)
    layers: list[QKV]  # per layer, (B, H, T, d) each


def recompute(model, inputs: dict, *, attentions: bool = True) -> Recomputed:
    """Run `model` on `inputs` once (eager, output_attentions unless `attentions` is False: a long input's
    streamed path, which never holds the model's L·H·T² weights) and recompute every layer's Q, K, V from its
    own weights, in float32 whatever the model's dtype."""
    base = getattr(model, "base_model", model)
    adapter = adapter_for(base)
    modules = adapter.modules(base)
    with recording_inputs(modules) as seen, torch.inference_mode():
        output = model(**inputs, output_attentions=attentions)
        layers = [layer_qkv(adapter, module, record, n, base.config)
                  for n, (module, record) in enumerate(zip(modules, seen))]
    key_mask = inputs.get("attention_mask")
    if key_mask is None:  # every key seen (a picture's patches too: its length is what the layers received)
        first = layers[0].q if layers else None
        shape = inputs["input_ids"].shape if "input_ids" in inputs else (1, first.shape[2] if first is not None else 0)
        device = inputs["input_ids"].device if "input_ids" in inputs else (first.device if first is not None else None)
        key_mask = torch.ones(shape, device=device)
    for qkv in layers:  # each layer's own mask: its sliding window or local reach, if it has one
        qkv.mask = attention_mask(key_mask, causal=adapter.causal, window=qkv.window, reach=qkv.reach)
    return Recomputed(output, layers)


def scratch_attentions(model, inputs: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """(scratch α, model α), each float32 (L, B, H, T, T), from one forward pass; and the largest |score| the
    softmax reads, |Q·Kᵀ| times its scale (plus a family's bias), over every layer and head: how finely float32
    can know the scores, and so α (api/scratch/verify.py score_tolerance)."""
    run = recompute(model, inputs)
    largest = 0.0
    with torch.inference_mode():
        alphas = [qkv.alpha() for qkv in run.layers]
        for qkv in run.layers:
            scores = (qkv.q.float() @ qkv.k.float().transpose(-1, -2)) * (qkv.scale or qkv.q.shape[-1] ** -0.5)
            if qkv.bias is not None:
                scores = scores + qkv.bias.float()
            largest = max(largest, float(scores.abs().max()))

    reported = attentions_of(run.output, model, getattr(model, "name_or_path", "the model"))
    model_alpha = torch.stack([a.float() for a in reported])  # (L, B, H, T, T)
    return torch.stack(alphas).cpu().numpy(), model_alpha.cpu().numpy(), largest


def capture_both(loaded, text, *, truncate: bool = True):
    """(model Capture, scratch Capture) for one text, from a single forward pass."""

    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=4.0)  # the model's α, scores, both stacks
    scratch, reported, largest = scratch_attentions(loaded.model, encoded.inputs)
    recomputed = make_capture(loaded, encoded, scratch[:, 0], text, source="scratch")
    recomputed.meta["largest_score"] = largest
    return make_capture(loaded, encoded, reported[:, 0], text), recomputed


def capture_both_ids(loaded, saved: Capture) -> tuple[Capture, Capture]:
    """(model Capture, scratch Capture) for the token ids of a saved capture (e.g. one written by
    attnviz generate), run through `loaded` in one forward pass: the saved α can then be compared with
    both."""


    if saved.pooled or saved.meta.get("level") == "word" or saved.quantity != "alpha":
        raise InputError(f"verify {arg('source')} needs a capture of token-level α (not pooled, {arg('words')} or "
                         f"{arg('norms')})")

    made_by = f"give the model that made it (the capture names {visible(saved.model)!r})"
    L, H = layers_and_heads(loaded.model.config)
    if (L, H) != (saved.n_layers, saved.n_heads):
        raise InputError(f"the capture has {saved.n_layers} layers × {saved.n_heads} heads, {loaded.name} has "
                         f"{L} × {H}: {made_by}")
    ids = np.asarray(saved.token_ids, dtype=np.int64)
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if ids.min() < 0 or ids.max() >= vocab:
        raise InputError(f"the capture's token ids (up to {int(ids.max())}) do not fit {loaded.name}'s vocabulary of "
                         f"{vocab}: {made_by}")
    if loaded.max_positions and len(ids) > loaded.max_positions:
        raise InputError(f"the capture has {len(ids)} tokens; {loaded.name} takes at most {loaded.max_positions}")
    check_memory(loaded, len(ids), copies=4.0)
    input_ids = torch.tensor(ids[None, :], device=loaded.device)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if "token_type_ids" in getattr(loaded.tokenizer, "model_input_names", ()):  # one segment, as encode gives
        inputs["token_type_ids"] = torch.zeros_like(input_ids)  # (GPT-2 would add wte[0] for it: never there)
    scratch, reported, largest = scratch_attentions(loaded.model, {k: v for k, v in inputs.items()
                                                                   if k in forward_args(loaded.model)})
    meta = {**saved.meta, "model": loaded.name, "dtype": loaded.dtype, "device": loaded.device}
    return (replace(saved, attentions=reported[:, 0], meta={**meta, "source": "model"}),
            replace(saved, attentions=scratch[:, 0], meta={**meta, "source": "scratch", "largest_score": largest}))


# --- an encoder-decoder model's parts, and a speech model's -------------------------------------------------


def parts_checks(loaded, parts: Parts, saved: bool, reporter: Reporter,
                 source: str | None = None) -> tuple[dict[str, list], dict[str, Capture]]:
    """An encoder-decoder model: each part (encoder, decoder, cross) of one forward pass over the source and
    the decoder's input, against the formula from the weights; with a `saved` capture, its parts against that
    pass too. (the checks: name -> each layer's differences, the capture each is about)"""
    if loaded.speech or any(c.mel is not None for c in parts.captures.values()):
        return speech_checks(loaded, parts, saved, reporter, source)
    encoder = parts.part("encoder") if "encoder" in parts.captures else None
    source_side = parts.part("cross").keys if "cross" in parts.captures else None
    source_ids = (encoder.token_ids if encoder is not None else source_side.token_ids if source_side else None)
    target = parts.part("decoder") if "decoder" in parts.captures else parts.captures.get("cross")
    if source_ids is None or target is None:
        raise InputError("verify needs the source and the target tokens: this capture holds only "
                         + ", ".join(parts.names))
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if max(int(source_ids.max()), int(target.token_ids.max())) >= vocab or min(int(source_ids.min()),
                                                                               int(target.token_ids.min())) < 0:
        raise InputError(f"the capture's token ids do not fit {loaded.name}'s vocabulary of {vocab}: give the model "
                         f"that made it (the capture names {visible(parts.model)!r})")
    device = loaded.device
    ids = torch.tensor([list(source_ids)], device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "decoder_input_ids": torch.tensor([list(target.token_ids)], device=device)}
    with reporter.status("Running the model and the from-scratch path over every part…"):
        results = scratch_parts(loaded, inputs)
    checks: dict[str, list] = {}
    captures: dict[str, Capture] = {"target": target}
    if encoder is not None:
        captures["encoder"] = encoder
    for name, (scratch, model_alpha) in results.items():
        if name not in parts.captures:
            continue
        stored = parts.part(name)
        captures[name] = stored
        if stored.attentions.shape != model_alpha.shape:
            raise InputError(f"the capture's {name} part is {stored.attentions.shape}, {loaded.name} gives "
                             f"{model_alpha.shape}: give the model that made it")
        reported = replace(stored, attentions=model_alpha)
        if saved:
            checks[f"{name}: saved vs model"] = differences(stored, reported)
        checks[f"{name}: model vs scratch"] = differences(reported, replace(stored, attentions=scratch))
    return checks, captures


def speech_checks(loaded, parts: Parts, saved: bool, reporter: Reporter,
                  source: str | None = None) -> tuple[dict[str, list], dict[str, Capture]]:
    """A speech model: one forward pass over the capture's sound (its spectrogram recomputed from the samples)
    and transcript; each part from the formula against the model over all the encoder's positions (the padding
    to 30 s too), and the capture's parts (the silence folded into one key) against that pass folded alike."""
    from attnviz.data.sound import Sound
    from attnviz.engine.speech import features, fold, frame_side

    heard = next((c for c in parts.captures.values() if c.sound is not None), None)
    if not loaded.speech or heard is None:
        raise InputError(f"{source or 'the capture'} and {loaded.name} do not match: one is of a speech model and "
                         f"the other not")
    target = parts.captures.get("decoder") or parts.part("cross")
    vocab = int(loaded.model.get_input_embeddings().num_embeddings)
    if int(target.token_ids.max()) >= vocab or int(target.token_ids.min()) < 0:
        raise InputError(f"the capture's token ids do not fit {loaded.name}'s vocabulary of {vocab}")
    assert heard.sound is not None
    mel = features(loaded, Sound(heard.sound, str(parts.meta.get("audio_name", "the sound"))))
    inputs = {"input_features": mel,
              "decoder_input_ids": torch.tensor([list(target.token_ids)], device=loaded.device)}
    with reporter.status("Running the model and the from-scratch path over every part…"):
        results = scratch_parts(loaded, inputs)
    N = heard.frames
    checks: dict[str, list] = {}
    captures: dict[str, Capture] = {"target": target}
    for name, (scratch, model_alpha) in results.items():
        if name not in parts.captures:
            continue
        stored = parts.part(name)
        captures[name] = stored
        if name == "decoder":
            full = stored
        else:  # every position of the encoder, as the model computed them
            frames = frame_side(model_alpha.shape[-1], model_alpha.shape[-1])
            rows = frames if name == "encoder" else stored
            full = Capture(attentions=model_alpha, tokens=rows.tokens, token_ids=rows.token_ids, special=rows.special,
                           special_kind=rows.special_kind, subword=rows.subword, meta=stored.meta,
                           keys=frames if name == "cross" else None)
        checks[f"{name}: model vs scratch"] = differences(replace(full, attentions=model_alpha),
                                                          replace(full, attentions=scratch))
        if name != "decoder":
            captures[f"{name}: model vs scratch"] = full  # over every position the encoder has
        folded = model_alpha if name == "decoder" else fold(model_alpha, N, rows=name == "encoder")
        if folded.shape != stored.attentions.shape:
            raise InputError(f"the capture's {name} part is {stored.attentions.shape}, {loaded.name} gives "
                             f"{folded.shape}: give the model that made it")
        if saved:
            checks[f"{name}: saved vs model"] = differences(stored, replace(stored, attentions=folded))
    return checks, captures
