"""The cache of converted models: a folder per model, built once from its source file and stamped.

    written    into a staging folder beside the entry, every file fsynced, then the stamp (the source's
               SHA-256, the attnviz version and the format of what it writes, and each file's size, time
               and SHA-256), then renamed into place: an interrupted or failed build (a full disk) leaves
               nothing
    read       the entry must be a real folder (a symbolic link is refused, never followed), hold exactly
               the files its stamp lists, each a regular file of the stamped size; a file whose time
               changed is hashed again and must match its SHA-256. Anything else is built again (the
               stamped folder is attnviz's own: it is moved aside and removed, links inside it removed, never
               followed)
    shared     one builder of an entry at a time (a lock file); a second process waits, then reads it
    stale      a staging folder whose key's lock no process holds (its conversion was killed outright) is
               removed the next time the cache is used
    read-only  a cache that cannot be written converts into a temporary folder for this run, with one
               warning

No torch here."""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from attnviz._version import __version__
from attnviz.errors import ModelLoadError, warn
from attnviz.base.files import sync

CACHE_ENV = "ATTNVIZ_CACHE_DIR"
STAMP = "attnviz-stamp.json"
STAMP_KIND = "attnviz converted model"
# What a conversion writes, numbered: a folder stamped with an older format is built again. 2: the tokenizer's
# added tokens also in tokenizer_config.json (record_added_tokens)
STAMP_FORMAT = 2


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
        if not stat.S_ISREG(os.lstat(folder / STAMP).st_mode):
            return None
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
    the file's size or time changed since the stamp was written), and holds what the stamp lists, unchanged."""
    refuse_link(folder)
    stamp = _read_stamp(folder)
    if stamp is None or stamp.get("attnviz") != __version__ or stamp.get("format") != STAMP_FORMAT:
        return False
    try:
        facts = _source_facts(source)
    except OSError:
        return False
    if facts["size"] != stamp.get("size"):
        return False
    if facts["mtime_ns"] != stamp.get("mtime_ns") and file_sha256(source) != stamp.get("sha256"):
        return False
    return _holds_what_it_lists(folder, stamp.get("files"))


def refuse_link(folder: Path) -> None:
    """A cache entry that is a symbolic link is not attnviz's: refused, never followed or replaced."""
    if folder.is_symlink():
        try:
            os.stat(folder)
            what = "a symbolic link"
        except OSError as exc:
            what = ("a symbolic link that loops back on itself (a damaged cache entry)" if exc.errno == errno.ELOOP
                    else "a symbolic link to nothing (a damaged cache entry)")
        raise ModelLoadError(f"{folder} is {what}; attnviz does not follow links in its model cache: remove "
                             f"{folder} and the model is converted again")


def refuse_broken_root(root: Path) -> None:
    """The cache folder, or a folder on its way, that is a symbolic link looping back on itself or leading
    nowhere: one line saying which link to remove (attnviz makes its cache folder again), never followed."""
    for path in (root, *root.parents):
        if not path.is_symlink():
            continue
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                how = f"loops back on itself (a damaged cache); remove {path} and attnviz makes its cache again"
            else:
                how = f"leads to {os.readlink(path)}, which does not exist; create that folder or remove {path}"
            raise ModelLoadError(f"the model cache {root} cannot be used: {path} is a symbolic link that {how}, "
                                 f"or set {CACHE_ENV} to another folder") from None


def _holds_what_it_lists(folder: Path, files) -> bool:
    """Exactly the listed files besides the stamp, each a regular file of its size, and of its SHA-256 when
    its time changed since it was written."""
    if not isinstance(files, dict) or not files:
        return False
    try:
        present = {entry.name for entry in folder.iterdir()} - {STAMP}
        if present != set(files):
            return False
        for name, listed in files.items():
            info = os.lstat(folder / name)
            if not isinstance(listed, dict) or not stat.S_ISREG(info.st_mode) or info.st_size != listed.get("size"):
                return False
            if info.st_mtime_ns != listed.get("mtime_ns") and file_sha256(folder / name) != listed.get("sha256"):
                return False
    except OSError:
        return False
    return True


def record_added_tokens(folder: Path) -> None:
    """The added tokens of the folder's tokenizer.json written into its tokenizer_config.json as
    `added_tokens_decoder`, as transformers' tokenizers saved them before version 5. Without them, transformers
    5 reads the whole tokenizer.json in Python on every load only to find those few tokens, besides the parse
    that builds the tokenizer: 0.55 s of the 1.3 s that loading multilingual's 17 MB tokenizer takes. With them,
    it builds the same tokenizer (the same AddedToken objects, from the same fields) and skips that read."""
    config_path, tokenizer_path = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (config_path.is_file() and tokenizer_path.is_file()):
        return
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        tokenizer = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not JSON: left as it is, for transformers to say so when it loads
        return
    if not isinstance(config, dict) or "added_tokens_decoder" in config or not isinstance(tokenizer, dict):
        return
    added = tokenizer.get("added_tokens") or []
    fields = {"content": str, "single_word": bool, "lstrip": bool, "rstrip": bool, "normalized": bool,
              "special": bool}
    if not isinstance(added, list) or not all(
            isinstance(t, dict) and type(t.get("id")) is int and isinstance(t.get("content"), str)
            and all(isinstance(t[k], kind) for k, kind in fields.items() if k in t) for t in added):
        return  # a list transformers would not read either: left to transformers as it was
    config["added_tokens_decoder"] = {str(token["id"]): {k: token[k] for k in fields if k in token}
                                      for token in added}
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _file_facts(path: Path) -> dict:
    info = os.lstat(path)
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256": file_sha256(path)}


