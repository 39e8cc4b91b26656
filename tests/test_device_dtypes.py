"""No float64 tensor on the device path: MPS (Apple GPUs) has no float64, so a training step,
its figures, the sums over ranks and validation must not make one. Checked on the CPU by
watching every aten op's output dtype."""

import pytest
import torch
import torch.distributed
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from xformer_cli.config import TrainConfig
from xformer_cli.data.batching import Batch
from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.model.transformer import ModelConfig, Transformer
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.metrics import StepStats
from xformer_cli.train.step import TrainStep
from xformer_cli.train.validation import validation_sums

from helpers import quiet, tiny_config

CPU = torch.device("cpu")


class Float64Watch(TorchDispatchMode):
    """Records the ops whose output is a float64 tensor."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_leaves(out)):
            self.seen.append(str(func))
        return out


def test_the_watch_sees_a_float64_tensor():
    with Float64Watch() as watch:
        torch.zeros(2, dtype=torch.float64).sum()
    assert watch.seen  # it would catch what the tests below look for


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_training_step_its_figures_sums_and_validation_make_no_float64(precision, monkeypatch):
    model = Transformer(ModelConfig(d_model=32, d_ff=64, n_heads=4, encoder_layers=1, decoder_layers=1), src_vocab=50)
    ids = torch.randint(4, 50, (6, 9))
    corpus = EncodedCorpus([row.tolist() for row in ids], [row.tolist() for row in ids], ["x"] * 6)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, *a, **k: None)  # the sum's own tensors
    with Float64Watch() as watch:
        step = TrainStep(model, TrainConfig(clip_norm=1.0), CPU, precision, Distributed())
        stats = StepStats(CPU)
        for _ in range(2):
            result = step([Batch(ids, ids, ids, ids.numel())], ids.numel())
            stats.add(result.loss, result.nonfinite, result.oom, ids.numel())
        figures = stats.drain()
        Distributed(world_size=2).sum([1.0, 2.0], CPU)
        sums = validation_sums(model, corpus, 100, CPU, 0.1, precision)
    assert watch.seen == []
    assert figures[1] == 2 * ids.numel() and sums[2] == sum(len(t) + 1 for t in corpus.tgt)  # eos counted


@pytest.mark.slow
def test_a_whole_run_with_validation_makes_no_float64(small_corpus, tmp_path):
    """(Checkpoint averaging sums in float64 on purpose: on the host, where load_checkpoint
    maps every checkpoint, whatever the training device.)"""
    from xformer_cli.train.trainer import train

    sets = {"train.max_steps": 6, "train.valid_every": 3, "train.save_every": 2, "train.average_last": 0}
    with Float64Watch() as watch:
        result = train(tiny_config(small_corpus, tmp_path / "run", **sets), log=quiet, progress=False)
    assert result.steps == 6 and result.best_bleu is not None
    assert watch.seen == []
