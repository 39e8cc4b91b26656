"""Packed batches: one shape per run, every pair once, and the model sees each pair as if alone."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from xformer_cli.config import load_config
from xformer_cli.data.batching import collate, shard
from xformer_cli.data.packing import (PackShape, collate_packed, make_packed_batches, pack_rows, pack_shape,
                                      packing_efficiency)
from xformer_cli.errors import XformerError
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID
from xformer_cli.train.run_checkpoints import resume_mismatch
from xformer_cli.train.epoch_batches import PackedPlan
from xformer_cli.train.loss import label_smoothed_nll


CONFIG = Path(__file__).resolve().parents[1] / "configs" / "multi30k.yaml"


def _lengths(n: int = 5000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sentence lengths like a real corpus: log-normal sources, targets ~10% longer with noise."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(2.8, 0.45, n), 1, 120).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.1, 0.12, n), 1, 128).astype(np.int64)
    return src, tgt


def _corpus(n: int, seed: int = 0, longest: int = 9):
    """n random pairs (ids 4..49) and the flat arrays the token cache holds them in."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, 50, rng.integers(1, longest + 1)).tolist() for _ in range(n)]
    tgt = [rng.integers(4, 50, rng.integers(1, longest + 1)).tolist() for _ in range(n)]

    def flat(side):
        return np.array([i for s in side for i in s], dtype=np.int64), np.cumsum([0] + [len(s) for s in side])

    (src_ids, src_off), (tgt_ids, tgt_off) = flat(src), flat(tgt)
    data = SimpleNamespace(src_ids=src_ids, src_offsets=src_off, tgt_ids=tgt_ids, tgt_offsets=tgt_off,
                           src_lens=np.diff(src_off), tgt_lens=np.diff(tgt_off))
    return src, tgt, data


def _model(**kw) -> Transformer:
    cfg = dict(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    cfg.update(kw)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**cfg), src_vocab=50).eval()


def _packed(src, tgt, data, shape: PackShape):
    """The corpus packed into batches of ``shape`` (no shuffling) and collated."""
    batches = make_packed_batches(data.src_lens, data.tgt_lens, shape, shuffle=False)
    return batches, [collate_packed(data.src_ids, data.src_offsets, data.tgt_ids, data.tgt_offsets, b, shape)
                     for b in batches]


def test_a_packed_batch_lays_pairs_back_to_back_with_their_own_specials():
    src, tgt, data = _corpus(3)
    src, tgt = [[5, 6], [7], [8, 9, 10]], [[11], [12, 13], [14]]
    data.src_ids, data.src_offsets = np.array([5, 6, 7, 8, 9, 10]), np.array([0, 2, 3, 6])
    data.tgt_ids, data.tgt_offsets = np.array([11, 12, 13, 14]), np.array([0, 1, 3, 4])
    batch = collate_packed(data.src_ids, data.src_offsets, data.tgt_ids, data.tgt_offsets,
                           [np.array([0, 1]), np.array([2])], PackShape(rows=3, src_width=6, tgt_width=6))
    assert batch.src.tolist() == [[5, 6, EOS_ID, 7, EOS_ID, PAD_ID], [8, 9, 10, EOS_ID, 0, 0], [0] * 6]
    assert batch.tgt_in.tolist() == [[BOS_ID, 11, BOS_ID, 12, 13, PAD_ID], [BOS_ID, 14, 0, 0, 0, 0], [0] * 6]
    assert batch.tgt_out.tolist() == [[11, EOS_ID, 12, 13, EOS_ID, PAD_ID], [14, EOS_ID, 0, 0, 0, 0], [0] * 6]
    p = batch.packing
    assert p.src_segments.tolist() == [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0], [0] * 6]
    assert p.src_positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0], [0] * 6]
    assert p.tgt_segments.tolist() == [[1, 1, 2, 2, 2, 0], [1, 1, 0, 0, 0, 0], [0] * 6]
    assert p.tgt_positions.tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 0, 0, 0, 0], [0] * 6]
    assert batch.n_tokens == 2 + 3 + 2


@pytest.mark.parametrize("kw", [{}, {"pre_norm": True}, {"tie_embeddings": False}])
def test_packed_logits_equal_each_pair_run_alone(kw):
    """The oracle for masks and positions: every target token's logits in a packed batch
    (pad rows included) are those of its pair alone through the unpacked model."""
    src, tgt, data = _corpus(40, seed=1)
    model = _model(**kw)
    batches, packed = _packed(src, tgt, data, PackShape(rows=8, src_width=24, tgt_width=24))
    assert len(batches) >= 2 and len(batches[-1]) < 8  # the last batch has empty rows
    seen = 0
    with torch.no_grad():
        for rows, batch in zip(batches, packed):
            logits = model(batch.src, batch.tgt_in, packing=batch.packing)
            assert torch.isfinite(logits).all()
            for r, row in enumerate(rows):
                for segment, pair in enumerate(row.tolist(), start=1):
                    alone = model(collate([src[pair]], [tgt[pair]]).src, collate([src[pair]], [tgt[pair]]).tgt_in)[0]
                    slots = batch.packing.tgt_segments[r] == segment
                    torch.testing.assert_close(logits[r][slots], alone, atol=2e-5, rtol=1e-5)
                    seen += 1
    assert seen == 40


