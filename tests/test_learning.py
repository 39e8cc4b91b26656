"""Proof of learning: a small model memorises real sentence pairs and reproduces them exactly."""

import pytest

from xformer_cli.config import load_config
from xformer_cli.decode.translator import Translator
from xformer_cli.train.trainer import train

from conftest import head, write_lines

N_PAIRS = 40


def test_tiny_model_memorises_real_pairs_and_translates_them_exactly(multi30k, tmp_path):
    src = head(multi30k / "train.en", N_PAIRS)
    tgt = head(multi30k / "train.de", N_PAIRS)
    write_lines(tmp_path / "mem.en", src)
    write_lines(tmp_path / "mem.de", [t.strip() for t in tgt])
    cfg = load_config("configs/multi30k.yaml", [
        f"run_dir={tmp_path / 'run'}",
        f"data.train.prefix={tmp_path / 'mem'}",
        f"data.valid.prefix={tmp_path / 'mem'}",
        "tokenizer.vocab_size=400",
        "model.d_model=64", "model.d_ff=256", "model.n_heads=4",
        "model.encoder_layers=2", "model.decoder_layers=2", "model.dropout=0.0",
        "train.max_tokens=4000", "train.max_steps=300", "train.max_minutes=0",
        "train.warmup_steps=40", "train.lr_scale=0.5", "train.label_smoothing=0.0",
        "train.valid_every=300", "train.threads=1", "train.device=cpu",
    ])
    result = train(cfg, log=lambda _: None, progress=False)
    assert result.steps == 300

    translator = Translator.from_checkpoint(tmp_path / "run" / "last.pt", device="cpu")
    greedy = translator.translate(src, beam_size=1)
    beam = translator.translate(src, beam_size=4)
    expected = [t.strip() for t in tgt]
    assert greedy == expected
    assert beam == expected
    assert result.best_bleu == pytest.approx(100.0)  # validation on the same pairs saw the same thing
