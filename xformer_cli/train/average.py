"""Checkpoint averaging, as the paper did for its reported scores (last 5 or 20 checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from xformer_cli.checkpoint import (
    checkpoint_step,
    kept_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from xformer_cli.errors import XformerError


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The newest ``n`` step checkpoints a run kept (train.keep_checkpoints)."""
    kept = kept_checkpoints(run_dir)
    if len(kept) < n:
        raise XformerError(f"{run_dir} holds {len(kept)} step checkpoints, fewer than {n} "
                           "(train with train.keep_checkpoints set to keep them)")
    return kept[-n:]


def average_checkpoints(paths: Sequence[str | Path], output: str | Path) -> dict:
    """Mean of the weights; config and tokenizer from the first. One checkpoint in memory at a time."""
    if not paths:
        raise XformerError("nothing to average")
    first = load_checkpoint(paths[0])
    total = {k: v.double() if v.is_floating_point() else v.clone() for k, v in first["model"].items()}
    for path in paths[1:]:
        state = load_checkpoint(path)
        if state["config"].get("model") != first["config"].get("model") or state["model"].keys() != total.keys():
            raise XformerError(f"{path} is a different model from {paths[0]}: only checkpoints of one run can be averaged")
        for key, value in state["model"].items():
            if value.is_floating_point():
                total[key] += value.double()
    averaged = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in total.items()}
    result = {
        "config": first["config"], "tokenizer": first["tokenizer"], "model": averaged,
        "step": max(checkpoint_step(p) for p in paths), "averaged_from": [str(p) for p in paths],
    }
    save_checkpoint(result, output)
    return result

