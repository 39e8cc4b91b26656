"""Validation's check that the encoder still reads its input (``train/validation.py``)."""

from __future__ import annotations

import torch

from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.train.validation import COLLAPSED_SPREAD, encoder_spread


def corpus() -> EncodedCorpus:
    src = [[5, 9, 12, 7, 2], [8, 3, 2], [4], [11, 6, 10, 2]]  # [4]: one piece, no spread to measure
    return EncodedCorpus(src, [[5, 2]] * 4, ["x"] * 4)


def test_a_working_encoder_spreads_its_positions_and_a_collapsed_one_does_not():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=1,
                                    dropout=0.0), src_vocab=20)
    assert encoder_spread(model, corpus(), torch.device("cpu")) > 10 * COLLAPSED_SPREAD
    with torch.no_grad():  # every position the same vector: what a collapsed post-norm stack gives
        model.encoder_layers[-1].sub_ffn.norm.weight.zero_()  # post-norm: the last sublayer norms the output
    assert encoder_spread(model, corpus(), torch.device("cpu")) < COLLAPSED_SPREAD
    assert model.training  # handed back as it came


def test_a_valid_set_of_one_piece_sentences_measures_nothing():
    model = Transformer(ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1), src_vocab=20)
    one = EncodedCorpus([[4], [5]], [[5, 2]] * 2, ["x"] * 2)
    spread = encoder_spread(model, one, torch.device("cpu"))
    assert spread != spread  # nan: no warning either way
