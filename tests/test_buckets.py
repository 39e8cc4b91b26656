"""Static batch shapes: every bucketed batch has a declared (rows, width) and fills it well."""

import numpy as np
import pytest
import torch

from xformer_cli.config import load_config
from xformer_cli.data.batching import (bucket_shape, collate, declared_shapes, make_bucketed_batches, shard)
from xformer_cli.errors import XformerError
from xformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID


def _lengths(n: int = 5000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sentence lengths like a real corpus: log-normal sources, targets ~10% longer with noise."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(2.8, 0.45, n), 1, 120).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.1, 0.12, n), 1, 128).astype(np.int64)
    return src, tgt


def _shape_of(batch: np.ndarray, src, tgt, max_tokens: int, step: int) -> tuple[int, int]:
    return bucket_shape(int(np.maximum(src[batch], tgt[batch]).max()) + 1, max_tokens, step)


@pytest.mark.parametrize("step", [1, 4])
def test_every_batch_has_a_declared_shape_and_every_pair_comes_once(step):
    src, tgt = _lengths()
    batches = make_bucketed_batches(src, tgt, 3000, step, seed=1, epoch=0)
    declared = set(declared_shapes(128, 3000, step))
    assert len(declared) <= 129 // step + 1
    for b in batches:
        rows, width = _shape_of(b, src, tgt, 3000, step)
        assert (rows, width) in declared and len(b) <= rows and width % step == 0
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))
    assert all(rows * width <= 3000 for rows, width in declared)  # the token budget still holds


def test_padding_efficiency_on_a_synthetic_length_distribution():
    src, tgt = _lengths()
    real = int(src.sum() + tgt.sum()) + 2 * len(src)
    for step, floor in ((1, 0.88), (4, 0.83)):
        batches = make_bucketed_batches(src, tgt, 3000, step, seed=1)
        slots = sum(2 * rows * width for rows, width in (_shape_of(b, src, tgt, 3000, step) for b in batches))
        assert real / slots >= floor, step


def test_the_epoch_is_fixed_by_seed_and_epoch_and_shards_stay_disjoint():
    src, tgt = _lengths()
    one = make_bucketed_batches(src, tgt, 3000, 2, seed=3, epoch=5)
    again = make_bucketed_batches(src, tgt, 3000, 2, seed=3, epoch=5)
    other = make_bucketed_batches(src, tgt, 3000, 2, seed=3, epoch=6)
    assert all(np.array_equal(a, b) for a, b in zip(one, again)) and len(one) == len(again)
    assert not all(np.array_equal(a, b) for a, b in zip(one, other))
    ranks = [np.concatenate(shard(one, r, 2)) for r in range(2)]
    assert not set(ranks[0].tolist()) & set(ranks[1].tolist())
    assert len(ranks[0]) + len(ranks[1]) == len(src)


def test_a_batch_padded_to_its_shape_keeps_its_loss_positions():
    batch = collate([[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]])
    grown = batch.padded_to(4, 8)
    for t in (grown.src, grown.tgt_in, grown.tgt_out):
        assert t.shape == (4, 8)
    assert torch.equal(grown.src[:2, :4], batch.src) and torch.equal(grown.tgt_out[:2, :5], batch.tgt_out)
    assert grown.src[2:, 0].eq(EOS_ID).all() and grown.tgt_in[2:, 0].eq(BOS_ID).all()
    assert grown.tgt_out[2:].eq(PAD_ID).all() and grown.n_tokens == batch.n_tokens  # filler rows predict nothing


def test_a_negative_length_bucket_is_refused():
    with pytest.raises(XformerError, match="train.length_bucket"):
        load_config(None, ["train.length_bucket=-1"])
