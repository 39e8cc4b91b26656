"""One writer per run folder (run_lock): a second train, prepare or pipeline on a folder in use
stops in one line naming the first and touches nothing; the lock goes with its process, kill -9
included; a pipeline's --status names the stage a running pipeline is at."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from helpers import ROOT, assert_one_line_error, write_lines, xformer

from xformer_cli import run_lock
from xformer_cli.errors import XformerError

HOLD = """
import sys, time
from xformer_cli import run_lock
with run_lock.holding(sys.argv[1], sys.argv[2]):
    if len(sys.argv) > 3:
        run_lock.set_stage(sys.argv[1], sys.argv[3])
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def held_by_another_process(folder: Path, command: str, stage: str = "") -> Iterator[subprocess.Popen]:
    """A process holding ``folder`` until the block ends (killed with SIGKILL then)."""
    args = [sys.executable, "-c", HOLD, str(folder), command] + ([stage] if stage else [])
    process = subprocess.Popen(args, stdout=subprocess.PIPE, cwd=ROOT, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow  # another process holds the folder
def test_a_folder_held_by_another_process_is_refused_in_one_line_naming_it(tmp_path):
    with held_by_another_process(tmp_path, "xformer train") as other:
        found = run_lock.holder(tmp_path)
        assert (found.pid, found.command) == (other.pid, "xformer train")
        with pytest.raises(XformerError) as refused:
            with run_lock.holding(tmp_path, "xformer prepare"):
                pytest.fail("a second writer got in")
        message = str(refused.value)
        assert "\n" not in message and f"{tmp_path} is in use by pid {other.pid} (xformer train, since" in message
    assert run_lock.holder(tmp_path) is None


@pytest.mark.slow  # another process holds the folder
def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    with held_by_another_process(tmp_path, "xformer train") as other:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
        assert run_lock.holder(tmp_path) is None
        with run_lock.holding(tmp_path, "xformer train"):
            assert run_lock.holder(tmp_path).pid == os.getpid()


@pytest.mark.slow  # another process holds the folder
def test_a_hold_inside_a_hold_of_the_same_process_passes_and_the_outer_one_lets_go(tmp_path):
    with run_lock.holding(tmp_path, "xformer train"):
        with run_lock.holding(tmp_path, "xformer prepare"):  # prepare_data inside train
            pass
        assert run_lock.holder(tmp_path).command == "xformer train"  # still held by the outer one
        probe = subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"), str(tmp_path), "x"],
                               capture_output=True, text=True, cwd=ROOT)
        assert probe.returncode != 0 and "is in use by pid" in probe.stderr
    assert run_lock.holder(tmp_path) is None


def test_a_folder_made_for_a_run_that_wrote_nothing_goes_again(tmp_path):
    fresh, used = tmp_path / "fresh", tmp_path / "used"
    with pytest.raises(ValueError):
        with run_lock.holding(fresh, "xformer train"):
            raise ValueError("bad input, found before anything was written")
    assert not fresh.exists()
    with run_lock.holding(used, "xformer train"):
        (used / "last.pt").write_bytes(b"x")
    assert sorted(p.name for p in used.iterdir()) == [run_lock.LOCK_NAME, "last.pt"]


def test_a_run_folder_that_cannot_be_made_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(XformerError,
                       match=r"^config key 'run_dir': cannot make the folder .*file/run: a file stands in its path$"):
        with run_lock.holding(tmp_path / "file" / "run", "xformer train"):
            pytest.fail("held a folder that cannot exist")


def test_a_lock_file_this_user_may_not_write_is_locked_read_only(tmp_path, monkeypatch):
    """Another user's run folder (its lock file theirs): the lock still keeps two runs apart."""
    (tmp_path / run_lock.LOCK_NAME).write_text('{"pid": 1, "command": "xformer train", "since": "then"}')
    opened = os.open

    def not_writable(path, flags, *mode):
        if str(path).endswith(run_lock.LOCK_NAME) and flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, flags, *mode)

    monkeypatch.setattr(run_lock.os, "open", not_writable)
    with run_lock.holding(tmp_path, "xformer train"):
        assert run_lock.holder(tmp_path).pid == os.getpid()  # this process's own hold
    assert (tmp_path / run_lock.LOCK_NAME).read_text().startswith('{"pid": 1,')  # its note left as it was


@pytest.mark.slow  # another process holds the folder
def test_a_run_inside_a_folder_another_process_holds_is_refused(tmp_path):
    with held_by_another_process(tmp_path, "xformer pipeline", stage="student") as other:
        with pytest.raises(XformerError, match=rf"student lies inside {tmp_path}, in use by pid {other.pid} "
                                               r"\(xformer pipeline, stage student"):
            with run_lock.holding(tmp_path / "student", "xformer train"):
                pytest.fail("a run got inside a running pipeline's folder")
    with run_lock.holding(tmp_path, "xformer pipeline"):  # this process's pipeline trains its stages
        with run_lock.holding(tmp_path / "student", "xformer train"):
            pass


PEEK = """
import sys, time
from xformer_cli import run_lock
end = time.monotonic() + float(sys.argv[2])
print("peeking", flush=True)
while time.monotonic() < end:
    run_lock.holder(sys.argv[1])
"""


