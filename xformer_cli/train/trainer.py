"""The training loop: a planned run -> batches -> TrainStep -> validation and checkpoints.

``train(config)`` is the whole of ``xformer train``. The run directory ends up holding
``config.yaml`` (the resolved config), ``tokenizer/``, ``metrics.jsonl``, ``last.pt``
and ``best.pt`` (highest validation BLEU).

Before the loop, run_plan.py works out everything once (device, precision, resume, init_from,
data, batch size); the loop receives that plan. Beside the loop: step.py (one optimizer
update: forward and loss, backward, gradients summed over ranks, the update), epoch_batches.py
(an epoch's batches and their shapes), state.py (what run_checkpoints.py, validation.py and
after_training.py share with the loop), metrics.py, prefetch.py and signals.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import torch

from xformer_cli import run_lock
from xformer_cli.checkpoint_file import build_model
from xformer_cli.config import Config
from xformer_cli.data.batching import Batch
from xformer_cli.data.weights import source_untils
from xformer_cli.errors import XformerError
from xformer_cli.train import after_training, forward_loss, init_from, run_checkpoints, validation
from xformer_cli.train.epoch_batches import BatchPlan, epoch_share, plan_for
from xformer_cli.train.time_budget import BudgetKeeper, revised_validation_steps, validation_steps
from xformer_cli.train.background_save import CheckpointWriter, writes_in_background
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.metrics import MetricsLog, StepStats
from xformer_cli.train.run_plan import RunPlan, plan_run
from xformer_cli.train.prefetch import prefetch
from xformer_cli.train.progress import RunProgress
from xformer_cli.train.schedule import make_schedule
from xformer_cli.train.signals import StopSignals
from xformer_cli.train.state import Counters, RunState, ValidSet
from xformer_cli.train.step import TrainStep

_AGREE_EVERY = 10  # steps between the ranks' agreement on stopping (a signal, the clock)


class StopReason(str, Enum):
    """Why a run stopped. A str: callers and scripts compare it with the plain value."""

    MAX_STEPS = "max_steps"
    PLANNED_STEPS = "planned steps"  # the plan (train/time_budget.py) ended before train.max_steps
    TIME = "time"  # train.max_minutes
    EPOCHS = "epochs"  # train.max_epochs
    PATIENCE = "patience"
    INTERRUPTED = "interrupted"  # SIGINT/SIGTERM: last.pt saved, no passes after training
    ALREADY_DONE = "already done"  # a resume of a run already at its last step

    def __str__(self) -> str:  # the value, as the bare strings were, in f-strings and logs
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class TrainResult:
    steps: int
    epochs: int
    minutes: float
    best_bleu: Optional[float]
    run_dir: Path
    stopped_because: StopReason


class Trainer:
    """Runs a planned training run; its state (``self.state``) goes whole into every checkpoint,
    so a run continues exactly."""

    def __init__(self, config: Config, overwrite: bool = False, log: Callable[[str], None] = print,
                 progress: bool = True):
        plan = plan_run(config, overwrite, log)
        self.config, self.dist, self.device, self.overwrite = plan.config, plan.dist, plan.device, overwrite
        self.progress = progress and plan.dist.is_main
        self.train_data = plan.data.train
        tc = self.config.train
        self.batch_plan: BatchPlan = plan_for(self.train_data, tc.max_tokens, tc.length_bucket, tc.seed, tc.batching)
        model = self._build_model(plan)
        self.step_fn = self._build_step(plan, model)
        valid = [ValidSet(direction, corpus, plan.data.valid_encoded_sets[direction])
                 for direction, corpus in plan.data.valid_sets.items()]
        schedule = make_schedule(self.step_fn.optimizer, tc, self.config.model.d_model)
        self.state = RunState(self.config, self.dist, self.device, plan.precision, plan.data.tokenizer, model,
                              self.step_fn.optimizer, schedule,
                              self.step_fn.scaler, MetricsLog(Path(self.config.run_dir), enabled=self.dist.is_main),
                              valid, plan.log, writer=CheckpointWriter(writes_in_background(self.device)),
                              data_key=self.train_data.content)
        self.resumed = plan.resume is not None
        if plan.resume is not None:
            run_checkpoints.restore(self.state, plan.resume)
        self.stats = StepStats(self.device, self.config.train.max_nonfinite)
        self.stats.go_on_from(*self.counters.window_open)
        self.counters.window_open = (0.0, 0.0)
        self.valid_seconds = plan.valid_seconds  # the budget plan's estimate (0: none)
        self.keeper: Optional[BudgetKeeper] = None
        self.planned_validations: Optional[list[int]] = None  # train.validations' steps, once the plan is known
        self.bar: Optional[RunProgress] = None  # the progress bar, while the loop runs
        self._cached_epoch: Optional[int] = None  # the epoch whose batches _batches_of holds
        self.untils = source_untils(self.config.data)  # (name, until) of each cached source

    def _build_model(self, plan: RunPlan) -> torch.nn.Module:
        """The model, with the pretrained weights on a fresh init_from run, on this rank's device."""
        model = build_model(self.config, plan.data.tokenizer, plan.output_pieces)
        if plan.pretrained is not None and plan.pretrained.weights is not None:  # not when resuming
            init_from.load_weights(model, plan.pretrained)  # all but the pieces this run counted
        return model.to(self.device)

    def _build_step(self, plan: RunPlan, model: torch.nn.Module) -> TrainStep:
        tc = self.config.train
        shapes = len(self.batch_plan.declared(self.config.data.max_len)) if tc.compile else 0
        step = TrainStep(model, tc, self.device, plan.precision, self.dist, self.batch_plan.static_shapes, shapes)
        if self.dist.enabled:
            torch.manual_seed(tc.seed + self.dist.rank)  # same initial weights, different dropout per rank
        plan.log(f"model: {model.count_parameters():,} parameters on {self.device}"
                 + (f" x {self.dist.world_size} processes" if self.dist.enabled else ""))
        self.compiled_before = forward_loss.compilations()
        return step

    @property
    def counters(self) -> Counters:
        return self.state.counters

    def train_step(self, group: list[Batch]) -> int:
        """One optimizer update over ``update_freq`` batches (on every rank); returns the target
        tokens it saw on this rank. Nothing here waits for the accelerator: the figures stay
        on the device (``self.stats``), read at the log lines and saves (``drain_stats``)."""
        n_tokens = sum(b.n_tokens for b in group)
        # The loss is normalised by the target tokens of the whole update, over every batch and
        # every rank, and the gradients are summed over ranks (step.py).
        all_tokens = n_tokens
        if self.dist.enabled:
            all_tokens = self.dist.all_reduce_sum(torch.full((), float(n_tokens), device=self.device))
        self._lr = self.state.schedule.step()
        result = self.step_fn(group, all_tokens)
        if result.oom_here:
            self.state.log(f"step {self.counters.step + 1}: out of memory on a batch of {n_tokens} target tokens; "
                           "the update is skipped (lower train.max_tokens if this repeats)")
        self.stats.add(result.loss, result.nonfinite, result.oom, all_tokens, step=self.counters.step + 1)
        self.counters.step += 1
        return n_tokens

    def drain_stats(self, keep_sums: bool = False) -> tuple[float, float]:
        """Read the device-side figures since the last call (one sync): the summed loss and
        the target tokens (all ranks) of the applied updates (``keep_sums``: left to add on).
        Reports skipped updates and stops the run when too many non-finite losses came in a row."""
        c = self.counters
        loss_sum, good_tokens, skipped, _, ooms = self.stats.drain(keep_sums)
        if skipped:
            c.nonfinite_total += skipped
            self.state.log(f"step {c.step}: non-finite loss, update skipped {skipped} time(s) since the last report "
                           f"({c.nonfinite_total} in all)")
        if ooms:
            c.oom_total += ooms
            if self.dist.enabled:
                self.state.log(f"step {c.step}: a rank ran out of memory; {ooms} update(s) skipped on every rank since "
                               f"the last report ({c.oom_total} in all)")
        self.stop_if_nonfinite()
        return loss_sum, good_tokens

    def stop_if_nonfinite(self) -> None:
        """Stop the run once train.max_nonfinite non-finite losses came in a row, at the step
        they did (StepStats keeps it on the device). Read only where that adds no host sync:
        after every step on a CPU (its figures are computed when the step returns); on an
        accelerator at each read of the figures (log lines, the last step, and before every
        validation or save, so no checkpoint holds a later state) and at the ranks' agreement."""
        tripped = self.stats.tripped()
        if not tripped:
            return
        c, last = self.counters, self.state.run_dir / "last.pt"
        seen = f" (read at step {c.step})" if c.step != tripped else ""
        saved = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint was saved before"
        raise XformerError(f"{self.config.train.max_nonfinite} non-finite losses in a row at step {tripped}{seen}; "
                           f"stopped, {saved} (lower train.lr_scale or set train.clip_norm)")

    def _load_group(self, batches: list, start: int) -> list[Batch]:
        bos = self.config.model.bos_id
        indices = batches[start : start + self.config.train.update_freq]
        group = [self.batch_plan.load(idx).with_start_token(bos) for idx in indices]
        if self.device.type == "cuda":
            group = [b.pin() for b in group]
        return [b.to(self.device) for b in group]

    def run(self) -> TrainResult:
        """Train until max_steps, the clock, max_epochs, patience or a signal ends the run."""
        tc, c = self.config.train, self.counters
        self.state.started = time.time() - c.train_seconds  # a resumed run's minutes go on
        self.deadline = self.state.started + tc.max_minutes * 60 if tc.max_minutes else math.inf
        ended = self.ended_before_a_step()
        at_end = c.step >= self.last_step() or ended is not None
        unvalidated = at_end and bool(self.state.valid) and not after_training.validated_at(self.state, c.step)
        owed = at_end and (unvalidated or after_training.owed(self.state))
        if self.dist.is_main and (owed or not at_end):  # a refused run leaves the config it was trained with
            run_checkpoints.write_config(self.config, self.state.precision)
        if at_end:
            if owed:  # a run stopped at its last step before its validation (a signal) or inside its passes
                self.state.log(f"{self.state.run_dir} is at its last step {c.step}, and nothing marks its "
                               f"{'validation and ' * unvalidated}passes after training finished: running them")
                if unvalidated:
                    validation.validate(self.state)
                after_training.forget_unfinished(self.state)
                return self.finish(StopReason.ALREADY_DONE)
            self.state.log(self._already_done(ended))
            return TrainResult(c.step, c.epoch, c.train_seconds / 60, c.best_bleu, self.state.run_dir,
                               StopReason.ALREADY_DONE)
        if tc.max_minutes and self.state.schedule.planned_steps:
            self.keeper = BudgetKeeper(self.deadline, self.valid_seconds, self.validation_steps(), tc.max_steps,
                                       valid_every=0 if tc.validations else tc.valid_every)
            self.keeper.start(c.step, time.time())
        self.state.model.train()
        self._lr = self.state.schedule.lr(max(c.step, 1))
        self.window_tokens = 0.0  # tokens/s is measured from this process's start (or the last log line)
        self.window_start = time.time()
        bar = self.bar = RunProgress(self.last_step(), tc.max_minutes, c.step, self.progress, self.state.started,
                                     c.train_seconds, planned=bool(self.state.schedule.planned_steps))
        with StopSignals() as signals:
            try:
                reason, last_validated = self._loop(signals, bar)
            except BaseException:
                self.state.writer.wait(raise_error=False)  # the files a failure's message names are whole
                raise
            bar.close()
            self.read_stats(off_the_grid=True)  # the open window's loss and skipped updates, into the checkpoint
            if reason is StopReason.INTERRUPTED:
                # last.pt alone: no validation (the user wants out now), and no kept step
                # checkpoint off the save_every grid, which a resumed run would then average
                run_checkpoints.save(self.state, kept=False)
                again = "run the same command without --overwrite" if self.overwrite else "run the same command"
                self.state.log(f"interrupted at step {c.step}: saved {self.state.run_dir / 'last.pt'}; "
                               f"{again} to resume")
            elif last_validated != c.step:
                validation.validate(self.state)
        return self.finish(reason)

    def ended_before_a_step(self) -> Optional[str]:
        """What ends the run before its next step, other than its step limits (a run that stopped
        on its minutes, its patience or its epochs, run again): None when it trains on."""
        tc, c = self.config.train, self.counters
        if tc.max_minutes and c.train_seconds >= tc.max_minutes * 60:  # the checkpoint's count: every rank's alike
            return f"its {tc.max_minutes:g} minutes are spent; raise train.max_minutes to train on"
        if tc.patience and c.bad_validations >= tc.patience:
            return (f"{c.bad_validations} validations without a better BLEU (train.patience={tc.patience}); "
                    "raise train.patience to train on")
        if tc.max_epochs and self.epoch_batches() is None:
            return f"its {tc.max_epochs} epochs are done; raise train.max_epochs to train on"
        return None

    def _already_done(self, ended: Optional[str]) -> str:
        """The line a run that has nothing left to do says, and how to go on."""
        c, planned = self.counters, self.state.schedule.planned_steps
        if ended is not None:
            return f"{self.state.run_dir} has finished at step {c.step}: {ended}"
        onward = ("its schedule ended there: to train on, fine-tune its best.pt in another run_dir "
                  "(train.init_from), or --overwrite to start afresh" if planned and c.step >= planned
                  else "raise train.max_steps to train on")
        return (f"{self.state.run_dir} is already at step {c.step} (train.max_steps={self.config.train.max_steps}, "
                f"planned {planned or '-'}); {onward}")

    def _loop(self, signals: StopSignals, bar: RunProgress) -> tuple[StopReason, int]:
        """Epochs of steps until a stop reason; returns it and the step last validated."""
        tc, c = self.config.train, self.counters
        last_validated = c.step if self.resumed else -1
        while True:
            batches = self.epoch_batches()
            if batches is None:
                return StopReason.EPOCHS, last_validated
            starts = range(c.batches_done, len(batches), tc.update_freq)
            for start, group in prefetch(starts, lambda start: self._load_group(batches, start)):
                c.batches_done = min(start + tc.update_freq, len(batches))
                self.window_tokens += self.train_step(group)
                epoch_cut = self.end_corpora(len(batches))
                bar.update(c.step)
                due_to_validate = self.due_to_validate(c.step)
                due_to_save = due_to_validate or bool(tc.save_every and c.step % tc.save_every == 0)
                if c.step % tc.log_every == 0 or due_to_save or c.step >= self.last_step():
                    # the one read of device figures, before anything is logged or saved
                    self.read_stats(off_the_grid=not (c.step % tc.log_every == 0 or due_to_save))
                elif self.device.type == "cpu":
                    self.stop_if_nonfinite()  # no sync to wait for on a CPU: checked at every step
                if c.step % tc.log_every == 0:
                    self.log_window(bar)
                reason = self.stop_reason(signals, due_to_save)
                started = time.time()
                if reason is None and due_to_validate:
                    last_validated = c.step
                    # validate() saves last.pt (and best.pt when better) itself; it decodes through
                    # RunState.valid_engine -> decode.factory.engine_for_model
                    if validation.validate(self.state):
                        reason = StopReason.PATIENCE
                    if self.keeper is not None:
                        self.keeper.validated(time.time() - started)
                elif reason is None and due_to_save:
                    run_checkpoints.save(self.state)
                    if self.keeper is not None:
                        self.keeper.exclude(time.time() - started)
                if reason is not None:
                    return reason, last_validated
                if epoch_cut:
                    break

    def last_step(self) -> int:
        """train.max_steps, or the planned steps when a plan ends the run sooner."""
        planned = self.state.schedule.planned_steps
        return min(self.config.train.max_steps, planned) if planned else self.config.train.max_steps

    def validation_steps(self) -> list[int]:
        """The steps train.validations spreads over the plan ([] when valid_every decides);
        revise_plan moves the ones still to come."""
        if self.planned_validations is None:
            self.planned_validations = validation_steps(self.config.train, self.last_step())
        return self.planned_validations

    def due_to_validate(self, step: int) -> bool:
        tc = self.config.train
        if tc.validations:
            return step in self.validation_steps()
        return step % tc.valid_every == 0

    def epoch_batches(self) -> Optional[list]:
        """This epoch's batches (this rank's share), moving to the next epoch when the current
        one is done; None once train.max_epochs are done. (seed, epoch) fix the order, so
        ``batches_done`` is a resumable position."""
        tc, c = self.config.train, self.counters
        batches = None
        if c.epoch > 0:
            batches = self._batches_of(c.epoch)
        if batches is None or c.batches_done >= len(batches):
            if tc.max_epochs and c.epoch >= tc.max_epochs:
                return None
            c.epoch += 1
            c.batches_done = 0
            batches = self._batches_of(c.epoch)
        return batches

    def _batches_of(self, epoch: int) -> list:
        if self._cached_epoch != epoch:
            left_out = {i for i, first in self.counters.corpora_ended.items() if epoch >= first}
            self._cached_batches = epoch_share(self.batch_plan, self.train_data, self.config.data,
                                               self.config.train.seed, epoch, self.dist.rank, self.dist.world_size,
                                               left_out)
            self._cached_epoch = epoch
        return self._cached_batches

    def end_corpora(self, n_batches: int) -> bool:
        """data.train's ``until``: a corpus whose share of the planned steps is done leaves every
        epoch after this one, and this one ends here (``batches_done`` at its end, before any save,
        so a resume takes up the next epoch too). Returns whether the epoch ends."""
        c = self.counters
        steps = self.state.schedule.planned_steps or self.config.train.max_steps  # not moved by a resume's max_steps
        due = [(i, name, until) for i, (name, until) in enumerate(self.untils)
               if until < 1 and i not in c.corpora_ended and c.step >= round(until * steps)]
        for i, name, until in due:
            c.corpora_ended[i] = c.epoch + 1
            self.state.log(f"step {c.step}: {name} ends here (until {until:g} of {steps} planned steps): "
                           f"epoch {c.epoch} stops, the epochs from {c.epoch + 1} on leave it out")
            self.state.metrics.record(self.state.event(corpus_ended=name, until=until))
        if due:
            c.batches_done = n_batches
        return bool(due)

    def read_stats(self, off_the_grid: bool = False) -> None:
        """Add the device-side loss figures since the last read to the open logging window.
        ``off_the_grid``: a read an uninterrupted run would not make (the run's end, a signal):
        the sums stay on the device, adding on in their order, and go into last.pt apart
        (``Counters.window_open``), for a resumed run's device to go on from them."""
        loss_sum, good_tokens = self.drain_stats(keep_sums=off_the_grid)
        if off_the_grid:
            self.counters.window_open = (loss_sum, good_tokens)
            return
        self.counters.window_loss_sum += loss_sum
        self.counters.window_good_tokens += good_tokens
        self.counters.window_open = (0.0, 0.0)

    def log_window(self, bar: RunProgress) -> None:
        """One train_loss / tokens-per-second line (progress bar and metrics.jsonl); closes the window."""
        c = self.counters
        tokens = self.dist.sum([self.window_tokens], self.device)[0]
        rate = tokens / max(time.time() - self.window_start, 1e-9)
        avg = c.window_loss_sum / max(c.window_good_tokens, 1)
        bar.update(c.step, loss=f"{avg:.3f}", ppl=f"{math.exp(min(avg, 50)):.1f}", lr=f"{self._lr:.2e}",
                   tok_s=f"{rate:.0f}", epoch=c.epoch)
        compiled = {"compilations": self.compilations()} if self.config.train.compile else {}
        self.state.metrics.record({"step": c.step, "epoch": c.epoch, "train_loss": round(avg, 6), "lr": self._lr,
                                   "tokens_per_s": round(rate, 1), "minutes": round(self.state.minutes(), 3),
                                   **compiled})
        c.window_loss_sum = c.window_good_tokens = 0.0
        self.window_tokens = 0.0
        self.window_start = time.time()

    def compilations(self) -> int:
        """Graphs torch.compile has built for this run's training step so far."""
        return forward_loss.compilations() - self.compiled_before

    def stop_reason(self, signals: StopSignals, due_to_save: bool) -> Optional[StopReason]:
        """Why the run stops after this step (None to go on): interrupted, the step limit or time.
        Every few steps the budget keeper may also revise the planned steps."""
        tc, step = self.config.train, self.counters.step
        now, planned = time.time(), self.last_step()
        interrupted, out_of_time = signals.received is not None, now >= self.deadline
        # a plan of a few dozen steps looks more often: ten looks at least before it ends
        agree = not step % max(1, min(_AGREE_EVERY, planned // 10)) or due_to_save or step >= planned
        proposal = self.keeper.proposal(step, planned, now) if agree and self.keeper is not None else planned
        # Ranks must agree (a signal or the clock may reach them a step apart, their paces
        # differ a little): one collective every few steps, not a host sync on every step.
        if self.dist.enabled:
            if not agree:
                interrupted = out_of_time = False
            else:
                flags = self.dist.sum([float(interrupted), float(out_of_time), float(proposal)], self.device)
                interrupted, out_of_time = flags[0] > 0, flags[1] > 0
                proposal = math.floor(flags[2] / self.dist.world_size)
                self.stop_if_nonfinite()  # the collective has drained the device's queue: a free read
        if proposal != planned:
            self.revise_plan(proposal)
        if interrupted:
            return StopReason.INTERRUPTED
        if step >= self.last_step():
            return StopReason.MAX_STEPS if step >= tc.max_steps else StopReason.PLANNED_STEPS
        return StopReason.TIME if out_of_time else None

    def revise_plan(self, steps: int) -> None:
        """The machine's pace has changed: the schedule's cool-down and the validations move."""
        schedule, c = self.state.schedule, self.counters
        fit = "no longer fit" if steps < schedule.planned_steps else "leave time for more"
        self.state.log(f"step {c.step}: at this pace {schedule.planned_steps} steps {fit} in "
                       f"{self.config.train.max_minutes:g} minutes; planned steps {schedule.planned_steps} -> {steps}")
        self.state.metrics.record(self.state.event(planned_steps=steps, planned_before=schedule.planned_steps))
        schedule.replan(c.step, steps)
        self.planned_validations = revised_validation_steps(self.validation_steps(), c.step, self.last_step())
        self.keeper.validations = self.planned_validations
        if self.bar is not None:
            self.bar.retarget(self.last_step())

    def finish(self, reason: StopReason) -> TrainResult:
        """After the loop: release the process group, average checkpoints and tune the length
        penalty (rank 0 alone), say how it ended."""
        tc, c, run = self.config.train, self.counters, self.state
        main = self.dist.is_main
        run.writer.wait()  # every checkpoint on disk before anything reads them back
        self.dist.stop()
        run.dist = Distributed()  # rank 0 goes on alone: the passes below communicate with nobody
        if tc.average_last and main and reason is not StopReason.INTERRUPTED:
            after_training.average_last(run)
        if tc.tune_length_penalty and main and reason is not StopReason.INTERRUPTED and run.valid:
            after_training.tune_length_penalty(run)
        if main and reason is not StopReason.INTERRUPTED:
            run.metrics.record(run.event(**{after_training.DONE: True}))
        run.metrics.close()
        if tc.compile:
            shapes = "static" if self.batch_plan.static_shapes else "dynamic"
            run.log(f"torch.compile: {self.compilations()} compilations for {len(self.step_fn.shapes_seen)} "
                    f"batch shapes ({shapes} shapes)")
        if reason is StopReason.PATIENCE:
            run.log(f"early stop: no better validation BLEU for {tc.patience} validations")
        best = c.best_bleu if c.best_bleu is None else round(c.best_bleu, 2)
        run.log(f"done: {c.step} steps, epoch {c.epoch}, {run.minutes():.1f} min; best valid BLEU {best}; "
                f"checkpoints in {run.run_dir}"
                + (f"; {c.nonfinite_total} non-finite losses skipped" if c.nonfinite_total else "")
                + (f"; {c.oom_total} updates skipped for lack of memory" if c.oom_total else ""))
        return TrainResult(c.step, c.epoch, run.minutes(), c.best_bleu, run.run_dir, reason)


def train(config: Config, overwrite: bool = False, log: Callable[[str], None] = print,
          progress: bool = True) -> TrainResult:
    """Train the run ``config`` describes, holding its run_dir (run_lock) from first to last."""
    with run_lock.holding(config.run_dir, "xformer train"):
        return Trainer(config, overwrite, log, progress).run()
