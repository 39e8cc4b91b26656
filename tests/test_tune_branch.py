"""scripts/tune_branch.py: a run branched from another's checkpoint ends where it would have
from scratch (the recipe search of issue 28 relies on it)."""

import sys

import pytest
import torch

from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.train.trainer import train

from helpers import ROOT, losses, quiet, tiny_config

sys.path.insert(0, str(ROOT / "scripts"))
import tune_branch  # noqa: E402


def _config(corpus, run_dir, **changes):
    sets = {"train.max_minutes": 0, "train.max_steps": 20, "train.save_every": 4, "train.keep_checkpoints": 20, "train.average_last": 3,
            **changes}
    return tune_branch.with_plan(tiny_config(corpus, run_dir, **sets))


def _rows(run_dir, key):
    import json
    return [json.loads(line)[key] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if key in line]


@pytest.mark.slow
@pytest.mark.parametrize("restrict", ["false", "true"])  # true: the child carries the parent's counted pieces
def test_a_cooldown_branched_from_the_plain_run_equals_it_trained_from_scratch(small_corpus, tmp_path, restrict):
    parent = _config(small_corpus, tmp_path / "parent", **{"model.restrict_output": restrict})
    child = _config(small_corpus, tmp_path / "child", **{"train.cooldown": 0.3, "model.restrict_output": restrict})
    # The cool-down covers steps 15-20 (6 of 20): the rates agree up to step 14, and the
    # parent's newest checkpoint on its grid (every 4 steps, validations every 6) is 12.
    step = tune_branch.branch_step(parent, child)
    assert step == 12
    train(parent, log=quiet, progress=False)
    tune_branch.make_branch(tmp_path / "parent", tmp_path / "child", child, step)
    lines: list[str] = []
    train(child, log=lines.append, progress=False)
    assert any(line.startswith("resuming ") and "step 12" in line for line in lines)
    train(_config(small_corpus, tmp_path / "scratch", **{"train.cooldown": 0.3, "model.restrict_output": restrict}),
          log=quiet, progress=False)

    branched, scratch = losses(tmp_path / "child"), losses(tmp_path / "scratch")
    assert sorted(branched) == sorted(scratch) == list(range(1, 21))
    for s in range(1, 21):
        assert branched[s] == pytest.approx(scratch[s], abs=1e-4), s
    assert _rows(tmp_path / "child", "lr")[-1] == pytest.approx(_rows(tmp_path / "scratch", "lr")[-1])
    assert _rows(tmp_path / "child", "valid_bleu") == _rows(tmp_path / "scratch", "valid_bleu")  # averaged one too
    a, b = (load_checkpoint(tmp_path / d / "last.pt")["model"] for d in ("child", "scratch"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4)


def test_a_run_that_trains_differently_is_no_branch(tmp_path):
    from xformer_cli.config import load_config
    parent = tune_branch.with_plan(load_config("configs/multi30k.yaml", [f"run_dir={tmp_path}/a"]))
    child = tune_branch.with_plan(load_config("configs/multi30k.yaml", [f"run_dir={tmp_path}/b", "model.dropout=0.2"]))
    with pytest.raises(ValueError, match="model.dropout"):
        tune_branch.branch_step(parent, child)


def test_a_longer_warmup_shares_no_step_and_a_cooldown_shares_those_before_it(tmp_path):
    from xformer_cli.config import load_config

    def config(*sets):  # on the recipe before the search: the paper's schedule, a validation every 1000 steps
        return tune_branch.with_plan(load_config("configs/multi30k.yaml", [f"run_dir={tmp_path}/x", "train.max_minutes=0",
                                                                          "train.max_steps=2000", "train.cooldown=0",
                                                                          "train.validations=0", *sets]))
    plain = config()
    assert tune_branch.branch_step(plain, config("train.warmup_steps=200")) == 0
    assert tune_branch.branch_step(plain, config("train.cooldown=0.3")) == 1350  # cool-down from step 1401
    assert tune_branch.branch_step(plain, config("train.cooldown=0.3", "train.max_steps=1300")) == 900
    assert tune_branch.branch_step(plain, config("train.max_steps=1300")) == 1200
