"""The learning-rate schedule of section 5.3 ("Noam").

lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5): linear warm-up for
``warmup`` steps, then decay with the inverse square root of the step.
"""

from __future__ import annotations


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


class NoamSchedule:
    """Sets the optimizer's learning rate for each step; its only state is the step."""

    def __init__(self, optimizer, d_model: int, warmup: int, scale: float = 1.0):
        self.optimizer, self.d_model, self.warmup, self.scale = optimizer, d_model, warmup, scale
        self.step_num = 0

    def lr(self, step: int) -> float:
        return noam_lr(step, self.d_model, self.warmup, self.scale)

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
