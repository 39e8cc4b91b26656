"""The code paths a GPU takes, run on the CPU wherever torch can: torch.compile training and
fp16 with a gradient scaler (a forced overflow skips its step). The OOM skip is simulated in
test_training.py; NCCL and pinned memory need CUDA (scripts/gpu_check.sh runs them there)."""

import json

import pytest
import torch

from xformer_cli.train import forward_loss as forward_loss_module
from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.train.trainer import Trainer, train

from helpers import losses, quiet, tiny_config

pytestmark = pytest.mark.slow  # both train on Multi30k


def compiled_vs_eager_tolerance(dtype: torch.dtype, step: int, terms: int = 1000) -> float:
    """Relative difference allowed between a compiled and an eager run's loss at ``step``.

    Inductor's kernels sum in other orders than eager's (and than each other: AVX-512, AVX2
    and scalar code). A sum of n terms taken in another order differs by about sqrt(n) units
    of ``dtype``'s precision (eps): step 1, the same weights, differs by sqrt(``terms``) eps
    at most (a log-softmax over the 1000-piece vocabulary, sums over the batch's tokens). Each
    update then carries the difference on and adds its own, and Adam, dividing every gradient
    element by its running size, turns a tiny difference in a near-zero gradient into a whole
    learning-rate step in that weight: t steps of fresh rounding, each grown over the steps
    left, differ by the order of eps * t^2. Measured (fp32, 20 steps; docs/benchmarks/platforms.md,
    "Compiled against eager training"; beyond metrics.jsonl's 6 decimals): at most 0.93 eps t^2 after step 1
    with inductor's AVX2 and scalar code (step 17: 3.2e-5, the AVX2-only EPYC's failure, reproduced here with
    ATEN_CPU_CAPABILITY=avx2), 3.4 eps at step 1, nothing visible with its AVX-512 code. The
    bound, sqrt(terms) eps + 8 eps t^2, is 8x over the worst of them and still fails what a
    real bug does: a skipped update moved every later loss by >= 4.8e-3 (12x the bound at step
    20), label smoothing 0.11 for 0.1 moved step 1's by 2.4e-4 (50x its bound)."""
    eps = torch.finfo(dtype).eps
    return eps * (terms**0.5 + 8 * step**2)


@pytest.mark.parametrize("restrict", [False, True], ids=["whole-output", "restricted-output"])
def test_compiled_training_matches_eager(small_corpus, tmp_path, restrict):
    """inductor compiles model and loss together for the CPU (with the machine's C++ compiler):
    over 20 steps the losses equal eager mode's within the rounding the updates carry forward
    (``compiled_vs_eager_tolerance``), and the run logs its compilations. Also with the output
    layer over the target side's pieces (its gathered rows compiled too)."""
    same = {"train.max_steps": 20, "model.dropout": 0.0, "train.precision": "fp32", "train.valid_every": 100,
            "train.lr_scale": 0.1,  # a gentle rate: at the tiny config's 0.7 the same rounding grew to 3e-3 by step 18
            "model.restrict_output": str(restrict).lower()}
    train(tiny_config(small_corpus, tmp_path / "eager", **same), log=quiet, progress=False)
    lines: list[str] = []
    train(tiny_config(small_corpus, tmp_path / "compiled", **same, **{"train.compile": "true"}), log=lines.append,
          progress=False)
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert sorted(eager) == sorted(compiled) == list(range(1, 21))
    for step in eager:  # abs: metrics.jsonl keeps 6 decimals
        tolerance = compiled_vs_eager_tolerance(torch.float32, step)
        assert compiled[step] == pytest.approx(eager[step], rel=tolerance, abs=1e-6), step
    assert any(line.startswith("torch.compile: ") and "dynamic shapes" in line for line in lines)
    rows = [json.loads(line) for line in (tmp_path / "compiled" / "metrics.jsonl").read_text().splitlines()]
    counts = [row["compilations"] for row in rows if "train_loss" in row]
    assert counts and 1 <= counts[-1] <= 3  # dynamic shapes: compiled once (a recompile or two for 0/1 sizes at most)


