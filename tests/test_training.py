"""Training survives: exact resume, signals, non-finite losses, early stopping, averaging."""

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xformer_cli.errors import XformerError
from xformer_cli.train import metrics as metrics_module
from xformer_cli.train import forward_loss as forward_loss_module
from xformer_cli.train.average import average_checkpoints
from xformer_cli import checkpoint_file
from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.train.trainer import StopReason, Trainer, TrainResult, train

from helpers import ROOT, assert_one_line_error, losses, quiet, signal_after_step, tiny_config, tiny_overrides, xformer


@pytest.mark.slow
def test_interrupted_and_resumed_equals_uninterrupted(small_corpus, tmp_path):
    whole = train(tiny_config(small_corpus, tmp_path / "a", **{"train.max_steps": 14}), log=quiet, progress=False)
    assert whole.steps == 14
    first = train(tiny_config(small_corpus, tmp_path / "b", **{"train.max_steps": 7}), log=quiet, progress=False)
    assert first.steps == 7 and load_checkpoint(tmp_path / "b" / "last.pt")["batches_done"] == 7  # mid-epoch
    resumed = train(tiny_config(small_corpus, tmp_path / "b", **{"train.max_steps": 14}), log=quiet, progress=False)
    assert resumed.steps == 14
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(1, 15))
    for step in range(8, 15):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step
    wa = load_checkpoint(tmp_path / "a" / "last.pt")["model"]
    wb = load_checkpoint(tmp_path / "b" / "last.pt")["model"]
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_an_unversioned_checkpoint_of_the_old_format_upgrades_and_resumes_exactly(small_corpus, tmp_path):
    """last.pt rewritten the way the first trainers wrote it (no version; no loss scaler,
    non-finite count, logging window or per-rank random states) still resumes exactly."""
    whole = tiny_config(small_corpus, tmp_path / "a", **{"train.max_steps": 10})
    train(whole, log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "b", **{"train.max_steps": 5}), log=quiet, progress=False)
    last = tmp_path / "b" / "last.pt"
    old = torch.load(last, weights_only=True)
    for key in ("version", "scaler", "nonfinite_total", "log_window", "precision"):
        del old[key]
    old["rng"] = {"torch": old["rng"]["torch"]}  # one process's state, no "ranks"
    torch.save(old, last)  # written directly, as before versions: save_checkpoint would add one

    upgraded = load_checkpoint(last)
    assert upgraded["version"] == checkpoint_file.VERSION and upgraded["nonfinite_total"] == 0
    assert torch.equal(upgraded["rng"]["ranks"][0]["torch"], old["rng"]["torch"])
    lines: list[str] = []
    resumed = train(tiny_config(small_corpus, tmp_path / "b", **{"train.max_steps": 10}), log=lines.append, progress=False)
    assert resumed.steps == 10 and any(line.startswith("resuming ") and "step 5" in line for line in lines)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    for step in range(6, 11):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step
    assert load_checkpoint(tmp_path / "b" / "last.pt")["version"] == checkpoint_file.VERSION


@pytest.mark.slow
def test_a_signal_finishes_the_step_saves_and_resumes(small_corpus, tmp_path, monkeypatch):
    cfg = tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 50, "train.valid_every": 100,
                                                           "train.save_every": 3})
    trainer = Trainer(cfg, log=quiet, progress=False)
    signal_after_step(trainer, 4, monkeypatch)
    result = trainer.run()
    assert result.stopped_because == "interrupted" and result.steps == 4
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 4
    # the kept step checkpoints stay on the save_every grid: a resumed run averages what an
    # uninterrupted one would
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint_*.pt")) == ["checkpoint_3.pt"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored
    again = Trainer(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 6}), log=quiet, progress=False)
    assert again.counters.step == 4
    assert again.run().steps == 6
    done = train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 6}), log=quiet, progress=False)
    trained = load_checkpoint(tmp_path / "run" / "last.pt")["train_seconds"] / 60
    assert done.stopped_because == "already done" and trained > 0 and done.minutes == pytest.approx(trained)  # not 0


