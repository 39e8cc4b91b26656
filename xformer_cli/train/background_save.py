"""Writing a run's checkpoints while it trains on.

A save copies the training state to host memory at the step it is taken (what a resume
needs, exactly), and on an accelerator the file is then written by a background thread
while the device goes on training: torch.save must copy the tensors off the device anyway,
and on a fast GPU the disk write of a base-size state (weights and Adam's moments) cost
more than a dozen steps each time. On a CPU the copy would be extra work on the cores that
train, so there the write stays inline.

One write is in flight at a time; ``wait`` joins it and raises its error (a full disk:
one line), and the trainer waits before anything reads the files back (averaging, the
length-penalty pass) and before it exits. A kill during a write leaves the previous files
as they were (the write goes to a temporary name first: ``fileio.atomic_file``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from xformer_cli.checkpoint_file import save_checkpoint


def writes_in_background(device: torch.device) -> bool:
    """Whether saves on ``device`` are written by a background thread (any accelerator)."""
    return device.type != "cpu"


def host_copy(value: Any, pin: bool = False) -> Any:
    """``value`` (nested dicts, lists, tuples) with every tensor copied to host memory, so later
    in-place updates of the live tensors leave it as it was. Device tensors are copied without
    waiting (into pinned memory with ``pin``): the caller synchronises before reading them."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value.detach().clone()
        out = torch.empty(value.shape, dtype=value.dtype, pin_memory=pin)
        return out.copy_(value.detach(), non_blocking=pin)
    if isinstance(value, dict):
        return {key: host_copy(item, pin) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(item, pin) for item in value)
    return value


def _save(state: dict, path: Path, also: Sequence[Path], then: Optional[Callable[[], None]]) -> None:
    save_checkpoint(state, path, also)
    if then is not None:
        then()


class CheckpointWriter:
    """Writes checkpoints inline, or (``background``) from a host copy on a worker thread."""

    def __init__(self, background: bool):
        self.background = background
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def write(self, state: dict, path: Path, also: Sequence[Path] = (),
              then: Optional[Callable[[], None]] = None) -> None:
        """Write ``state`` to ``path`` with ``also`` as other names of it, then call ``then``
        (pruning old files). Raises the error of the previous write, if it had one."""
        self.wait()
        if not self.background:
            _save(state, path, also, then)
            return
        pin = torch.cuda.is_available()
        snapshot = host_copy(state, pin)
        copied = torch.cuda.Event() if pin else None
        if copied is not None:
            copied.record()  # after the copies on the current stream; the thread waits for it
        self._thread = threading.Thread(target=self._write, args=(snapshot, path, also, then, copied),
                                        name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _write(self, snapshot: dict, path: Path, also: Sequence[Path], then: Optional[Callable[[], None]],
               copied: Optional["torch.cuda.Event"]) -> None:
        try:
            if copied is not None:
                copied.synchronize()
            _save(snapshot, path, also, then)
        except BaseException as exc:  # handed to the training thread by wait()
            self._error = exc

    def wait(self, raise_error: bool = True) -> None:
        """Until the write in flight is on disk; then raise its error (``raise_error``)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None and raise_error:
            raise error

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
