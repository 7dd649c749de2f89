"""Reading a .npz from someone else with bounded memory: the zip directory's size is checked before zipfile
parses it, each member's .npy header is read before its data, and a member whose dtype, dimensions or size
is not what the caller allows is refused before anything is allocated. Data is read with an exact byte
count taken from the checked header, so a zip member that claims less and inflates to more (a zip bomb)
costs no more than the header allows. Never unpickles. numpy only.
"""

from __future__ import annotations

import math
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnviz.errors import CaptureFormatError

MAX_DIRECTORY_BYTES = 1 << 20  # the zip central directory: a capture has 7 entries (~1 kB)
MAX_HEADER_BYTES = 10_000  # an .npy header (numpy's own default limit)


@dataclass(frozen=True)
class Member:
    """What one array may be: dtype kinds (numpy's kind letters: "f" float, "U" str, "i"/"u" int, "b" bool),
    number of dimensions, and the most bytes its data may take."""

    kinds: str
    ndim: int
    max_bytes: int
    max_itemsize: int | None = None  # e.g. the longest string a str array may hold, times 4 bytes


def _fail(path: Path, why: str) -> CaptureFormatError:
    return CaptureFormatError(f"{path} is not an attnviz capture (.npz of plain arrays): {why}")


def _directory_size(path: Path) -> int:
    """Size in bytes of the zip central directory, from the end-of-directory record (zip64 included)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        tail_len = min(size, 22 + 65535)
        fh.seek(size - tail_len)
        tail = fh.read(tail_len)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            raise _fail(path, "its zip directory is missing")
        directory = struct.unpack("<I", tail[at + 12:at + 16])[0]
        if directory == 0xFFFFFFFF:  # zip64: the real size is in the zip64 end record
            locator = tail[at - 20:at] if at >= 20 else b""
            if not locator.startswith(b"PK\x06\x07"):
                raise _fail(path, "its zip64 directory is missing")
            fh.seek(struct.unpack("<Q", locator[8:16])[0])
            record = fh.read(56)
            if not record.startswith(b"PK\x06\x06") or len(record) < 56:
                raise _fail(path, "its zip64 directory is damaged")
            directory = struct.unpack("<Q", record[40:48])[0]
    return directory


def _read_member(zf: zipfile.ZipFile, name: str, spec: Member, path: Path) -> np.ndarray:
    with zf.open(name) as fh:
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh, max_header_size=MAX_HEADER_BYTES)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=MAX_HEADER_BYTES)
            else:
                raise ValueError(f"unknown .npy version {version}")
        except (ValueError, SyntaxError, TypeError, EOFError) as exc:
            raise _fail(path, f"{name}: {str(exc).splitlines()[0][:120]}") from None
        key = name.removesuffix(".npy")
        if dtype.hasobject:
            raise _fail(path, f"{key} holds pickled objects")
        if dtype.kind not in spec.kinds or dtype.fields is not None or dtype.subdtype is not None:
            raise _fail(path, f"{key} has dtype {dtype}, expected kind {'/'.join(spec.kinds)}")
        if spec.max_itemsize is not None and dtype.itemsize > spec.max_itemsize:
            raise _fail(path, f"{key} holds strings of up to {dtype.itemsize // 4:,} characters, over the limit of "
                              f"{spec.max_itemsize // 4:,}")
        if len(shape) != spec.ndim:
            raise _fail(path, f"{key} has {len(shape)} dimensions {tuple(shape)}, expected {spec.ndim}")
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
        if nbytes > spec.max_bytes:
            raise _fail(path, f"{key} would take {nbytes:,} bytes, over the limit of {spec.max_bytes:,} "
                              f"(see docs/errors.md)")
        data = fh.read(nbytes)  # never more than the checked header allows
        if len(data) != nbytes:
            raise _fail(path, f"{key} is truncated ({len(data):,} of {nbytes:,} bytes)")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape, order="F" if fortran else "C")


def read_npz(path: str | Path, members: dict[str, Member],
             optional: dict[str, Member] | None = None) -> dict[str, np.ndarray]:
    """The named arrays of an .npz, each checked against its Member before its data is read; `optional`
    members are read (and checked) only when present."""
    path = Path(path)
    if not path.is_file():
        from attnviz.base.files import kind_of

        if path.exists():
            raise CaptureFormatError(f"{path} is {kind_of(path.stat().st_mode)}, not a capture file")
        raise CaptureFormatError(f"capture file not found: {path}")
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"PK\x03\x04":  # every .npz is a zip archive
                raise _fail(path, "it is not a zip archive")
        if _directory_size(path) > MAX_DIRECTORY_BYTES:
            raise _fail(path, "its zip directory is too large")
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            missing = [k for k in members if f"{k}.npy" not in names]
            if missing:
                raise _fail(path, f"missing {', '.join(missing)}")
            wanted = {**members, **{k: v for k, v in (optional or {}).items() if f"{k}.npy" in names}}
            return {key: _read_member(zf, f"{key}.npy", spec, path) for key, spec in wanted.items()}
    except CaptureFormatError:
        raise
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError,
            RuntimeError, struct.error) as exc:
        raise _fail(path, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}") from None