@pytest.mark.slow
def test_a_signal_off_the_log_steps_keeps_the_logged_loss_of_an_uninterrupted_run(small_corpus, tmp_path, monkeypatch):
    """The open logging window's losses since the last read were dropped at a signal: the resumed
    run's next train_loss averaged fewer steps than an uninterrupted run's."""
    sets = {"train.max_steps": 6, "train.valid_every": 100, "train.save_every": 3, "train.log_every": 3}
    train(tiny_config(small_corpus, tmp_path / "whole", **sets), log=quiet, progress=False)
    trainer = Trainer(tiny_config(small_corpus, tmp_path / "cut", **sets), log=quiet, progress=False)
    signal_after_step(trainer, 4, monkeypatch)  # neither a log nor a save step
    assert trainer.run().steps == 4
    train(tiny_config(small_corpus, tmp_path / "cut", **sets), log=quiet, progress=False)
    assert losses(tmp_path / "cut")[6] == pytest.approx(losses(tmp_path / "whole")[6], abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["signal", "max_steps"])
def test_a_run_stopped_off_its_log_steps_and_resumed_logs_an_uninterrupted_runs_losses_to_the_digit(
        small_corpus, tmp_path, monkeypatch, stop):
    """Read at the stop and summed on after the resume, the window's loss added up in another
    order than an uninterrupted run's float32 device sum: the logged train_loss moved in its
    sixth decimal. The device's sums now go on from those read at the stop."""
    sets = {"train.max_steps": 40, "train.valid_every": 100, "train.save_every": 100, "train.log_every": 20}
    train(tiny_config(small_corpus, tmp_path / "whole", **sets), log=quiet, progress=False)
    if stop == "signal":
        trainer = Trainer(tiny_config(small_corpus, tmp_path / "cut", **sets), log=quiet, progress=False)
        signal_after_step(trainer, 27, monkeypatch)
        assert trainer.run().steps == 27
    else:
        train(tiny_config(small_corpus, tmp_path / "cut", **{**sets, "train.max_steps": 27}), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "cut", **sets), log=quiet, progress=False)
    assert losses(tmp_path / "cut") == losses(tmp_path / "whole")


@pytest.mark.slow
def test_non_finite_losses_are_skipped_counted_and_stop_the_run_when_repeated(small_corpus, tmp_path, monkeypatch):
    real = forward_loss_module.label_smoothed_nll
    calls = {"n": 0}
    poisoned = {3}

    def sometimes_nan(logits, target, eps, pad, *rest):
        calls["n"] += 1
        loss, nll = real(logits, target, eps, pad, *rest)
        return (loss * float("nan"), nll) if calls["n"] in poisoned else (loss, nll)

    monkeypatch.setattr(forward_loss_module, "label_smoothed_nll", sometimes_nan)
    messages = []
    result = train(tiny_config(small_corpus, tmp_path / "one", **{"train.max_steps": 5}), log=messages.append, progress=False)
    assert result.steps == 5
    state = load_checkpoint(tmp_path / "one" / "last.pt")
    # The poisoned update was skipped on the device: Adam applied 4 of the 5 updates.
    assert all(int(s["step"]) == 4 for s in state["optimizer"]["state"].values())
    assert state["nonfinite_total"] == 1
    assert any("non-finite loss, update skipped 1 time(s)" in m for m in messages)
    assert any("1 non-finite losses skipped" in m for m in messages)

    calls["n"] = 0
    poisoned.clear()
    poisoned.update(range(8, 100))
    cfg = tiny_config(small_corpus, tmp_path / "many", **{"train.max_steps": 50, "train.valid_every": 5,
                                                          "train.max_nonfinite": 3})
    with pytest.raises(XformerError, match="3 non-finite losses in a row"):
        train(cfg, log=quiet, progress=False)
    assert load_checkpoint(tmp_path / "many" / "last.pt")["step"] == 5  # the last good checkpoint is intact


def test_a_stop_reason_is_one_of_the_enum_and_reads_as_its_plain_string():
    """One enum for the reasons a run stops; the strings callers and scripts compare stay the
    same (==, f-strings, JSON), and a result always carries one the trainer gave it."""
    assert [r.value for r in StopReason] == ["max_steps", "planned steps", "time", "epochs", "patience",
                                             "interrupted", "already done"]
    reason = StopReason.PLANNED_STEPS
    assert reason == "planned steps" and f"{reason}" == str(reason) == "planned steps"
    assert json.dumps({"stopped": StopReason.INTERRUPTED}) == '{"stopped": "interrupted"}'
    with pytest.raises(TypeError):
        TrainResult(1, 1, 0.1, None, Path("run"))  # no default a run never produces


