"""A model folder is untrusted input: its config.json, tokenizer files and safetensors headers are checked
before transformers reads them. No torch here.

transformers builds a model from what config.json declares before it reads a weight, so a config declaring
10^9 layers loops for minutes and one declaring a width of 10^9 allocates what it says. Here, first:

    config.json        a regular file of at most 1 MiB, a JSON object; every size it declares a whole number
                       within sane bounds, and the smallest model those sizes make (the embedding table, one
                       norm vector per layer) within ATTNVIZ_MAX_MODEL_BYTES
    *.safetensors      each header's length within the file and 100 MB, every tensor's dtype known, its
                       offsets inside the file and as long as its shape says; the weights within
                       ATTNVIZ_MAX_MODEL_BYTES; a config declaring more layers than the weights hold blocks,
                       or a width the token embedding does not have, refused
    tokenizer files    regular files of at most 256 MiB

Each refusal is one ModelLoadError line naming the file and what it declares."""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path

from attnviz.engine.offline.gguf import MAX_CONTEXT, MAX_MODEL_ENV, max_model_bytes
from attnviz.errors import ModelLoadError
from attnviz.base.files import kind_of

CONFIG_BYTES = 1 << 20  # a config.json, at most
HEADER_BYTES = 100_000_000  # a safetensors header, at most (the safetensors library's own limit)
TOKENIZER_BYTES = 256 << 20  # a tokenizer file, at most (Gemma 3's tokenizer.json: 33 MB)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "source.spm", "target.spm", "tokenizer_config.json",
                   "special_tokens_map.json")
INDEX_BYTES = 64 << 20  # a sharded checkpoint's index, at most

# Sizes a config declares, and the largest a real model has been given (with room to spare).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers")
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
SIZE_BOUNDS = {
    **dict.fromkeys(LAYER_KEYS, 4096),
    **dict.fromkeys(WIDTH_KEYS, 1 << 17),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "num_key_value_heads",
                     "encoder_attention_heads", "decoder_attention_heads"), 1 << 14),
    **dict.fromkeys(("intermediate_size", "n_inner", "d_ff", "hidden_dim", "encoder_ffn_dim", "decoder_ffn_dim"),
                    1 << 20),
    **dict.fromkeys(("head_dim", "d_kv"), 1 << 14),
    "vocab_size": 1 << 24,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), MAX_CONTEXT),
    "type_vocab_size": 1 << 16,
}
BYTES_PER = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
             "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E8M0": 1, "F4": 1}


def check_folder(folder: Path, *, bytes_per_weight: int = 4) -> None:
    """Refuse, in one line, a model folder whose files declare what they do not hold or more than the limit
    (ATTNVIZ_MAX_MODEL_BYTES, at `bytes_per_weight` bytes a weight: 4 in float32)."""
    config = read_config(folder / "config.json")
    limit = max_model_bytes()
    parts = [config] + [value for key in ("text_config", "encoder", "decoder") if isinstance(value := config.get(key),
                                                                                            dict)]
    for part in parts:
        _check_sizes(part)
    smallest = max(_smallest_weights(part) for part in parts)
    if smallest * bytes_per_weight > limit:
        raise ModelLoadError(f"{folder.name}/config.json declares a model of at least {smallest:,} weights, over the "
                             f"limit of {_size(limit)} ({MAX_MODEL_ENV}): not loaded")
    for name in TOKENIZER_FILES:
        _check_regular(folder / name, TOKENIZER_BYTES, "tokenizer file")
    tensors = weights = 0
    shapes: dict[str, list[int]] = {}
    for path in _safetensors_files(folder):
        count, elements = check_safetensors(path, shapes)
        tensors, weights = tensors + count, weights + elements
    if weights * bytes_per_weight > limit:
        raise ModelLoadError(f"{folder.name} holds {weights:,} weights, {_size(weights * bytes_per_weight)} as "
                             f"loaded, over the limit of {_size(limit)} ({MAX_MODEL_ENV})")
    if tensors:
        check_against_weights(folder.name, parts, shapes)


