"""scripts/tune_recipe.py prune: a finished run keeps its last step checkpoints, best.pt and
last.pt; an unfinished run, and a run another still has to branch from, keep everything."""

import json
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import tune_recipe  # noqa: E402


def _run(runs, name, steps, done):
    run = runs / name
    run.mkdir(parents=True)
    for step in steps:
        (run / f"checkpoint_{step}.pt").write_bytes(b"x" * 10)
    for kept in ("best.pt", "last.pt"):
        (run / kept).write_bytes(b"x")
    rows = [{"step": steps[-1], "valid_bleu": 30.0}] + ([{"step": steps[-1], "length_penalty": 1.0}] if done else [])
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_prune_keeps_the_last_checkpoints_of_finished_runs_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_recipe, "RUNS", tmp_path)
    monkeypatch.setattr(tune_recipe, "CONFIGS", {
        "done": tune_recipe.Run(600, {}), "going": tune_recipe.Run(600, {}),
        "parent": tune_recipe.Run(600, {}), "child": tune_recipe.Run(600, {"train.seed": 2}, "parent")})
    steps = [150, 300, 450, 600]
    done, going, parent = (_run(tmp_path, n, steps, finished) for n, finished in
                           (("done", True), ("going", False), ("parent", True)))
    assert tune_recipe.prune(["done", "going", "parent"], keep=2) == 20
    assert sorted(p.name for p in done.iterdir()) == ["best.pt", "checkpoint_450.pt", "checkpoint_600.pt",
                                                      "last.pt", "metrics.jsonl"]
    assert len(list(going.glob("checkpoint_*.pt"))) == 4  # still training: averaging needs them
    assert len(list(parent.glob("checkpoint_*.pt"))) == 4  # "child" has not branched yet
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "last.pt").write_bytes(b"x")
    assert tune_recipe.prune(["parent"], keep=0) == 40 and not list(parent.glob("checkpoint_*.pt"))


def test_a_run_a_kill_cut_off_is_read_without_its_last_line_and_counts_are_checked(tmp_path):
    """A metrics.jsonl cut by a kill -9 stopped the whole search with a JSONDecodeError; --jobs 0
    waited forever, and --keep -1 pruned the newest checkpoints."""
    import argparse

    import pytest

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 20, "train_loss": 5.0}\n{"step": 40, "train_lo')
    assert tune_recipe.read_metrics(metrics) == [{"step": 20, "train_loss": 5.0}]
    assert tune_recipe.read_metrics(tmp_path / "none.jsonl") == []
    assert tune_recipe._at_least(1)("2") == 2
    for low, text in ((1, "0"), (0, "-1")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"must be at least {low}, not {text}"):
            tune_recipe._at_least(low)(text)
