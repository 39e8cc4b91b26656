"""One writer per run folder: ``train``, ``prepare`` and ``pipeline`` hold ``<run_dir>/.xformer.lock``
while they write there, so a second command started on the same folder, or inside a folder a
pipeline holds (another terminal, a scheduler's retry), stops at once with one line naming the
first, instead of interleaving its checkpoints, metrics and caches with the first's.

The lock is an ``flock``: the kernel lets it go when its process ends, ``kill -9`` included, so
no stale lock outlives a run and there is nothing to clean up. Readers (``translate``, ``serve``,
``pipeline --status``) take no lock. It keeps processes apart, not threads of one process. Without
``fcntl`` (Windows), or where no lock can be had (a filesystem that refuses locks, a lock file
that cannot be opened), commands run unlocked, as before."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from xformer_cli.errors import XformerError
from xformer_cli.fileio import make_folder

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

LOCK_NAME = ".xformer.lock"
# A peek (``holder``) holds a shared lock for an instant: a writer starting then tries again
# for this long before it calls the folder in use.
_PATIENCE_SECONDS = 0.5
_held: dict[str, "_Hold"] = {}  # folders this process holds: a hold inside a hold passes through


@dataclass(frozen=True)
class Holder:
    """Who holds a run folder, as its lock file says."""

    pid: int
    command: str
    since: str
    stage: str = ""  # a pipeline's current stage

    def describe(self) -> str:
        """"pid 4242 (xformer train, since 2026-11-30 13:40:02)"."""
        at = f", stage {self.stage}" if self.stage else ""
        return f"pid {self.pid} ({self.command}{at}, since {self.since})"


@dataclass
class _Hold:
    fd: int
    writable: bool  # a lock file of another user's is locked read-only, its note left as it is
    info: dict
    created: bool = False  # this hold made the folder
    depth: int = 1

    def write(self) -> None:
        """The note ``holder`` reads; only shown, so a failed write is let go."""
        if self.writable:
            data = json.dumps(self.info).encode()
            with contextlib.suppress(OSError):
                os.pwrite(self.fd, data, 0)  # written over, then cut: never an empty file to a peek
                os.ftruncate(self.fd, len(data))


def _key(run_dir: Path) -> str:
    return str(run_dir.resolve())


def _is_worker_rank() -> bool:
    """Under torchrun every rank runs the command; rank 0 holds the folder for all of them."""
    return os.environ.get("RANK", "0") not in ("", "0")


@contextlib.contextmanager
def holding(run_dir: Path | str, command: str) -> Iterator[None]:
    """Hold ``run_dir`` (created if missing) for ``command`` while the block runs; raises a
    one-line XformerError naming the holder when another process holds it or a folder above
    it. A folder this made and the block left empty (bad input stops a run before it writes)
    is removed again."""
    run_dir = Path(run_dir)
    if fcntl is None or _is_worker_rank():
        yield
        return
    created = not run_dir.exists()
    key = _key(run_dir)
    if key in _held:  # this process holds it already (a library call inside a command that holds it)
        _held[key].depth += 1
    else:
        _refuse_inside_a_held_folder(run_dir)
        opened = _acquire(run_dir)
        if opened is None:
            yield
            return
        hold = _Hold(*opened, {"pid": os.getpid(), "command": command,
                               "since": time.strftime("%Y-%m-%d %H:%M:%S")}, created=created)
        hold.write()
        _held[key] = hold
    try:
        yield
    finally:
        _release(key)


def _refuse_inside_a_held_folder(run_dir: Path) -> None:
    """A train run inside the folder of a pipeline running in another process (its stage's
    folder, which the pipeline may set aside or remove) is refused as the folder itself is."""
    for folder in run_dir.resolve().parents:
        found = _other_holder(folder)
        if found is not None:
            raise XformerError(f"{run_dir} lies inside {folder}, in use by {found.describe()}: "
                               f"wait for it to end, or give another run_dir")


def _release(key: str) -> None:
    hold = _held[key]
    hold.depth -= 1
    if hold.depth:
        return
    del _held[key]
    folder = Path(key)
    try:
        with contextlib.suppress(OSError):
            if hold.created and [p.name for p in folder.iterdir()] == [LOCK_NAME]:
                (folder / LOCK_NAME).unlink()  # still held, so nobody is inside; _acquire checks the file it locks
                folder.rmdir()
    finally:
        os.close(hold.fd)  # closing lets the flock go


def _acquire(run_dir: Path) -> Optional[tuple[int, bool]]:
    """(an fd holding the exclusive flock of ``run_dir``'s lock file, whether it is writable),
    or None where no lock can be had. The file locked must still be the one at the path: a
    holder that removed its empty folder on the way out may have unlinked the file this opened."""
    path = run_dir / LOCK_NAME
    deadline = time.monotonic() + _PATIENCE_SECONDS
    while True:
        make_folder(run_dir, "config key 'run_dir'")
        opened = _open(path)
        if opened is None:
            return None
        fd, writable = opened
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise XformerError(_in_use(run_dir)) from None
        except OSError:  # e.g. ENOLCK on a network filesystem: run unlocked
            os.close(fd)
            return None
        else:
            if _same_file(fd, path):
                return fd, writable
            os.close(fd)
            if time.monotonic() >= deadline:  # a filesystem whose files change identity: run unlocked
                return None
        time.sleep(0.02)


def _open(path: Path) -> Optional[tuple[int, bool]]:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True  # the umask decides, as for every file
    except IsADirectoryError:
        raise XformerError(f"{path} is a folder: xformer keeps its lock file there; remove it") from None
    except OSError:  # another user's lock file, a read-only disk: lock it read-only, or not at all
        try:
            return os.open(path, os.O_RDONLY), False
        except OSError:
            return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, locked = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (locked.st_dev, locked.st_ino)


def _in_use(run_dir: Path) -> str:
    found = holder(run_dir)
    who = found.describe() if found else "another process"
    return (f"{run_dir} is in use by {who}: one command writes a run folder at a time; "
            f"wait for it to end, or stop it (run the command again afterwards to go on from where it stopped)")


def holder(run_dir: Path | str) -> Optional[Holder]:
    """Who holds ``run_dir`` now (None: nobody), read without creating or changing anything."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    if fcntl is None or not path.is_file():
        return None
    mine = _held.get(_key(run_dir))
    if mine is not None:
        return _holder_of(mine.info)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_of(_read_info(fd)) or Holder(0, "a process that left no note", "unknown")
        except OSError:
            return None
        return None  # free: the shared lock goes with the fd
    finally:
        os.close(fd)


def held_inside(folder: Path) -> Optional[tuple[Path, Holder]]:
    """A run folder under ``folder`` (or ``folder`` itself) that another process holds, and
    who: a pipeline stage about to clear its folder asks first."""
    if not folder.is_dir():
        return None
    for lock in folder.rglob(LOCK_NAME):
        found = _other_holder(lock.parent)
        if found is not None:
            return lock.parent, found
    return None


def _other_holder(folder: Path) -> Optional[Holder]:
    """Who holds ``folder`` when it is another process (None: nobody, or this one)."""
    return None if _key(folder) in _held else holder(folder)


def set_stage(run_dir: Path | str, stage: str) -> None:
    """Name the stage a pipeline holding ``run_dir`` is at now (for ``pipeline --status``)."""
    hold = _held.get(_key(Path(run_dir)))
    if hold is not None:
        hold.info["stage"] = stage
        hold.write()


def _read_info(fd: int) -> dict:
    for _ in range(3):  # a note caught mid-write reads again
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode())
        except (OSError, ValueError):
            time.sleep(0.01)
            continue
        return info if isinstance(info, dict) else {}
    return {}


def _holder_of(info: dict) -> Optional[Holder]:
    if not isinstance(info.get("pid"), int):
        return None
    return Holder(info["pid"], str(info.get("command", "")), str(info.get("since", "")), str(info.get("stage", "")))