# A block's tensors are named …{layer|layers|h|block|blocks}.{i}.… in every family attnviz reads (BERT's
# encoder.layer.3., Llama's model.layers.3., GPT-2's h.3., T5's encoder.block.3.)
BLOCK_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d{1,9})\.")
EMBEDDING_NAMES = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight", "shared.weight")
EMBEDDING_WIDTH_KEYS = (*WIDTH_KEYS, "embedding_size", "word_embed_proj_dim", "d_embed")


def check_against_weights(name: str, parts: list[dict], shapes: dict[str, list[int]]) -> None:
    """The config's sizes against the tensors the weights hold, before transformers builds what the config
    declares (10^9 layers over a tiny model's weights grew to gigabytes): no more layers than the weights have
    blocks (counted by the block numbers in the tensors' names, else by the tensors), and a token embedding as
    wide as a width the config declares."""
    layers = max((part[key] for part in parts for key in LAYER_KEYS if _whole(part.get(key))), default=0)
    blocks = {int(found.group(1)) for tensor in shapes if (found := BLOCK_INDEX.search(tensor))}
    held = max(blocks) + 1 if blocks else len(shapes)
    if layers > held:
        what = f"{held:,} blocks (numbered 0 to {held - 1:,} in its tensors' names)" if blocks else \
            f"{held:,} tensors"
        raise ModelLoadError(f"{name}/config.json declares {layers:,} layers but its weights hold {what}: the config "
                             f"does not match the weights")
    widths = {part[key] for part in parts for key in EMBEDDING_WIDTH_KEYS if _whole(part.get(key))}
    for tensor, shape in shapes.items():
        if tensor.endswith(EMBEDDING_NAMES) and len(shape) == 2 and widths and shape[1] not in widths:
            raise ModelLoadError(f"{name}/config.json declares a width of {min(widths):,} but the token embedding "
                                 f"{tensor[:80]} is {shape[1]:,} wide: the config does not match the weights")


def read_config(path: Path) -> dict:
    """config.json as a dict: a regular file of at most CONFIG_BYTES, UTF-8 JSON, an object."""
    shown = f"{path.parent.name}/{path.name}"
    raw = _read_bounded(path, CONFIG_BYTES, shown)
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ModelLoadError(f"{shown} is not JSON text (UTF-8)") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{shown} holds a JSON {type(config).__name__}, not an object of settings")
    return config