def test_the_step_a_run_of_non_finite_losses_reaches_the_limit_is_kept_on_the_device():
    """StepStats records the step the limit was reached at, whenever it is read, and keeps it
    across drains and finite steps after it."""
    stats = metrics_module.StepStats(torch.device("cpu"), limit=3)
    for step, bad in enumerate([False, True, True, False, True, True, True, True, False], 1):
        stats.add(torch.tensor(1.0), torch.tensor(bad), torch.tensor(False), 10, step=step)
        if step == 6:
            assert stats.tripped() == 0  # two in a row since step 4's finite loss
    assert stats.tripped() == 7  # the third in a row, not the step it is read at
    stats.drain()
    assert stats.tripped() == 7 and metrics_module.StepStats(torch.device("cpu")).tripped() == 0


@pytest.mark.slow
def test_non_finite_losses_stop_the_run_at_the_step_they_reach_the_limit(small_corpus, tmp_path, monkeypatch):
    """train.max_nonfinite 3 and every loss from step 8 on non-finite, a log line every 50
    steps and a save every 4: the run stops at step 10, the third in a row (it went on to the
    next read of the figures, step 12), and no save comes after it (last.pt is step 8's)."""
    real = forward_loss_module.label_smoothed_nll
    calls = {"n": 0}

    def nan_from_step_8(logits, target, eps, pad, *rest):
        calls["n"] += 1
        loss, nll = real(logits, target, eps, pad, *rest)
        return (loss * float("nan"), nll) if calls["n"] >= 8 else (loss, nll)

    monkeypatch.setattr(forward_loss_module, "label_smoothed_nll", nan_from_step_8)
    cfg = tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 40, "train.log_every": 50,
                                                         "train.valid_every": 100, "train.save_every": 4,
                                                         "train.max_nonfinite": 3})
    with pytest.raises(XformerError, match="3 non-finite losses in a row at step 10; stopped, the last good checkpoint"):
        train(cfg, log=quiet, progress=False)
    assert calls["n"] == 10  # one loss a step: no step after the tenth
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 8


@pytest.mark.slow
def test_early_stopping_stops_after_patience_validations(small_corpus, tmp_path):
    # A learning rate of ~0 keeps BLEU flat: validation 1 sets the best, 2 and 3 do not improve.
    cfg = tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 100, "train.valid_every": 2,
                                                         "train.patience": 2, "train.lr_scale": 1e-9})
    result = train(cfg, log=quiet, progress=False)
    assert result.stopped_because == "patience" and result.steps == 6


@pytest.mark.slow
def test_kept_checkpoints_and_averaging(small_corpus, tmp_path):
    cfg = tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 8, "train.valid_every": 2,
                                                         "train.keep_checkpoints": 3, "train.average_last": 0})
    train(cfg, log=quiet, progress=False)
    kept = sorted(p.name for p in (tmp_path / "run").glob("checkpoint_*.pt"))
    assert kept == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_8.pt"]

    copies = [tmp_path / "run" / "checkpoint_8.pt", tmp_path / "copy1.pt", tmp_path / "copy2.pt"]
    for copy in copies[1:]:  # one file three times is refused: it would count three times in a real mean
        shutil.copyfile(copies[0], copy)
    same = average_checkpoints(copies, tmp_path / "same.pt")
    original = load_checkpoint(tmp_path / "run" / "checkpoint_8.pt")["model"]
    for key, value in original.items():
        torch.testing.assert_close(same["model"][key], value)

    proc = xformer("average", tmp_path / "run", "--last", "2", "-o", tmp_path / "avg.pt")
    assert proc.returncode == 0, proc.stderr.decode()
    avg = load_checkpoint(tmp_path / "avg.pt")["model"]
    six = load_checkpoint(tmp_path / "run" / "checkpoint_6.pt")["model"]
    key = "encoder_layers.0.ffn.w1.weight"
    torch.testing.assert_close(avg[key], (six[key] + original[key]) / 2)
    proc = xformer("translate", "-m", tmp_path / "avg.pt", "-b", "1", stdin=b"A dog runs.\n")
    assert proc.returncode == 0 and len(proc.stdout.decode().splitlines()) == 1
    assert_one_line_error(xformer("average", tmp_path / "run", "--last", "9", "-o", tmp_path / "x.pt"), "fewer than 9")
    written = (tmp_path / "avg.pt").read_bytes()  # a second average onto it: refused, the first kept
    assert_one_line_error(xformer("average", tmp_path / "run", "--last", "1", "-o", tmp_path / "avg.pt"),
                          "avg.pt exists (use --force to replace it)")
    assert (tmp_path / "avg.pt").read_bytes() == written
    assert xformer("average", tmp_path / "run", "--last", "1", "-o", tmp_path / "avg.pt", "--force").returncode == 0
    torch.testing.assert_close(load_checkpoint(tmp_path / "avg.pt")["model"][key], original[key])
    config = (tmp_path / "run" / "config.yaml").read_bytes()  # --force replaced any file, the run's config too
    assert_one_line_error(xformer("average", tmp_path / "run", "--last", "1", "-o", tmp_path / "run" / "config.yaml",
                                  "--force"), "config.yaml is not a checkpoint (.pt): --force replaces a checkpoint only")
    assert (tmp_path / "run" / "config.yaml").read_bytes() == config


