"""Branches for scripts/tune_recipe.py: a run that trains exactly as another (its parent) up
to some step starts from the parent's kept checkpoint of that step instead of step 0.

Two runs of the search that differ only in the schedule's cool-down (or its length), or in
the checkpoint grid, take the same steps until the first step whose learning rate differs:
the same seed, data order, dropout draws and weights. The child's last.pt is then the
parent's checkpoint of the last step they share, its config and its schedule's planned steps
made the child's, with the parent's kept checkpoints, best.pt and metrics up to that step.
Resuming from it is the trainer's own exact resume, so the child ends where it would from
scratch, for a fraction of the steps.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from xformer_cli.checkpoint_file import checkpoint_step, kept_checkpoints, load_checkpoint, save_checkpoint, step_checkpoint
from xformer_cli.config import Config, load_config
from xformer_cli.train.time_budget import needs_plan
from xformer_cli.train.schedule import make_schedule

# What may differ between a parent and its child: everything else decides the steps themselves.
MAY_DIFFER = {"run_dir", "train.max_steps", "train.planned_steps", "train.cooldown", "train.warmup_fraction",
              "train.warmup_steps", "train.lr_scale", "train.save_every"}


def run_config(config_path: Path, sets: dict) -> Config:
    """The config a run trains with: the file and its --set overrides, planned (with_plan)."""
    return with_plan(load_config(config_path, [f"{k}={v}" for k, v in sets.items()]))


def with_plan(config: Config) -> Config:
    """``config`` with train.planned_steps as a max_steps run plans them (train/time_budget.py)."""
    tc = config.train
    planned = tc.max_steps if needs_plan(tc) and not tc.max_minutes and not tc.planned_steps else tc.planned_steps
    return dataclasses.replace(config, train=dataclasses.replace(tc, planned_steps=planned))


def differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys += differences(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.append(f"{prefix}{key}")
    return keys


def learning_rates(config: Config, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    schedule = make_schedule(optimizer, config.train, config.model.d_model)
    return [schedule.lr(step) for step in range(1, steps + 1)]


def branch_step(parent: Config, child: Config) -> int:
    """The step of the parent's checkpoint the child starts from (0: none, start afresh)."""
    other = [k for k in differences(parent.to_dict(), child.to_dict()) if k not in MAY_DIFFER]
    if other:
        raise ValueError(f"{child.run_dir} trains differently from {parent.run_dir}: {', '.join(other)}")
    pt, ct = parent.train, child.train
    shared = min(pt.max_steps, ct.max_steps)
    rates = zip(learning_rates(parent, shared), learning_rates(child, shared))
    first_diff = next((i + 1 for i, (a, b) in enumerate(rates) if a != b), shared + 1)
    limit = min(first_diff - 1, ct.max_steps - 1)
    if pt.save_every != ct.save_every:  # the child's averaging window lies on its own grid
        limit = min(limit, ct.max_steps - ct.average_last * ct.save_every)
    grid = [s for s in range(1, limit + 1) if not s % pt.save_every or not s % pt.valid_every or s == pt.max_steps]
    return max(grid, default=0)


def make_branch(parent_dir: Path, child_dir: Path, child: Config, step: int) -> None:
    """``child_dir`` as the child run stands at ``step``: last.pt (the parent's checkpoint of
    ``step`` with the child's config and planned steps), the kept checkpoints, best.pt and
    metrics.jsonl up to it, the tokenizer."""
    shutil.rmtree(child_dir, ignore_errors=True)
    child_dir.mkdir(parents=True)
    shutil.copytree(parent_dir / "tokenizer", child_dir / "tokenizer")
    # the ones that may enter the child's final average (average_last): the rest are older
    kept = [p for p in kept_checkpoints(parent_dir) if checkpoint_step(p) <= step][-child.train.average_last:]
    for path in kept:
        shutil.copy2(path, child_dir / path.name)
    rows = [r for r in _metrics(parent_dir) if r["step"] <= step and "averaged_steps" not in r
            and "length_penalty" not in r]
    state = _as_child(load_checkpoint(step_checkpoint(parent_dir, step)), child)
    validations = [r for r in rows if "valid_bleu" in r]
    if state["best_bleu"] is not None and validations:  # best.pt: the first validation with the best BLEU so far
        best_step = max(validations, key=lambda r: (r["valid_bleu"], -r["step"]))["step"]
        save_checkpoint(_as_child(load_checkpoint(step_checkpoint(parent_dir, best_step)), child), child_dir / "best.pt")
    (child_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (child_dir / "branched_from.json").write_text(json.dumps({"parent": str(parent_dir), "step": step}) + "\n")
    save_checkpoint(state, child_dir / "last.pt")  # last: its presence marks a finished branch


def _as_child(state: dict, child: Config) -> dict:
    state = {k: v for k, v in state.items() if k not in ("format", "version")}
    counted = state["config"].get("model", {}).get("output_pieces", 0)  # the parent counted its data's pieces
    state["config"] = child.to_dict()
    state["config"]["model"]["output_pieces"] = counted
    state["schedule"] = {**state["schedule"], "planned_steps": child.train.planned_steps}
    return state


def _metrics(run_dir: Path) -> list[dict]:
    """The run's whole rows (a line a kill cut off left out)."""
    from xformer_cli.textio import complete_rows

    return [row for _, row in complete_rows(run_dir / "metrics.jsonl")]
