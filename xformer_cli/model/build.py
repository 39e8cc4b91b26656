"""Builds the Transformer a run config and its tokenizer describe."""

from __future__ import annotations

from xformer_cli.config import Config
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID, Tokenizer


def build_model(config: Config, tokenizer: Tokenizer) -> Transformer:
    tgt_vocab = 0 if tokenizer.joint else tokenizer.tgt_vocab_size
    return Transformer(config.model_config(tokenizer.src_vocab_size, tgt_vocab, PAD_ID))