@pytest.mark.slow
def test_resuming_with_a_different_model_is_refused(small_corpus, tmp_path):
    train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 2}), log=quiet, progress=False)
    with pytest.raises(XformerError, match="different 'model.d_model'"):
        Trainer(tiny_config(small_corpus, tmp_path / "run", **{"model.d_model": 32}), log=quiet, progress=False)


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_accumulating_two_batches(small_corpus, tmp_path):
    """torchrun with 2 CPU processes (gloo) and update_freq 1 takes the same steps as one
    process with update_freq 2: rank r trains on batches r, r+2, ... of the same plan."""
    common = {"train.max_steps": 4, "train.valid_every": 100, "model.dropout": 0.0, "train.threads": 1}
    single = tiny_config(small_corpus, tmp_path / "single", **common, **{"train.update_freq": 2})
    train(single, log=quiet, progress=False)

    sets = dict(s.split("=", 1) for s in tiny_overrides(small_corpus, tmp_path / "ddp")[1::2])
    sets.update({"model.dropout": "0.0", "train.max_tokens": "600", "train.log_every": "1", "train.valid_every": "100",
                 "data.valid_max_sentences": "8", "decode.max_len_a": "0.5", "decode.max_len_b": "3",
                 "train.max_steps": "4", "train.threads": "1", "train.update_freq": "1"})
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "xformer_cli", "train", "-c", "configs/multi30k.yaml", "--quiet", *args],
                          capture_output=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert "x 2 processes" in proc.stderr.decode()

    one = load_checkpoint(tmp_path / "single" / "last.pt")
    two = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert one["step"] == two["step"] == 4
    for key, value in one["model"].items():
        torch.testing.assert_close(two["model"][key], value, atol=2e-5, rtol=1e-4)
    # And the per-step losses agree: both normalise by all the update's target tokens.
    a, b = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    for step in range(1, 5):
        assert b[step] == pytest.approx(a[step], rel=1e-4), step


RANK_THAT_STOPS = """
import os, sys, torch
from pathlib import Path
from xformer_cli.train.distributed import Distributed

dist = Distributed.from_environment()
dist.start(torch.device("cpu"))
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=True)  # as the trainer makes it, after start
dist.stop()
threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
# a file per rank: two ranks printing at once interleave their words on one stdout line
Path(sys.argv[1], f"rank{dist.rank}.txt").write_text(f"rank {dist.rank} threads after stop: {sorted(threads)}")
"""


