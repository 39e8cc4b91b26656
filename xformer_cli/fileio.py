"""Writing files and directories whole or not at all, and the one line a full disk gives.

Every output (checkpoints, translations, exports, the token cache) is written under a
temporary name beside its target (the same directory, so the rename never crosses a
filesystem), fsynced, renamed over the target, and then the directory holding it is
fsynced. Without the fsyncs a power loss soon after the rename can leave the new name
pointing at an empty file; without the temporary name a failed write (a full disk, an
interrupt) would leave half a file where a good one was.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator, Optional

from xformer_cli.errors import XformerError

# -- a full disk ---------------------------------------------------------------------------

_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from or while handling, is a full disk
    (torch's zip writer reports one as a RuntimeError raised while handling the OSError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return True
        if isinstance(exc, RuntimeError) and "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_full_error(path: "str | Path", needed: Optional[int] = None, intact: Optional[str] = None) -> XformerError:
    """One line: the file that could not be written, the space there and what is still safe."""
    path = Path(path)
    where = path.parent if path.parent.exists() else Path(".")
    try:
        free = f"{_size(shutil.disk_usage(where).free)} free"
    except OSError:
        free = "free space unknown"
    need = f", about {_size(needed)} needed" if needed else ""
    safe = f"; {intact}" if intact else ""
    return XformerError(f"could not write {path}: no space left on device ({free}{need}){safe}")


@contextlib.contextmanager
def writing(path: "str | Path", needed: Optional[int] = None, intact: Optional[str] = None) -> Iterator[None]:
    """Turn a full disk while writing ``path`` into one ``XformerError`` line (the caller's
    own clean-up, removing its temporary file, has run by the time this sees it)."""
    try:
        yield
    except Exception as exc:
        if disk_full(exc):
            raise disk_full_error(path, needed, intact) from None
        raise


def unchanged_or(path: Path, otherwise: str) -> str:
    """What a failed write of ``path`` left safe: the previous one, or ``otherwise``."""
    return f"the previous {path.name} is unchanged" if path.exists() else otherwise


# -- durable writes ------------------------------------------------------------------------

def sync_directory(path: "str | Path") -> None:
    """fsync a directory, which makes the names created or renamed in it durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(root: "str | Path") -> None:
    """fsync every file below ``root`` and every directory, ``root`` last: for a directory
    that other libraries wrote (numpy, safetensors, ctranslate2), which never fsync."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        sync_directory(directory)


def unwritable_folder(folder: Path) -> Optional[str]:
    """Why files cannot be made in ``folder`` (an existing directory), or None when they can."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "a read-only file system" if read_only else "no permission to write there"


def _cannot_make(path: Path, exc: OSError) -> XformerError:
    """The one line for a file or folder beside which nothing can be written (not a full disk)."""
    return XformerError(f"cannot write {path}: {exc.strerror or exc}")


@contextlib.contextmanager
def atomic_file(path: "str | Path", mode: str = "wb", *, encoding: Optional[str] = None,
                newline: Optional[str] = None) -> Iterator[IO]:
    """A handle on a temporary sibling of ``path`` that replaces ``path`` only when the block
    succeeds, fsynced before and after the rename; on any failure it is removed and
    ``path`` is as it was. A device or a pipe (``/dev/null``, ``/dev/stdout``, a FIFO) is
    written into as it is: renaming a file over it would replace the node itself."""
    path = Path(path)
    if path.is_dir():
        raise XformerError(f"{path} is a directory: give a file name to write")
    if path.exists() and not path.is_file():  # asked before resolving: /dev/stdout on a pipe resolves to no path
        with open(path, mode, encoding=encoding, newline=newline) as handle:
            yield handle
        return
    if path.is_symlink():  # the link stays, pointing at the new file
        path = path.resolve()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        if disk_full(exc):
            raise
        raise _cannot_make(path, exc) from None
    with _removed_on_failure(tmp):
        os.fchmod(fd, _mode_for(path, 0o666))  # mkstemp's 0600 would hide the file from others
        with os.fdopen(fd, mode, encoding=encoding, newline=newline) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    sync_directory(path.parent)


