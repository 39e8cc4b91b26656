"""The training progress bar, counting toward the limit that will end the run.

A run ends at ``train.max_steps`` or at ``train.max_minutes``, whichever comes first. A bar
over steps alone shows 0/100000 and thirty hours for a 25-minute run; this one counts
minutes while the clock will end the run first (judged from the step rate so far), and
steps once the step limit will come first, so the remaining time it shows is true. A run with
planned steps (train/time_budget.py) counts steps toward its plan throughout: the plan is what the
minutes allow, the budget keeper moves it, and a bar judging the two limits itself flipped
between them at every small change of pace.
"""

from __future__ import annotations

import time
from typing import Optional

from tqdm import tqdm

_STEPS_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} steps [{elapsed}<{remaining}{postfix}]"
_MINUTES_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} min [{elapsed}<{remaining}{postfix}]"


class RunProgress:
    def __init__(self, max_steps: int, max_minutes: float, step: int, enabled: bool = True,
                 started: Optional[float] = None, trained_before: float = 0.0, planned: bool = False):
        self.max_steps, self.max_minutes, self.planned = max_steps, max_minutes, planned
        self.first_step = step
        self.started = time.time() if started is None else started  # the run's clock (a resume's goes on)
        # The pace is this process's steps over its own time: its loop began trained_before
        # seconds after the run's clock (the seconds a resumed run trained in earlier processes).
        self.process_started = self.started + trained_before
        self.unit = "min" if max_minutes and not planned else "steps"
        total, initial = (max_minutes, 0.0) if self.unit == "min" else (max_steps, step)
        self.total, self.position = total, initial  # what the bar shows (also when it is disabled)
        self.bar = tqdm(total=total, initial=initial, desc="train", disable=not enabled, dynamic_ncols=True,
                        bar_format=_MINUTES_FORMAT if self.unit == "min" else _STEPS_FORMAT)

    def limit(self, step: int) -> str:
        """``min`` while the clock will end the run first, ``steps`` once the step limit will."""
        if not self.max_minutes or self.planned:
            return "steps"
        now = time.time()
        elapsed, left = now - self.process_started, self.max_minutes * 60 - (now - self.started)
        done = step - self.first_step
        if done <= 0 or elapsed <= 0:
            return self.unit
        steps_at_deadline = step + done / elapsed * max(left, 0.0)
        return "steps" if steps_at_deadline >= self.max_steps else "min"

    def retarget(self, max_steps: int) -> None:
        """The step that ends the run moved (the budget keeper revised the plan): count toward it."""
        self.max_steps = max_steps
        if self.unit == "steps":
            self.total = self.bar.total = max_steps
            self.bar.refresh()

    def update(self, step: int, **postfix: object) -> None:
        unit = self.limit(step)
        if unit != self.unit:  # the other limit now ends the run first: count toward it instead
            self.unit = unit
            self.bar.bar_format = _MINUTES_FORMAT if unit == "min" else _STEPS_FORMAT
            self.total = self.max_minutes if unit == "min" else self.max_steps
            self.bar.reset(total=self.total)
            # reset() restarts tqdm's clock: elapsed and the rate it estimates the rest by go on
            self.bar.start_t = self.bar.last_print_t = self.process_started
            self.position = 0
        position = min((time.time() - self.started) / 60 if unit == "min" else step, self.total)
        self.bar.update(position - self.position)
        self.position = position
        if postfix:
            self.bar.set_postfix(step=step, **postfix, refresh=False)

    def close(self) -> None:
        self.bar.close()
