"""A GGUF file is untrusted input: checked before transformers reads it.

The fixed header (magic, version, tensor and key counts) is read by hand and bounded; then the `gguf`
package's reader (numpy memory map: nothing is loaded) lists the metadata and tensors, and every tensor must
lie inside the file. The weights dequantized to float32 must fit ATTNVIZ_MAX_MODEL_BYTES (default 8 GiB),
checked from the tensor shapes before anything is dequantized. No torch here."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from attnviz.errors import ModelLoadError
from attnviz.sizes import size_from_env

MAGIC = b"GGUF"
MAX_TENSORS = 100_000
MAX_KEYS = 100_000
MAX_MODEL_ENV = "ATTNVIZ_MAX_MODEL_BYTES"
DEFAULT_MAX_MODEL_BYTES = 8 << 30


@dataclass
class GGUFSummary:
    architecture: str
    name: str
    tensors: int
    parameters: int  # weights in all tensors (4 bytes each dequantized to float32)


def max_model_bytes() -> int:
    return size_from_env(MAX_MODEL_ENV, DEFAULT_MAX_MODEL_BYTES)


def check_header(path: Path) -> None:
    """Refuse what is not a GGUF file of a version the reader knows, or whose counts are absurd."""
    shown = path.name
    try:
        with open(path, "rb") as handle:
            head = handle.read(24)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if len(head) < 24 or head[:4] != MAGIC:
        raise ModelLoadError(f"{shown} is not a GGUF file (it does not start with GGUF)")
    version, tensors, keys = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise ModelLoadError(f"{shown} is GGUF version {version}; attnviz reads versions 2 and 3")
    if tensors > MAX_TENSORS or keys > MAX_KEYS:
        raise ModelLoadError(f"{shown} says it holds {tensors} tensors and {keys} metadata keys: not a model "
                             f"attnviz will read")


def inspect(path: Path) -> GGUFSummary:
    """Check a GGUF file without loading its weights. ModelLoadError (one line) for anything wrong."""
    check_header(path)
    shown = path.name
    try:
        from gguf import GGUFReader
    except ImportError:
        from attnviz.engine.offline import GGUF_INSTALL

        raise ModelLoadError(f"reading GGUF files needs the gguf and accelerate packages: {GGUF_INSTALL}") from None
    size = path.stat().st_size
    try:
        reader = GGUFReader(str(path))
        field = reader.fields.get("general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None else ""
        field = reader.fields.get("general.name")
        name = bytes(field.parts[field.data[0]]).decode("utf-8", "replace") if field is not None else path.stem
        parameters = 0
        for tensor in reader.tensors:
            end = int(tensor.data_offset) + int(tensor.n_bytes)
            if int(tensor.n_elements) <= 0 or end > size:
                raise ModelLoadError(f"{shown}: tensor {tensor.name!r} runs past the end of the file (truncated?)")
            parameters += int(tensor.n_elements)
        count = len(reader.tensors)
    except ModelLoadError:
        raise
    except Exception as exc:  # the reader raises many kinds for a damaged file
        raise ModelLoadError(f"{shown} is not a readable GGUF file (truncated or damaged: "
                             f"{type(exc).__name__})") from None
    if not architecture:
        raise ModelLoadError(f"{shown} names no architecture (general.architecture), so it cannot be loaded")
    if count == 0:
        raise ModelLoadError(f"{shown} holds no tensors")
    need, limit = parameters * 4, max_model_bytes()
    if need > limit:
        from attnviz.sizes import size_text

        raise ModelLoadError(f"{shown} has {parameters:,} weights: {size_text(need)} dequantized to float32, over "
                             f"the limit of {size_text(limit)} ({MAX_MODEL_ENV})")
    return GGUFSummary(architecture, name, count, parameters)
