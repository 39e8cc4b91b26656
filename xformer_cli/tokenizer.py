"""Subword tokenization with sentencepiece: train, load, encode, decode.

Ids are fixed so the model can rely on them: pad 0, unk 1, bos 2, eos 3. A joint
tokenizer uses one sentencepiece model for both languages (and allows three-way
embedding tying); a separate one holds a model per side. Models travel as bytes so a
checkpoint alone can translate.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Iterable, Optional, Sequence

import sentencepiece as spm

from xformer_cli.errors import XformerError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def train_sentencepiece(
    sentences: Sequence[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    seed: int = 1,
) -> bytes:
    """Train on (a seeded random sample of) ``sentences``; returns the serialized model."""
    sample = list(sentences)
    if len(sample) > input_sentence_size:
        sample = random.Random(seed).sample(sample, input_sentence_size)
    sample = [s for s in sample if s.strip()]
    if not sample:
        raise XformerError("cannot train a tokenizer: the training data has no non-empty sentence")
    out = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=out,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            hard_vocab_limit=False,  # small corpora get a smaller vocabulary rather than an error
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise XformerError(f"sentencepiece training failed: {str(exc).strip().splitlines()[-1]}") from None
    return out.getvalue()


def _load(model_bytes: bytes, what: str) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except Exception:  # sentencepiece raises a bare RuntimeError/OSError with C++ text
        raise XformerError(f"{what} is not a sentencepiece model") from None
    if sp.pad_id() != PAD_ID or sp.eos_id() != EOS_ID or sp.bos_id() != BOS_ID:
        raise XformerError(f"{what}: needs pad=0 unk=1 bos=2 eos=3 (train it with xformer or those ids)")
    return sp


class Tokenizer:
    """Source and target sentencepiece models (the same object when joint)."""

    def __init__(self, src_model: bytes, tgt_model: Optional[bytes] = None):
        self.src_model_bytes = src_model
        self.tgt_model_bytes = tgt_model
        self.src = _load(src_model, "source tokenizer")
        self.tgt = self.src if tgt_model is None else _load(tgt_model, "target tokenizer")

    @property
    def joint(self) -> bool:
        return self.tgt_model_bytes is None

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    @classmethod
    def from_files(cls, src_path: str | Path, tgt_path: Optional[str | Path] = None) -> "Tokenizer":
        def read(p: str | Path) -> bytes:
            path = Path(p)
            if not path.is_file():
                raise XformerError(f"tokenizer model not found: {path}")
            return path.read_bytes()

        return cls(read(src_path), read(tgt_path) if tgt_path else None)

    @classmethod
    def train(
        cls, src_sentences: Sequence[str], tgt_sentences: Sequence[str], joint: bool, vocab_size: int, **kwargs
    ) -> "Tokenizer":
        if joint:
            return cls(train_sentencepiece(list(src_sentences) + list(tgt_sentences), vocab_size, **kwargs))
        return cls(train_sentencepiece(src_sentences, vocab_size, **kwargs), train_sentencepiece(tgt_sentences, vocab_size, **kwargs))

    def save(self, directory: str | Path) -> list[Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.joint:
            paths = [(directory / "joint.model", self.src_model_bytes)]
        else:
            paths = [(directory / "src.model", self.src_model_bytes), (directory / "tgt.model", self.tgt_model_bytes)]
        for path, data in paths:
            path.write_bytes(data)
        return [p for p, _ in paths]

    def encode_src(self, lines: Iterable[str]) -> list[list[int]]:
        return self.src.encode(list(lines))

    def encode_tgt(self, lines: Iterable[str]) -> list[list[int]]:
        return self.tgt.encode(list(lines))

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return self.tgt.decode([list(map(int, x)) for x in ids])

    def src_pieces(self, line: str) -> list[str]:
        return self.src.encode(line, out_type=str)

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.tgt.id_to_piece(int(i)) for i in ids]
