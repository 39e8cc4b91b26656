"""A schedule that knows its budget: the planned steps (train/time_budget.py), the cool-down and the
warm-up share (train/schedule.py), validations spread over the plan, and a plan that shrinks
when the machine slows down. Unit tests first; the runs at the end are slow."""

import json
import random
import time

import pytest
import torch
import yaml

from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.config import TrainConfig, load_config, planned_settings
from xformer_cli.train.run_checkpoints import resume_mismatch, resumed_config
from xformer_cli.train import time_budget
from xformer_cli.train.time_budget import BudgetKeeper, fit_steps, planned_train, revised_validation_steps, validation_steps
from xformer_cli.train.schedule import LrSchedule, cooldown_factor, make_schedule, noam_lr

from helpers import quiet, signal_after_step, tiny_config


def _optimizer():
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.0)


def test_the_cooldown_falls_linearly_to_near_zero_at_the_planned_last_step():
    assert cooldown_factor(699, 1000, 300) == 1.0  # before the last 300 steps
    assert cooldown_factor(700, 1000, 300) == 1.0  # 300 left after it: still full
    assert cooldown_factor(850, 1000, 300) == pytest.approx(151 / 301)
    assert cooldown_factor(1000, 1000, 300) == pytest.approx(1 / 301)
    assert cooldown_factor(1005, 1000, 300) == pytest.approx(1 / 301)  # the floor after the plan
    assert cooldown_factor(10, 1000, 0) == 1.0 and cooldown_factor(10, 0, 300) == 1.0  # off


def test_a_planned_noam_schedule_warms_up_for_its_share_and_ends_under_a_tenth_of_its_peak():
    tc = TrainConfig(lr_scale=0.7, warmup_fraction=0.05, cooldown=0.3, planned_steps=1300)
    schedule = make_schedule(_optimizer(), tc, 256)
    rates = [schedule.step() for _ in range(1300)]
    peak = max(rates)
    assert rates.index(peak) + 1 == 65  # 5% of 1300
    assert peak == pytest.approx(noam_lr(65, 256, 65, 0.7))
    assert rates[-1] < 0.1 * peak and rates[-1] == pytest.approx(noam_lr(1300, 256, 65, 0.7) / 391)
    assert rates[909] == pytest.approx(noam_lr(910, 256, 65, 0.7))  # the paper's shape until the cool-down
    plain = make_schedule(_optimizer(), TrainConfig(lr_scale=0.7, warmup_steps=400), 256)
    assert [plain.step() for _ in range(1300)][-1] == pytest.approx(noam_lr(1300, 256, 400, 0.7))  # noam unchanged


def test_the_schedule_state_keeps_a_shortened_plan_and_reads_older_checkpoints():
    tc = TrainConfig(cooldown=0.2, planned_steps=100)
    schedule = make_schedule(_optimizer(), tc, 64)
    for _ in range(10):
        schedule.step()
    schedule.planned_steps = 60  # the keeper shortened it
    again = make_schedule(_optimizer(), tc, 64)
    again.load_state_dict(schedule.state_dict())
    assert again.planned_steps == 60 and again.step() == pytest.approx(schedule.step())
    older = make_schedule(_optimizer(), tc, 64)
    older.load_state_dict({"step_num": 10})  # before plans: the config's
    assert older.planned_steps == 100


def test_a_plan_revised_inside_the_cool_down_never_moves_the_rate_at_once():
    """A cool-down over the last 500 of 1000 planned steps, revised at step 700 (factor 301/501)
    to 1300 steps (the machine sped up) and at step 1000 to 1100 (it slowed again): the rate
    goes on from where it was each time, falls straight to the same floor at the new end, never
    rises, and a resume from the revised state gives the same rates."""
    tc = TrainConfig(lr_scale=1.0, warmup_steps=10, cooldown=0.5, planned_steps=1000)
    schedule = make_schedule(_optimizer(), tc, 64)
    rates = [schedule.step() for _ in range(700)]
    schedule.replan(700, 1300)
    assert schedule.factor(700) == pytest.approx(301 / 501)  # the factor at the revision: unchanged
    rates += [schedule.step() for _ in range(300)]
    assert schedule.factor(1000) == pytest.approx(301 / 501 + (1 / 501 - 301 / 501) * 300 / 600)
    schedule.replan(1000, 1100)
    saved = schedule.state_dict()
    rates += [schedule.step() for _ in range(100)]
    after = rates[699:]
    assert all(b < a for a, b in zip(after, after[1:]))  # down at every step, across both revisions
    assert schedule.factor(1100) == pytest.approx(1 / 501)  # the floor, at the revised end
    assert rates[-1] < 0.01 * max(rates)
    again = make_schedule(_optimizer(), tc, 64)
    again.load_state_dict(saved)
    assert [again.step() for _ in range(100)] == rates[-100:]
    before = make_schedule(_optimizer(), tc, 64)  # before the cool-down: the cool-down moves with the plan
    for _ in range(100):
        before.step()
    before.replan(100, 1400)
    assert before.anchor is None and before.factor(900) == 1.0 and before.factor(1400) == pytest.approx(1 / 501)


