"""A GGUF file is untrusted input: checked before transformers reads it.

The header, the metadata and the tensor table are read by hand from a memory map, every declared size checked
against what is left of the file before it is used; the metadata must agree with the tensors (transformers
builds the model from the metadata); every tensor must lie inside the file; the weights dequantized to float32
must fit ATTNVIZ_MAX_MODEL_BYTES (default 8 GiB), checked from the tensor shapes before anything is
dequantized. No torch here."""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from attnviz.errors import ModelLoadError
from attnviz.base.sizes import size_from_env

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


# --- the metadata and tensor table, read by hand with every size bounded --------------------------------
# GGUF lays out: magic, version, tensor count, key count; then each key (a string), its value type and value
# (arrays: element type, count, elements); then each tensor (name, dimensions, type, offset). Every length
# read here is checked against what is left of the file before it is used, so a header that declares an
# array of 10^8 entries in a file of 1 KB, or 10^9 layers, is refused in microseconds, before the gguf
# package's reader (which would loop over the declared entries) or transformers sees it.

_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_ARRAY = 4_000_000  # entries in one metadata array (Gemma 3's vocabulary: 262,144 tokens)
MAX_NAME = 65_536  # bytes of one key or tensor name
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_CONTEXT = 1 << 24  # positions a model may declare (the longest real ones: about 10^6)


