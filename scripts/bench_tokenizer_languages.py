"""The multilingual tokenizer per language: unknown pieces, pieces per sentence and exact
round trips on held-out text, with sentencepiece's byte fallback off and on.

Trains what `xformer train -c configs/multi30k-multilingual.yaml` trains (the same sample,
balanced across languages, the tags as user-defined symbols), once as configured and once
with byte_fallback, then encodes each language's valid and test2016 lines with each.

    python scripts/bench_tokenizer_languages.py --config configs/multi30k-multilingual.yaml \
        --extra ../shared/data/wmt14/newstest2014.de --extra ../shared/data/wmt14/newstest2014.en
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import sentencepiece as spm

from xformer_cli.config import load_config
from xformer_cli.data.directions import language_sample, train_sources
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def train(sentences: list[str], config, byte_fallback: bool) -> spm.SentencePieceProcessor:
    """The settings of tokenizer.train_sentencepiece, byte_fallback aside."""
    tc = config.tokenizer
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=out, vocab_size=tc.vocab_size, model_type=tc.model_type,
        character_coverage=tc.character_coverage, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece="<pad>", hard_vocab_limit=False, num_threads=2, minloglevel=2, byte_fallback=byte_fallback,
        user_defined_symbols=[tag for _, tag in config.data.languages().tags])
    return spm.SentencePieceProcessor(model_proto=out.getvalue())


def measure(sp: spm.SentencePieceProcessor, lines: list[str]) -> dict:
    ids = sp.encode(lines)
    unk = sum(row.count(UNK_ID) for row in ids)
    exact = sum(sp.decode(row) == " ".join(line.split()) for row, line in zip(ids, lines))
    return {"lines": len(lines), "unk_pieces": unk, "lines_with_unk": sum(UNK_ID in row for row in ids),
            "pieces_per_line": sum(map(len, ids)) / len(lines), "exact_round_trips": exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/multi30k-multilingual.yaml")
    parser.add_argument("--splits", default="valid,test2016")
    parser.add_argument("--extra", action="append", default=[], metavar="FILE",
                        help="also measure on this file (out-of-domain text: characters the sample lacks)")
    args = parser.parse_args()
    config = load_config(args.config)
    d = config.data
    by_language = language_sample(train_sources(d, print), d, config.tokenizer.input_sentence_size, config.train.seed)
    sample = [line for lines in by_language.values() for line in lines]
    print("sample:", {lang: len(lines) for lang, lines in by_language.items()})
    models = {fallback: train(sample, config, fallback) for fallback in (False, True)}
    print("pieces:", {f"byte_fallback={k}": sp.get_piece_size() for k, sp in models.items()})
    folder = Path(d.train[0].prefix).parent
    for lang in by_language:
        lines = [line for split in args.splits.split(",")
                 for line in (folder / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()]
        for fallback, sp in models.items():
            print(lang, f"byte_fallback={fallback}", measure(sp, lines))
    for extra in args.extra:
        lines = [line for line in Path(extra).read_text(encoding="utf-8").splitlines() if line.strip()]
        for fallback, sp in models.items():
            print(extra, f"byte_fallback={fallback}", measure(sp, lines))


if __name__ == "__main__":
    main()
