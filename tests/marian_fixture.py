"""A tiny random MarianMTModel written by transformers' own save_pretrained, with the
tokenizer files OPUS-MT ships (source.spm, target.spm, vocab.json): what the importer tests read."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

EN = "a man woman dog child is are rides runs sits on in the with red blue ball street park water bike".split()
DE = "ein mann frau hund kind ist sind fährt läuft sitzt auf in dem mit rot blau ball straße park wasser rad".split()


def sentences(words: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + "." for _ in range(n)]


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    """A sentencepiece model with sentencepiece's own ids (unk 0, bos 1, eos 2), as Marian's are."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=vocab_size,
                                   hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return out.getvalue()


def marian_vocabulary(*spm_models: bytes, tags: tuple[str, ...] = ()) -> dict[str, int]:
    """Marian's vocab.json: </s> 0, <unk> 1, a multilingual model's target-language tags
    (>>fra<<: in the vocabulary only, not in either sentencepiece model), the pieces of both
    models, <pad> last."""
    import sentencepiece as spm

    pieces = ["</s>", "<unk>", *tags]
    for model in spm_models:
        sp = spm.SentencePieceProcessor(model_proto=model)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in pieces:
                pieces.append(piece)
    pieces.append("<pad>")
    return {piece: i for i, piece in enumerate(pieces)}


def make_marian(directory: Path, seed: int = 0, tags: tuple[str, ...] = (), **config) -> Path:
    """Write a random MarianMTModel (swish, a non-zero final_logits_bias, untied output
    matrix, scaled embeddings) and its tokenizer files to ``directory``; with ``tags``, a
    multilingual one (OPUS-MT's: ">>fra<< A man ..." asks for French)."""
    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    src_spm, tgt_spm = train_spm(sentences(EN, 300, 1), 60), train_spm(sentences(DE, 300, 2), 60)
    vocab = marian_vocabulary(src_spm, tgt_spm, tags=tags)
    pad = len(vocab) - 1
    settings = dict(vocab_size=len(vocab), d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                    decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, activation_function="swish",
                    max_position_embeddings=128, scale_embedding=True, share_encoder_decoder_embeddings=True,
                    tie_word_embeddings=False, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                    forced_eos_token_id=0, init_std=0.3, dropout=0.1)
    settings.update(config)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(transformers.MarianConfig(**settings)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
        model.final_logits_bias[0, 0] += 3.0  # eos likelier: most outputs end before the length limit
    model.save_pretrained(directory)
    transformers.GenerationConfig(
        decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=0, forced_eos_token_id=0, bad_words_ids=[[pad]],
        num_beams=4, max_length=64, length_penalty=1.0).save_pretrained(directory)
    (directory / "source.spm").write_bytes(src_spm)
    (directory / "target.spm").write_bytes(tgt_spm)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "en", "target_lang": "mul" if tags else "de", "unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>",
         "model_max_length": 128, "separate_vocabs": False}), encoding="utf-8")
    return directory
