"""Checkpoint averaging, as the paper did for its reported scores (last 5 or 20 checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from xformer_cli.checkpoint_file import (
    checkpoint_step,
    kept_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from xformer_cli.errors import XformerError
from xformer_cli.fileio import same_file


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The newest ``n`` step checkpoints a run kept (train.keep_checkpoints)."""
    if n < 1:
        raise XformerError(f"--last must be at least 1, not {n}")
    kept = kept_checkpoints(run_dir)
    if len(kept) < n:
        raise XformerError(f"{run_dir} holds {len(kept)} step checkpoints, fewer than {n} "
                           "(train with train.keep_checkpoints set to keep them)")
    return kept[-n:]


def average_checkpoints(paths: Sequence[str | Path], output: str | Path) -> dict:
    """Mean of the weights; config and tokenizer from the first; the step the newest of them
    reached (as each checkpoint records it: last.pt or best.pt name no step). One checkpoint in
    memory at a time."""
    if not paths:
        raise XformerError("nothing to average")
    _check_output(paths, Path(output))
    first = load_checkpoint(paths[0])
    total = {k: v.double() if v.is_floating_point() else v.clone() for k, v in first["model"].items()}
    steps = [_step_of(first, paths[0])]
    for path in paths[1:]:
        state = load_checkpoint(path)
        steps.append(_step_of(state, path))
        if state["model"].keys() != total.keys() or any(
                _run_of(state, key) != _run_of(first, key) for key in ("model", "tokenizer", "seed")):
            raise XformerError(f"{path} is not of the run {paths[0]} is of (another model, tokenizer or "
                               "train.seed): only checkpoints of one run can be averaged")
        for key, value in state["model"].items():
            if value.is_floating_point():
                total[key] += value.double()
    averaged = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v
                for k, v in total.items()}
    result = {
        "config": first["config"], "tokenizer": first["tokenizer"], "model": averaged,
        "step": max(steps), "averaged_from": [str(p) for p in paths],
    }
    save_checkpoint(result, output)
    return result


def _step_of(state: dict, path: str | Path) -> int:
    """The step a checkpoint holds; its file name's for one that records none."""
    step = state.get("step")
    return int(step) if step is not None else checkpoint_step(path)


def _run_of(state: dict, key: str):
    """What makes two checkpoints steps of one run: the model, the tokenizer and the seed (the
    data may be spelt otherwise by a resume, which takes another test set or cache folder)."""
    if key == "tokenizer":
        return state.get("tokenizer")
    if key == "seed":
        return state["config"].get("train", {}).get("seed")
    return state["config"].get(key)


def _check_output(paths: Sequence[str | Path], output: Path) -> None:
    """Refuse to write over an input, or over a run's last.pt (its resume point: an average
    holds no optimizer state, so the run could not go on); refuse an input given twice."""
    for i, path in enumerate(paths):
        if same_file(output, path):
            raise XformerError(f"--output {output} is one of the checkpoints to average: write it elsewhere")
        twice = next((other for other in paths[:i] if same_file(other, path)), None)
        if twice is not None:  # it would count twice in the mean
            raise XformerError(f"{path} is {twice} again: give each checkpoint once")
    if output.name == "last.pt" and (kept_checkpoints(output.parent) or (output.parent / "config.yaml").is_file()):
        raise XformerError(f"--output {output} is the run's last.pt (what it resumes from): "
                           "write the average elsewhere")
