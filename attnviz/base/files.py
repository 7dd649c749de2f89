"""Files in and out, in one place. Pure Python.

Reading what someone else gave: only regular files, never a FIFO, device or socket (opening a FIFO blocks
until a writer comes; /dev/zero never ends). Writing: a file through a temporary beside it, renamed into
place (atomic_output); a folder of attnviz's through a staging folder and a manifest (write_folder), so an
error never leaves a half-written file and --force never deletes what attnviz did not write."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import tempfile
from collections.abc import Callable
import hashlib
from pathlib import Path
from typing import BinaryIO

from attnviz._version import __version__
from attnviz.errors import InputError, OutputError, arg

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def kind_of(mode: int) -> str | None:
    """What a file is when it is not a regular file ("a FIFO (named pipe)"), else None."""
    return next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def open_regular(path: str | Path, what: str = "file", error: type[Exception] = InputError) -> BinaryIO:
    """`path` opened for reading in binary, after checking that it is a regular file. The file is opened
    without blocking (a FIFO would block in open() itself) and checked on the open descriptor, so it cannot
    be swapped in between. `error` is raised, with one line saying what the path is instead."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        kind = kind_of(mode)
        if kind is not None:
            hint = "; give a regular file, or - to read standard input" if what == "text" else ""
            raise error(f"{path} is {kind}, not a regular file{hint}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int, what: str = "file", error: type[Exception] = InputError) -> bytes:
    """At most limit + 1 bytes of a regular file (the caller tells "too large" from limit + 1)."""
    with open_regular(path, what, error) as handle:
        return handle.read(limit + 1)


def read_input(source: str | Path | None, limit: int, what: str) -> tuple[bytes, str]:
    """(a file's bytes, its name for messages) for an input read whole (an image, a sound); None reads standard
    input. At most `limit` bytes: a larger one, or one that cannot be read, is InputError naming the argument."""
    import sys

    if source is None:
        data = sys.stdin.buffer.read(limit + 1)
        name = "standard input"
    else:
        name = str(source)
        try:
            data = read_regular(Path(source), limit, what)
        except OSError as exc:
            raise InputError(f"cannot read the {what} {name}: {exc.strerror or exc}", what) from None
    if len(data) > limit:
        raise InputError(f"the {what} in {name} is over {limit >> 20} MB", what)
    return data, name


# --- writing a file ------------------------------------------------------------------------------------


class atomic_output:
    """Context manager yielding a temporary path beside `path`; on success it is renamed onto
    `path`, on any error it is removed, so no half-written file is left behind.
    Missing parent folders are created; permission problems become OutputError."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __enter__(self) -> Path:
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=parent)
        except OSError as exc:
            raise OutputError(f"cannot write to {parent}: {exc.strerror or exc}") from None
        os.close(fd)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; give the file the usual mode
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                sync(self.tmp)  # on disk before it takes the name: a crash leaves the old file or the new one
                os.replace(self.tmp, self.path)
                return
            except OSError as err:
                self.tmp.unlink(missing_ok=True)
                raise OutputError(f"cannot write {self.path}: {err.strerror or err}") from None
        self.tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # a full disk, a quota, an I/O error while writing: one line
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}; nothing was written") from None


def sync(path: Path) -> None:
    """fsync a file (or a folder's list of names), so that what was written is on disk before a rename."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - file systems that cannot sync a folder say EINVAL
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- writing a folder -----------------------------------------------------------------------------------
# The export is written into a staging folder beside the target and moved into place at the end. What may
# be replaced is decided by a manifest: an export lists every file it wrote, with size and SHA-256, in
# MANIFEST. `--force` replaces a folder only when everything in it is exactly such a list of files, and the
# state of the target is checked again at the moment of the swap, so a file put there meanwhile, or a
# second export into the same folder, is never deleted: the later export says so and changes nothing.

MANIFEST = "attnviz-export.json"
MANIFEST_KIND = "attnviz export"


def write_folder(target: str | os.PathLike, force: bool, fill: Callable[[Path], None], what: str = "export") -> Path:
    """Write a folder of attnviz's atomically: `fill(staging)` writes every file into a staging folder beside
    `target`, which, with a manifest of what it holds, takes `target`'s place only when complete. Returns the
    folder written (symbolic links resolved). `target` must be absent, empty, or (with `force`) an earlier
    attnviz folder, unchanged."""
    target = export_folder(target)
    before = check_target(target, force, what)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent))
    except OSError as exc:
        raise OutputError(f"cannot write to {target.parent}: {exc.strerror or exc}") from None
    try:
        fill(staging)
        write_manifest(staging, what)
        for entry in staging.iterdir():
            sync(entry)
        sync(staging)
        _swap(staging, target, before)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputError(f"cannot write the {what} {target}: {exc.strerror or exc}; nothing was changed") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def export_folder(target: str | os.PathLike) -> Path:
    """The folder an export will become, as an absolute path: "." and symbolic links are resolved (a link
    to a folder keeps pointing at the new export), files, broken links and the root are refused."""
    path = Path(target).expanduser()
    if path.is_symlink():
        if not path.exists():
            raise OutputError(f"{path} is a broken symbolic link; remove it or choose another {arg('out_dir')}")
    path = path.resolve()
    if path.parent == path:
        raise OutputError(f"cannot export to {path}: choose a folder below it")
    if path.exists() and not path.is_dir():
        raise OutputError(f"{path} exists and is not a folder")
    return path