def same_file(a: "str | Path | None", b: "str | Path | None") -> bool:
    """Whether ``a`` and ``b`` are one existing file (links and other spellings included)."""
    return a is not None and b is not None and Path(a).exists() and Path(b).exists() and os.path.samefile(a, b)


def new_output_file(path: "str | Path", force: bool) -> Path:
    """``path`` as a command's output file (-o): one that exists is replaced only with --force,
    so a checkpoint already written is never lost to a mistyped name; a directory never is."""
    path = Path(path)
    if path.is_dir():
        raise XformerError(f"{path} is a directory: -o takes the file to write")
    if path.exists() and not force:
        raise XformerError(f"{path} exists (use --force to replace it)")
    return path


def is_inside(path: "str | Path", folder: "str | Path") -> bool:
    """Whether ``path`` is ``folder`` or lies under it (links resolved: another spelling of it counts)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def _mode_for(path: Path, default: int) -> int:
    """The permissions a file written anew at ``path`` gets: the old file's, else what
    ``open`` would give (``default`` less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return default & ~_UMASK


@contextlib.contextmanager
def _removed_on_failure(tmp: "str | Path") -> Iterator[None]:
    """A temporary file that the block fails to rename into place is removed."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_NO_HARD_LINKS = (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)


def link_atomically(source: "str | Path", target: "str | Path") -> None:
    """``target`` becomes another name of the (complete) file ``source``: a hard link, made
    under a temporary name and renamed over ``target``, so ``target`` is either the old file
    or the new one; a copy (``atomic_file``) where the filesystem has no hard links. One file
    written once can then be both a run's last.pt and its step checkpoint."""
    source, target = Path(source), Path(target)
    tmp = target.parent / f".{target.name}.{os.getpid()}.link.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        os.link(source, tmp)
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        with open(source, "rb") as src, atomic_file(target) as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        return
    with _removed_on_failure(tmp):
        os.replace(tmp, target)
    sync_directory(target.parent)


def make_folder(folder: Path, named: str = "") -> None:
    """``folder`` and its parents, or one line saying why not (a file in the way, a read-only
    disk, no permission); ``named``: what the user called it (a config key, an option)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if disk_full(exc):
            raise
        said = f"{named}: " if named else ""
        why = {FileExistsError: "a file has that name", NotADirectoryError: "a file stands in its path"}.get(
            type(exc), exc.strerror or str(exc))
        raise XformerError(f"{said}cannot make the folder {folder}: {why}") from None


@contextlib.contextmanager
def atomic_directory(target: Path, *, staging_name: Optional[str] = None, replace: bool = True) -> Iterator[Path]:
    """An empty staging directory beside ``target`` that, when the block succeeds, is fsynced
    whole and renamed to ``target``; on any failure it is removed and ``target`` is as it was.

    An existing ``target`` is replaced (set aside first, removed once the new one is in
    place), or with ``replace=False`` kept: the staging directory is dropped and
    ``FileExistsError`` raised, for a cache where the first build to finish wins.
    ``staging_name`` names the staging directory (it must not exist) instead of a fresh
    temporary name.
    """
    make_folder(target.parent, str(target))
    try:
        if staging_name is None:
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
            staging.chmod(_mode_for(target, 0o777))  # mkdtemp's 0700, as mkdir would have made it
        else:
            staging = target.parent / staging_name
            staging.mkdir()
    except (PermissionError, OSError) as exc:
        if disk_full(exc) or isinstance(exc, FileExistsError):
            raise
        raise _cannot_make(target, exc) from None
    try:
        yield staging
        sync_tree(staging)
        (_replace_directory if replace else _rename_new_directory)(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sync_directory(target.parent)


def _replace_directory(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an old ``target`` is set aside first and removed last."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / target.name)
    try:
        os.replace(staging, target)
    except BaseException:
        if old is not None:  # put the previous one back
            os.replace(old / target.name, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _rename_new_directory(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target`` unless a non-empty ``target`` is already there."""
    try:
        os.rename(staging, target)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        raise FileExistsError(errno.EEXIST, "already exists", str(target)) from exc
