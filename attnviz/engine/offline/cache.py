"""The cache of converted models: a folder per model, built once from its source file, atomically, and
stamped with the source's SHA-256 and the attnviz version that built it. A stamp that does not match (the
source changed, attnviz was upgraded) means the folder is built again. No torch here."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from attnviz._version import __version__
from attnviz.errors import ModelLoadError

CACHE_ENV = "ATTNVIZ_CACHE_DIR"
STAMP = "attnviz-stamp.json"
STAMP_KIND = "attnviz converted model"


def cache_root() -> Path:
    """$ATTNVIZ_CACHE_DIR, else $XDG_CACHE_HOME/attnviz, else ~/.cache/attnviz."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if raw:
        root = Path(raw).expanduser()
        if root.exists() and not root.is_dir():
            raise ModelLoadError(f"{CACHE_ENV}={raw!r} is not a folder: point it at a folder attnviz may write to")
        return root
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "attnviz"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_stamp(folder: Path) -> dict | None:
    try:
        raw = (folder / STAMP).read_bytes()
        if len(raw) > 65536:
            return None
        stamp = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("kind") == STAMP_KIND else None


def _source_facts(source: Path) -> dict:
    info = source.stat()
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


def is_current(folder: Path, source: Path) -> bool:
    """The folder was built by this attnviz version from this very file (its SHA-256; hashed again only when
    the file's size or time changed since the stamp was written)."""
    stamp = _read_stamp(folder)
    if stamp is None or stamp.get("attnviz") != __version__:
        return False
    try:
        facts = _source_facts(source)
    except OSError:
        return False
    if facts["size"] != stamp.get("size"):
        return False
    if facts["mtime_ns"] == stamp.get("mtime_ns"):
        return True
    return file_sha256(source) == stamp.get("sha256")


@contextlib.contextmanager
def _lock(root: Path, key: str) -> Iterator[None]:
    """One builder of a key at a time (a second process waits, then finds the folder built)."""
    handle = open(root / f".{key}.lock", "a+b")
    try:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - Windows: no lock, the rename stays atomic
            pass
        yield
    finally:
        handle.close()


def cached_folder(key: str, source: Path, build: Callable[[Path], None], *, root: Path | None = None) -> Path:
    """The cache folder `key`, built from `source` by `build(temporary folder)` when missing or stale.

    The build writes into a temporary folder beside the final one, which is stamped and then renamed into
    place, so an interrupted build leaves no half-written model. A stale folder is replaced only when its
    stamp shows attnviz made it; anything else at that path is refused, never deleted."""
    root = root or cache_root()
    folder = root / key
    if is_current(folder, source):
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"cannot create the model cache {root}: {exc.strerror or exc}; set {CACHE_ENV} to a "
                             f"folder attnviz may write to") from None
    with _lock(root, key):
        if is_current(folder, source):  # another process built it meanwhile
            return folder
        if folder.exists() and _read_stamp(folder) is None:
            raise ModelLoadError(f"{folder} exists but attnviz did not make it; move it away (attnviz keeps "
                                 f"converted models there)")
        facts = _source_facts(source)
        stamp = {"kind": STAMP_KIND, "attnviz": __version__, "source": source.name,
                 "sha256": file_sha256(source), **facts}
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            build(staging)
            (staging / STAMP).write_text(json.dumps(stamp, indent=1), encoding="utf-8")
            if folder.exists():  # stale, and stamped by attnviz: replace it
                old = Path(tempfile.mkdtemp(prefix=f".{key}.old.", dir=root))
                os.replace(folder, old / key)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder
