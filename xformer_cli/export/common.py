"""What every exporter shares: reading the checkpoint, and writing a directory whole or not at all."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Callable

from xformer_cli.checkpoint_file import load_checkpoint, load_model
from xformer_cli.config import Config
from xformer_cli.errors import XformerError
from xformer_cli.export.format import EXPORT_FILES, EXPORT_INFO, is_export_directory, read_export_info
from xformer_cli.fileio import atomic_directory, is_inside, unchanged_or, writing
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

# Model options the exporters know how to map; a checkpoint with any other is refused.
KNOWN_MODEL_KEYS = {f.name for f in fields(ModelConfig)}


def load_for_export(checkpoint: str | Path, target: str) -> tuple[Transformer, Tokenizer, Config]:
    """The model, tokenizer and config of a checkpoint, read the way ``Translator`` does;
    refused (naming ``target``) when it holds model options no exporter knows."""
    state = load_checkpoint(checkpoint)
    unknown = sorted(set(state.get("config", {}).get("model", {})) - KNOWN_MODEL_KEYS)
    if unknown:
        raise XformerError(f"{checkpoint}: cannot export to {target}: unsupported model option(s) {', '.join(unknown)}")
    return load_model(checkpoint, state)


def special_pieces(tokenizer: Tokenizer, where: str, why: str = "", bos_id: int = BOS_ID) -> dict[str, str]:
    """The unk/bos/eos/pad piece names (bos: the decoder's start token, ``model.bos_id``).
    Both export formats name each role once for both sides, so the source and target
    tokenizers must agree; else one line: ``where``, the role and both pieces, then ``why``
    (``{role}`` is filled in)."""
    names = {}
    for role, src_id, tgt_id in (("unk", tokenizer.src.unk_id(), tokenizer.tgt.unk_id()), ("bos", bos_id, bos_id),
                                 ("eos", EOS_ID, EOS_ID), ("pad", PAD_ID, PAD_ID)):
        src, tgt = tokenizer.src.id_to_piece(src_id), tokenizer.tgt.id_to_piece(tgt_id)
        if src != tgt:
            raise XformerError(f"{where}: the {role} piece differs between source ({src!r}) and target ({tgt!r}) "
                               f"tokenizers{why.format(role=role)}")
        names[role] = src
    return names


def output_directory(output_dir: str | Path, force: bool, checkpoint: str | Path) -> Path:
    """``output_dir`` as an absolute path ("." and "a/.." have a name to rename), refused when
    it is a file, or a non-empty directory without ``force``. ``force`` replaces an earlier
    export only: a folder that holds ``checkpoint`` (its run, a parent of it) or anything else
    is refused, for the export would delete it."""
    # realpath: "." and "a/.." have a name to rename, and a link to a folder (current -> v1) is
    # written at its target, as a checkpoint path that is a link is, not replaced by a folder
    output = Path(os.path.realpath(output_dir))
    if output.exists() and not output.is_dir():
        raise XformerError(f"{output} exists and is not a directory")
    if not output.is_dir() or not any(output.iterdir()):
        return output
    if not force:
        raise XformerError(f"{output} exists and is not empty (use --force to replace an earlier export there)")
    if is_inside(checkpoint, output):
        raise XformerError(f"{output} holds the checkpoint being exported ({checkpoint}): --force would delete it; "
                           "write the export elsewhere")
    if not is_export_directory(output):
        raise XformerError(f"{output} holds files that are not an xformer export: --force replaces an earlier export "
                           "only (move them, or write the export elsewhere)")
    others = foreign_files(output)
    if others:
        named = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        raise XformerError(f"{output} holds {named} beside an earlier export: --force replaces the export only "
                           "(move them, or write the export elsewhere)")
    return output


def foreign_files(output: Path) -> list[str]:
    """What an earlier export folder holds besides the export's own files: those its
    EXPORT_INFO lists, or (an export written before it listed them) the names either format writes."""
    listed = read_export_info(output).get("files")
    ours = set(listed) if isinstance(listed, list) else EXPORT_FILES
    return sorted(p.name + "/" if p.is_dir() else p.name for p in output.iterdir() if p.is_dir() or p.name not in ours)


def _list_files(staging: Path) -> None:
    """EXPORT_INFO names every file of the export (foreign_files reads it on a later --force)."""
    info = read_export_info(staging)
    info["files"] = sorted(p.name for p in staging.iterdir())
    (staging / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def write_directory(output: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write`` on a temporary sibling of ``output``, then rename it into place, so an
    interrupted or failed export (a full disk: one line) never leaves a half-written model
    where a good one was."""
    intact = unchanged_or(output, "no partial export was left")
    with writing(output, intact=intact), atomic_directory(output) as staging:
        write(staging)
        _list_files(staging)
    return output