def test_the_steps_that_fit_leave_time_for_their_validations():
    tc = TrainConfig(validations=5, max_steps=100_000)
    steps = fit_steps(1500, 0.75, 20.0, tc)
    assert steps == int((1500 * time_budget.MARGIN - 5 * 20) / 0.75)
    assert steps * 0.75 + 5 * 20 <= 1500
    every = TrainConfig(valid_every=500, max_steps=100_000)
    n = fit_steps(1500, 0.75, 20.0, every)

    def seconds(steps: int) -> float:  # the validations at 500, 1000, ... before the end, and the end's own
        return steps * 0.75 + ((steps - 1) // 500 + 1) * 20

    assert seconds(n) <= 1500 * time_budget.MARGIN < seconds(n + 1)  # the most that fit
    assert n > 1500 and time_budget.validations_to_come(1, n, [], 500) == 4  # at 500, 1000, 1500 and the end
    assert fit_steps(1500, 0.75, 20.0, TrainConfig(validations=5, max_steps=300)) == 300  # max_steps still caps


def test_validations_are_spread_evenly_and_the_last_is_at_the_end():
    assert validation_steps(TrainConfig(validations=4), 1291) == [323, 646, 968, 1291]
    assert validation_steps(TrainConfig(validations=3), 2) == [1, 2]
    assert validation_steps(TrainConfig(validations=0), 1291) == []


def test_a_moved_plan_neither_repeats_nor_loses_a_validation():
    """Seen in a main job: validated at 1069 (a quarter of 4276), the plan grew to 4330 at step
    1070, and a quarter of the new plan (1082) validated a second time."""
    before = validation_steps(TrainConfig(validations=4), 4276)
    assert before[0] == 1069
    after = revised_validation_steps(before, 1070, 4330)
    assert after == [1069, 2165, 3248, 4330]  # the three to come at their shares of the new plan, the last at its end
    # A plan that shrinks past a point still to come: that validation runs at the next step instead of being lost.
    shrunk = revised_validation_steps([1000, 2000, 3000, 4000], 1990, 3900)
    assert shrunk == [1000, 1991, 2925, 3900] and len(shrunk) == 4
    assert revised_validation_steps([1000, 2000], 1500, 1500) == [1000]  # the plan ends now: the end's own validation
    assert revised_validation_steps([], 500, 900) == []  # valid_every decides: nothing planned


def test_validations_stay_spread_over_a_plan_that_moves_dozens_of_times():
    """Seen in a main job: the keeper moved the plan 30 times (3788 -> 3984 by steps of about 50)
    and each move spread the validations still to come over what was left, so they drifted to
    the end (3358, 3568, 3776, 3984: none in the first 3000 steps)."""
    planned, points, ran = 3788, validation_steps(TrainConfig(validations=4), 3788), []
    for step in range(1, 10000):
        if step % 30 == 0 and step < 3000:
            planned += 50 if (step // 30) % 3 else -90  # up twice, down once: the keeper's pattern
            points = revised_validation_steps(points, step, planned)
        if step in points:
            ran.append(step)
        if step >= planned:
            break
    assert len(ran) == 4 == len(set(ran))
    assert [r / planned for r in ran] == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=0.05)  # near k/4 of the plan
    # the rule this replaced, for the record: 3257, 3544, 3831, 4118 (no validation before 79% of the run)
    assert ran[-1] == planned


def test_the_plan_is_measured_once_only_for_a_minutes_bound_run_that_needs_it():
    calls = []

    def measure():
        calls.append(1)
        return 0.5, 10.0

    lines: list[str] = []
    timed = planned_train(TrainConfig(max_minutes=10, cooldown=0.3, validations=4), measure, lines.append)
    assert timed.planned_steps == int((600 * time_budget.MARGIN - 40) / 0.5) and calls == [1]
    assert lines[0].startswith(f"planned steps: {timed.planned_steps} in 10 minutes (0.500 s a step, 10.0 s a validation")
    assert planned_train(timed, measure, quiet) is timed and calls == [1]  # given (or resumed): not measured again
    assert planned_train(TrainConfig(max_steps=900, cooldown=0.3), measure, quiet).planned_steps == 900
    assert planned_train(TrainConfig(max_minutes=10), measure, quiet).planned_steps == 0  # plain noam: no plan
    assert calls == [1]


def _keep(keeper: BudgetKeeper, planned: int, steps: range, pace, clock: float = 0.0) -> tuple[int, float]:
    """Looks every 10 steps, as the trainer's agreement does; ``pace(step)``: the seconds the
    10 steps before ``step`` took. Returns (the plan, the clock)."""
    for step in steps:
        clock += pace(step)
        planned = keeper.proposal(step, planned, clock)
    return planned, clock


def test_the_keeper_shortens_the_plan_when_the_machine_stays_slower():
    """200 steps planned at 0.4 s a step in 93 s; from step 50 a step takes 1 s. The time lost
    counts at once; once most of the recent paces are the slow one, the plan shortens to what
    fits at 1 s a step. The validation's time is not pace; the one due at the step the keeper
    looks at is still to come (the loop validates after the look)."""
    keeper = BudgetKeeper(deadline=93.0, valid_s=5.0, validations=[50, 200])
    assert keeper.proposal(0, 200, 0.0) == 200  # the first look only marks the pace's start
    planned, clock = _keep(keeper, 200, range(10, 51, 10), lambda step: 4.0)
    assert planned == 50 + int(((93 - 20) * time_budget.MARGIN - 2 * 5.0) / 0.4) == 202  # both validations reserved
    keeper.validated(5.0)
    planned, clock = _keep(keeper, planned, range(60, 91, 10), lambda step: 10.0, clock + 5.0)
    assert planned == 90 + int(((93 - clock) * time_budget.MARGIN - 5.0) / 0.4)  # four slow paces of nine: not the median yet
    planned, clock = _keep(keeper, planned, [100], lambda step: 10.0, clock)
    assert planned == 100 + int(((93 - clock) * time_budget.MARGIN - 5.0) / 1.0) == 112


def test_a_stall_costs_its_own_steps_only_and_a_faster_cool_down_spends_its_minutes():
    """2200 steps planned at 0.65 s in 25 minutes, a cool-down over the last 1100. A 55-second
    stall at step 110 (the main job met one) costs the steps of 55 seconds, not the pace of the
    whole run; a machine twice as slow from step 400 on shortens the plan for good; inside the
    cool-down a faster pace lengthens the plan (the schedule goes on from its rate there:
    test_a_plan_revised_inside_the_cool_down_never_moves_the_rate_at_once); more steps than
    train.max_steps never."""
    def keeper() -> BudgetKeeper:
        return BudgetKeeper(deadline=25 * 60, valid_s=7.0, validations=[550, 1100, 1650, 2200], max_steps=100_000)

    stalled, _ = _keep(keeper(), 2200, range(0, 301, 10), lambda step: 6.5 + (55.0 if step == 110 else 0.0))
    assert 2200 - 55 / 0.65 - 22 <= stalled <= 2200 - 55 / 0.65 * time_budget.MARGIN + 22
    slower, clock = _keep(keeper(), 2200, range(0, 601, 10), lambda step: 6.5 if step <= 400 else 13.0)
    left = 25 * 60 - clock - 3 * 7.0
    assert slower == pytest.approx(600 + left * time_budget.MARGIN / 1.3, rel=time_budget.REVISE_SHARE) and slower < 1700
    cooling = keeper()
    _keep(cooling, 2200, range(1000, 1201, 10), lambda step: 6.5, clock=1000 * 0.65)
    longer, clock = _keep(cooling, 2200, range(1210, 1401, 10), lambda step: 3.0, clock=1200 * 0.65)
    assert longer == pytest.approx(1400 + (25 * 60 - clock - 2 * 7.0) * time_budget.MARGIN / 0.3, rel=time_budget.REVISE_SHARE)
    capped = BudgetKeeper(deadline=25 * 60, valid_s=0.0, validations=[], max_steps=1000)
    assert _keep(capped, 500, range(0, 101, 10), lambda step: 1.0)[0] == 1000  # 0.1 s a step: up to max_steps


def _keep_like_the_trainer(keeper: BudgetKeeper, planned: int, step_s: float, valid_s: float) -> tuple[int, float]:
    """The trainer's loop on a clock: a look every 10 steps, validations where the keeper's list
    has them (moved with the plan as the trainer moves them). Returns (the last step, the clock)."""
    clock, step = 0.0, 0
    while step < planned and clock < keeper.deadline:
        step += 1
        clock += step_s
        if step % 10 == 0 or step >= planned:
            proposal = keeper.proposal(step, planned, clock)
            if proposal != planned:
                keeper.validations = time_budget.revised_validation_steps(keeper.validations, step, proposal)
                planned = proposal
        if step in keeper.validations:
            clock += valid_s
            keeper.validated(valid_s)
    return step, clock


def test_a_plan_measured_on_a_busy_machine_grows_to_its_minutes_once_the_run_sees_its_pace():
    """The README's main job started beside a test run on 2 cores: the probe measured 6.96 s a
    step and ~209 s a validation, and planned 59 steps in 25 minutes. The keeper read no pace
    before 50 steps, so the run ended after 7.5 of its minutes (BLEU 0.12). It now reads the
    pace over a quarter of so short a plan: whether the machine frees up (0.45 s a step) or
    stays busy (7 s), the run spends most of its minutes, and ends inside them."""
    validations = time_budget.validation_steps(TrainConfig(validations=5), 59)
    for step_s, valid_s in ((0.45, 20.0), (7.0, 60.0)):
        keeper = BudgetKeeper(deadline=25 * 60, valid_s=209.0, validations=validations, max_steps=100_000)
        step, clock = _keep_like_the_trainer(keeper, 59, step_s, valid_s)
        assert 0.9 * 25 * 60 < clock <= 25 * 60, (step_s, step, clock)
        assert step > (2500 if step_s < 1 else 150)
    # A long plan still waits for PACE_STEPS steps: one slow look early on is no trend
    keeper = BudgetKeeper(deadline=25 * 60, valid_s=7.0, validations=[])
    assert [keeper.proposal(step, 2200, step * 0.65 + (30.0 if step >= 20 else 0.0)) for step in (10, 20, 30)] == [2200] * 3


def test_the_validations_to_come_are_the_grid_before_the_end_and_the_end():
    """One count for the plan (fit_steps) and the keeper: with valid_every, its multiples from
    the step the keeper looks at (that step's runs after the look) to before the end, and the
    end's own; with train.validations, the planned ones from that step on."""
    assert time_budget.validations_to_come(40, 100, [], 40) == 3  # 40 (after this look), 80, the end
    assert time_budget.validations_to_come(41, 100, [], 40) == 2
    assert time_budget.validations_to_come(41, 120, [], 40) == 2  # 80, and 120: on the grid and the end at once
    assert time_budget.validations_to_come(1, 40, [], 40) == 1
    assert time_budget.validations_to_come(50, 300, [50, 200], 0) == 2 and time_budget.validations_to_come(51, 300, [50, 200], 0) == 1


def test_a_valid_every_run_on_a_clock_that_spends_its_validations_ends_inside_its_minutes_at_the_floor():
    """train.validations 0 with valid_every 40 and a cool-down, 90 s at 0.3 s a step and 3 s a
    validation, the clock moved by the steps and the validations as the trainer's loop takes
    them (a look every 10 steps, a validation after the look). The keeper had reserved none of
    them: the plan grew, each validation cut it, and the run stopped by the clock with its rate
    above the floor. Now it ends at its planned step, the rate at the floor, inside its minutes
    (the end's validation included), having spent most of them."""
    tc = TrainConfig(max_minutes=1.5, valid_every=40, validations=0, cooldown=0.5, max_steps=100_000)
    deadline, step_s, valid_s = 90.0, 0.3, 3.0
    planned = fit_steps(deadline, step_s, valid_s, tc)
    schedule = LrSchedule(_optimizer(), lambda step: 1.0, planned, round(tc.cooldown * planned))
    keeper = BudgetKeeper(deadline, valid_s, [], valid_every=40)
    clock, step = 0.0, 0
    while step < schedule.planned_steps and clock < deadline:
        step += 1
        clock += step_s
        if step % 10 == 0:
            proposal = keeper.proposal(step, schedule.planned_steps, clock)
            if proposal != schedule.planned_steps:
                schedule.replan(step, proposal)
        if step % 40 == 0 and step < schedule.planned_steps:
            clock += valid_s
            keeper.validated(valid_s)
    clock += valid_s  # the end's validation
    assert step == schedule.planned_steps and 0.95 * deadline < clock <= deadline
    assert schedule.factor(step) == pytest.approx(1 / (schedule.cooldown_steps + 1))  # the floor


def test_a_gpu_paced_run_keeps_its_plan_steady_and_its_minutes():
    """A GPU step takes tens of milliseconds, its length varying with the batch's shape (here
    15-35 ms, drawn): ten-step paces are noise. An H200 run moved its plan 300 times in 4.5
    minutes on them. Now the pace is read over looks 2 s apart: the plan moves a few times,
    and the run still ends inside its minutes."""
    rng = random.Random(7)
    deadline, planned = 270.0, 4900  # the probe's 48 ms a step: about half the real pace
    keeper = BudgetKeeper(deadline=deadline, valid_s=4.3, validations=[])
    moves, clock, step = 0, 0.0, 0
    while step < planned and clock < deadline:
        step += 10
        clock += sum(rng.uniform(0.015, 0.035) for _ in range(10))
        proposal = keeper.proposal(step, planned, clock)
        moves += proposal != planned
        planned = proposal
    assert step >= planned and clock <= deadline
    assert planned > 0.9 * deadline * time_budget.MARGIN / 0.025  # the pace it found: ~25 ms a step
    assert moves <= 12


# -- runs -----------------------------------------------------------------------------------

def _lr_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _planned(config, steps: int):
    import dataclasses

    return dataclasses.replace(config, train=dataclasses.replace(config.train, planned_steps=steps))


def _epochs(config, steps: int, epochs: float):
    import dataclasses

    return dataclasses.replace(config, train=dataclasses.replace(config.train, planned_steps=steps, planned_epochs=epochs))


def test_dropout_follows_the_planned_steps_and_says_so():
    config = load_config("configs/multi30k.yaml", ["train.dropout_by_planned_steps={3500: 0.2, 6000: 0.3}",
                                                   "model.dropout=0.1", "train.label_smoothing_by_planned_steps={}"])
    lines: list[str] = []
    assert [planned_settings(_planned(config, n), lines.append).model.dropout for n in (0, 1300, 3499, 3500, 5999, 9000)] \
        == [0.1, 0.1, 0.1, 0.2, 0.2, 0.3]
    assert lines[0] == "model.dropout 0.1 -> 0.2: the run plans 3500 steps, at least 3500 (train.dropout_by_planned_steps)"
    assert len(lines) == 3  # only where it changes something
    plain = load_config("configs/multi30k.yaml", ["train.dropout_by_planned_steps={}"])
    assert planned_settings(_planned(plain, 9000)).model.dropout == plain.model.dropout


def test_a_dropout_given_on_the_command_line_wins_over_the_files_rule():
    given = load_config("configs/multi30k.yaml", ["model.dropout=0.3"])
    assert given.train.dropout_by_planned_steps == {}
    assert planned_settings(_planned(given, 9000)).model.dropout == 0.3
    assert given.train.dropout_by_planned_epochs == {}
    assert load_config("configs/multi30k.yaml").train.dropout_by_planned_epochs == {16.8: 0.2}  # the file's rule
    both = load_config("configs/multi30k.yaml", ["model.dropout=0.3", "train.dropout_by_planned_steps={5000: 0.4}"])
    assert planned_settings(_planned(both, 9000)).model.dropout == 0.4  # a rule given with it still applies


def test_a_resume_takes_the_dropout_its_plan_gave_and_is_not_refused_for_it():
    """The checkpoint's config holds the resolved dropout; the config file still says 0.1. The
    resume re-applies the rule to the checkpoint's plan and so compares equal."""
    sets = ["train.dropout_by_planned_steps={3500: 0.2}", "model.dropout=0.1", "train.max_minutes=25"]
    saved = planned_settings(_planned(load_config("configs/multi30k.yaml", sets), 4334))
    assert saved.model.dropout == 0.2
    last = {"config": saved.to_dict()}
    again = resumed_config(load_config("configs/multi30k.yaml", sets), last)
    assert again.train.planned_steps == 4334 and again.model.dropout == 0.2
    assert resume_mismatch(last["config"], again.to_dict()) is None
    other = resumed_config(load_config("configs/multi30k.yaml", ["train.dropout_by_planned_steps={}", *sets[1:]]),
                           last)  # the rule removed: refused
    assert resume_mismatch(last["config"], other.to_dict()) == "model.dropout"


def test_label_smoothing_follows_the_planned_steps_beside_dropout():
    config = load_config("configs/multi30k.yaml", ["train.label_smoothing_by_planned_steps={3500: 0.2}",
                                                   "train.dropout_by_planned_steps={3500: 0.2}"])
    lines: list[str] = []
    short, long = planned_settings(_planned(config, 2000), lines.append), planned_settings(_planned(config, 4400), lines.append)
    assert (short.train.label_smoothing, short.model.dropout) == (0.1, 0.1)
    assert (long.train.label_smoothing, long.model.dropout) == (0.2, 0.2)
    assert lines == ["model.dropout 0.1 -> 0.2: the run plans 4400 steps, at least 3500 (train.dropout_by_planned_steps)",
                     "train.label_smoothing 0.1 -> 0.2: the run plans 4400 steps, at least 3500 "
                     "(train.label_smoothing_by_planned_steps)"]
    shipped = load_config("configs/multi30k.yaml")
    assert shipped.train.label_smoothing_by_planned_epochs == {16.8: 0.2}  # the file's rule
    # a smoothing given on the command line clears its own rule, not dropout's
    given = planned_settings(_epochs(load_config("configs/multi30k.yaml", ["train.label_smoothing=0.05"]), 4400, 19.7))
    assert (given.train.label_smoothing, given.model.dropout) == (0.05, 0.2)


def test_a_resume_takes_the_label_smoothing_its_plan_gave():
    sets = ["train.label_smoothing_by_planned_steps={3500: 0.2}", "train.max_minutes=25"]
    saved = planned_settings(_planned(load_config("configs/multi30k.yaml", sets), 4334))
    again = resumed_config(load_config("configs/multi30k.yaml", sets), {"config": saved.to_dict()})
    assert again.train.planned_steps == 4334 and again.train.label_smoothing == 0.2


def test_the_shipped_rules_count_epochs_so_a_smaller_batch_does_not_move_them():
    """configs/multi30k.yaml: 16.8 epochs (3000 steps of 3000 tokens) and more get dropout and
    label smoothing 0.2, whatever the batch; 3400 steps of 2000 tokens (12.9 epochs) keep 0.1."""
    shipped = load_config("configs/multi30k.yaml")
    lines: list[str] = []
    small_batches = planned_settings(_epochs(shipped, 3400, 12.9), lines.append)
    assert (small_batches.model.dropout, small_batches.train.label_smoothing) == (0.1, 0.1) and lines == []
    long = planned_settings(_epochs(shipped, 3526, 19.7), lines.append)
    assert (long.model.dropout, long.train.label_smoothing) == (0.2, 0.2)
    assert lines[0] == "model.dropout 0.1 -> 0.2: the run plans 19.7 epochs, at least 16.8 (train.dropout_by_planned_epochs)"
    assert shipped.train.max_tokens_by_planned_epochs == {10: 2000, 16.8: 3000}


def test_a_rule_given_on_the_command_line_replaces_the_files_rule_in_the_other_unit():
    steps = load_config("configs/multi30k.yaml", ["train.dropout_by_planned_steps={3500: 0.3}"])
    assert steps.train.dropout_by_planned_epochs == {} and steps.train.label_smoothing_by_planned_epochs == {16.8: 0.2}
    assert planned_settings(_epochs(steps, 3600, 12.0)).model.dropout == 0.3
    for sets in (["train.max_tokens=4000"], ["train.tokens_per_update=12000"]):
        assert load_config("configs/multi30k.yaml", sets).train.max_tokens_by_planned_epochs == {}


def test_a_bad_rule_by_epochs_is_one_line_naming_its_key(tmp_path):
    from xformer_cli.errors import XformerError

    with pytest.raises(XformerError, match=r"train.max_tokens_by_planned_epochs.10.*expected int"):
        load_config("configs/multi30k.yaml", ["train.max_tokens_by_planned_epochs={10: 0.5}"])
    with pytest.raises(XformerError, match=r"train.dropout_by_planned_epochs.-1.*positive epoch count"):
        load_config("configs/multi30k.yaml", ["train.dropout_by_planned_epochs={-1: 0.2}"])
    with pytest.raises(XformerError, match=r"train.max_tokens_by_planned_epochs.12.*positive whole number of tokens"):
        load_config("configs/multi30k.yaml", ["train.max_tokens_by_planned_epochs={12: 0}"])
    both = tmp_path / "both.yaml"
    both.write_text("train:\n  dropout_by_planned_steps: {3000: 0.2}\n  dropout_by_planned_epochs: {17: 0.2}\n")
    with pytest.raises(XformerError, match=r"train.dropout_by_planned_epochs.*in steps or in epochs, not both"):
        load_config(both)
    auto = tmp_path / "auto.yaml"
    auto.write_text("train:\n  max_tokens: auto\n  max_tokens_by_planned_epochs: {10: 2000}\n")
    with pytest.raises(XformerError, match=r"train.max_tokens_by_planned_epochs.: needs a number in train.max_tokens"):
        load_config(auto)


def test_a_resume_keeps_the_batch_its_plan_chose():
    """The checkpoint says 2000 tokens (the rule's, by the first plan's epochs); the config file
    says 3000: the resume trains on 2000 and is not refused for it. Without the rule it is."""
    import dataclasses

    saved = load_config("configs/multi30k.yaml")
    saved = _epochs(dataclasses.replace(saved, train=dataclasses.replace(saved.train, max_tokens=2000)), 3400, 12.9)
    last = {"config": saved.to_dict()}
    again = resumed_config(load_config("configs/multi30k.yaml"), last)
    assert (again.train.max_tokens, again.train.planned_steps, again.train.planned_epochs) == (2000, 3400, 12.9)
    assert (again.model.dropout, again.train.label_smoothing) == (0.1, 0.1)
    assert resume_mismatch(last["config"], again.to_dict()) is None
    plain = resumed_config(load_config("configs/multi30k.yaml", ["train.max_tokens_by_planned_epochs={}"]), last)
    assert resume_mismatch(last["config"], plain.to_dict()) == "train.max_tokens"


def test_a_checkpoint_from_before_the_rules_by_epochs_resumes_with_the_settings_it_saved():
    """Saved by a run whose rule counted steps (dropout and smoothing 0.2 at 4266 planned steps,
    no planned_epochs): today's config, whose rules count epochs, resumes it as it was."""
    old = planned_settings(_planned(load_config("configs/multi30k.yaml", [
        "train.dropout_by_planned_steps={3000: 0.2}", "train.label_smoothing_by_planned_steps={3000: 0.2}"]), 4266))
    saved = old.to_dict()
    del saved["train"]["planned_epochs"]
    again = resumed_config(load_config("configs/multi30k.yaml"), {"config": saved})
    assert (again.model.dropout, again.train.label_smoothing, again.train.planned_steps) == (0.2, 0.2, 4266)
    assert resume_mismatch(saved, again.to_dict()) is None


def test_a_bad_dropout_rule_is_one_line_naming_its_key():
    from xformer_cli.errors import XformerError

    with pytest.raises(XformerError, match=r"train.dropout_by_planned_steps.3500.*step count and a dropout in \[0, 1\)"):
        load_config("configs/multi30k.yaml", ["train.dropout_by_planned_steps={3500: 1.5}"])
    with pytest.raises(XformerError, match=r"train.label_smoothing_by_planned_steps.0.*label_smoothing in \[0, 1\)"):
        load_config("configs/multi30k.yaml", ["train.label_smoothing_by_planned_steps={0: 0.2}"])


def _keeper_out(monkeypatch) -> None:
    """The plan as measured (faked) stays: these steps on the real clock take far less than the
    faked measure says, which the budget keeper would rightly act on (the busy-machine tests)."""
    monkeypatch.setattr(time_budget.BudgetKeeper, "proposal", lambda self, step, planned, now: planned)


@pytest.mark.slow
def test_a_minutes_bound_run_plans_once_resumes_bit_identically_and_ends_near_zero(small_corpus, tmp_path, monkeypatch):
    """The plan is measured once (faked: 24 steps fit), written to config.yaml, taken from the
    checkpoint on resume (not measured again); a run interrupted at step 12 and resumed equals
    the uninterrupted one, weights and losses; the last step's rate is under a tenth of the peak."""

    from xformer_cli.train.trainer import Trainer, train

    measured = []
    step_s = (600 * time_budget.MARGIN - 3 * 1.0) / 24  # 24 steps and 3 validations of 1 s fit in 10 minutes

    def fake_measure(*args):
        measured.append(1)
        return step_s, 1.0

    monkeypatch.setattr(time_budget, "measure_seconds", fake_measure)
    _keeper_out(monkeypatch)
    sets = {"train.max_minutes": 10, "train.max_steps": 1000, "train.cooldown": 0.3, "train.warmup_fraction": 0.1,
            "train.validations": 3, "train.save_every": 0, "train.dropout_by_planned_steps": "{20: 0.25, 30: 0.4}",
            "train.label_smoothing_by_planned_steps": "{24: 0.2}"}
    whole = train(tiny_config(small_corpus, tmp_path / "whole", **sets), log=quiet, progress=False)
    assert whole.steps == 24 and whole.stopped_because == "planned steps" and measured == [1]
    recorded = yaml.safe_load((tmp_path / "whole" / "config.yaml").read_text())
    assert recorded["train"]["planned_steps"] == 24 and recorded["model"]["dropout"] == 0.25  # the plan's dropout
    assert recorded["train"]["label_smoothing"] == 0.2  # and its label smoothing
    rows = _lr_rows(tmp_path / "whole")
    rates = {r["step"]: r["lr"] for r in rows if "lr" in r}
    assert rates[24] < 0.1 * max(rates.values())
    assert [r["step"] for r in rows if "valid_bleu" in r and "averaged_steps" not in r] == [8, 16, 24]

    trainer = Trainer(tiny_config(small_corpus, tmp_path / "parts", **sets), log=quiet, progress=False)
    signal_after_step(trainer, 12, monkeypatch)
    assert trainer.run().stopped_because == "interrupted" and measured == [1, 1]
    resumed = train(tiny_config(small_corpus, tmp_path / "parts", **sets), log=quiet, progress=False)
    assert resumed.steps == 24 and measured == [1, 1]  # the resume took the plan from its checkpoint
    a, b = load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "parts" / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert {r["step"]: r["lr"] for r in _lr_rows(tmp_path / "parts") if "lr" in r} == rates


@pytest.mark.slow
def test_a_batch_chosen_by_the_planned_epochs_is_planned_again_recorded_and_resumed(small_corpus, tmp_path,
                                                                                    monkeypatch):
    """train.max_tokens_by_planned_epochs: the first plan (at 600 tokens, faked: 24 steps fit)
    reaches the rule's threshold, so the run trains on 300-token batches, planned again at that
    size (faked: 40 steps fit); the epochs of the second plan set the dropout. config.yaml keeps
    all of it, and a resume takes it from the checkpoint without measuring: bit-identical."""
    from xformer_cli.train.trainer import Trainer, train

    measured: list[int] = []
    fits = {600: 24, 300: 40}

    def fake_measure(config, *args):
        measured.append(config.train.max_tokens)
        return (600 * time_budget.MARGIN - 2 * 1.0) / fits[config.train.max_tokens], 1.0

    monkeypatch.setattr(time_budget, "measure_seconds", fake_measure)
    _keeper_out(monkeypatch)
    sets = {"train.max_minutes": 10, "train.max_steps": 1000, "train.cooldown": 0.3, "train.validations": 2,
            "train.save_every": 0, "train.max_tokens_by_planned_epochs": "{0.05: 300}",
            "train.dropout_by_planned_epochs": "{0.1: 0.3}"}
    lines: list[str] = []
    whole = train(tiny_config(small_corpus, tmp_path / "whole", **sets), log=lines.append, progress=False)
    assert measured == [600, 300] and whole.steps == 40
    assert any(line.startswith("train.max_tokens 600 -> 300: the run plans ") and
               line.endswith("at least 0.05 (train.max_tokens_by_planned_epochs)") for line in lines)
    recorded = yaml.safe_load((tmp_path / "whole" / "config.yaml").read_text())["train"]
    epoch_steps = time_budget.steps_per_epoch(tiny_config(small_corpus, tmp_path / "x", **{"train.max_tokens": 300}),
                                         _prepared(small_corpus, tmp_path))
    assert (recorded["max_tokens"], recorded["planned_steps"]) == (300, 40)
    assert recorded["planned_epochs"] == round(40 / epoch_steps, 2) >= 0.1
    assert yaml.safe_load((tmp_path / "whole" / "config.yaml").read_text())["model"]["dropout"] == 0.3

    trainer = Trainer(tiny_config(small_corpus, tmp_path / "parts", **sets), log=quiet, progress=False)
    signal_after_step(trainer, 15, monkeypatch)
    assert trainer.run().stopped_because == "interrupted" and measured == [600, 300] * 2
    resumed = train(tiny_config(small_corpus, tmp_path / "parts", **sets), log=quiet, progress=False)
    assert resumed.steps == 40 and measured == [600, 300] * 2  # the resume took batch and plan from its checkpoint
    a, b = load_checkpoint(tmp_path / "whole" / "last.pt"), load_checkpoint(tmp_path / "parts" / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def _prepared(corpus, tmp_path):
    from xformer_cli.data.prepare import build_data, check_inputs

    config = tiny_config(corpus, tmp_path / "whole")
    return build_data(check_inputs(config, quiet), quiet, write=False)


@pytest.mark.slow
def test_a_resumed_run_goes_on_with_the_minutes_it_has_trained(small_corpus, tmp_path, monkeypatch):
    """The clock travels in the checkpoint (fairseq's --stop-time-hours counts the same way): a
    resumed run's metrics go on from the minutes trained before, and train.max_minutes counts
    them. Here the checkpoint says the whole budget was spent before the interruption: the
    resumed run trains no step more (it trained one past the budget), validates the step the
    signal left unvalidated and ends, its minutes past the budget's 10."""
    from xformer_cli.checkpoint_file import save_checkpoint
    from xformer_cli.train.trainer import Trainer, train

    monkeypatch.setattr(time_budget, "measure_seconds", lambda *args: ((600 * time_budget.MARGIN - 3) / 24, 1.0))
    sets = {"train.max_minutes": 10, "train.max_steps": 1000, "train.cooldown": 0.3, "train.validations": 3,
            "train.save_every": 0, "train.average_last": 0}
    run_dir = tmp_path / "run"
    trainer = Trainer(tiny_config(small_corpus, run_dir, **sets), log=quiet, progress=False)
    signal_after_step(trainer, 12, monkeypatch)
    assert trainer.run().stopped_because == "interrupted"
    last = load_checkpoint(run_dir / "last.pt")
    assert 0 < last["train_seconds"] < 120  # what the first part took
    last["train_seconds"] = 600.0
    save_checkpoint(last, run_dir / "last.pt")
    resumed = train(tiny_config(small_corpus, run_dir, **sets), log=quiet, progress=False)
    assert resumed.stopped_because == "already done" and resumed.steps == 12 and resumed.minutes >= 10
    validated = [r for r in _lr_rows(run_dir) if r["step"] == 12 and "valid_loss" in r]
    assert validated and all(r["minutes"] >= 10 for r in validated)
    assert not [r for r in _lr_rows(run_dir) if r["step"] > 12]


class _Clock:
    """time for the trainer and its run state: moved by the steps and validations the test
    says they take, never by the machine, so a busy machine changes none of the figures."""

    def __init__(self):
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def _run_on_a_fake_clock(config, monkeypatch, step_s, valid_s: float, log=quiet):
    """Train ``config`` with each step taking ``step_s(step)`` seconds and each validation
    ``valid_s`` (its decoding left out) of a fake clock; returns (trainer, result, the steps validated)."""
    from xformer_cli.train import state as state_module, trainer as trainer_module, validation
    from xformer_cli.train.trainer import Trainer

    clock, validated = _Clock(), []
    monkeypatch.setattr(trainer_module, "time", clock)
    monkeypatch.setattr(state_module, "time", clock)

    def validate(run) -> bool:
        validated.append(run.counters.step)
        clock.now += valid_s
        return False

    monkeypatch.setattr(validation, "validate", validate)
    trainer = Trainer(config, log=log, progress=False)
    real_step = trainer.train_step

    def timed_step(group):
        done = real_step(group)
        clock.now += step_s(trainer.counters.step)
        return done

    monkeypatch.setattr(trainer, "train_step", timed_step)
    return trainer, trainer.run(), validated


@pytest.mark.slow
def test_a_valid_every_run_reserves_its_validations_and_ends_inside_its_minutes_at_the_floor(small_corpus, tmp_path,
                                                                                            monkeypatch):
    """train.validations 0 with valid_every and a cool-down, the trainer on a clock that spends
    0.3 s a step and 3 s a validation, as measured. The keeper had counted no validation (the
    trainer gave it none): the plan grew, each validation cut it, and the run stopped by the
    clock with its rate at 0.6 of the peak, or validated past its minutes. It ends at its
    planned step, the rate at the floor, the end's validation inside the 1.5 minutes."""
    monkeypatch.setattr(time_budget, "measure_seconds", lambda *a: (0.3, 3.0))
    sets = {"train.max_minutes": 1.5, "train.max_steps": 100_000, "train.validations": 0, "train.valid_every": 40,
            "train.cooldown": 0.5, "train.save_every": 0, "train.log_every": 10}
    trainer, result, validated = _run_on_a_fake_clock(tiny_config(small_corpus, tmp_path / "run", **sets),
                                                      monkeypatch, lambda step: 0.3, 3.0)
    assert result.stopped_because == "planned steps" and 0.95 * 1.5 < result.minutes <= 1.5
    schedule = trainer.state.schedule
    assert schedule.factor(result.steps) == pytest.approx(1 / (schedule.cooldown_steps + 1))  # the floor
    assert validated == [*range(40, result.steps, 40), result.steps]


@pytest.mark.slow
@pytest.mark.parametrize("measured, planned, first_revision", [
    ((1.0, 5.0), 48, "at this pace 48 steps leave time for more"),
    ((5.0, 20.0), 3, "step 1: at this pace 3 steps leave time for more"),
], ids=["48-step plan", "3-step plan"])
def test_a_run_planned_on_a_busy_machine_spends_its_minutes(small_corpus, tmp_path, monkeypatch, measured, planned,
                                                            first_revision):
    """The probe ran beside another job: the main job beside a test run planned 59 steps in 25
    minutes and ended after 7.5 of them; beside three busy loops, 2 steps in 4 minutes (4.0 s a
    step, 83 s a validation), and ended after them: the keeper had read no pace (50 steps, looks
    2 s apart). Here the probe leaves 48 or 3 steps in a minute and the steps then take 0.25 s:
    the keeper reads the pace from the loop's start and looks often enough in so short a plan,
    says so, and the run trains its minute."""
    monkeypatch.setattr(time_budget, "measure_seconds", lambda *a: measured)
    lines: list[str] = []
    sets = {"train.max_minutes": 1.0, "train.max_steps": 100_000, "train.cooldown": 0.3, "train.validations": 2,
            "train.save_every": 0}
    trainer, result, validated = _run_on_a_fake_clock(tiny_config(small_corpus, tmp_path / "run", **sets), monkeypatch,
                                                      lambda step: 0.25, 1.0, lines.append)
    assert trainer.config.train.planned_steps == planned
    assert [line for line in lines if first_revision in line], lines
    assert result.stopped_because == "planned steps" and 0.8 < result.minutes <= 1.0
    assert result.steps > 180 and len(validated) == 2 and validated[-1] == result.steps


@pytest.mark.slow
def test_a_machine_that_slows_down_mid_run_still_stops_within_its_minutes(small_corpus, tmp_path, monkeypatch):
    """The plan says 0.05 s a step; from step 10 every step takes 0.35 s. The keeper sees the
    new pace and shortens the plan, so the cool-down and the last validation still come, and the
    run ends inside its 30 seconds. On a fake clock: a busy machine moves no figure here."""
    monkeypatch.setattr(time_budget, "measure_seconds", lambda *a: (0.05, 0.5))
    lines: list[str] = []
    sets = {"train.max_minutes": 0.5, "train.max_steps": 100_000, "train.cooldown": 0.3, "train.validations": 2,
            "train.save_every": 0}
    trainer, result, validated = _run_on_a_fake_clock(tiny_config(small_corpus, tmp_path / "run", **sets), monkeypatch,
                                                      lambda step: 0.05 if step <= 10 else 0.35, 0.5, lines.append)
    assert result.stopped_because == "planned steps" and result.minutes <= 0.5
    assert [line for line in lines if "no longer fit" in line], lines
    assert trainer.state.schedule.planned_steps == result.steps < trainer.config.train.planned_steps  # shortened
    assert len(validated) == 2 and validated[-1] == result.steps  # both validations, the last at the end
    rows = _lr_rows(tmp_path / "run")
    assert any("planned_before" in r for r in rows)
    rates = {r["step"]: r["lr"] for r in rows if "lr" in r}
    assert rates[max(rates)] < 0.1 * max(rates.values())
