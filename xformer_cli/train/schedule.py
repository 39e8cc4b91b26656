"""Learning-rate schedules: the paper's ("Noam", section 5.3) and two for fine-tuning, each
with an optional cool-down that ends the rate near zero at the run's planned last step.

noam: lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warm-up for
``warmup`` steps, then decay with the inverse square root of the step. Its peak suits training
from random weights.
constant and inverse_sqrt (fairseq's name) take the peak learning rate itself: linear warm-up
to ``lr``, then ``lr`` (constant) or ``lr * sqrt(warmup / step)`` (inverse_sqrt); a small
``lr`` is what fine-tuning a pretrained model wants (config.py, train.schedule).

Cool-down (``train.cooldown``, a share of the planned steps; train/time_budget.py plans them): over
the last ``cooldown x planned`` steps the rate is multiplied by a factor falling linearly from 1
to 1/(length + 1) at the planned last step. A run that stops at its budget then stops at a
rate near zero, as budgeted training wants (Li, Yumer and Ramanan, ICLR 2020), instead of
wherever the inverse square root happens to be; the warm-up and the decay before it are the
schedule's own. With cooldown 0 the schedule is the plain one.

A plan revised inside the cool-down (the machine's pace changed, train/time_budget.py) never moves
the rate up or down at once: from the step of the revision the factor goes on from its value
there and falls in a straight line to the same floor at the new last step. A longer plan then
cools down more slowly instead of raising the rate again, and a shorter one more steeply.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Callable, Optional

from xformer_cli.config import TrainConfig

if TYPE_CHECKING:  # this module itself needs no torch
    from torch.optim import Optimizer


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def constant_lr(step: int, lr: float, warmup: int) -> float:
    """``lr`` after a linear warm-up over ``warmup`` steps (0: from the first step)."""
    step = max(step, 1)
    return lr * min(1.0, step / warmup) if warmup else lr


def inverse_sqrt_lr(step: int, lr: float, warmup: int) -> float:
    """Linear warm-up to ``lr`` at step ``warmup``, then ``lr * sqrt(warmup / step)``."""
    step = max(step, 1)
    if step < warmup:
        return lr * step / warmup
    return lr * math.sqrt(max(warmup, 1) / step)


def cooldown_factor(step: int, planned: int, length: int) -> float:
    """1 before the last ``length`` steps of ``planned``, then linearly down to 1/(length + 1)
    at step ``planned`` (and that floor after it)."""
    if length <= 0 or planned <= 0:
        return 1.0
    left = planned - step  # steps after this one up to the planned last
    return min(1.0, max(left + 1, 1) / (length + 1))


def anchored_cooldown_factor(step: int, anchor: tuple[int, float], planned: int, length: int) -> float:
    """After a revised plan: from ``anchor`` (the revision's step and its factor) straight down
    to the floor 1/(length + 1) at step ``planned``, and that floor after it."""
    start, factor = anchor
    floor = 1.0 / (length + 1)
    if step >= planned:
        return floor
    return factor + (floor - factor) * max(step - start, 0) / (planned - start)


class LrSchedule:
    """Sets the optimizer's learning rate for each step from ``formula(step)`` times the
    cool-down factor; its state is the step, the planned steps (which the budget keeper may
    revise mid-run, train/time_budget.py) and, after a revision inside the cool-down, its anchor."""

    def __init__(self, optimizer: Optimizer, formula: Callable[[int], float], planned_steps: int = 0,
                 cooldown_steps: int = 0):
        self.optimizer, self.formula = optimizer, formula
        self.step_num = 0
        self.planned_steps, self.cooldown_steps = planned_steps, cooldown_steps
        self.anchor: Optional[tuple[int, float]] = None  # (step, factor) a revised cool-down goes on from

    def factor(self, step: int) -> float:
        """The cool-down's factor at ``step`` (1 before it begins)."""
        if self.anchor is None:
            return cooldown_factor(step, self.planned_steps, self.cooldown_steps)
        return anchored_cooldown_factor(step, self.anchor, self.planned_steps, self.cooldown_steps)

    def lr(self, step: int) -> float:
        return self.formula(step) * self.factor(step)

    def replan(self, step: int, planned: int) -> None:
        """The plan moves to ``planned`` steps after ``step``. Before the cool-down the cool-down
        moves with it; once the revised plan's cool-down would have begun, the factor goes on
        from this step's value and falls straight to the floor at the new last step."""
        now = self.factor(step)
        if self.cooldown_steps > 0 and planned > step and (now < 1.0 or planned - self.cooldown_steps <= step):
            self.anchor = (step, now)
        self.planned_steps = planned

    def step(self) -> float:
        """Advance to the next step and set its learning rate (call before optimizer.step)."""
        self.step_num += 1
        value = self.lr(self.step_num)
        for group in self.optimizer.param_groups:
            group["lr"] = value
        return value

    def state_dict(self) -> dict:
        state = {"step_num": self.step_num, "planned_steps": self.planned_steps}
        if self.anchor is not None:
            state["cooldown_anchor"] = list(self.anchor)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.step_num = int(state["step_num"])
        self.planned_steps = int(state.get("planned_steps", self.planned_steps))  # older checkpoints: the plan's
        anchor = state.get("cooldown_anchor")  # older checkpoints: none (their revisions only shortened)
        self.anchor = None if anchor is None else (int(anchor[0]), float(anchor[1]))


class NoamSchedule(LrSchedule):
    def __init__(self, optimizer: Optimizer, d_model: int, warmup: int, scale: float = 1.0, planned_steps: int = 0,
                 cooldown_steps: int = 0):
        super().__init__(optimizer, functools.partial(noam_lr, d_model=d_model, warmup=warmup, scale=scale),
                         planned_steps, cooldown_steps)
        self.d_model, self.warmup, self.scale = d_model, warmup, scale


def warmup_steps(train: TrainConfig) -> int:
    """train.warmup_fraction of the planned steps when given, else train.warmup_steps."""
    if train.warmup_fraction > 0 and train.planned_steps > 0:
        return max(1, round(train.warmup_fraction * train.planned_steps))
    return train.warmup_steps


def cooldown_steps(train: TrainConfig) -> int:
    return round(train.cooldown * train.planned_steps) if train.planned_steps > 0 else 0


def make_schedule(optimizer: Optimizer, train: TrainConfig, d_model: int) -> LrSchedule:
    """The schedule ``train.schedule`` names, with its settings and the cool-down over the
    planned steps (train.planned_steps, worked out before the run by train/time_budget.py)."""
    warmup, planned, cooldown = warmup_steps(train), train.planned_steps, cooldown_steps(train)
    if train.schedule == "constant":
        return LrSchedule(optimizer, functools.partial(constant_lr, lr=train.lr, warmup=warmup), planned, cooldown)
    if train.schedule == "inverse_sqrt":
        return LrSchedule(optimizer, functools.partial(inverse_sqrt_lr, lr=train.lr, warmup=warmup), planned, cooldown)
    return NoamSchedule(optimizer, d_model, warmup, train.lr_scale, planned, cooldown)