class _Bounded:
    """A cursor over the file's bytes that refuses to read past the end."""

    def __init__(self, data, shown: str):
        self.data, self.at, self.shown = data, 0, shown

    def left(self) -> int:
        return len(self.data) - self.at

    def need(self, count: int, what: str) -> None:
        if count < 0 or count > self.left():
            raise ModelLoadError(f"{self.shown}: {what} runs past the end of the file (declared {count:,} bytes, "
                                 f"{self.left():,} left): truncated or forged")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += size
        return value

    def string(self, what: str, limit: int | None = None) -> bytes:
        length = self.unpack("<Q", what)
        if limit is not None and length > limit:
            raise ModelLoadError(f"{self.shown}: {what} declares {length:,} bytes (at most {limit:,}): forged")
        self.need(length, what)
        raw = self.data[self.at:self.at + length]
        self.at += length
        return raw

    def value(self, kind: int, what: str, depth: int = 0):
        """The value (scalars and strings; arrays as their length, strings in them skipped)."""
        if kind in _SCALARS:
            return self.unpack(_FORMATS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY or depth > 1:
            raise ModelLoadError(f"{self.shown}: {what} has value type {kind}, which GGUF does not define")
        inner = self.unpack("<I", what)
        count = self.unpack("<Q", what)
        if count > MAX_ARRAY:
            raise ModelLoadError(f"{self.shown}: {what} declares an array of {count:,} entries (at most "
                                 f"{MAX_ARRAY:,}): not a model attnviz will read")
        if inner in _SCALARS:
            self.need(count * _SCALARS[inner], what)
            self.at += count * _SCALARS[inner]
        elif inner == STRING:
            self.need(count * 8, what)  # each string at least its 8-byte length
            for _ in range(count):
                length = self.unpack("<Q", what)
                self.need(length, what)
                self.at += length
        else:
            self.need(count * 12, what)  # each inner array at least its type and count
            for _ in range(count):
                self.value(inner, what, depth + 1)
        return count


@dataclass
class _Tensor:
    name: str
    dims: tuple[int, ...]  # ggml order: dims[0] varies fastest (a weight [out, in] is (in, out))
    kind: int
    offset: int


def _scan(path: Path) -> tuple[dict, list[_Tensor], int]:
    """(metadata: key -> scalar, string or array length; tensors; the offset where tensor data starts), every
    size checked against the file. ModelLoadError (one line) for anything forged."""
    import mmap

    shown = path.name
    try:
        with open(path, "rb") as handle:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {shown}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        cursor = _Bounded(data, shown)
        cursor.at = 24
        _, tensors, keys = struct.unpack_from("<IQQ", data, 4)
        if tensors * 24 + keys * 13 > cursor.left():  # a tensor entry and a key take at least that much
            raise ModelLoadError(f"{shown} declares {tensors:,} tensors and {keys:,} metadata keys, more than "
                                 f"its {len(data):,} bytes can hold: truncated or forged")
        metadata: dict = {}
        for _ in range(keys):
            raw = cursor.string("a metadata key", MAX_NAME)
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ModelLoadError(f"{shown}: a metadata key is not UTF-8 text ({raw[:40]!r}): forged or "
                                     f"damaged") from None
            kind = cursor.unpack("<I", f"metadata {key!r}")
            metadata[key] = cursor.value(kind, f"metadata {key!r}")
        table = []
        for _ in range(tensors):
            raw = cursor.string("a tensor name", MAX_NAME)
            name = raw.decode("utf-8", "replace")
            count = cursor.unpack("<I", f"tensor {name!r}")
            if not 1 <= count <= MAX_DIMS:
                raise ModelLoadError(f"{shown}: tensor {name!r} has {count} dimensions (ggml allows 1 to {MAX_DIMS})")
            dims = tuple(cursor.unpack("<Q", f"tensor {name!r}") for _ in range(count))
            table.append(_Tensor(name, dims, cursor.unpack("<I", f"tensor {name!r}"),
                                 cursor.unpack("<Q", f"tensor {name!r}")))
        alignment = metadata.get("general.alignment", 32)
        if not isinstance(alignment, int) or not 1 <= alignment <= 1 << 16 or alignment & (alignment - 1):
            raise ModelLoadError(f"{shown}: general.alignment is {alignment!r}, not a power of two up to 65536")
        start = -(-cursor.at // alignment) * alignment
        return metadata, table, start
    finally:
        data.close()


def inspect(path: Path) -> GGUFSummary:
    """Check a GGUF file without loading its weights: the header, every metadata size and tensor against the
    file's real size, the metadata against the tensors (as many blocks as `blk.N` tensors, the embedding width
    of the embedding table, heads that divide it), and the float32 size against ATTNVIZ_MAX_MODEL_BYTES.
    ModelLoadError (one line) for anything wrong; nothing is allocated by what the file declares."""
    check_header(path)
    shown = path.name
    try:
        from gguf import GGML_QUANT_SIZES
    except ImportError:
        from attnviz.engine.offline import GGUF_INSTALL

        raise ModelLoadError(f"reading GGUF files needs the gguf and accelerate packages: {GGUF_INSTALL}") from None
    size = path.stat().st_size
    metadata, table, start = _scan(path)
    raw = metadata.get("general.architecture")
    architecture = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else ""
    if not architecture:
        raise ModelLoadError(f"{shown} names no architecture (general.architecture), so it cannot be loaded")
    raw = metadata.get("general.name")
    name = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else path.stem
    if not table:
        raise ModelLoadError(f"{shown} holds no tensors")
    sizes = {int(kind): value for kind, value in GGML_QUANT_SIZES.items()}
    parameters = 0
    for tensor in table:
        if tensor.kind not in sizes:
            raise ModelLoadError(f"{shown}: tensor {tensor.name!r} has ggml type {tensor.kind}, which attnviz does not "
                                 f"know")
        block, type_size = sizes[tensor.kind]
        elements = math.prod(tensor.dims)
        if elements <= 0 or tensor.dims[0] % block:
            raise ModelLoadError(f"{shown}: tensor {tensor.name!r} has shape {list(tensor.dims)}, which its type "
                                 f"cannot hold")
        if start + tensor.offset + elements // block * type_size > size:
            raise ModelLoadError(f"{shown}: tensor {tensor.name!r} runs past the end of the file (truncated?)")
        parameters += elements
    _check_metadata(shown, architecture, metadata, table)
    need, limit = parameters * 4, max_model_bytes()
    if need > limit:
        from attnviz.base.sizes import size_text

        raise ModelLoadError(f"{shown} has {parameters:,} weights: {size_text(need)} dequantized to float32, over "
                             f"the limit of {size_text(limit)} ({MAX_MODEL_ENV})")
    return GGUFSummary(architecture, name, len(table), parameters)


def _check_metadata(shown: str, arch: str, metadata: dict, table: list[_Tensor]) -> None:
    """The sizes the metadata declares (which transformers builds the model from) agree with the tensors."""
    def number(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    blocks = {int(found.group(1)) for tensor in table if (found := _BLOCK.search(tensor.name))}
    declared = number("block_count")
    if declared is not None and (declared != len(blocks) or (blocks and max(blocks) >= declared)):
        raise ModelLoadError(f"{shown} declares {declared:,} layers ({arch}.block_count) but holds the tensors of "
                             f"{len(blocks):,}: its metadata does not match its weights")
    width = number("embedding_length")
    embedding = next((t for t in table if t.name == "token_embd.weight"), None)
    if width is not None and embedding is not None and embedding.dims[0] != width:
        raise ModelLoadError(f"{shown} declares an embedding width of {width:,} ({arch}.embedding_length) but its "
                             f"embedding table is {embedding.dims[0]:,} wide: its metadata does not match its weights")
    heads, groups = number("attention.head_count"), number("attention.head_count_kv")
    if heads is not None and (heads < 1 or (width is not None and heads > width)):
        raise ModelLoadError(f"{shown} declares {heads:,} attention heads ({arch}.attention.head_count) for an "
                             f"embedding width of {width}: forged or damaged")
    if heads is not None and groups is not None and (groups < 1 or groups > heads or heads % groups):
        raise ModelLoadError(f"{shown} declares {groups:,} key/value heads for {heads:,} query heads "
                             f"({arch}.attention.head_count_kv must divide the head count)")
    context = number("context_length")
    if context is not None and not 1 <= context <= MAX_CONTEXT:
        raise ModelLoadError(f"{shown} declares a context of {context:,} positions ({arch}.context_length; at most "
                             f"{MAX_CONTEXT:,}): forged or damaged")


_BLOCK = re.compile(r"(?:^|\.)blk\.(\d+)\.")


def plain_reader(reader: type):
    """gguf's GGUFReader, made once per file for one conversion (transformers reads the file three times: for the
    config, the tokenizer and the weights; the reader only reads), reading its memory-mapped file through a plain
    ndarray view of the same mapping: the reader slices the file once per metadata value (2.4 M slices for Gemma
    3's 262k-token vocabulary), and numpy's memmap subclass spends most of each slice in Python
    (__array_finalize__, __getitem__): most of a conversion's time. The bytes read are the same."""
    import numpy as np

    class PlainReader(reader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value) -> None:
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    made: dict = {}

    def read(path, mode: str = "r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in made:
            made[key] = PlainReader(path, mode)
        return made[key]

    return read