def test_packed_loss_equals_the_loss_of_the_same_pairs_batched_the_old_way():
    src, tgt, data = _corpus(30, seed=2)
    model = _model()
    batches, packed = _packed(src, tgt, data, PackShape(rows=16, src_width=20, tgt_width=20))
    assert len(batches) == 1
    batch = packed[0]
    old = collate(src, tgt)
    logits = model(batch.src, batch.tgt_in, packing=batch.packing)
    loss, nll = label_smoothed_nll(logits, batch.tgt_out, 0.1, PAD_ID)
    old_loss, old_nll = label_smoothed_nll(model(old.src, old.tgt_in), old.tgt_out, 0.1, PAD_ID)
    torch.testing.assert_close(loss, old_loss, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(nll, old_nll, atol=1e-4, rtol=1e-5)
    assert batch.n_tokens == old.n_tokens
    loss.backward()  # pad rows and padding slots give finite gradients
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_every_batch_has_the_one_shape_and_every_pair_comes_once():
    src_lens, tgt_lens = _lengths()
    shape = pack_shape(src_lens, tgt_lens, 3000)
    assert shape.rows * max(shape.src_width, shape.tgt_width) <= 3000  # make_batches' per-side budget
    assert shape.src_width > src_lens.max() and shape.tgt_width > tgt_lens.max()
    batches = make_packed_batches(src_lens, tgt_lens, shape, seed=1, epoch=0)
    pairs = np.concatenate([r for rows in batches for r in rows])
    assert sorted(pairs.tolist()) == list(range(len(src_lens)))
    for rows in batches:
        assert 0 < len(rows) <= shape.rows
        for r in rows:  # a row holds whole pairs within both widths
            assert (src_lens[r] + 1).sum() <= shape.src_width and (tgt_lens[r] + 1).sum() <= shape.tgt_width
    assert sum(len(rows) < shape.rows for rows in batches) <= 1


def test_collated_batches_all_have_the_declared_shape():
    src, tgt, data = _corpus(100, seed=3)
    shape = pack_shape(data.src_lens, data.tgt_lens, 64)
    for seed in range(3):
        for rows in make_packed_batches(data.src_lens, data.tgt_lens, shape, seed=seed):
            b = collate_packed(data.src_ids, data.src_offsets, data.tgt_ids, data.tgt_offsets, rows, shape)
            assert b.src.shape == b.packing.src_segments.shape == (shape.rows, shape.src_width)
            assert b.tgt_in.shape == b.tgt_out.shape == b.packing.tgt_positions.shape == (shape.rows, shape.tgt_width)


def test_the_epoch_is_fixed_by_seed_and_epoch_and_shards_partition_it():
    src_lens, tgt_lens = _lengths()
    shape = pack_shape(src_lens, tgt_lens, 3000)

    def flat(batches):
        return [r.tolist() for rows in batches for r in rows]

    one = make_packed_batches(src_lens, tgt_lens, shape, seed=3, epoch=5)
    assert flat(one) == flat(make_packed_batches(src_lens, tgt_lens, shape, seed=3, epoch=5))
    assert flat(one) != flat(make_packed_batches(src_lens, tgt_lens, shape, seed=3, epoch=6))
    plan = PackedPlan(SimpleNamespace(src_lens=src_lens, tgt_lens=tgt_lens), 3000, seed=3)
    epoch = plan.batches(5, src_lens, tgt_lens)
    usable = len(epoch) // 2 * 2  # the loop's equal shares across ranks (Trainer._batches_of)
    ranks = [shard(epoch[:usable], rank, 2) for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(one) // 2
    mine = [set(np.concatenate([r for rows in b for r in rows]).tolist()) for b in ranks]
    assert not mine[0] & mine[1]
    kept = one[: len(one) // 2 * 2]
    assert mine[0] | mine[1] == set(np.concatenate([r for rows in kept for r in rows]).tolist())


def test_padding_efficiency_on_a_synthetic_length_distribution():
    """Multi30k-sized (an epoch of tens of batches: the last one's empty rows count too)."""
    src_lens, tgt_lens = _lengths(20000)
    for max_tokens in (3000, 8000):
        shape = pack_shape(src_lens, tgt_lens, max_tokens)
        batches = make_packed_batches(src_lens, tgt_lens, shape, seed=1)
        assert packing_efficiency(batches, src_lens, tgt_lens, shape) >= 0.93, max_tokens


def test_rows_are_filled_first_fit_decreasing():
    rows = pack_rows(np.array([3, 5, 2, 2, 4]), np.array([3, 5, 2, 2, 4]), 7, 7)
    assert sorted(map(sorted, (r.tolist() for r in rows))) == [[0, 4], [1, 2], [3]]


def test_the_loops_plan_loads_packed_batches():
    src, tgt, data = _corpus(60, seed=4)
    plan = PackedPlan(data, 80, seed=1)
    batches = plan.batches(1, data.src_lens, data.tgt_lens)
    group = [plan.load(rows) for rows in batches[1:3]]
    shape = pack_shape(data.src_lens, data.tgt_lens, 80)
    assert len(group) == 2 and all(b.src.shape == (shape.rows, shape.src_width) for b in group)
    assert sum(b.n_tokens for b in group) == sum(int(data.tgt_lens[r].sum()) + len(r)
                                                 for rows in batches[1:3] for r in rows)


def test_embedding_positions_given_as_a_tensor_match_the_default_ones_exactly():
    model = _model()
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(model.src_embed(ids), model.src_embed(ids, positions=torch.arange(4)[None]))


def test_the_batching_key_is_checked_and_an_old_checkpoint_reads_as_dynamic():
    def config(*overrides):
        return load_config(CONFIG, list(overrides))

    assert config().train.batching == "dynamic"
    assert config("train.batching=packed").train.batching == "packed"
    with pytest.raises(XformerError, match="train.batching"):
        config("train.batching=bucketed")
    with pytest.raises(XformerError, match="train.length_bucket"):
        config("train.batching=packed", "train.length_bucket=8")
    current, old = config().to_dict(), config().to_dict()
    del old["train"]["batching"]
    assert resume_mismatch(old, current) is None
    packed = config("train.batching=packed").to_dict()
    assert resume_mismatch(old, packed) == "train.batching"
