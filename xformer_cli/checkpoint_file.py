"""Self-contained checkpoints: config, tokenizer, weights and training state.

One module that training, translation and export all read checkpoints through (as
fairseq's ``checkpoint_utils``): writing and reading them, the ``checkpoint_STEP.pt``
names a run keeps, and building the model a checkpoint describes.

Only tensors and plain Python data go in, so ``torch.load(weights_only=True)`` reads
them and a checkpoint from a stranger cannot run code. Writes are atomic: a temporary
file in the same directory is fsynced and then renamed over the old one.
"""

from __future__ import annotations

import codecs
import dataclasses
import io
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from xformer_cli.config import Config, config_from_dict
from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file, link_atomically, make_folder, unchanged_or, writing
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID, Tokenizer

FORMAT = "xformer-checkpoint"
VERSION = 3  # what save_checkpoint writes; load_checkpoint upgrades older ones (upgrade_checkpoint)


def safe_load_reads_bytes() -> bool:
    """Whether ``torch.load(weights_only=True)`` gives back a ``bytes`` that torch.save wrote
    (a checkpoint's tokenizer models are bytes)."""
    buffer = io.BytesIO()
    torch.save(b"spm", buffer)
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True) == b"spm"
    except pickle.UnpicklingError:  # torch 2.4: "Unsupported global: GLOBAL _codecs.encode"
        return False


def allow_bytes_in_safe_loads() -> None:
    """torch.save pickles bytes as a call to ``_codecs.encode`` (pickle protocol 2), which the
    weights-only unpickler allows from torch 2.5 on. torch 2.4 refuses it, so no checkpoint
    would load there: that one function is allowlisted (as 2.5 does itself), nothing else."""
    if not safe_load_reads_bytes():
        torch.serialization.add_safe_globals([codecs.encode])


allow_bytes_in_safe_loads()  # on import: every reader of checkpoints imports this module


def save_checkpoint(state: dict[str, Any], path: str | Path, also: Sequence[str | Path] = ()) -> None:
    """Write ``state`` to ``path`` (atomically), and make each of ``also`` another name of
    that file (hard links where the filesystem has them): one write for several names."""
    path = Path(path)
    make_folder(path.parent, str(path))
    payload = {"format": FORMAT, "version": VERSION, **state}
    intact = f"the previous {path.name} there is unchanged" if path.is_file() else "nothing was written there"
    size = _tensor_bytes(payload)
    with writing(path, size, intact):
        _atomic_save(payload, path)
    for other in map(Path, also):
        with writing(other, size, unchanged_or(other, "nothing was written there")):
            link_atomically(path, other)


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
    with atomic_file(path, "wb") as handle:
        torch.save(payload, handle)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise XformerError(f"{path} is a directory, not a checkpoint file" if path.is_dir()
                           else f"checkpoint not found: {path}")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning would come before the one line
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch.load on arbitrary bytes can raise nearly anything
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not zipfile.is_zipfile(path):
            reason = "not a torch.save zip archive"
        raise XformerError(f"{path} is not a readable xformer checkpoint "
                           f"(truncated or foreign file: {reason[:160]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise XformerError(f"{path} is not an xformer checkpoint")
    version = state.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        raise XformerError(f"{path}: checkpoint version {version} is not supported (this xformer reads 1 to {VERSION})")
    return upgrade_checkpoint(state)


def read_light(path: str | Path) -> dict[str, Any]:
    """A checkpoint's entries without reading its weights (memory-mapped: its config, step,
    languages), for a look that should not cost a load; {} when it is not a dict."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an older file format: read it whole (one-line errors)
        state = load_checkpoint(path)
    return state if isinstance(state, dict) else {}


def upgrade_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` in the current format, whichever version wrote it: every reader (training,
    translation, export) passes here, so none needs a default for a key added later.

    Version 1 (also a checkpoint without a version) may lack parts of the training state that
    later runs save: the loss scaler, the count of skipped non-finite updates, the open logging
    window, and the random state per rank (one process then). Version 2 always has them.
    Version 3 adds the count of updates skipped because a rank ran out of memory (none before).
    """
    version = state.get("version", 1)
    if version < 2 and "optimizer" in state:  # a training checkpoint, not average.pt
        state.setdefault("scaler", {})  # an empty state: the scaler was off
        state.setdefault("nonfinite_total", 0)
        state.setdefault("log_window", {"loss_sum": 0.0, "good_tokens": 0.0})
        rng = state["rng"]
        rng.setdefault("ranks", [dict(rng)])
    if version < 3 and "optimizer" in state:
        state.setdefault("oom_total", 0)
    state["version"] = VERSION
    return state


# -- the step checkpoints a run keeps (train.keep_checkpoints) -------------------------------

STEP_PREFIX = "checkpoint_"


def step_checkpoint(run_dir: str | Path, step: int) -> Path:
    """Where a run keeps its weights of ``step``: ``RUN_DIR/checkpoint_STEP.pt``."""
    return Path(run_dir) / f"{STEP_PREFIX}{step}.pt"


def checkpoint_step(path: str | Path) -> int:
    """The step in a ``checkpoint_STEP.pt`` name; 0 for any other name."""
    stem = Path(path).stem
    number = stem[len(STEP_PREFIX):]
    return int(number) if stem.startswith(STEP_PREFIX) and number.isdigit() else 0


def kept_checkpoints(run_dir: str | Path) -> list[Path]:
    """The step checkpoints a run kept, oldest first."""
    return sorted(Path(run_dir).glob(f"{STEP_PREFIX}*.pt"), key=checkpoint_step)


# -- the model a checkpoint describes ---------------------------------------------------------

def build_model(config: Config, tokenizer: Tokenizer, output_pieces: Optional[torch.Tensor] = None) -> Transformer:
    """The Transformer of ``config.model``, its vocabularies sized by ``tokenizer``; with
    ``output_pieces`` (sorted ids: train/output_pieces.target_pieces), an output layer that
    scores only those (``model.restrict_output``)."""
    tgt_vocab = 0 if tokenizer.joint else tokenizer.tgt_vocab_size
    if output_pieces is None:
        return Transformer(config.model, tokenizer.src_vocab_size, tgt_vocab, PAD_ID)
    restricted = dataclasses.replace(config.model, restrict_output=True, output_pieces=output_pieces.numel())
    model = Transformer(restricted, tokenizer.src_vocab_size, tgt_vocab, PAD_ID)
    model.restrict_output(output_pieces)
    return model


def load_model(path: str | Path, state: Optional[dict] = None) -> tuple[Transformer, Tokenizer, Config]:
    """The model (eval mode), tokenizer and config of a checkpoint; one-line errors."""
    state = load_checkpoint(path) if state is None else state
    try:
        config = config_from_dict(state["config"])
        tok = state["tokenizer"]
        tokenizer = Tokenizer.from_state(tok)
        model = build_model(config, tokenizer)
        model.load_state_dict(state["model"])
    except (KeyError, TypeError, RuntimeError) as exc:
        detail = " ".join(str(exc).split())[:160]  # torch's size-mismatch report runs over many lines
        raise XformerError(f"{path}: checkpoint is incomplete or does not match its config "
                           f"({type(exc).__name__}: {detail})") from None
    return model.eval(), tokenizer, config
