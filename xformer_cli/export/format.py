"""The names an xformer export directory is made of, read by the exporters that write one
and by the engines and the server that load one: one definition each.

Both formats (``export/ctranslate2.py``, ``export/huggingface.py``) write ``EXPORT_INFO``,
a JSON file with xformer's decode settings, version and language codes, beside the files
their own runtime reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from xformer_cli.languages import Languages

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

    from xformer_cli.tokenizer import VocabPieces

EXPORT_INFO = "xformer_export.json"
# Rows of an exported position table at least: CTranslate2 and Marian cannot grow theirs
# (xformer can), so an export must cover inputs longer than the training data's.
MIN_POSITIONS = 1024
# The sentencepiece model(s) of a CTranslate2 export: one when the vocabulary is joint.
JOINT_SPM, SOURCE_SPM, TARGET_SPM = "spm.model", "source.spm.model", "target.spm.model"
# Every file name either format writes: what an export written before EXPORT_INFO listed its
# files may hold (export/common.foreign_files); anything else there is the user's.
EXPORT_FILES = {EXPORT_INFO, "config.json", "model.bin", "shared_vocabulary.json", "source_vocabulary.json",
                "target_vocabulary.json", JOINT_SPM, SOURCE_SPM, TARGET_SPM, "vmap.txt", "generation_config.json",
                "model.safetensors", "source.spm", "target.spm", "tokenizer_config.json", "vocab.json",
                "target_vocab.json", "special_tokens_map.json"}


def piece_list(sp: SentencePieceProcessor | VocabPieces) -> list[str]:
    """A sentencepiece model's pieces in id order: the vocabulary an export lists, and the
    id <-> piece mapping an engine reading that export needs."""
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def read_export_info(directory: "str | Path") -> dict:
    """``EXPORT_INFO`` of an export directory; {} when it is missing or unreadable."""
    try:
        info = json.loads((Path(directory) / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def is_export_directory(path: "str | Path") -> bool:
    """Whether ``path`` holds an xformer export (its ``EXPORT_INFO``)."""
    return (Path(path) / EXPORT_INFO).is_file()


def export_languages(info: dict) -> Optional[Languages]:
    """The directions an export's ``EXPORT_INFO`` records: ``languages`` (pairs and tags), else
    the one pair src_lang -> tgt_lang of exports from before multilingual models; None when
    it records neither."""
    if isinstance(info.get("languages"), dict):
        return Languages.from_dict(info["languages"])
    src, tgt = info.get("src_lang"), info.get("tgt_lang")
    return Languages.of([(src, tgt)]) if isinstance(src, str) and isinstance(tgt, str) else None
