"""Aten ops per training step on the code path CUDA takes, counted on a CPU with fake tensors."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from xformer_cli.config import TrainConfig
from xformer_cli.data.batching import Batch
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.train.loss import forced_path, label_smoothed_nll
from xformer_cli.train.opcount import count_ops, cuda_path_step_ops, gpu_code_path
from xformer_cli.train.step import TrainStep

PAPER_VOCAB = 37000


def _batch(tokens: int, vocab: int, length: int = 25) -> Batch:
    ids = torch.randint(4, vocab, (tokens // length, length))
    return Batch(ids, ids, ids, ids.numel())


def _loss_ops(tokens: int) -> int:
    with FakeTensorMode(), gpu_code_path():
        logits = torch.randn(tokens // 25, 25, PAPER_VOCAB, dtype=torch.bfloat16, requires_grad=True)
        gold = _batch(tokens, PAPER_VOCAB).tgt_out

        def loss_and_grad() -> None:
            loss, _ = label_smoothed_nll(logits, gold, 0.1, 0)
            loss.backward()

        return count_ops(loss_and_grad).total


def test_the_gpu_loss_costs_the_same_ops_at_4k_and_32k_tokens():
    assert _loss_ops(4000) == _loss_ops(32000)
    with FakeTensorMode(), forced_path("blocked"):  # the CPU's walk grows with the rows
        logits = torch.randn(32000, PAPER_VOCAB)
        gold = torch.randint(4, PAPER_VOCAB, (32000,))
        blocked = count_ops(lambda: label_smoothed_nll(logits, gold, 0.1, 0)).total
    assert blocked > 10 * _loss_ops(32000)


def _step_kernels(tokens: int, loss_path: str) -> int:
    # Two layers a side keep the test fast; the loss's share shrinks with more layers, and
    # the full paper-base step (6 + 6) is measured by scripts/bench_opcount.py.
    cfg = ModelConfig(d_model=512, d_ff=2048, n_heads=8, encoder_layers=2, decoder_layers=2)
    return cuda_path_step_ops(lambda: Transformer(cfg, PAPER_VOCAB, 0, 0), [_batch(tokens, PAPER_VOCAB)], TrainConfig(),
                              "bf16", False, loss_path).kernels


def test_a_paper_sized_training_step_launches_far_fewer_kernels_with_the_one_pass_loss():
    one_pass, blocked = _step_kernels(25000, "one_pass"), _step_kernels(25000, "blocked")
    assert one_pass == _step_kernels(4000, "one_pass")  # nothing in the step grows with the batch
    assert one_pass < 0.5 * blocked


def test_the_counter_sees_ops_below_autograd_and_leaves_out_views():
    x = torch.randn(4, 3, requires_grad=True)
    counter = count_ops(lambda: (x.view(12) * 2).sum().backward())
    assert counter.ops["mul"] >= 1 and counter.ops["sum"] == 1 and counter.ops["view"] >= 1
    assert counter.kernels < counter.total


def test_the_trainers_cuda_bf16_step_casts_each_weight_once_per_update():
    """cuda_path_step_ops (scripts/bench_opcount.py, README's figure): with the half-weight
    cache the trainer attaches on CUDA bf16, two micro-batches cast the weights once, not
    once each; the saving is exactly the second micro-batch's per-use casts."""
    cfg = ModelConfig(d_model=64, d_ff=128, n_heads=4, encoder_layers=2, decoder_layers=2)
    batches = [_batch(1000, 500), _batch(1000, 500)]

    def ops(half: bool, micro: int):
        return cuda_path_step_ops(lambda: Transformer(cfg, 500, 0, 0), batches[:micro], TrainConfig(), "bf16", half).ops

    plain1, plain2, cached1, cached2 = ops(False, 1), ops(False, 2), ops(True, 1), ops(True, 2)
    per_micro_batch_casts = plain2["_to_copy"] - plain1["_to_copy"]
    assert per_micro_batch_casts > 0
    assert cached2["_to_copy"] - cached1["_to_copy"] < per_micro_batch_casts
    assert sum(cached2.values()) < sum(plain2.values())


def _small_step_ops(tc: TrainConfig, precision: str = "bf16", loss_path: str = "one_pass", layers: int = 2):
    cfg = ModelConfig(d_model=64, d_ff=128, n_heads=4, encoder_layers=layers, decoder_layers=layers)
    return cuda_path_step_ops(lambda: Transformer(cfg, 500, 0, 0), [_batch(1000, 500)], tc, precision, True, loss_path)


def test_the_count_is_of_the_trainers_own_step(monkeypatch):
    """The op count runs train/step.py's TrainStep (a warm-up update, then the counted one), so a
    change to the step moves the README's figure."""
    calls = []
    real = TrainStep.__call__
    monkeypatch.setattr(TrainStep, "__call__", lambda self, *a: calls.append(self) or real(self, *a))
    counter = _small_step_ops(TrainConfig())
    assert len(calls) == 2 and calls[0] is calls[1]
    # the fused update, and the step's figures (loss, out-of-memory flag) stacked for the finite check
    assert counter.ops["_fused_adam_"] == 1 and counter.ops["stack"] == 1


@pytest.mark.parametrize("loss_path", ["one_pass", "blocked"])
def test_clipping_counts_the_foreach_norms_real_gradients_take(loss_path):
    """train.clip_norm adds the same few ops at any depth: fake gradients take torch's foreach
    norm as real ones do (one op for them all), not a norm per parameter."""
    extra = [_small_step_ops(TrainConfig(clip_norm=1.0), "bf16", loss_path, layers).total
             - _small_step_ops(TrainConfig(), "bf16", loss_path, layers).total for layers in (1, 3)]
    assert extra[0] == extra[1] and 0 < extra[0] < 20


def test_fp16_counts_the_loss_scalers_ops():
    fp16, bf16 = _small_step_ops(TrainConfig(), "fp16").ops, _small_step_ops(TrainConfig(), "bf16").ops
    assert fp16["_amp_update_scale_"] == 1 and "_amp_update_scale_" not in bf16


def test_the_cuda_code_path_keeps_attention_in_its_inputs_dtype():
    """The CPU computes training attention scores in fp32 (its bf16 backward is slow); CUDA
    does not, so the CUDA-path count must not carry those casts (nor autograd's casts back)."""
    from xformer_cli.model.linear import plain_products
    from xformer_cli.model.transformer import attention

    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def step():
        attention(q, k, v, causal=True).float().sum().backward()

    cpu = count_ops(step).ops
    with plain_products():
        cuda = count_ops(step).ops
    assert cpu["_to_copy"] == 6  # q, k, v to fp32 and their gradients back (the output is fp32 already)
    assert cuda["_to_copy"] == 2  # only the test's own .float() of the bf16 output, and its gradient back


def test_the_cuda_code_path_counts_cudas_fused_dropout():
    """On CUDA F.dropout is one fused kernel forward and one backward; the CPU draws its own
    mask in several (model/dropout.py). The count takes CUDA's, so it does not carry the CPU's."""
    from xformer_cli.model.dropout import dropout
    from xformer_cli.model.linear import plain_products

    x = torch.randn(64, 32, requires_grad=True)
    cpu = count_ops(lambda: dropout(x, 0.1, True).sum().backward()).ops
    with plain_products():
        cuda = count_ops(lambda: dropout(x, 0.1, True).sum().backward()).ops
    assert cpu["randint"] == 1 and "native_dropout" not in cpu
    assert cuda["native_dropout"] == cuda["native_dropout_backward"] == 1 and "randint" not in cuda
    assert sum(cuda.values()) < sum(cpu.values())
