"""The code paths a GPU takes, run on the CPU wherever torch can: torch.compile training and
fp16 with a gradient scaler (a forced overflow skips its step). The OOM skip is simulated in
test_training.py; NCCL and pinned memory need CUDA (scripts/gpu_check.sh runs them there)."""

import pytest
import torch

from xformer_cli.train import forward_loss as forward_loss_module
from xformer_cli.checkpoint import load_checkpoint
from xformer_cli.train.trainer import Trainer, train

from helpers import losses, quiet, tiny_config

pytestmark = pytest.mark.slow  # both train on Multi30k


def test_compiled_training_matches_eager(small_corpus, tmp_path):
    """inductor compiles the model for the CPU (with the machine's C++ compiler): the losses
    of a few steps equal eager mode's up to kernel rounding."""
    same = {"train.max_steps": 4, "model.dropout": 0.0, "train.precision": "fp32", "train.valid_every": 100}
    train(tiny_config(small_corpus, tmp_path / "eager", **same), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "compiled", **same, **{"train.compile": "true"}), log=quiet, progress=False)
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert sorted(eager) == sorted(compiled) == [1, 2, 3, 4]
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=1e-3), step


def test_fp16_with_a_gradient_scaler_skips_an_overflowing_step(small_corpus, tmp_path, monkeypatch):
    real = forward_loss_module.label_smoothed_nll
    calls = {"n": 0}

    def overflow_once(logits, target, eps, pad):
        calls["n"] += 1
        loss, nll = real(logits, target, eps, pad)
        return (loss * float("inf"), nll) if calls["n"] == 3 else (loss, nll)

    monkeypatch.setattr(forward_loss_module, "label_smoothed_nll", overflow_once)
    messages = []
    result = train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 5, "train.precision": "fp16"}),
                   log=messages.append, progress=False)
    assert result.steps == 5
    assert any(m.startswith("precision: fp16") for m in messages)
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["precision"] == "fp16"
    assert state["scaler"]["scale"] == 2.0 ** 16 / 2  # the overflow halved the loss scale once
    assert all(int(s["step"]) == 4 for s in state["optimizer"]["state"].values())  # 4 of 5 updates applied
    assert state["nonfinite_total"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_the_trainer_uses_cached_half_weights_where_cuda_would_and_trains_as_autocast(small_corpus, tmp_path, monkeypatch):
    """CUDA's bf16 path on a CPU (plain products, the switch that attaches the cache): the
    cache is attached and refreshed once per step, and the losses and weights are autocast's."""
    from xformer_cli.model import linear
    from xformer_cli.train.forward_loss import forced_half_weights

    refreshes = {"n": 0}
    real_halves = linear.HalfWeightCache.halves_for

    def counted(self, m):
        refreshes["n"] += self.stale
        return real_halves(self, m)

    monkeypatch.setattr(linear.HalfWeightCache, "halves_for", counted)
    sets = {"train.max_steps": 6, "train.precision": "bf16", "train.update_freq": 2}
    with linear.plain_products():
        with forced_half_weights(True):
            cached = Trainer(tiny_config(small_corpus, tmp_path / "cached", **sets), log=quiet, progress=False)
            assert cached.half_weights is not None
            cached.decode_precision = "fp32"  # validation: plain products take no bf16 weights on a CPU
            assert cached.run().steps == 6
        with forced_half_weights(False):
            plain = Trainer(tiny_config(small_corpus, tmp_path / "autocast", **sets), log=quiet, progress=False)
            assert plain.half_weights is None
            plain.decode_precision = "fp32"
            plain.run()
    assert refreshes["n"] == 6  # one refresh per optimizer step, not per micro-batch or per use
    a, b = losses(tmp_path / "cached"), losses(tmp_path / "autocast")
    assert sorted(a) == list(range(1, 7)) and a == b
    wa = load_checkpoint(tmp_path / "cached" / "last.pt")["model"]
    wb = load_checkpoint(tmp_path / "autocast" / "last.pt")["model"]
    assert all(torch.equal(wa[key], wb[key]) for key in wa)
