"""``xformer pipeline``: the stages in order, each skipped when its record says it finished
with the same inputs (one line says so), resumed when it began with them, done afresh
otherwise; ``from_stage`` redoes a stage and all after it, ``only`` runs one stage."""

from __future__ import annotations

import time
from typing import Callable, Optional

from xformer_cli.errors import XformerError
from xformer_cli.pipeline.settings import PipelineConfig
from xformer_cli.pipeline.stages import FINGERPRINTS, RUNS, STAGES, Pipeline


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
    if not redo and (record.done_with(stamp) or record.restore_if_done_with(stamp)):
        record.drop_replaced()
        pipe.log(f"stage {name}: up to date (fingerprint {stamp}), skipped")
        return record.read() or {}
    resuming = record.begin(stamp, fresh=redo)
    pipe.log(f"stage {name}: {'resuming' if resuming else 'starting'} in {record.directory}")
    started = time.time()
    try:
        results = RUNS[name](pipe)
    except XformerError as exc:
        if record.restore():
            raise XformerError(f"{exc} (stage {name}: the output of its previous inputs is kept)") from None
        raise
    except Exception:  # not an interrupt: that one keeps the new run to resume
        record.restore()
        raise
    minutes = round((time.time() - started) / 60, 2)
    record.finish(stamp, minutes=minutes, finished=time.strftime("%Y-%m-%dT%H:%M:%S"), **results)
    record.drop_replaced()
    pipe.log(f"stage {name}: done in {minutes} min")
    return record.read() or {}


def run_pipeline(config: PipelineConfig, from_stage: Optional[str] = None, only: Optional[str] = None,
                 log: Callable[[str], None] = print, progress: bool = True) -> dict[str, dict]:
    """Run the pipeline's stages; returns each visited stage's record."""
    stages, redo = _chosen(from_stage, only)
    pipe = Pipeline(config, log, progress)
    pipe.base  # the model config is read and checked before any stage starts
    return {name: run_stage(pipe, name, redo=name in redo) for name in stages}