@pytest.mark.slow
def test_a_rank_has_no_gloo_threads_left_after_stop(tmp_path):
    """Distributed.stop() ends the process group there and then: no gloo thread is left for the
    interpreter's shutdown, where tearing one down could abort a rank after a finished run.
    Making the optimizer after the group exists (torch._dynamo's import) once kept it alive."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_THAT_STOPS)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [path.read_text() for path in sorted(tmp_path.glob("rank*.txt"))]
    assert len(lines) == 2 and all("threads after stop" in line for line in lines), lines
    assert not any("gloo" in line for line in lines), lines


@pytest.mark.slow
def test_two_process_ddp_resumes_exactly_with_dropout(small_corpus, tmp_path):
    """Each rank's random state (its dropout stream) is in the checkpoint: a 2-process run
    stopped at step 3 and resumed matches the uninterrupted one at every later step."""
    def torchrun(run_dir, max_steps):
        sets = dict(s.split("=", 1) for s in tiny_overrides(small_corpus, run_dir)[1::2])
        sets.update({"model.dropout": "0.3", "train.max_tokens": "600", "train.log_every": "1", "train.valid_every": "100",
                     "train.save_every": "3", "train.max_steps": str(max_steps), "train.threads": "1"})
        args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               "-m", "xformer_cli", "train", "-c", "configs/multi30k.yaml", "--quiet", *args],
                              capture_output=True, timeout=600, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]

    torchrun(tmp_path / "whole", 6)
    torchrun(tmp_path / "parts", 3)
    saved = load_checkpoint(tmp_path / "parts" / "last.pt")["rng"]["ranks"]
    assert len(saved) == 2 and not torch.equal(saved[0]["torch"], saved[1]["torch"])
    torchrun(tmp_path / "parts", 6)
    a, b = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    for step in range(4, 7):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step


def test_prefetch_keeps_order_stops_early_and_surfaces_errors():
    from xformer_cli.train.prefetch import prefetch

    assert [x for x in prefetch(range(10), lambda i: i * i)] == [(i, i * i) for i in range(10)]
    for item, _ in prefetch(range(1000), lambda i: i):
        if item == 3:
            break  # the thread is told to stop and joined, not left blocked

    def boom(i):
        if i == 2:
            raise ValueError("bad batch")
        return i

    with pytest.raises(ValueError, match="bad batch"):
        list(prefetch(range(5), boom))


@pytest.mark.slow
def test_an_out_of_memory_batch_is_skipped(small_corpus, tmp_path, monkeypatch):
    real = forward_loss_module.label_smoothed_nll
    calls = {"n": 0}

    def oom_once(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(*args)

    monkeypatch.setattr(forward_loss_module, "label_smoothed_nll", oom_once)
    messages = []
    result = train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 4}), log=messages.append, progress=False)
    assert result.steps == 4
    assert any(m.startswith("step 2: out of memory") and "skipped" in m for m in messages)
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["oom_total"] == 1
    assert all(int(s["step"]) == 3 for s in state["optimizer"]["state"].values())  # 3 of 4 updates applied


@pytest.mark.slow
def test_tensorboard_events_when_tensorboard_is_installed(small_corpus, tmp_path, monkeypatch):
    scalars = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, step):
            scalars.append((tag, step))

        def flush(self):
            pass

        def close(self):
            scalars.append(("closed", -1))

    monkeypatch.setattr(metrics_module, "tensorboard_writer", lambda directory: FakeWriter(directory))
    train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 2, "train.valid_every": 2}),
          log=quiet, progress=False)
    tags = {tag for tag, _ in scalars}
    assert {"train_loss", "lr", "tokens_per_s", "valid_bleu", "valid_loss"} <= tags and ("closed", -1) in scalars


@pytest.mark.slow
def test_average_last_validates_the_mean_of_the_kept_checkpoints(small_corpus, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(small_corpus, run, **{"train.max_steps": 12, "train.save_every": 3, "train.keep_checkpoints": 3,
                                            "train.average_last": 3})
    lines: list[str] = []
    result = train(cfg, log=lines.append, progress=False)
    kept = [load_checkpoint(run / f"checkpoint_{step}.pt")["model"] for step in (6, 9, 12)]
    average = load_checkpoint(run / "average.pt")
    for key, value in average["model"].items():
        if not value.is_floating_point():  # the output layer's pieces: one run's, taken as they are
            assert all(torch.equal(value, k[key]) for k in kept)
            continue
        torch.testing.assert_close(value, sum(k[key].double() for k in kept).div(3).float())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    averaged = [r for r in rows if "averaged_steps" in r]
    assert len(averaged) == 1 and averaged[0]["averaged_steps"] == [6, 9, 12]
    assert any(line.startswith("average of steps 6, 9, 12: valid loss") for line in lines)
    best = load_checkpoint(run / "best.pt")
    others = max(r["valid_bleu"] for r in rows if "valid_bleu" in r and "averaged_steps" not in r)
    if "averaged_steps" in best:  # the mean won: best.pt holds it
        assert averaged[0]["valid_bleu"] > others and result.best_bleu == pytest.approx(averaged[0]["valid_bleu"], abs=0.01)
        assert torch.equal(best["model"]["generator.weight"], average["model"]["generator.weight"])
    else:
        assert averaged[0]["valid_bleu"] <= others
    last = load_checkpoint(run / "last.pt")["model"]  # last.pt keeps the trained weights, for resuming
    assert all(torch.equal(last[key], kept[-1][key]) for key in last)


@pytest.mark.slow
def test_the_loss_logged_after_a_resume_averages_the_same_steps(small_corpus, tmp_path):
    """A logging window open at the stop (steps 6-7 of 6-10) is carried in the checkpoint."""
    every = {"train.log_every": 5}
    train(tiny_config(small_corpus, tmp_path / "a", **every, **{"train.max_steps": 15}), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "b", **every, **{"train.max_steps": 7}), log=quiet, progress=False)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["log_window"]["good_tokens"] > 0
    train(tiny_config(small_corpus, tmp_path / "b", **every, **{"train.max_steps": 15}), log=quiet, progress=False)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == [5, 10, 15]
    for step in (5, 10, 15):
        assert b[step] == pytest.approx(a[step], abs=1e-5), step


def assert_resumed_bit_identically(whole: Path, resumed: Path, stopped_at: int, steps: int) -> None:
    """The resumed run's losses after the stop and its final weights are the uninterrupted run's, bit for bit."""
    a, b = losses(whole), losses(resumed)
    assert sorted(b) == list(range(1, steps + 1))
    for step in range(stopped_at + 1, steps + 1):
        assert b[step] == a[step], step
    wa, wb = load_checkpoint(whole / "last.pt")["model"], load_checkpoint(resumed / "last.pt")["model"]
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bucketed_training_resumes_bit_identically(small_corpus, tmp_path, precision):
    """train.length_bucket on: every batch has a declared shape, and a run stopped mid-epoch
    and resumed gives the uninterrupted run's losses and weights bit for bit."""
    sets = {"train.length_bucket": 8, "train.precision": precision}
    whole = Trainer(tiny_config(small_corpus, tmp_path / "a", **sets, **{"train.max_steps": 12}), log=quiet, progress=False)
    assert whole.run().steps == 12
    declared = {(rows, width, width) for rows, width in whole.batch_plan.declared(whole.config.data.max_len)}
    assert whole.step_fn.shapes_seen and whole.step_fn.shapes_seen <= declared
    train(tiny_config(small_corpus, tmp_path / "b", **sets, **{"train.max_steps": 6}), log=quiet, progress=False)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["config"]["train"]["length_bucket"] == 8
    train(tiny_config(small_corpus, tmp_path / "b", **sets, **{"train.max_steps": 12}), log=quiet, progress=False)
    assert_resumed_bit_identically(tmp_path / "a", tmp_path / "b", stopped_at=6, steps=12)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_packed_training_has_one_shape_learns_and_resumes_bit_identically(small_corpus, tmp_path, precision):
    """train.batching: packed: every batch has the plan's one shape, the loss falls, and a run
    stopped mid-epoch and resumed gives the uninterrupted run's losses and weights bit for bit."""
    sets = {"train.batching": "packed", "train.precision": precision, "train.log_every": 1}
    whole = Trainer(tiny_config(small_corpus, tmp_path / "a", **sets, **{"train.max_steps": 12}), log=quiet, progress=False)
    assert whole.run().steps == 12
    assert whole.step_fn.shapes_seen == set(whole.batch_plan.declared(whole.config.data.max_len))
    train(tiny_config(small_corpus, tmp_path / "b", **sets, **{"train.max_steps": 6}), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "b", **sets, **{"train.max_steps": 12}), log=quiet, progress=False)
    assert_resumed_bit_identically(tmp_path / "a", tmp_path / "b", stopped_at=6, steps=12)
    assert losses(tmp_path / "a")[12] < losses(tmp_path / "a")[1]