def check_target(target: Path, force: bool, what: str = "export") -> str:
    """What is at `target` now: "absent", "empty", or the manifest digest of an earlier folder of the same
    kind (`what`: "export", "corpus statistics"; only with `force`). Anything else is refused, so --force never
    deletes a folder of the user's own, nor one another attnviz command wrote."""
    try:
        entries = list(target.iterdir()) if target.is_dir() else None
    except OSError as exc:
        raise OutputError(f"cannot read {target}: {exc.strerror or exc}") from None
    if entries is None:
        return "absent"
    if not entries:
        return "empty"
    if not force:
        raise OutputError(f"{target} is not empty; pass {arg('force')} to replace an earlier attnviz {what} there")
    return earlier_export(target, what)


def written_by(listed: dict) -> str:
    """What kind of folder a manifest says it is ("export", "corpus statistics"); manifests written before the
    kind was recorded are told apart by their files."""
    kind = listed.get("folder")
    if isinstance(kind, str):
        return kind
    return "corpus statistics" if "stats.json" in listed.get("files", {}) else "export"


def earlier_export(folder: Path, what: str = "export") -> str:
    """The digest of `folder`'s manifest if the folder holds exactly the files an earlier `what` (an export,
    corpus statistics) wrote, unchanged; otherwise OutputError naming what is not that command's."""
    refuse = f"refusing to replace {folder} even with {arg('force')}"
    manifest = folder / MANIFEST
    try:
        raw = manifest.read_bytes() if manifest.is_file() and not manifest.is_symlink() else None
        listed = json.loads(raw) if raw is not None and len(raw) < 1_000_000 else None
    except (OSError, ValueError, RecursionError):
        listed = None
    if (raw is None or not isinstance(listed, dict) or listed.get("kind") != MANIFEST_KIND
            or not isinstance(listed.get("files"), dict)):
        raise OutputError(f"{folder} is not an attnviz {what} (it has no {MANIFEST}); {refuse}")
    if written_by(listed) != what:
        raise OutputError(f"{folder} holds attnviz {written_by(listed)[:40]}, not an attnviz {what}; {refuse} "
                          f"(choose another folder)")
    files = listed["files"]
    present = {entry.name for entry in folder.iterdir()} - {MANIFEST}
    strange = [name for name in files if not isinstance(name, str) or name not in present]
    if strange:  # a manifest must list exactly the files beside it (and no paths elsewhere)
        raise OutputError(f"{folder}'s {MANIFEST} lists {str(strange[0])[:80]!r}, which is not there; {refuse}")
    for entry in folder.iterdir():
        if entry.name == MANIFEST:
            continue
        expected = files.get(entry.name)
        if expected is None or entry.is_symlink() or not entry.is_file():
            raise OutputError(f"{folder} holds {entry.name!r}, which attnviz did not write; {refuse}")
        if not isinstance(expected, dict) or _fingerprint(entry) != expected:
            raise OutputError(f"{entry} was changed since attnviz wrote it; {refuse}")

    return hashlib.sha256(raw).hexdigest()