STAGING = re.compile(r"\.(?P<key>[^/]+?)\.(?:old\.)?[a-z0-9_]{8}")  # what tempfile.mkdtemp names ours


def remove_stale_staging(root: Path) -> list[str]:
    """Remove the staging folders that a conversion killed outright (SIGKILL, a power cut) left in the cache
    (1.1 GB for Qwen2.5-Coder-1.5B); the names removed. A staging folder is stale when no process holds its
    key's lock: a live conversion holds it from before its folder is made until after it is renamed into
    place, so another process's folder is never touched. Only folders named as attnviz names them, beside
    their key's lock file, are removed (never a link, never what a link inside points to); a cache that
    cannot be read or written is left as it is."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    locks = {entry.name for entry in entries if entry.name.endswith(".lock")}
    for entry in entries:
        found = STAGING.fullmatch(entry.name)
        if found is None or f".{found['key']}.lock" not in locks:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            with _lock(root, found["key"], wait=False) as held:
                if held:
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.name)
        except OSError:
            continue
    return removed


@contextlib.contextmanager
def _lock(root: Path, key: str, *, wait: bool = True) -> Iterator[bool]:
    """One builder of a key at a time (a second process waits, then finds the folder built). Yields whether the
    lock is held: with wait=False, False when another process holds it."""
    path = root / f".{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    handle = os.fdopen(fd, "a+b")
    try:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except ImportError:  # pragma: no cover - Windows: no lock, the rename stays atomic
            yield wait  # a staging folder is never taken for stale there
            return
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        handle.close()


def cached_folder(key: str, source: Path, build: Callable[[Path], None], *, root: Path | None = None) -> Path:
    """The cache folder `key`, built from `source` by `build(temporary folder)` when missing or stale.

    The build writes into a temporary folder beside the final one, which is synced, stamped and then renamed
    into place, so an interrupted build leaves no half-written model. A stale folder is replaced only when its
    stamp shows attnviz made it; anything else at that path is refused, never deleted. A cache that cannot be
    written (read-only, no permission) converts into a temporary folder for this run, with a warning."""
    root = root or cache_root()
    folder = root / key
    remove_stale_staging(root)
    if is_current(folder, source):
        return folder
    refuse_broken_root(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _lock(root, key):
            if is_current(folder, source):  # another process built it meanwhile
                return folder
            if (folder.exists() or folder.is_symlink()) and _read_stamp(folder) is None:
                raise ModelLoadError(f"{folder} exists but attnviz did not make it; move it away (attnviz keeps "
                                     f"converted models there)")
            staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
            _build_into(staging, source, build)
            if folder.exists():  # stale or damaged, and stamped by attnviz: replaced
                old = Path(tempfile.mkdtemp(prefix=f".{key}.old.", dir=root))
                os.replace(folder, old / key)
                shutil.rmtree(old, ignore_errors=True)  # removes links inside, never what they point to
            os.replace(staging, folder)
            sync(root)
            return folder
    except OSError as exc:
        if exc.errno not in UNWRITABLE:
            raise ModelLoadError(f"cannot write the converted model into the cache {root}: "
                                 f"{exc.strerror or exc}; nothing was kept") from None
        reason = exc.strerror or str(exc)
    return _temporary_build(root, reason, key, source, build)


UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}  # a cache that cannot be written: converted elsewhere
NO_SPACE = ("No space left on device", "Disk quota exceeded", "File too large")  # the OS's words, in another type


def _build_into(staging: Path, source: Path, build: Callable[[Path], None]) -> None:
    """Build, sync and stamp the staging folder; on any failure remove it. A write that fails (a full disk:
    OSError, or the message safetensors raises in its own type) is one line."""
    facts = _source_facts(source)
    stamp = {"kind": STAMP_KIND, "attnviz": __version__, "format": STAMP_FORMAT, "source": source.name,
             "sha256": file_sha256(source), **facts}
    try:
        build(staging)
        record_added_tokens(staging)
        names = sorted(entry.name for entry in staging.iterdir())
        for name in names:
            if not stat.S_ISREG(os.lstat(staging / name).st_mode):
                raise ModelLoadError(f"converting {source.name} made {name!r}, which is not a file")
            sync(staging / name)
        stamp["files"] = {name: _file_facts(staging / name) for name in names}
        with open(staging / STAMP, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(stamp, indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        sync(staging)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, (ModelLoadError, KeyboardInterrupt, SystemExit)):
            raise
        found = next((words for words in NO_SPACE if words in str(exc)), None)
        if isinstance(exc, OSError) or found:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else found or exc
            code = getattr(exc, "errno", None) or errno.ENOSPC
            raise OSError(code, f"{why} while converting {source.name}") from None
        raise


def _temporary_build(root: Path, reason: str, key: str, source: Path, build: Callable[[Path], None]) -> Path:
    """Convert into a temporary folder removed when the process ends: the cache cannot be written."""
    try:
        staging = Path(tempfile.mkdtemp(prefix=f"attnviz-{key}."))
    except OSError as exc:
        raise ModelLoadError(f"the model cache {root} cannot be written ({reason}) and neither can a temporary "
                             f"folder ({exc.strerror or exc}); set {CACHE_ENV} to a folder attnviz may write "
                             f"to") from None
    atexit.register(shutil.rmtree, staging, True)
    warn(f"the model cache {root} cannot be written ({reason}): {source.name} is converted into a "
                  f"temporary folder for this run only; set {CACHE_ENV} to a folder attnviz may write to, to "
                  f"convert it once")
    try:
        _build_into(staging, source, build)
    except OSError as exc:
        raise ModelLoadError(f"cannot convert {source.name} into a temporary folder: {exc.strerror or exc}; "
                             f"nothing was kept") from None
    return staging
