"""train.max_tokens: auto and train.tokens_per_update: the probe's search, on a fake "fits"
(no GPU), and a run that resolves once, records the value and resumes without probing again."""

import pytest
import yaml

from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.config import TrainConfig
from xformer_cli.errors import XformerError
from xformer_cli.train import batch_size
from xformer_cli.train import run_plan
from xformer_cli.train.batch_size import largest_fitting, resolved, split_update, with_headroom
from xformer_cli.train.memory_probe import probe_shape
from xformer_cli.train.trainer import train

from helpers import losses, quiet, tiny_config


def fits_below(limit: int, calls: list):
    def fits(tokens: int) -> bool:
        calls.append(tokens)
        return tokens <= limit
    return fits


@pytest.mark.parametrize("memory", [300, 4095, 4096, 5000, 70_000, 123_457, 999_999])
def test_the_search_finds_nearly_the_largest_fitting_multiple_of_256_in_few_tries(memory):
    calls: list[int] = []
    found = largest_fitting(fits_below(memory, calls))
    assert found % 256 == 0 and found <= memory < found + max(256, found // 32)  # within 3% of the largest
    assert all(size % 256 == 0 for size in calls)
    assert len(calls) <= 9 + 6  # doubling from 4096 to a million, then halving the gap to 1/32
    assert len(set(calls)) == len(calls)  # no size tried twice


def test_the_search_stops_at_its_limit_and_reports_nothing_when_nothing_fits():
    calls: list[int] = []
    assert largest_fitting(fits_below(10**9, calls), limit=1 << 20) == 1 << 20
    assert max(calls) == 1 << 20
    assert largest_fitting(fits_below(100, [])) == 0


def test_headroom_and_splitting_an_update():
    assert with_headroom(100_000) == 84_992  # 15% off, down to a multiple of 256
    assert with_headroom(200) == 256  # never below one granule
    assert split_update(25_000, 60_000) == (25_000, 1)  # a batch never holds more than the update
    assert split_update(25_000, 10_000) == (8_334, 3)  # the fewest batches, in equal shares
    assert split_update(25_000, 25_000) == (25_000, 1)


def test_the_probe_shape_is_the_widest_declared_bucket():
    assert probe_shape(8000, 77, 8) == (100, 80)  # width 77 -> bucket 80: 8000 // 80 rows
    assert probe_shape(8000, 77, 0) == (103, 77)


def test_auto_on_a_cpu_takes_the_default_budget_and_says_so():
    lines: list[str] = []
    tc = resolved(TrainConfig(max_tokens="auto", tokens_per_update=25_000), None, lines.append)
    assert (tc.max_tokens, tc.update_freq) == (3572, 7)  # 7 x 3572 >= 25000 from a 4096 budget
    assert "needs CUDA" in lines[0] and str(batch_size.CPU_MAX_TOKENS) in lines[0]
    with pytest.raises(XformerError, match="train.max_tokens: auto found no batch"):
        resolved(TrainConfig(max_tokens="auto"), lambda: 0, quiet)


@pytest.mark.slow
def test_auto_probes_once_records_the_value_and_a_resume_reuses_it(small_corpus, tmp_path, monkeypatch):
    probes: list[int] = []

    def fake_gpu_probe(config, tokenizer, data, device, precision, dist, width):
        probes.append(width)
        return lambda: 1000  # "the largest batch that fits": 1000 tokens

    monkeypatch.setattr(run_plan, "gpu_probe", fake_gpu_probe)
    auto = {"train.max_tokens": "auto", "train.tokens_per_update": 1200, "train.length_bucket": 8}
    lines: list[str] = []
    train(tiny_config(small_corpus, tmp_path / "run", **auto, **{"train.max_steps": 4}), log=lines.append, progress=False)
    assert len(probes) == 1 and probes[0] > 10  # probed at the widest pair of the data
    # 1000 less 15% headroom -> 768; 1200 tokens an update -> 2 batches of 600
    assert any("train.max_tokens: auto -> 768" in line for line in lines)
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]
    assert (written["max_tokens"], written["update_freq"], written["tokens_per_update"]) == (600, 2, 1200)
    from xformer_cli.config import load_config

    again = resolved(load_config(tmp_path / "run" / "config.yaml").train, None, quiet)  # the written config reloads
    assert (again.max_tokens, again.update_freq) == (600, 2)
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["config"]["train"]
    assert (saved["max_tokens"], saved["update_freq"]) == (600, 2)

    monkeypatch.setattr(run_plan, "gpu_probe", lambda *a: pytest.fail("a resume must not probe again"))
    resumed = train(tiny_config(small_corpus, tmp_path / "run", **auto, **{"train.max_steps": 6}), log=quiet, progress=False)
    assert resumed.steps == 6 and sorted(losses(tmp_path / "run")) == list(range(1, 7))
    # the same run with the resolved numbers written out trains the same steps
    fixed = {"train.max_tokens": 600, "train.update_freq": 2, "train.length_bucket": 8, "train.max_steps": 6}
    train(tiny_config(small_corpus, tmp_path / "fixed", **fixed), log=quiet, progress=False)
    assert losses(tmp_path / "fixed") == losses(tmp_path / "run")


@pytest.mark.slow
def test_the_memory_probe_takes_the_real_step_with_everything_it_allocates(small_corpus, tmp_path, monkeypatch):
    """The probe's step is the run's TrainStep: on CUDA's bf16 path it holds the half-weight
    cache, with several ranks the gradient buckets (and communicates nothing), and a packed run
    is probed on a real packed batch of the run's one shape, attention masks included."""
    import torch

    from xformer_cli.data.prepare import prepare_data
    from xformer_cli.train.epoch_batches import PackedPlan, widest_pair
    from xformer_cli.train.distributed import Distributed
    from xformer_cli.train.forward_loss import forced_half_weights
    from xformer_cli.train.memory_probe import step_fits
    from xformer_cli.train.step import TrainStep

    config = tiny_config(small_corpus, tmp_path / "run", **{"train.batching": "packed", "train.precision": "bf16"})
    prepared = prepare_data(config, log=quiet)
    calls = []
    real_call = TrainStep.__call__

    def recorded(self, group, all_tokens):
        calls.append((self, group))
        return real_call(self, group, all_tokens)

    monkeypatch.setattr(TrainStep, "__call__", recorded)
    monkeypatch.setattr(torch.distributed, "broadcast", lambda *a, **k: pytest.fail("the probe communicated"))
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: pytest.fail("the probe communicated"))
    cpu = torch.device("cpu")
    with forced_half_weights(True):
        fits = step_fits(config, prepared.tokenizer, prepared.train, cpu, "bf16", Distributed(world_size=2),
                         widest_pair(prepared.train), compiled=False)
        assert fits(1500) and fits(3000)
    step, group = calls[0]
    assert step is fits.step and step.half_weights is not None
    params = {id(p): p for p in step.model.parameters()}.values()
    assert step.sync is not None and sum(b.numel() for b in step.sync.buckets) == sum(p.numel() for p in params)
    shape = PackedPlan(prepared.train, 1500, config.train.seed).shape
    assert group[0].packing is not None and tuple(group[0].src.shape) == (shape.rows, shape.src_width)
    assert tuple(calls[1][1][0].src.shape) == (PackedPlan(prepared.train, 3000, 1).shape.rows, shape.src_width)
