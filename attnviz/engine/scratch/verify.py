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


def scratch_attentions(model, inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(scratch α, model α), each float32 (L, B, H, T, T), from one forward pass."""
    run = recompute(model, inputs)
    with torch.inference_mode():
        alphas = [qkv.alpha() for qkv in run.layers]

    reported = attentions_of(run.output, model, getattr(model, "name_or_path", "the model"))
    model_alpha = torch.stack([a.float() for a in reported])  # (L, B, H, T, T)
    return torch.stack(alphas).cpu().numpy(), model_alpha.cpu().numpy()


def capture_both(loaded, text, *, truncate: bool = True):
    """(model Capture, scratch Capture) for one text, from a single forward pass."""

    encoded = encode(loaded, text, truncate=truncate)
    check_memory(loaded, len(encoded.token_ids), copies=4.0)  # the model's α, scores, both stacks
    scratch, reported = scratch_attentions(loaded.model, encoded.inputs)
    return (make_capture(loaded, encoded, reported[:, 0], text),
            make_capture(loaded, encoded, scratch[:, 0], text, source="scratch"))


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
    scratch, reported = scratch_attentions(loaded.model, {k: v for k, v in inputs.items()
                                                          if k in forward_args(loaded.model)})
    meta = {**saved.meta, "model": loaded.name, "dtype": loaded.dtype, "device": loaded.device}
    return (replace(saved, attentions=reported[:, 0], meta={**meta, "source": "model"}),
            replace(saved, attentions=scratch[:, 0], meta={**meta, "source": "scratch"}))
