"""Subword tokenization with sentencepiece: train, load, encode, decode.

Ids are fixed so the model can rely on them: pad 0, unk 1, bos 2, eos 3. A joint
tokenizer uses one sentencepiece model for both languages (and allows three-way
embedding tying); a separate one holds a model per side. Models travel as bytes so a
checkpoint alone can translate.

An imported MarianMT model (``importers/marian.py``) brings a third kind: a sentencepiece
model per side whose pieces take their ids from a vocabulary list (Marian's vocab.json, one
id space for both sides, or one list per side), pad, unk and eos at xformer's ids.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import sentencepiece as spm

from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file, make_folder
from xformer_cli.languages import TAG

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def train_sentencepiece(
    sentences: Sequence[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    seed: int = 1,
    user_defined_symbols: Sequence[str] = (),
    control_symbols: Sequence[str] = (),
    split_digits: bool = False,
    byte_fallback: bool = False,
) -> bytes:
    """Train on (a seeded random sample of) ``sentences``; returns the serialized model.
    ``user_defined_symbols``: pieces never split (a multilingual model's tags, ``>>deu<<``);
    ``control_symbols``: pieces text never encodes to, placed by id (a corpus tag, ``<bt>``).

    ``split_digits`` makes every digit a piece of its own, so a number is spelled digit by
    digit and the model copies it digit by digit instead of choosing among whole-number
    pieces; ``byte_fallback`` encodes a character the vocabulary lacks as its UTF-8 bytes
    (256 more pieces) instead of unk, so it can be copied too."""
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
            split_digits=split_digits,
            byte_fallback=byte_fallback,
            hard_vocab_limit=False,  # small corpora get a smaller vocabulary rather than an error
            user_defined_symbols=list(user_defined_symbols),
            control_symbols=list(control_symbols),
            num_threads=2,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise XformerError(f"sentencepiece training failed: {str(exc).strip().splitlines()[-1]}") from None
    return out.getvalue()


# sentencepiece's calls on a list start a pool of threads each time (~0.2-0.4 ms): below this
# many lines one call a line is faster (docs/benchmarks/decoding.md, "One sentencepiece call a line")
ONE_CALL_FROM = 64


def one_call_or_each(call: Callable[[Any], Any], items: list) -> list:
    """``call(items)`` for a long list, ``[call(item) ...]`` for a short one: the same result."""
    return call(items) if len(items) >= ONE_CALL_FROM else [call(item) for item in items]


def _load(model_bytes: bytes, what: str) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except Exception:  # sentencepiece raises a bare RuntimeError/OSError with C++ text
        raise XformerError(f"{what} is not a sentencepiece model") from None
    if sp.pad_id() != PAD_ID or sp.eos_id() != EOS_ID or sp.bos_id() != BOS_ID:
        raise XformerError(f"{what}: needs pad=0 unk=1 bos=2 eos=3 (train it with xformer or those ids)")
    return sp


class VocabPieces:
    """A sentencepiece model whose pieces are numbered by ``pieces`` (position = id) instead
    of its own ids; a piece not in the list is unk. It answers the calls xformer makes on a
    ``SentencePieceProcessor``, so the rest of the code need not know which kind it has."""

    def __init__(self, sp: spm.SentencePieceProcessor, pieces: Sequence[str], what: str):
        self.sp = sp
        self.pieces = list(pieces)
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        if len(self.ids) != len(self.pieces) or len(self.pieces) <= EOS_ID:
            raise XformerError(f"{what}: the vocabulary needs distinct pieces and more than {EOS_ID + 1} of them")

    def encode(self, lines: str | Sequence[str], out_type: type = int,
               **kwargs: Any) -> list[int] | list[str] | list[list[int]] | list[list[str]]:
        pieces = self.sp.encode(lines, out_type=str, **kwargs)
        if out_type is str:
            return pieces
        if isinstance(lines, str):
            return [self.ids.get(p, UNK_ID) for p in pieces]
        return [[self.ids.get(p, UNK_ID) for p in line] for line in pieces]

    def decode(self, ids: Sequence[int] | Sequence[Sequence[int]]) -> str | list[str]:
        if not ids or isinstance(ids[0], int):  # one sequence; [] is the empty one, as sentencepiece reads it
            return self._text(ids)
        return [self._text(line) for line in ids]

    def _text(self, ids: Sequence[int]) -> str:
        """MarianTokenizer's text (``batch_decode(..., skip_special_tokens=True)``): pad, unk
        and eos left out, the pieces decoded, and every "▁" left over turned into a space.
        The vocabulary is shared by both sides, so the decoder may emit a piece only the
        source model has; sentencepiece writes such a piece as it is ("▁Man")."""
        special = {PAD_ID, UNK_ID, EOS_ID}
        text = self.sp.decode_pieces([self.pieces[i] for i in ids if i not in special])
        return text.replace("\u2581", " ").strip()

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def piece_to_id(self, piece: str) -> int:
        return self.ids.get(piece, UNK_ID)

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def unk_id(self) -> int:
        return UNK_ID

    def pad_id(self) -> int:
        return PAD_ID

    def eos_id(self) -> int:
        return EOS_ID

    def bos_id(self) -> int:
        return BOS_ID


def _load_mapped(model_bytes: bytes, what: str, pieces: Sequence[str]) -> VocabPieces:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except Exception:
        raise XformerError(f"{what} is not a sentencepiece model") from None
    return VocabPieces(sp, pieces, what)


class Tokenizer:
    """Source and target sentencepiece models (the same object when joint); with ``vocab``
    (and ``tgt_vocab`` for a target id space of its own), pieces numbered by those lists."""

    def __init__(self, src_model: bytes, tgt_model: Optional[bytes] = None, vocab: Optional[Sequence[str]] = None,
                 tgt_vocab: Optional[Sequence[str]] = None,
                 names: tuple[str, str] = ("source tokenizer", "target tokenizer")):
        self.src_model_bytes = src_model
        self.tgt_model_bytes = tgt_model
        self.vocab = list(vocab) if vocab is not None else None
        self.tgt_vocab = list(tgt_vocab) if tgt_vocab is not None else None
        src_name, tgt_name = names  # what a load error names: the file, where there is one
        if self.vocab is None:
            self.src = _load(src_model, src_name)
            self.tgt = self.src if tgt_model is None else _load(tgt_model, tgt_name)
        else:
            self.src = _load_mapped(src_model, src_name, self.vocab)
            self.tgt = self.src if tgt_model is None else _load_mapped(tgt_model, tgt_name,
                                                                       self.tgt_vocab or self.vocab)

    def state(self) -> dict:
        """What a checkpoint keeps of the tokenizer (``from_state`` reads it back)."""
        state: dict = {"src": self.src_model_bytes, "tgt": self.tgt_model_bytes}
        if self.vocab is not None:
            state["vocab"] = self.vocab
            if self.tgt_vocab is not None:
                state["tgt_vocab"] = self.tgt_vocab
        return state

    @classmethod
    def from_state(cls, state: dict) -> "Tokenizer":
        return cls(state["src"], state.get("tgt"), state.get("vocab"), state.get("tgt_vocab"))

    @property
    def one_id_space(self) -> bool:
        """Both sides number their pieces alike (a joint model, or one vocabulary list)."""
        return self.joint or (self.vocab is not None and self.tgt_vocab is None)

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

        return cls(read(src_path), read(tgt_path) if tgt_path else None,
                   names=(f"tokenizer model {src_path}", f"tokenizer model {tgt_path}"))

    @classmethod
    def train(
        cls, src_sentences: Sequence[str], tgt_sentences: Sequence[str], joint: bool, vocab_size: int, **kwargs: Any
    ) -> "Tokenizer":
        if joint:
            return cls(train_sentencepiece(list(src_sentences) + list(tgt_sentences), vocab_size, **kwargs))
        return cls(train_sentencepiece(src_sentences, vocab_size, **kwargs),
                   train_sentencepiece(tgt_sentences, vocab_size, **kwargs))

    def save(self, directory: str | Path) -> list[Path]:
        directory = Path(directory)
        make_folder(directory)
        if self.joint:
            paths = [(directory / "joint.model", self.src_model_bytes)]
        else:
            paths = [(directory / "src.model", self.src_model_bytes), (directory / "tgt.model", self.tgt_model_bytes)]
        for path, data in paths:
            with atomic_file(path) as f:  # whole or not at all, as every output
                f.write(data)
        return [p for p, _ in paths]

    @property
    def src_tags(self) -> dict[str, int]:
        """The source vocabulary's target-language tags (``>>deu<<``) and their ids; {} in a
        bilingual model's."""
        if not hasattr(self, "_src_tags"):
            pieces = (self.src.id_to_piece(i) for i in range(self.src.get_piece_size()))
            self._src_tags = {piece: i for i, piece in enumerate(pieces) if TAG.fullmatch(piece)}
        return self._src_tags

    def tag_id(self, tag: str) -> int:
        """The id of a target-language tag, which must be one piece of the source vocabulary,
        or of a corpus tag (``<bt>``), a control piece of it."""
        control = self.src.piece_to_id(tag)
        if not tag.startswith(">>") and control != UNK_ID and getattr(self.src, "is_control", lambda _: False)(control):
            return control
        if tag not in self.src_tags:
            pieces = " ".join(self.src.encode(tag, out_type=str))
            raise XformerError(f"the tag {tag} is not one piece of the source vocabulary (it splits into {pieces})")
        return self.src_tags[tag]

    def _lead_tag(self, line: str) -> tuple[Optional[int], str]:
        """(the id of the tag the line starts with, the rest), as MarianTokenizer splits a
        language code off before sentencepiece; (None, line) without a known tag."""
        if line.startswith(">>"):
            end = line.find("<<")
            if end != -1 and line[:end + 2] in self.src_tags:
                return self.src_tags[line[:end + 2]], line[end + 2:]
        return None, line

    def encode_src(self, lines: Iterable[str]) -> list[list[int]]:
        """Source ids per line; a line that starts with one of the vocabulary's tags
        (``>>fra<< A man ...``) starts with the tag's id."""
        lines = list(lines)
        if not self.src_tags:
            return one_call_or_each(self.src.encode, lines)
        split = [self._lead_tag(line) for line in lines]
        ids = one_call_or_each(self.src.encode, [rest for _, rest in split])
        return [[tag] + x if tag is not None else x for (tag, _), x in zip(split, ids)]

    def encode_tgt(self, lines: Iterable[str]) -> list[list[int]]:
        return one_call_or_each(self.tgt.encode, list(lines))

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return one_call_or_each(self.tgt.decode, [list(map(int, x)) for x in ids])

    def src_pieces(self, line: str) -> list[str]:
        tag, rest = self._lead_tag(line) if self.src_tags else (None, line)
        return ([self.src.id_to_piece(tag)] if tag is not None else []) + self.src.encode(rest, out_type=str)

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.tgt.id_to_piece(int(i)) for i in ids]
