"""Self-contained checkpoints: config, tokenizer, weights and training state.

Only tensors and plain Python data go in, so ``torch.load(weights_only=True)`` reads
them and a checkpoint from a stranger cannot run code. Writes are atomic: a temporary
file in the same directory is fsynced and then renamed over the old one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from xformer_cli.errors import XformerError, writing

FORMAT = "xformer-checkpoint"
VERSION = 1


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "version": VERSION, **state}
    intact = f"the previous {path.name} there is unchanged" if path.is_file() else "nothing was written there"
    with writing(path, _tensor_bytes(payload), intact):
        _atomic_save(payload, path)


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state: about what the checkpoint will take."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _atomic_save(payload: dict, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise XformerError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch.load on arbitrary bytes can raise nearly anything
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise XformerError(f"{path} is not a readable xformer checkpoint (truncated or foreign file: {reason[:160]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise XformerError(f"{path} is not an xformer checkpoint")
    if state.get("version") != VERSION:
        raise XformerError(f"{path}: checkpoint version {state.get('version')} is not supported (expected {VERSION})")
    return state
