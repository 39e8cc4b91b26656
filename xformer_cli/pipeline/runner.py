"""``xformer pipeline``: the stages in order, each skipped when its record says it finished
with the same inputs (one line says so), resumed when it began with them, done afresh
otherwise; ``from_stage`` redoes a stage and all after it, ``only`` runs one stage."""

from __future__ import annotations

import time
from typing import Callable, Optional

from xformer_cli import run_lock
from xformer_cli.errors import XformerError
from xformer_cli.pipeline.checks import gone_output, stage_problem, stale_need
from xformer_cli.pipeline.corpus_translation import RESUMES_THERE
from xformer_cli.pipeline.earlier_forms import upgradable, upgrade
from xformer_cli.pipeline.record import ASIDE, CHANGED, DONE, STOPPED
from xformer_cli.pipeline.settings import PipelineConfig
from xformer_cli.pipeline.stages import FINGERPRINTS, NEEDS, RUNS, STAGES, Pipeline
from xformer_cli.pipeline.status import StageStatus, stage_statuses


def _chosen(from_stage: Optional[str], only: Optional[str]) -> tuple[list[str], set[str]]:
    """(the stages to visit, those to redo even when up to date)."""
    for flag, name in (("--from", from_stage), ("--only", only)):
        if name is not None and name not in STAGES:
            raise XformerError(f"{flag}: unknown stage {name!r} (stages: {', '.join(STAGES)})")
    if from_stage and only:
        raise XformerError("--from and --only: give one of them")
    if only:
        return [only], set()
    if from_stage:
        return list(STAGES), set(STAGES[STAGES.index(from_stage):])
    return list(STAGES), set()


def run_stage(pipe: Pipeline, name: str, redo: bool = False) -> dict:
    """One stage: skipped when up to date (unless ``redo``), resumed or done; returns its record."""
    stamp = FINGERPRINTS[name](pipe)
    record = pipe.record(name)
    standing = record.standing(stamp)
    if standing in (CHANGED, STOPPED) and not redo and upgrade(pipe, name, stamp):
        standing = record.standing(stamp)  # an earlier version's record of these inputs: finished, or to resume
    gone = gone_output(pipe, name) if standing == DONE else None
    if gone is not None:
        pipe.log(f"stage {name}: its record names {gone}, which is gone: the stage runs again")
        redo = True
    if not redo and (standing == DONE or (standing == ASIDE and record.restore())):
        record.drop_replaced()
        pipe.log(f"stage {name}: up to date (fingerprint {stamp}), skipped")
        return record.read() or {}
    for folder in (record.directory, record.replaced):  # what begin may clear or set aside
        busy = run_lock.held_inside(folder)
        if busy is not None:
            raise XformerError(f"stage {name}: {busy[0]} is in use by {busy[1].describe()}: wait for it to end, "
                               "or stop it, before the stage runs there")
    resuming = record.begin(stamp)
    before = record.minutes_so_far() if resuming else 0.0
    pipe.log(f"stage {name}: {'resuming' if resuming else 'starting'} in {record.directory}")
    try:
        with record.ticking(before) as minutes_so_far:
            results = RUNS[name](pipe)
    except XformerError as exc:
        if record.restore():  # the new run's partial output goes: no rerun resumes it
            said = str(exc).replace(RESUMES_THERE, "")
            raise XformerError(f"{said} (stage {name}: the output of its previous inputs is kept; a rerun starts "
                               "the stage over)") from None
        raise
    except Exception:  # not an interrupt: that one keeps the new run to resume
        record.restore()
        raise
    minutes = round(minutes_so_far(), 2)
    record.finish(stamp, minutes=minutes, finished=time.strftime("%Y-%m-%dT%H:%M:%S"), **results)
    record.drop_replaced()
    pipe.log(f"stage {name}: done in {minutes} min" + (f" ({before:.2f} of them in earlier calls)" if before else ""))
    return record.read() or {}


def whole_path(pipe: Pipeline) -> Optional[str]:
    """The line summing every stage's minutes, once each has finished (None before)."""
    minutes = stage_minutes(pipe)
    return path_line(minutes) if len(minutes) == len(STAGES) else None


def pipeline_status(config: PipelineConfig) -> list[StageStatus]:
    """What the next run would do with each stage, and its record's figures; writes nothing."""
    pipe = Pipeline(config, log=lambda _: None, progress=False)
    return stage_statuses(pipe, upgradable=lambda name: upgradable(pipe, name) is not None)


def stage_minutes(pipe: Pipeline) -> dict[str, float]:
    """Each finished stage's minutes as its record keeps them: what the whole path cost, also
    when its stages ran in separate calls (a stage resumed after a kill: all its calls' minutes)."""
    minutes = {}
    for name in STAGES:
        record = pipe.record(name).read()
        if record and record.get("done") and isinstance(record.get("minutes"), (int, float)):
            minutes[name] = float(record["minutes"])
    return minutes


def path_line(minutes: dict[str, float]) -> str:
    """"the whole path: 170.2 minutes of stages (reverse 26.1, ...)"."""
    parts = ", ".join(f"{name} {value:.1f}" for name, value in minutes.items())
    return f"the whole path: {sum(minutes.values()):.1f} minutes of stages ({parts})"


def _check_before_the_first_stage(pipe: Pipeline, stages: list[str]) -> None:
    """What would stop a stage it visits (``stage_problem``), and what --from or --only would
    read that is gone or out of date (a needed stage left out whose output was deleted, or
    that finished with other inputs than the config gives it now): one line each."""
    for name in stages:
        problem = stage_problem(pipe, name)
        if problem:
            raise XformerError(problem)
    for need in dict.fromkeys(need for name in stages for need in NEEDS[name] if need not in stages):
        gone = gone_output(pipe, need)
        if gone is not None:
            raise XformerError(f"pipeline stage {need} made {gone}, which is gone: run it again "
                               f"(xformer pipeline -c CONFIG --from {need})")
        if stale_need(pipe, need, upgradable=lambda name: upgradable(pipe, name) is not None):
            raise XformerError(f"pipeline stage {need} finished with other inputs than the config gives it now: run "
                               f"it first (xformer pipeline -c CONFIG --from {need}, or --only {need})")


def run_pipeline(config: PipelineConfig, from_stage: Optional[str] = None, only: Optional[str] = None,
                 log: Callable[[str], None] = print, progress: bool = True) -> dict[str, dict]:
    """Run the pipeline's stages; returns each visited stage's record. Once every stage has
    finished, one line sums their minutes: the budget a config is sized to."""
    stages, redo = _chosen(from_stage, only)
    pipe = Pipeline(config, log, progress)
    pipe.base  # the model config is read and checked before any stage starts, and the files it names
    with run_lock.holding(pipe.run_dir, "xformer pipeline"):  # before its records are read: another run may write them
        _check_before_the_first_stage(pipe, stages)
        records = {}
        for name in stages:
            run_lock.set_stage(pipe.run_dir, name)
            records[name] = run_stage(pipe, name, redo=name in redo)
    line = whole_path(pipe)
    if line is not None:
        log(line)
    return records