def _fingerprint(path: Path) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def write_manifest(folder: Path, what: str = "export") -> None:
    """The manifest: every file of the folder with its size and SHA-256, and which command wrote it."""

    files = {entry.name: _fingerprint(entry) for entry in sorted(folder.iterdir())}
    manifest = {"kind": MANIFEST_KIND, "folder": what, "attnviz_version": __version__, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _swap(staging: Path, target: Path, before: str) -> None:
    """Move the finished staging folder onto `target`, if `target` is still what check_target saw.
    Ctrl-C and SIGTERM wait until the renames are done, so an earlier export is never left half-moved."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked) if hasattr(signal, "pthread_sigmask") else None
    try:
        _swap_now(staging, target, before)
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _swap_now(staging: Path, target: Path, before: str) -> None:
    changed = f"{target} changed while the export ran (another export, or a file put there); nothing was replaced"
    if before == "absent":
        try:
            os.rename(staging, target)  # atomic; fails if something is there now
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise OutputError(changed) from None
            raise
        os.chmod(target, 0o777 & ~current_umask())  # mkdtemp makes the folder 0700; give it the usual mode
        return
    # The folder itself stays (it may be the current folder, or a symbolic link's target): the earlier
    # export's files are moved aside, the new files linked in one by one (a link never replaces a file),
    # and anything that goes wrong puts everything back.
    now = "empty" if not any(target.iterdir()) else _digest_or_none(target)
    if now != before:
        raise OutputError(changed)
    old = [] if before == "empty" else [*json.loads((target / MANIFEST).read_text(encoding="utf-8"))["files"],
                                        MANIFEST]
    aside = staging.with_name(staging.name.removesuffix(".part") + ".old")
    aside.mkdir()
    moved_old: list[str] = []
    linked: list[str] = []
    try:
        for name in old:
            os.rename(target / name, aside / name)
            moved_old.append(name)
        if old and _digest_or_none(aside) != before:  # edited in the moment between the check and the move
            raise OutputError(changed)
        for entry in sorted(staging.iterdir()):
            try:
                os.link(entry, target / entry.name)
            except FileExistsError:
                raise OutputError(changed) from None
            linked.append(entry.name)
    except BaseException:
        for name in linked:
            (target / name).unlink(missing_ok=True)
        for name in moved_old:
            os.rename(aside / name, target / name)
        aside.rmdir()
        raise
    shutil.rmtree(staging, ignore_errors=True)  # only the new files' second names: they live on in target
    for name in moved_old:
        (aside / name).unlink()
    aside.rmdir()


def _digest_or_none(folder: Path) -> str | None:
    """The manifest digest of an unchanged attnviz folder (of whichever kind), else None."""
    try:
        listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return earlier_export(folder, written_by(listed) if isinstance(listed, dict) else "export")
    except (OSError, ValueError, RecursionError, TypeError, AttributeError, OutputError):
        return None


def check_suffix(path: str | os.PathLike, allowed: tuple[str, ...]) -> Path:
    """Raise OutputError unless `path` ends in one of `allowed` (".png", ...). Returns it as a Path."""
    path = Path(path)
    if path.suffix.lower() not in allowed:
        raise OutputError(f"unknown output format {path.suffix or '(no suffix)'!r} for {path}: use "
                          f"{', '.join(allowed)}")
    return path
