"""``xformer pipeline --status``: what each stage's record says and what the next run would do
with it (skip, resume, start, redo, or wait for a stage before it), read without writing a
byte: a record of an earlier version is not upgraded, an output set aside is not put back. A
run of several hours is looked at this way while it runs, or before it is called again with
other settings."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from xformer_cli import run_lock
from xformer_cli.errors import XformerError
from xformer_cli.pipeline.corpus_translation import whole_chunks
from xformer_cli.pipeline.record import ASIDE, CHANGED, DONE, RESUMABLE, STOPPED, StageRecord
from xformer_cli.pipeline.checks import gone_output, stage_problem
from xformer_cli.pipeline.stages import (FINGERPRINTS, NEEDS, STAGES, TEACHER_DONE, Pipeline, real_target_files,
                                         trained_run_dirs, translation_files)

SKIP, RESUME, START, REDO, AFTER, FAIL = "skipped", "resumes", "starts", "redone", "after", "fails"
RUNNING = "running"  # another process's pipeline is at this stage now (run_lock)


@dataclass
class StageStatus:
    stage: str
    action: str  # what the next `xformer pipeline` does with it: SKIP, RESUME, START, REDO, AFTER or FAIL;
    #              RUNNING: a pipeline running now is at it
    detail: str  # its record's figures, or how far it got, or why it runs

    def line(self) -> str:
        return f"{self.stage:<14} {self.action:<8} {self.detail}"


def stage_statuses(pipe: Pipeline, upgradable: Callable[[str], bool] = lambda name: False) -> list[StageStatus]:
    """Each stage in order, as the runner would meet it. ``upgradable(name)``: whether the record
    is an earlier version's of these inputs, which the run upgrades (the runner's check, read only)."""
    pipe.base  # the model config is read and checked, as a run would
    holder = run_lock.holder(pipe.run_dir)
    running: set[str] = set()  # the stages the next run does work in (or stops at)
    statuses = []
    for name in STAGES:
        waits = [need for need in NEEDS[name] if need in running]
        try:
            problem = stage_problem(pipe, name)
        except XformerError as exc:  # what the reading of its input says (a line that is not UTF-8, named)
            problem = str(exc)
        if problem:  # the run stops before its first stage
            status = StageStatus(name, FAIL, problem)
        elif waits:
            status = StageStatus(name, AFTER, f"runs after {', '.join(waits)}")
        else:
            status = _one(pipe, name, upgradable)
            if holder is not None and holder.stage == name and status.action != SKIP:
                status = StageStatus(name, RUNNING, f"now, by {holder.describe()}: {status.detail}")
            if status.detail.endswith(PUT_BACK):  # later stages read its record where it waits
                pipe = replace(pipe, read_aside=pipe.read_aside | {name})
        if status.action != SKIP:
            running.add(name)
        statuses.append(status)
    return statuses


PUT_BACK = "(put back from where a redo set it aside)"
UPGRADED = "its record, from an earlier version of these inputs, upgraded"


def _one(pipe: Pipeline, name: str, upgradable: Callable[[str], bool]) -> StageStatus:
    """One stage whose upstream stages are up to date, as the runner decides (StageRecord.standing)."""
    record = pipe.record(name)
    try:
        stamp = FINGERPRINTS[name](pipe)
    except XformerError as exc:  # an input is missing or unreadable: the run stops here, saying this
        return StageStatus(name, FAIL, str(exc))
    standing = record.standing(stamp)
    upgraded = standing in (CHANGED, STOPPED) and upgradable(name)
    if upgraded:  # the run upgrades the record first: then finished, or to resume
        standing = DONE if standing == CHANGED else RESUMABLE
    said = f"; {UPGRADED}" if upgraded else ""
    gone = gone_output(pipe, name) if standing == DONE else None
    if gone is not None:
        return StageStatus(name, REDO, f"{gone} is gone: runs again")
    if standing == DONE:
        return StageStatus(name, SKIP, _finished(record.read()) + said)
    if standing == ASIDE:
        return StageStatus(name, SKIP, f"{_finished(StageRecord(name, record.replaced).read())} {PUT_BACK}")
    if standing == RESUMABLE:
        spent = record.minutes_so_far()
        return StageStatus(name, RESUME, _how_far(pipe, name) + (f"; {spent:.1f} min so far" if spent else "") + said)
    if standing == CHANGED:
        return StageStatus(name, REDO, f"its inputs changed since it finished ({_finished(record.read())})")
    if standing == STOPPED:
        return StageStatus(name, START, "afresh: a run of other inputs stopped part-way")
    return StageStatus(name, START, "not begun")


def _finished(record: dict) -> str:
    parts = [f"{record['minutes']:.1f} min" if isinstance(record.get("minutes"), (int, float)) else "",
             f"finished {record['finished']}" if record.get("finished") else ""]
    if isinstance(record.get("lines"), int):
        parts.append(f"{record['lines']:,} lines")
    if isinstance(record.get("steps"), int):
        parts.append(f"{record['steps']:,} steps")
    if isinstance(record.get("best_valid_bleu"), (int, float)):
        parts.append(f"valid BLEU {record['best_valid_bleu']:.2f}")
    return ", ".join(p for p in parts if p) or "finished"


def _how_far(pipe: Pipeline, name: str) -> str:
    """A stage that began with these inputs: where its translation or its runs go on."""
    files = translation_files(pipe, name)
    if files is not None:
        chunk = getattr(pipe.config, name).chunk_lines
        said = f"after {whole_chunks(*files, chunk):,} translated lines (the whole chunks of {chunk:,})"
        real = real_target_files(pipe) if name == "backtranslate" else None
        if real is not None and real[0].exists():  # backtranslate.real_targets: the second job has begun
            said += f", then {whole_chunks(*real, chunk):,} of the real targets"
        return said
    runs = [run for run in trained_run_dirs(pipe, name) if run.is_dir()]
    if not runs:
        return "begun, not finished: it runs again from its beginning"
    named = [(run.relative_to(pipe.run_dir).as_posix(), run) for run in runs]
    return "from last.pt: " + "; ".join(f"{name} {_how_far_trained(run)}" for name, run in named)


def _how_far_trained(run: Path) -> str:
    from xformer_cli.checkpoint_file import read_light

    if (run / TEACHER_DONE).is_file():
        return "finished"
    if not (run / "last.pt").is_file():
        return "nothing saved yet (from step 0)"
    return f"at step {int(read_light(run / 'last.pt').get('step', 0)):,}"