@pytest.mark.slow
def test_resuming_with_another_length_bucket_is_refused_and_old_checkpoints_read_it_as_off(small_corpus, tmp_path):
    train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 2}), log=quiet, progress=False)
    with pytest.raises(XformerError, match="train.length_bucket"):
        train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 4, "train.length_bucket": 8}),
              log=quiet, progress=False)
    last = tmp_path / "run" / "last.pt"
    old = torch.load(last, weights_only=False)
    del old["config"]["train"]["length_bucket"], old["config"]["train"]["tokens_per_update"]  # as before the keys
    torch.save(old, last)
    assert train(tiny_config(small_corpus, tmp_path / "run", **{"train.max_steps": 4}), log=quiet, progress=False).steps == 4


@pytest.mark.slow
def test_resuming_over_changed_training_data_that_trains_another_tokenizer_is_refused_and_keeps_the_run(
        small_corpus, tmp_path):
    """The same config over other text: its tokenizer's ids are not the ones the weights learnt."""
    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(small_corpus, data)
    train(tiny_config(data, run, **{"train.max_steps": 2}), log=quiet, progress=False)
    kept = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    Trainer(tiny_config(data, run, **{"train.max_steps": 2}), log=quiet, progress=False)  # the same data: resumes
    german = (data / "train.de").read_text(encoding="utf-8").splitlines()
    (data / "train.de").write_text("".join(f"{line.upper()}\n" for line in german), encoding="utf-8")
    with pytest.raises(XformerError, match=r"last\.pt was trained with another tokenizer than the training data gives"):
        Trainer(tiny_config(data, run, **{"train.max_steps": 2}), log=quiet, progress=False)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == kept