def test_compiled_bucketed_epoch_compiles_at_most_once_per_batch_shape(small_corpus, tmp_path):
    """With train.length_bucket the compiled step specialises on each declared shape: over a
    whole epoch dynamo compiles no more graphs than the shapes the epoch used."""
    sets = {"train.max_epochs": 1, "train.max_steps": 10_000, "train.length_bucket": 32, "train.max_tokens": 1500,
            "train.compile": "true", "train.valid_every": 100_000, "model.dropout": 0.0}
    trainer = Trainer(tiny_config(small_corpus, tmp_path / "run", **sets), log=quiet, progress=False)
    result = trainer.run()
    assert result.stopped_because == "epochs" and result.steps > 20
    declared = {(rows, width, width) for rows, width in trainer.batch_plan.declared(trainer.config.data.max_len)}
    assert trainer.step_fn.shapes_seen <= declared and len(trainer.step_fn.shapes_seen) >= 2
    assert 1 <= trainer.compilations() <= len(trainer.step_fn.shapes_seen)


def test_a_compiled_packed_epoch_compiles_once(small_corpus, tmp_path):
    """train.batching: packed gives every batch one shape: a whole compiled epoch builds one graph."""
    sets = {"train.max_epochs": 1, "train.max_steps": 10_000, "train.batching": "packed", "train.max_tokens": 1500,
            "train.compile": "true", "train.valid_every": 100_000, "model.dropout": 0.0}
    trainer = Trainer(tiny_config(small_corpus, tmp_path / "run", **sets), log=quiet, progress=False)
    result = trainer.run()
    assert result.stopped_because == "epochs" and result.steps > 5
    assert len(trainer.step_fn.shapes_seen) == 1 and trainer.compilations() == 1


def test_fp16_with_a_gradient_scaler_skips_an_overflowing_step(small_corpus, tmp_path, monkeypatch):
    real = forward_loss_module.label_smoothed_nll
    calls = {"n": 0}

    def overflow_once(logits, target, eps, pad, *rest):
        calls["n"] += 1
        loss, nll = real(logits, target, eps, pad, *rest)
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


@pytest.mark.parametrize("restrict", [False, True], ids=["whole-output", "restricted-output"])
def test_the_trainer_uses_cached_half_weights_where_cuda_would_and_trains_as_autocast(small_corpus, tmp_path, monkeypatch,
                                                                                       restrict):
    """CUDA's bf16 path on a CPU (plain products, the switch that attaches the cache): the
    cache is attached and refreshed once per step, and the losses and weights are autocast's
    to bf16's rounding (the cache's bias gradients skip autocast's rounding to bf16, and
    self-attention's q, k and v come from one product; also when the output layer takes the
    target side's rows of the cached weights)."""
    from xformer_cli.model import linear
    from xformer_cli.train.forward_loss import forced_half_weights

    refreshes = {"n": 0}
    real_refresh = linear.HalfWeightCache._refresh

    def counted(self):
        refreshes["n"] += self.stale
        return real_refresh(self)

    monkeypatch.setattr(linear.HalfWeightCache, "_refresh", counted)
    sets = {"train.max_steps": 6, "train.precision": "bf16", "train.update_freq": 2,
            "model.restrict_output": str(restrict).lower()}
    with linear.plain_products():
        with forced_half_weights(True):
            cached = Trainer(tiny_config(small_corpus, tmp_path / "cached", **sets), log=quiet, progress=False)
            assert cached.step_fn.half_weights is not None
            cached.state.decode_precision = "fp32"  # validation: plain products take no bf16 weights on a CPU
            assert cached.run().steps == 6
        with forced_half_weights(False):
            plain = Trainer(tiny_config(small_corpus, tmp_path / "autocast", **sets), log=quiet, progress=False)
            assert plain.step_fn.half_weights is None
            plain.state.decode_precision = "fp32"
            plain.run()
    assert refreshes["n"] == 6  # one refresh per optimizer step, not per micro-batch or per use
    a, b = losses(tmp_path / "cached"), losses(tmp_path / "autocast")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    assert all(abs(a[step] - b[step]) <= 1e-4 * abs(b[step]) for step in a)
    wa = load_checkpoint(tmp_path / "cached" / "last.pt")["model"]
    wb = load_checkpoint(tmp_path / "autocast" / "last.pt")["model"]
    for key in wa:  # Adam turns a near-zero bias gradient's rounding into a step of up to the learning rate
        torch.testing.assert_close(wa[key], wb[key], atol=0.1, rtol=0)