def check_safetensors(path: Path, shapes: dict[str, list[int]] | None = None) -> tuple[int, int]:
    """(tensors, weights) of a .safetensors file, after checking its header against its size: the header is
    an 8-byte length and that much JSON, then the data every tensor's offsets point into. `shapes`, when given,
    gets each tensor's name and shape."""
    shown = path.name
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 2 <= length <= min(HEADER_BYTES, size - 8):
                raise ModelLoadError(f"{shown} is not a safetensors file (its header declares {length:,} bytes in a "
                                     f"file of {size:,})")
            raw = handle.read(length)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {shown}: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ModelLoadError(f"{shown}: its header is not JSON text (damaged or not safetensors)") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{shown}: its header is not a JSON object (damaged or not safetensors)")
    data = size - 8 - length
    tensors = elements = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shown_name = str(name)[:80]
        if not isinstance(entry, dict) or entry.get("dtype") not in BYTES_PER:
            raise ModelLoadError(f"{shown}: tensor {shown_name!r} has no dtype safetensors defines")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if (not isinstance(shape, list) or len(shape) > 8 or not all(_whole(d, zero=True) for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(_whole(o, zero=True) for o in offsets)):
            raise ModelLoadError(f"{shown}: tensor {shown_name!r} has a malformed shape or offsets")
        count = math.prod(shape)
        begin, end = offsets
        if not begin <= end <= data:
            raise ModelLoadError(f"{shown}: tensor {shown_name!r} runs past the end of the file (declared to end at "
                                 f"byte {end:,} of {data:,}): truncated or forged")
        if end - begin != (count * BYTES_PER[entry["dtype"]] if entry["dtype"] != "F4" else -(-count // 2)):
            raise ModelLoadError(f"{shown}: tensor {shown_name!r} declares shape {shape[:8]} but {end - begin:,} "
                                 f"bytes: forged or damaged")
        tensors, elements = tensors + 1, elements + count
        if shapes is not None:
            shapes[str(name)] = shape
    return tensors, elements


def _safetensors_files(folder: Path) -> list[Path]:
    """The weight files transformers would read: model.safetensors, or the shards an index names."""
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return []
    raw = _read_bounded(index, INDEX_BYTES, index.name)
    try:
        listed = json.loads(raw.decode("utf-8")).get("weight_map", {})
        shards = sorted({str(v) for v in listed.values()}) if isinstance(listed, dict) else None
    except (UnicodeDecodeError, ValueError, RecursionError, AttributeError):
        shards = None
    if shards is None:
        raise ModelLoadError(f"{index.name} is not a safetensors index (a JSON object with a weight_map)")
    files = []
    for shard in shards:
        path = folder / shard
        if Path(shard).name != shard or not path.is_file():
            raise ModelLoadError(f"{index.name} names {shard[:80]!r}, which is not a file in the model folder")
        files.append(path)
    return files


AT_LEAST_ONE = (*LAYER_KEYS[:4], *WIDTH_KEYS, "num_attention_heads", "n_head", "n_heads", "num_heads",
                "num_key_value_heads", "encoder_attention_heads", "decoder_attention_heads")


def _check_sizes(config: dict) -> None:
    for key, bound in SIZE_BOUNDS.items():
        if key not in config or config[key] is None:
            continue
        value = config[key]
        if isinstance(value, (list, dict)):  # per-stage sizes (a hierarchical vision model): not a model attnviz reads
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelLoadError(f"config.json declares {key} = {str(value)[:20]!r}, not a whole number: forged or "
                                 f"damaged")
        if not 0 <= value <= bound:
            raise ModelLoadError(f"config.json declares {key} = {value:,} (a model has at most {bound:,}): forged "
                                 f"or damaged")
        if value == 0 and key in AT_LEAST_ONE:
            raise ModelLoadError(f"config.json declares {key} = 0 (a model has at least 1): forged or damaged")
    width = next((config[k] for k in WIDTH_KEYS if _whole(config.get(k))), None)
    heads = next((config[k] for k in ("num_attention_heads", "n_head", "n_heads") if _whole(config.get(k))), None)
    if width and heads and not _whole(config.get("head_dim")) and width % heads:
        raise ModelLoadError(f"config.json declares a width of {width:,} in {heads:,} heads, which does not divide "
                             f"it (and no head_dim): forged or damaged")


def _smallest_weights(config: dict) -> int:
    """A lower bound on the weights the sizes make: the embedding table and one norm vector per layer."""
    width = next((config[k] for k in WIDTH_KEYS if _whole(config.get(k))), 0)
    vocab = config["vocab_size"] if _whole(config.get("vocab_size")) else 0
    layers = max((config[k] for k in LAYER_KEYS if _whole(config.get(k))), default=0)
    return vocab * width + layers * width


def _whole(value, zero: bool = False) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= (0 if zero else 1)


def _check_regular(path: Path, limit: int, what: str) -> None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    kind = kind_of(info.st_mode)
    if kind is not None:
        raise ModelLoadError(f"{path.parent.name}/{path.name} is {kind}, not a regular file")
    if info.st_size > limit:
        raise ModelLoadError(f"{path.parent.name}/{path.name} is {_size(info.st_size)} (at most {_size(limit)}): not "
                             f"a {what} attnviz will read")


def _read_bounded(path: Path, limit: int, shown: str) -> bytes:
    _check_regular(path, limit, "settings file")
    try:
        with open(path, "rb") as handle:
            return handle.read(limit + 1)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {shown}: {exc.strerror or exc}") from None


def _size(n: int) -> str:
    from attnviz.base.sizes import size_text

    return size_text(n)