@pytest.mark.slow  # another process peeks
def test_a_peek_never_makes_a_starting_run_think_its_folder_in_use(tmp_path):
    """`pipeline --status` in a loop beside runs that start and end (each making and removing
    its folder): every start gets the lock."""
    folder = tmp_path / "run"
    peeker = subprocess.Popen([sys.executable, "-c", PEEK, str(folder), "3"], stdout=subprocess.PIPE, cwd=ROOT,
                              text=True)
    try:
        assert peeker.stdout.readline().strip() == "peeking"
        for _ in range(1500):  # each makes the folder and removes it again
            with run_lock.holding(folder, "xformer train"):
                pass
            assert not folder.exists()
        folder.mkdir()
        (folder / "last.pt").write_bytes(b"a run's")
        for _ in range(1500):  # the lock file stays: the peek often holds it shared
            with run_lock.holding(folder, "xformer train"):
                pass
    finally:
        peeker.kill()
        peeker.wait()


@pytest.mark.slow  # another process holds the folder
def test_torchruns_other_ranks_leave_the_lock_to_rank_0(tmp_path, monkeypatch):
    with held_by_another_process(tmp_path, "xformer train"):  # rank 0, as far as this test goes
        monkeypatch.setenv("RANK", "1")
        with run_lock.holding(tmp_path, "xformer train"):
            pass


@pytest.mark.slow  # another process holds the folder
def test_train_on_a_folder_in_use_stops_before_touching_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"the other run's checkpoint")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    config = ROOT / "configs" / "multi30k.yaml"
    with held_by_another_process(run, "xformer train") as other:
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        for args in (["train", "-c", str(config), "--overwrite"], ["prepare", "-c", str(config)]):
            result = xformer(*args, "--set", f"run_dir={run}")
            assert_one_line_error(result, str(run), f"is in use by pid {other.pid} (xformer train")
            assert {p.name: p.read_bytes() for p in run.iterdir()} == before


@pytest.mark.slow  # another process holds the folder
def test_status_names_the_stage_a_running_pipeline_is_at(tmp_path):
    from xformer_cli.pipeline import load_pipeline_config, pipeline_status

    write_lines(tmp_path / "mono.de", ["Ein Hund läuft."] * 3)
    write_lines(tmp_path / "mono.en", ["A dog runs."] * 3)
    sets = [f"run_dir={tmp_path / 'run'}", f"mono.target={tmp_path / 'mono.de'}",
            f"mono.source={tmp_path / 'mono.en'}"]
    config = load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", sets)
    with held_by_another_process(tmp_path / "run", "xformer pipeline", stage="reverse") as other:
        reverse = pipeline_status(config)[0]
        assert (reverse.stage, reverse.action) == ("reverse", "running")
        assert reverse.detail == f"now, by {run_lock.holder(tmp_path / 'run').describe()}: not begun"
        assert f"pid {other.pid} (xformer pipeline, stage reverse, since" in reverse.detail
        given = ["-c", ROOT / "configs" / "pipeline-smoke.yaml", *[a for s in sets for a in ("--set", s)]]
        result = xformer("pipeline", *given, "--status")
        assert result.returncode == 0
        assert result.stdout.decode().splitlines()[0].startswith(
            f"pipeline in {tmp_path / 'run'}, running now: pid {other.pid} (xformer pipeline, stage reverse")
        second = xformer("pipeline", *given)
        assert_one_line_error(second, "is in use by pid", "(xformer pipeline, stage reverse")
    assert pipeline_status(config)[0].action == "starts"


@pytest.mark.slow  # another process holds the folder
def test_a_stage_does_not_clear_a_folder_another_process_trains_in(tmp_path, monkeypatch):
    """A train started by hand in a stage's folder before the pipeline: the stage (other inputs,
    so it would start that folder afresh) stops in one line and the run there keeps its files."""
    from xformer_cli.pipeline import load_pipeline_config, runner
    from xformer_cli.pipeline.stages import Pipeline

    config = load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", [f"run_dir={tmp_path / 'run'}"])
    pipe = Pipeline(config, log=lambda _: None, progress=False)
    monkeypatch.setitem(runner.FINGERPRINTS, "reverse", lambda _: "new inputs")
    monkeypatch.setitem(runner.RUNS, "reverse", lambda _: pytest.fail("the stage ran over a folder in use"))
    record = pipe.record("reverse")
    record.begin("old inputs")  # stopped part-way: a start with other inputs removes the folder
    (record.directory / "last.pt").write_bytes(b"the other run's")
    with held_by_another_process(record.directory, "xformer train") as other:
        with pytest.raises(XformerError, match=rf"^stage reverse: .*reverse is in use by pid {other.pid} "
                                               r"\(xformer train, since"):
            runner.run_stage(pipe, "reverse")
        assert (record.directory / "last.pt").read_bytes() == b"the other run's"


@pytest.mark.slow  # another process holds the folder
def test_a_pipeline_on_a_folder_in_use_says_so_before_it_reads_the_records(tmp_path, monkeypatch):
    """The checks before the first stage read the records first: a second pipeline on a busy
    folder stopped on what it read there (a stage 'gone' or 'out of date') instead of the lock."""
    from xformer_cli.pipeline import load_pipeline_config, run_pipeline
    from xformer_cli.pipeline import runner

    config = load_pipeline_config(ROOT / "configs" / "pipeline-smoke.yaml", [f"run_dir={tmp_path / 'run'}"])
    monkeypatch.setattr(runner, "gone_output", lambda *_: pytest.fail("a record was read before the lock"))
    (tmp_path / "run").mkdir()
    with held_by_another_process(tmp_path / "run", "xformer pipeline", "teacher") as other:
        with pytest.raises(XformerError, match=rf"is in use by pid {other.pid} \(xformer pipeline, stage teacher"):
            run_pipeline(config, only="distill", log=lambda _: None, progress=False)
