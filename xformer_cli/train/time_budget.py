"""How many steps a run will take, worked out once before its first step (``train.planned_steps``).

The schedule's cool-down (train.cooldown), a warm-up given as a share (train.warmup_fraction)
and validations spread over the run (train.validations) all need the run's last step before
the run starts. A ``max_steps`` run knows it. A run bounded by ``train.max_minutes`` does not:
how many steps fit depends on the machine. So, as ``max_tokens: auto`` probes memory once,
the plan times a few real training steps of a throwaway copy of the model on batches of the
run's first epoch, and a greedy decoding of a sample of the valid set, and fits the steps and
their validations into the minutes (``fit_steps``). The value is written to config.yaml, and
a resumed run takes it from its checkpoint: it is never measured again, so a resume stays
exact.

When the machine's pace changes mid-run (another job, thermal throttling, a stall),
``BudgetKeeper`` revises the plan at the ranks' regular agreement (every few steps) to what
fits in the minutes left at the recent pace, both ways: a stall of a minute shortens it, and
the steps after it give the steps back. Before the cool-down begins the schedule does not
depend on the planned steps; inside it the schedule goes on from the rate it has and falls to
the floor at the revised last step (``LrSchedule.replan``: never up), so a machine that slows
down there still ends near zero inside its minutes, and one that speeds up spends its minutes
instead of ending early. The run stops at its minutes whatever happens (the loop's deadline),
and a revised plan is kept in the checkpoint (the schedule's state) and logged.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional, Sequence

import torch

from xformer_cli.checkpoint_file import build_model
from xformer_cli.config import Config, TrainConfig
from xformer_cli.data.prepare import PreparedData
from xformer_cli.decode.factory import engine_for_model
from xformer_cli.train.epoch_batches import epoch_share, plan_for
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.step import TrainStep
from xformer_cli.train.validation import validation_sums

PROBE_WARM = 3  # untimed first steps: kernel selection, the allocator's first requests
PROBE_STEPS = 10  # timed steps
VALID_SAMPLE = 48  # valid sentences decoded to estimate a validation's time
MARGIN = 0.97  # of the budget planned for steps and validations: checkpoints and logging take the rest

Measure = Callable[[], tuple[float, float]]  # () -> (seconds per step, seconds per validation)


def needs_plan(tc: TrainConfig) -> bool:
    return tc.cooldown > 0 or tc.warmup_fraction > 0 or tc.validations > 0


def fit_steps(budget_s: float, step_s: float, valid_s: float, tc: TrainConfig) -> int:
    """The most steps that fit in ``budget_s`` with the validations they bring (``valid_s``
    each): train.validations of them, or one every train.valid_every steps and one at the end."""
    if tc.validations:
        return steps_that_fit(budget_s * MARGIN, step_s, valid_s, lambda n: min(tc.validations, n), tc.max_steps)
    return steps_that_fit(budget_s * MARGIN, step_s, valid_s, lambda n: validations_to_come(1, n, [], tc.valid_every),
                          tc.max_steps)


def validations_to_come(step: int, end: int, planned: Sequence[int], valid_every: int) -> int:
    """The validations a run runs from ``step`` on (one due at ``step`` too: the loop looks
    before it validates) when it ends at ``end``: those of ``planned`` (train.validations), or
    with ``valid_every`` (train.validations 0) its multiples before ``end`` and the one every
    run ends with. fit_steps and the BudgetKeeper count them alike, so the keeper reserves
    what the plan reserved."""
    if not valid_every:
        return sum(1 for v in planned if v >= step)
    return (end - 1) // valid_every - (step - 1) // valid_every + 1 if end >= step else 0


def steps_that_fit(seconds: float, step_s: float, valid_s: float, validations: Callable[[int], int],
                   limit: Optional[int] = None) -> int:
    """The most steps ``n`` (at least 1, at most ``limit``) whose time and validations fit in
    ``seconds``: ``n * step_s + valid_s * validations(n) <= seconds``. A binary search: more
    steps never bring fewer validations, and the count is not a closed form with valid_every."""
    hi = math.floor(seconds / max(step_s, 1e-9))
    lo, hi = 1, max(1, hi if limit is None else min(limit, hi))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid * step_s + valid_s * validations(mid) <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo


def validation_steps(tc: TrainConfig, planned: int) -> list[int]:
    """The steps train.validations spreads evenly over ``planned`` (the last one at the end)."""
    n = min(tc.validations, planned)
    return sorted({round(planned * k / n) for k in range(1, n + 1)}) if n else []


def revised_validation_steps(current: Sequence[int], step: int, planned: int) -> list[int]:
    """The validations when the plan moves to ``planned`` at ``step``: those at or before
    ``step`` have run (or run now) and stay; each one still to come goes back to its own share
    of the new plan (the k-th of n at k/n of it, the last at its end), so that a plan which
    moves dozens of times does not push them all to the end. One whose share is already behind
    the step runs at the next step instead of being lost; none runs twice."""
    done = [v for v in current if v <= step]
    n = len(current)
    if len(done) >= n or planned <= step:
        return done
    later: list[int] = []
    for k in range(len(done) + 1, n + 1):
        at = min(max(round(planned * k / n), (later[-1] if later else step) + 1), planned)
        if not later or at > later[-1]:
            later.append(at)
    return done + later


def planned_train(tc: TrainConfig, measure: Optional[Measure], log: Callable[[str], None]) -> TrainConfig:
    """``tc`` with planned_steps worked out where the config needs it and does not give it:
    max_steps, or for a max_minutes run what ``measure`` says fits."""
    if not needs_plan(tc) or tc.planned_steps:
        return tc
    if not tc.max_minutes or measure is None:
        log(f"planned steps: {tc.max_steps} (train.max_steps)")
        return dataclasses.replace(tc, planned_steps=tc.max_steps)
    started = time.time()
    step_s, valid_s = measure()
    steps = fit_steps(tc.max_minutes * 60, step_s, valid_s, tc)
    log(f"planned steps: {steps} in {tc.max_minutes:g} minutes ({step_s:.3f} s a step, {valid_s:.1f} s a "
        f"validation, measured in {time.time() - started:.0f} s)"
        + (" = train.max_steps" if steps == tc.max_steps else ""))
    return dataclasses.replace(tc, planned_steps=steps)


def steps_per_epoch(config: Config, data: PreparedData, world_size: int = 1) -> float:
    """Optimizer steps in an epoch: the first epoch's batches at train.max_tokens (as the run
    batches them, weights included) over the batches a step takes on all ranks."""
    tc = config.train
    plan = plan_for(data.train, tc.max_tokens, tc.length_bucket, tc.seed, tc.batching)
    batches = epoch_share(plan, data.train, config.data, tc.seed, 1)
    return len(batches) / (tc.update_freq * world_size)


def with_epochs(tc: TrainConfig, epoch_steps: float, log: Callable[[str], None]) -> TrainConfig:
    """``tc`` with planned_epochs: the passes over the data its planned steps make."""
    if not tc.planned_steps or epoch_steps <= 0:
        return tc
    epochs = round(tc.planned_steps / epoch_steps, 2)
    log(f"planned epochs: {epochs:.1f} ({epoch_steps:.0f} steps an epoch at train.max_tokens {tc.max_tokens})")
    return dataclasses.replace(tc, planned_epochs=epochs)


def measure_seconds(config: Config, data: PreparedData, device: torch.device, precision: str,
                    dist: Distributed) -> tuple[float, float]:
    """(seconds per training step, seconds per validation), timed on a throwaway copy of the
    model under a forked random state (the run's weights and dropout draws stay as they were)."""
    tc = config.train
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model(config, data.tokenizer).to(device).train()
        plan = plan_for(data.train, tc.max_tokens, tc.length_bucket, tc.seed, tc.batching)
        step = TrainStep(model, tc, device, precision, dist, plan.static_shapes, compile=False)
        batches = epoch_share(plan, data.train, config.data, tc.seed, 1, dist.rank, dist.world_size)
        step_s = _time_steps(step, [plan.load(b).with_start_token(config.model.bos_id) for b in _spread(batches, tc)],
                             tc.update_freq, device)
        valid_s = _time_validation(model, config, data, device, dist) if data.valid is not None else 0.0
    step_s, valid_s = (max(v) for v in zip(*dist.gather((step_s, valid_s), "the step-time probe")))
    return step_s, valid_s


def _spread(batches: list, tc: TrainConfig) -> list:
    """Batches from across the epoch, enough for the probe's steps (lengths vary along it)."""
    wanted = (PROBE_WARM + PROBE_STEPS) * tc.update_freq
    stride = max(1, len(batches) // wanted)
    picked = batches[::stride][:wanted]
    return (picked * (wanted // max(len(picked), 1) + 1))[:wanted]


def _time_steps(step: TrainStep, batches: list, update_freq: int, device: torch.device) -> float:
    groups = [batches[i : i + update_freq] for i in range(0, len(batches), update_freq)]
    started = 0.0
    for i, group in enumerate(groups):
        if i == PROBE_WARM:
            _sync(device)
            started = time.perf_counter()
        group = [b.to(device) for b in group]
        step(group, sum(b.n_tokens for b in group))
    _sync(device)
    return (time.perf_counter() - started) / max(len(groups) - PROBE_WARM, 1)


def _time_validation(model: torch.nn.Module, config: Config, data: PreparedData, device: torch.device,
                     dist: Distributed) -> float:
    """A validation's seconds on this rank: a sample of its share of the valid set decoded
    greedily to the references' length (a trained model stops about there; the probe's
    untrained one would run on to the length limit), scaled to the share."""
    valid, encoded, tc = data.valid, data.valid_encoded, config.train
    share = list(range(dist.rank, len(valid.src), dist.world_size))
    sample = share[:: max(1, len(share) // VALID_SAMPLE)][:VALID_SAMPLE]
    if not sample:
        return 0.0
    length = math.ceil(sum(len(encoded.tgt[i]) for i in sample) / len(sample)) + 1
    engine = engine_for_model(model, data.tokenizer, config.decode_settings(), device, "auto")
    model.eval()
    lines = [valid.src[i] for i in sample]
    engine.translate(lines[:2], beam_size=tc.valid_beam_size, max_len_a=0, max_len_b=length, min_len=length)
    started = time.perf_counter()
    engine.translate(lines, beam_size=tc.valid_beam_size, max_len_a=0, max_len_b=length, min_len=length)
    validation_sums(model, encoded, tc.max_tokens, device, tc.label_smoothing, indices=sample)
    _sync(device)
    model.train()
    return (time.perf_counter() - started) * len(share) / len(sample)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PACE_STEPS = 50  # the pace is measured over at least this many steps (one slow step is no trend)
# ... or over this share of the plan when that is fewer: a plan measured on a busy machine (tens
# of steps in 25 minutes) ended before 50 steps were seen and left most of its minutes unused
PACE_PLAN_SHARE = 0.25
PACE_LOOKS = 9  # ... as the median of the paces between the last looks: a stall is one outlier
# ... each look at least this long after the one before: a GPU's step (tens of ms, its length
# varying with the batch's shape) gives ten-step paces too noisy to plan by, and the plan churned
PACE_LOOK_SECONDS = 2.0
PACE_SPACED_PLAN = 200  # ... in a plan of this many steps or more: a shorter one (a busy start's) takes every look
REVISE_SHARE = 0.01  # the plan moves only for a change of at least 1% of it (no churn)


class BudgetKeeper:
    """Keeps the planned steps inside the minutes: revised to the recent pace, both ways."""

    def __init__(self, deadline: float, valid_s: float, validations: Sequence[int], max_steps: Optional[int] = None,
                 valid_every: int = 0):
        self.deadline, self.valid_s, self.validations = deadline, valid_s, list(validations)
        self.max_steps = max_steps
        # train.validations 0: one every valid_every steps and one at the end, which the plan
        # reserved (fit_steps) and the keeper must too, or each validation cuts the plan
        self.valid_every = valid_every
        self.marks: list[tuple[int, float]] = []  # (step, time less validations and saves) of the last looks
        self.excluded = 0.0  # seconds spent validating and saving, all told

    def start(self, step: int, now: float) -> None:
        """The loop begins at ``step``: the first pace is read from here, so that a plan of a
        few steps (measured on a busy machine) has one before it ends."""
        self.marks = [(step, now - self.excluded)]

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    def validated(self, seconds: float) -> None:
        """A validation took ``seconds``: later ones are expected to take as long."""
        self.valid_s = seconds
        self.exclude(seconds)

    def step_seconds(self, step: int, now: float, planned: int) -> Optional[float]:
        """Seconds a step: the median of the paces between the last PACE_LOOKS + 1 looks (None
        until they span PACE_STEPS steps, or a PACE_PLAN_SHARE of a shorter plan). A stall (a
        minute of another job, a swap storm) slows one or two of them and moves no median; a
        machine that stays slower moves them all."""
        spacing = PACE_LOOK_SECONDS if planned >= PACE_SPACED_PLAN else 0.0
        if self.marks and (step <= self.marks[-1][0] or now - self.excluded - self.marks[-1][1] < spacing):
            return None
        self.marks = (self.marks + [(step, now - self.excluded)])[-(PACE_LOOKS + 1):]
        if self.marks[-1][0] - self.marks[0][0] < max(1, min(PACE_STEPS, round(planned * PACE_PLAN_SHARE))):
            return None
        paces = sorted(max(b[1] - a[1], 1e-9) / (b[0] - a[0]) for a, b in zip(self.marks, self.marks[1:]))
        return paces[len(paces) // 2]

    def proposal(self, step: int, planned: int, now: float) -> int:
        """The planned steps to keep: what fits at the recent pace with the validations still
        to come, at least ``step`` + 1, at most train.max_steps (unchanged for a change under 1%
        of the plan)."""
        step_s = self.step_seconds(step, now, planned)
        if step_s is None or step >= planned:
            return planned
        limit = None if self.max_steps is None else max(1, self.max_steps - step)
        fits = step + steps_that_fit((self.deadline - now) * MARGIN, step_s, self.valid_s,
                                     lambda n: validations_to_come(step, step + n, self.validations, self.valid_every),
                                     limit)
        return fits if abs(fits - planned) >= max(1, planned * REVISE_SHARE) else planned