@pytest.mark.slow
def test_resuming_over_changed_training_data_with_the_same_tokenizer_goes_on_and_says_so(small_corpus, tmp_path):
    """A corrected corpus under a given tokenizer resumes (its ids mean what the weights learnt), with one
    warning: the batches from there on are not an uninterrupted run's. The same data resumes without it."""
    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(small_corpus, data)
    train(tiny_config(data, tmp_path / "first", **{"train.max_steps": 1}), log=quiet, progress=False)
    given = {"tokenizer.model": str(next((tmp_path / "first" / "tokenizer").glob("*.model")))}
    train(tiny_config(data, run, **given, **{"train.max_steps": 2}), log=quiet, progress=False)
    said: list[str] = []
    Trainer(tiny_config(data, run, **given, **{"train.max_steps": 4}), log=said.append, progress=False)
    german = (data / "train.de").read_text(encoding="utf-8").splitlines()
    german[0] = german[1]
    (data / "train.de").write_text("".join(f"{line}\n" for line in german), encoding="utf-8")
    said.clear()
    assert train(tiny_config(data, run, **given, **{"train.max_steps": 4}), log=said.append, progress=False).steps == 4
    assert len([line for line in said if "the training data changed since last.pt was saved" in line]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("ended", ["patience", "epochs", "minutes"])
def test_a_run_that_stopped_on_its_patience_epochs_or_minutes_is_finished_when_run_again(small_corpus, tmp_path, ended):
    """Only the step limits were checked: run again, such a run trained a step more, validated,
    wrote a checkpoint off the save_every grid (pruning a kept one) and redid its passes."""
    sets = {"patience": {"train.patience": 1, "train.valid_every": 2, "train.max_steps": 400},
            "epochs": {"train.max_epochs": 1, "train.max_steps": 400},
            "minutes": {"train.max_minutes": 0.02, "train.max_steps": 100000}}[ended]
    run = tmp_path / "run"
    sets = {**sets, "train.save_every": 2, "train.keep_checkpoints": 3, "train.average_last": 2}
    first = train(tiny_config(small_corpus, run, **sets), log=quiet, progress=False)
    assert first.stopped_because == {"patience": "patience", "epochs": "epochs", "minutes": "time"}[ended]
    files = {p.name: p.read_bytes() for p in run.glob("*.pt")} | {"metrics.jsonl": (run / "metrics.jsonl").read_bytes()}
    logged: list[str] = []
    again = train(tiny_config(small_corpus, run, **sets), log=logged.append, progress=False)
    assert again.stopped_because == "already done" and again.steps == first.steps
    assert any(f"has finished at step {first.steps}" in line for line in logged), logged
    assert {p.name: p.read_bytes() for p in run.glob("*.pt")} | {"metrics.jsonl": (run / "metrics.jsonl").read_bytes()} \
        == files


@pytest.mark.slow
def test_a_signal_in_the_last_step_leaves_its_validation_to_the_resumed_run(small_corpus, tmp_path, monkeypatch):
    """Interrupted in its last step, a run saved last.pt alone; the next call ran the passes
    only: the step was never validated and, with no validation before it, best.pt never made
    ('checkpoint not found: best.pt' at every call)."""
    sets = {"train.max_steps": 6, "train.valid_every": 100, "train.save_every": 100, "train.average_last": 0,
            "train.tune_length_penalty": "[0.6, 1.0]"}
    trainer = Trainer(tiny_config(small_corpus, tmp_path / "run", **sets), log=quiet, progress=False)
    signal_after_step(trainer, 6, monkeypatch)
    assert trainer.run().stopped_because == "interrupted" and not (tmp_path / "run" / "best.pt").exists()
    resumed = train(tiny_config(small_corpus, tmp_path / "run", **sets), log=quiet, progress=False)
    assert resumed.stopped_because == "already done" and resumed.best_bleu is not None
    assert load_checkpoint(tmp_path / "run" / "best.pt")["step"] == 6
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "valid_loss" in r and "averaged_steps" not in r] == [6]


