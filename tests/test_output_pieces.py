"""model.restrict_output: the output layer scores the pieces the target side uses, training
reads the same numbers the whole layer would give them, and decoding never emits the others."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.decode.translator import Translator
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.output_pieces import target_pieces
from xformer_cli.train.trainer import Trainer, train

from helpers import head, losses, quiet, tiny_config, write_lines

VOCAB = 40
PIECES = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34])


def _model(tie: bool = True, restrict: bool = True) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      tie_embeddings=tie, restrict_output=restrict, output_pieces=PIECES.numel() if restrict else 0)
    model = Transformer(cfg, VOCAB)
    if restrict:
        model.restrict_output(PIECES)
    return model


def test_target_pieces_are_the_target_sides_ids_and_the_special_ones():
    assert target_pieces(np.array([9, 7, 7, 30, 9, 3], dtype=np.uint16), 32).tolist() == [0, 1, 2, 3, 7, 9, 30]


def test_the_scored_logits_are_the_whole_layers_and_decoding_gives_the_others_minus_infinity():
    model = _model()
    src, tgt_in = torch.tensor([[5, 8, 13, 3]]), torch.tensor([[2, 21, 34, 5]])
    hidden = model.decode(tgt_in, model.encode(src), model.padding_mask(src))
    whole = model.generator(hidden)
    scored = model(src, tgt_in)
    assert scored.shape == (1, 4, PIECES.numel())
    torch.testing.assert_close(scored, whole[..., PIECES])
    decoding = model.logits(hidden)
    unscored = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, PIECES, False)
    assert torch.isneginf(decoding[..., unscored]).all() and torch.equal(decoding[..., PIECES], whole[..., PIECES])
    # The loss over the scored columns is the whole layer's with the others at -inf.
    gold = torch.tensor([[21, 34, 5, 3]])
    nll = label_smoothed_nll(scored, model.scored_targets(gold), 0.0, 0)[1]
    assert nll.item() == pytest.approx(F.cross_entropy(decoding.flatten(0, 1), gold.flatten(), reduction="sum").item(),
                                       rel=1e-5)
    assert model.scored_targets(gold).tolist() == [[7, 8, 4, 3]]
    assert model.scored_targets(torch.tensor([4, 0])).tolist() == [1, 0]  # unscored -> unknown; padding stays 0


def test_only_the_scored_rows_of_an_untied_output_layer_learn():
    model = _model(tie=False)
    src, tgt_in, gold = torch.tensor([[5, 8, 3]]), torch.tensor([[2, 21, 13]]), torch.tensor([[21, 13, 3]])
    label_smoothed_nll(model(src, tgt_in), model.scored_targets(gold), 0.1, 0)[0].backward()
    moved = model.generator.weight.grad.abs().sum(-1) > 0
    assert moved[PIECES].all() and moved.sum() == PIECES.numel()  # the scored rows (smoothing reaches them all), no other


def test_the_pieces_travel_in_the_state_and_a_wrong_count_is_refused():
    state = _model().state_dict()
    assert torch.equal(state["output_pieces"], PIECES) and "_position_of" not in state
    fresh = Transformer(_model().cfg, VOCAB)  # built with placeholder pieces, then loaded
    fresh.load_state_dict(state)
    assert fresh.scored_targets(torch.tensor([34])).tolist() == [8]
    with pytest.raises(ValueError, match="8 output pieces for a model built for 9"):
        _model(restrict=True).restrict_output(PIECES[:-1].contiguous())
    assert _model(restrict=False).output_bias() is None


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_restricted_run_counts_its_pieces_translates_and_resumes_bit_identically(small_corpus, tmp_path, precision):
    from test_training import assert_resumed_bit_identically

    sets = {"model.restrict_output": "true", "train.precision": precision}
    lines: list[str] = []
    whole = Trainer(tiny_config(small_corpus, tmp_path / "a", **sets, **{"train.max_steps": 12}), log=lines.append,
                    progress=False)
    cache = whole.train_data
    expected = target_pieces(cache.tgt_ids, whole.state.tokenizer.tgt_vocab_size)
    assert 100 < expected.numel() < whole.state.tokenizer.tgt_vocab_size
    assert whole.config.model.output_pieces == expected.numel()
    assert any(line.startswith(f"output layer: {expected.numel()} of ") for line in lines)
    assert whole.run().steps == 12
    assert torch.equal(load_checkpoint(tmp_path / "a" / "last.pt")["model"]["output_pieces"], expected)
    train(tiny_config(small_corpus, tmp_path / "b", **sets, **{"train.max_steps": 6}), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "b", **sets, **{"train.max_steps": 12}), log=quiet, progress=False)
    assert_resumed_bit_identically(tmp_path / "a", tmp_path / "b", stopped_at=6, steps=12)
    # Decoding emits only scored pieces.
    translator = Translator.from_checkpoint(tmp_path / "a" / "last.pt", device="cpu", precision="fp32")
    out = translator.search(head(small_corpus / "valid.en", 20), translator.options(beam_size=4))
    emitted = {t for hyps in out for t in hyps[0].tokens}
    assert emitted and emitted <= set(expected.tolist())
    assert losses(tmp_path / "a")[12] < losses(tmp_path / "a")[1]


@pytest.mark.slow
def test_fine_tuning_a_restricted_model_counts_the_new_datas_pieces(small_corpus, tmp_path):
    train(tiny_config(small_corpus, tmp_path / "pre", **{"model.restrict_output": "true", "train.max_steps": 4}),
          log=quiet, progress=False)
    pre = load_checkpoint(tmp_path / "pre" / "last.pt")["model"]["output_pieces"]
    few = tmp_path / "few"
    few.mkdir()
    for lang in ("en", "de"):
        write_lines(few / f"train.{lang}", head(small_corpus / f"train.{lang}", 40))
    tuned = Trainer(tiny_config(small_corpus, tmp_path / "tuned", **{
        "train.init_from": str(tmp_path / "pre" / "last.pt"), "data.train.prefix": str(few / "train"),
        "train.max_steps": 2, "model.restrict_output": "true"}), log=quiet, progress=False)
    assert tuned.config.model.restrict_output and 4 < tuned.config.model.output_pieces < pre.numel()
    assert tuned.run().steps == 2
    assert load_checkpoint(tmp_path / "tuned" / "last.pt")["model"]["output_pieces"].numel() < pre.numel()


@pytest.mark.slow
@pytest.mark.parametrize("pretrained_restricted", [True, False])
def test_a_fine_tune_may_switch_between_the_whole_and_the_restricted_layer(small_corpus, tmp_path, pretrained_restricted):
    """restrict_output is a training choice (init_from.TRAINING_MODEL_KEYS): the weights are
    the whole vocabulary's either way, so a fine-tune takes the pretrained ones and scores what
    its own config asks for."""
    flag = str(pretrained_restricted).lower()
    train(tiny_config(small_corpus, tmp_path / "pre", **{"model.restrict_output": flag, "train.max_steps": 4}),
          log=quiet, progress=False)
    tuned = Trainer(tiny_config(small_corpus, tmp_path / "tuned", **{
        "train.init_from": str(tmp_path / "pre" / "last.pt"), "train.max_steps": 2,
        "model.restrict_output": str(not pretrained_restricted).lower()}), log=quiet, progress=False)
    model = tuned.config.model
    assert model.restrict_output is not pretrained_restricted
    assert (model.output_pieces > 4) is not pretrained_restricted
    assert tuned.run().steps == 2
    weights = load_checkpoint(tmp_path / "tuned" / "last.pt")["model"]
    assert ("output_pieces" in weights) is not pretrained_restricted
