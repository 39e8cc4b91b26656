"""Learning-rate schedules: the paper's ("Noam", section 5.3) and two for fine-tuning.

noam: lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warm-up for
``warmup`` steps, then decay with the inverse square root of the step. Its peak suits training
from random weights.
constant and inverse_sqrt (fairseq's name) take the peak learning rate itself: linear warm-up
to ``lr``, then ``lr`` (constant) or ``lr * sqrt(warmup / step)`` (inverse_sqrt); a small
``lr`` is what fine-tuning a pretrained model wants (config.py, train.schedule).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

from xformer_cli.config import TrainConfig


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


class LrSchedule:
    """Sets the optimizer's learning rate for each step from ``formula(step)``; its only
    state is the step."""

    def __init__(self, optimizer, formula: Callable[[int], float]):
        self.optimizer, self.formula = optimizer, formula
        self.step_num = 0

    def lr(self, step: int) -> float:
        return self.formula(step)

    def step(self) -> float:
        """Advance to the next step and set its learning rate (call before optimizer.step)."""
        self.step_num += 1
        value = self.lr(self.step_num)
        for group in self.optimizer.param_groups:
            group["lr"] = value
        return value

    def state_dict(self) -> dict:
        return {"step_num": self.step_num}

    def load_state_dict(self, state: dict) -> None:
        self.step_num = int(state["step_num"])


class NoamSchedule(LrSchedule):
    def __init__(self, optimizer, d_model: int, warmup: int, scale: float = 1.0):
        super().__init__(optimizer, functools.partial(noam_lr, d_model=d_model, warmup=warmup, scale=scale))
        self.d_model, self.warmup, self.scale = d_model, warmup, scale


def make_schedule(optimizer, train: TrainConfig, d_model: int) -> LrSchedule:
    """The schedule ``train.schedule`` names, with its settings."""
    if train.schedule == "constant":
        return LrSchedule(optimizer, functools.partial(constant_lr, lr=train.lr, warmup=train.warmup_steps))
    if train.schedule == "inverse_sqrt":
        return LrSchedule(optimizer, functools.partial(inverse_sqrt_lr, lr=train.lr, warmup=train.warmup_steps))
    return NoamSchedule(optimizer, d_model, train.warmup_steps, train.lr_scale)