@pytest.mark.slow
def test_overwrite_keeps_the_earlier_runs_checkpoints_when_the_new_data_is_refused(small_corpus, tmp_path):
    """--overwrite cleared last.pt, best.pt and the rest before the data was built: a data.max_len
    that leaves no pair cost the earlier run and trained nothing."""
    run = tmp_path / "run"
    train(tiny_config(small_corpus, run, **{"train.max_steps": 4}), log=quiet, progress=False)
    before = {p.name: p.read_bytes() for p in run.glob("*.pt")}
    with pytest.raises(XformerError, match="nothing left to train on"):
        train(tiny_config(small_corpus, run, **{"train.max_steps": 4, "data.max_len": 1}), overwrite=True, log=quiet,
              progress=False)
    assert {p.name: p.read_bytes() for p in run.glob("*.pt")} == before and (run / "metrics.jsonl").is_file()


def test_device_sums_read_at_a_stop_go_on_in_their_float32_order_after_a_resume():
    """What a run that stops off its log steps keeps of the logging window: the sums read at the
    stop, which a resumed run's device goes on from. Summed in Python with the rest instead (as
    before), they differ from an uninterrupted run's float32 sum: 1e8 + 1 is 1e8 there."""
    cpu, no = torch.device("cpu"), torch.tensor(False)
    losses_in_order = [1e8] + [1.0] * 9
    whole = metrics_module.StepStats(cpu)
    for loss in losses_in_order:
        whole.add(torch.tensor(loss), no, no, 10)
    cut = metrics_module.StepStats(cpu)
    for loss in losses_in_order[:4]:
        cut.add(torch.tensor(loss), no, no, 10)
    read = cut.drain(keep_sums=True)
    cut.add(torch.tensor(1.0), no, no, 10)  # kept sums: the same process adds on in order
    assert cut.drain()[:2] == (1e8, 50.0)
    resumed = metrics_module.StepStats(cpu)
    resumed.go_on_from(read[0], read[1])
    rest = metrics_module.StepStats(cpu)
    for loss in losses_in_order[4:]:
        resumed.add(torch.tensor(loss), no, no, 10)
        rest.add(torch.tensor(loss), no, no, 10)
    expected = whole.drain()[:2]
    assert resumed.drain()[:2] == expected == (1e8, 100.0)
    assert read[0] + rest.drain()[0] != expected[0]  # the old way


@pytest.mark.slow
def test_valid_lines_cut_to_the_input_length_are_one_log_line_not_a_python_warning(small_corpus, tmp_path):
    """The API's UserWarning (a source path, a code line, a remedy for API callers) was printed at
    each validation and at the length-penalty pass."""
    import warnings

    logged: list[str] = []
    sets = {"train.max_steps": 4, "train.valid_every": 2, "data.max_len": 12, "train.tune_length_penalty": "[0.6, 1.0]"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_config(small_corpus, tmp_path / "run", **sets), log=logged.append, progress=False)
    assert not [w for w in caught if "were cut" in str(w.message)]
    cut = [line for line in logged if "longer than the model's input length" in line]
    assert len(cut) == 1 and cut[0].startswith("valid: ") and "(12 pieces) cut to it for BLEU" in cut[0], cut
