"""The training loop: data -> tokenizer -> batches -> model, loss, Adam + Noam -> checkpoints.

``train(config)`` is the whole of ``xformer train``. The run directory ends up holding
``config.yaml`` (the resolved config), ``tokenizer/``, ``metrics.jsonl``, ``last.pt``
and ``best.pt`` (highest validation BLEU).

The loop is here; beside it: batch_plan.py (an epoch's batches and their shapes: token
budgets or length buckets), batch_size.py and memory_probe.py (train.max_tokens: auto,
train.tokens_per_update), forward_loss.py (forward + loss as one function, what
train.compile compiles; the half-weight cache), checkpointing.py (what a checkpoint holds,
when files are written, resuming), validation.py, after_training.py (averaging, the
length-penalty search), metrics.py (metrics.jsonl, TensorBoard), prefetch.py and signals.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import Tensor

from xformer_cli.checkpoint import build_model
from xformer_cli.config import Config
from xformer_cli.data.batching import Batch, shard
from xformer_cli.data.prepare import build_data, check_inputs
from xformer_cli.data.weights import epoch_pairs, to_cache_indices
from xformer_cli.decode.translator import Translator
from xformer_cli.device import configure_threads, pick_device, resolve_precision
from xformer_cli.decode.factory import engine_for_model
from xformer_cli.errors import XformerError
from xformer_cli.train import after_training, batch_size, checkpointing, forward_loss, init_from, validation
from xformer_cli.train.batch_plan import BatchPlan, plan_for, widest_pair
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.memory_probe import gpu_probe
from xformer_cli.train.metrics import MetricsLog, StepStats
from xformer_cli.train.prefetch import prefetch
from xformer_cli.train.progress import RunProgress
from xformer_cli.train.schedule import make_schedule
from xformer_cli.train.signals import StopSignals

_AGREE_EVERY = 10  # steps between the ranks' agreement on stopping (a signal, the clock)


@dataclass
class TrainResult:
    steps: int
    epochs: int
    minutes: float
    best_bleu: Optional[float]
    run_dir: Path
    stopped_because: str = "finished"  # finished | max_steps | time | epochs | patience | interrupted | already done


class Trainer:
    """Owns the training state and writes it all to checkpoints, so a run continues exactly."""

    def __init__(self, config: Config, overwrite: bool = False, log: Callable[[str], None] = print, progress: bool = True):
        self.dist = Distributed.from_environment()
        if not self.dist.is_main:  # one voice: rank 0 logs, validates and writes checkpoints
            log, progress = (lambda _: None), False
        self.config, self.log, self.progress = config, log, progress
        self._start_device()
        self.run_dir = Path(config.run_dir)
        # train.init_from: the pretrained model's model and tokenizer sections replace the config's
        self.config, self.pretrained, self.resume_state = init_from.resolve(config, overwrite, log)
        self._prepare_data(overwrite)
        self._resolve_batch_size()
        tc = self.config.train
        self.plan: BatchPlan = plan_for(self.train_data, tc.max_tokens, tc.length_bucket, tc.seed, tc.batching)
        self._build_model()
        # Validation decodes the way `xformer translate --precision auto` does on this device.
        self.decode_precision = "auto"  # validation's, as `xformer translate --engine xformer` decides it
        self.step = self.epoch = self.batches_done = 0
        self._cached_epoch: Optional[int] = None  # the epoch whose batches _batches_of holds
        self.best_bleu: Optional[float] = None
        self.bad_validations = 0  # validations in a row without a better BLEU (early stopping)
        self.nonfinite_total = 0
        self.oom_skipped = 0
        # The open logging window's loss: saved with the checkpoint, so the first train_loss
        # after a resume averages the same steps an uninterrupted run's would.
        self.window_loss_sum = self.window_good_tokens = 0.0
        self.stats = StepStats(self.device)
        self.metrics = MetricsLog(self.run_dir, enabled=self.dist.is_main)
        if self.resume_state is not None:
            checkpointing.restore(self, self.resume_state)

    def _start_device(self) -> None:
        """Threads, seed, device (this rank's GPU under torchrun), process group, precision."""
        tc = self.config.train
        configure_threads(tc.threads)
        torch.manual_seed(tc.seed)
        self.device = pick_device(tc.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        self.dist.start(self.device)
        self.precision, why = resolve_precision(tc.precision, self.device)
        self.log(f"precision: {self.precision} ({why})" if tc.precision != "auto"
                 else f"precision: auto -> {self.precision} ({why})")

    def _prepare_data(self, overwrite: bool) -> None:
        """Tokenizer and encoded corpora. Every input is read and checked before the run
        directory is touched: bad data must not cost the checkpoints of an earlier run."""
        config, log = self.config, self.log
        tokenizer = self.pretrained.tokenizer if self.pretrained is not None else None
        if self.dist.is_main:
            inputs = check_inputs(config, log, tokenizer)
            checkpointing.prepare_run_dir(config, overwrite, self.precision)
            prepared = build_data(inputs, log)
            self.dist.barrier()
        else:  # wait for rank 0 to train the tokenizer and build the cache, then reuse both
            self.dist.barrier()
            prepared = build_data(check_inputs(config, log, tokenizer), log, write=False)
        self.tokenizer, self.train_data = prepared.tokenizer, prepared.train
        self.valid_corpus, self.valid_data = prepared.valid, prepared.valid_encoded

    def _resolve_batch_size(self) -> None:
        """train.max_tokens and update_freq as this run trains with them: a resumed run's from
        its checkpoint; a fresh run's resolved (auto probes GPU memory) and written to config.yaml."""
        before = self.config.train
        if self.resume_state is not None:
            self.config = checkpointing.resumed_config(self.config, self.resume_state)
            return
        probe = None
        if before.max_tokens == "auto":
            probe = gpu_probe(self.config, self.tokenizer, self.device, self.precision, widest_pair(self.train_data))
        if probe is not None and self.dist.enabled:  # every rank probes; all take the smallest
            rank_probe = probe
            probe = lambda: min(self.dist.gather(rank_probe()))  # noqa: E731
        self.config = dataclasses.replace(self.config, train=batch_size.resolved(before, probe, self.log))
        if self.config.train != before and self.dist.is_main:
            checkpointing.write_config(self.config, self.precision)

    def _build_model(self) -> None:
        """The model (DDP-wrapped when distributed), the optimizer, the half-weight cache (CUDA,
        bf16), the forward-and-loss function (compiled when asked), the loss scaler and the
        learning-rate schedule."""
        config, tc = self.config, self.config.train
        self.model = build_model(config, self.tokenizer)
        if self.pretrained is not None and self.pretrained.weights is not None:  # not when resuming
            init_from.load_weights(self.model, self.pretrained)
        self.model = self.model.to(self.device)
        self.forward_model = self.model
        if self.dist.enabled:
            self.forward_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            torch.manual_seed(tc.seed + self.dist.rank)  # same initial weights, different dropout per rank
        self.log(f"model: {self.model.count_parameters():,} parameters on {self.device}"
                 + (f" x {self.dist.world_size} processes" if self.dist.enabled else ""))
        optimizer_class = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = optimizer_class(
            self.model.parameters(), lr=0.0, betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps,
            # Fused (CPU and CUDA): one kernel per step, and it can skip a non-finite update on
            # the device (found_inf), so the loop never waits to decide.
            weight_decay=tc.weight_decay, fused=True,
        )
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a pass-through).
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.half_weights = forward_loss.attach_half_weights(self.model, self.optimizer, self.device, self.precision,
                                                             compiled=tc.compile)
        self.loss_of = forward_loss.forward_loss(self.forward_model, self.device, self.precision, tc.label_smoothing)
        if tc.compile:
            shapes = len(self.plan.declared(self.config.data.max_len))
            self.loss_of = forward_loss.compiled(self.loss_of, self.device, self.plan.static_shapes, shapes)
        self.compiled_before = forward_loss.compilations()
        self.shapes_seen: set[tuple] = set()  # batch shapes trained on (compiled code specialises on them)
        self.schedule = make_schedule(self.optimizer, tc, config.model.d_model)

    def valid_translator(self) -> Translator:
        """The model decoding the way `xformer translate --engine xformer` does on this device."""
        return engine_for_model(self.model, self.tokenizer, self.config.decode_settings(), self.device,
                                self.decode_precision)

    def minutes(self) -> float:
        return (time.time() - self.started) / 60

    def train_step(self, group: list[Batch]) -> int:
        """One optimizer update over ``update_freq`` batches (on every rank); returns the target
        tokens it saw on this rank. Nothing here waits for the accelerator: the loss stays on
        the device (``self.stats``) and a non-finite one makes the fused optimizer skip the
        update on the device; ``drain_stats`` reads the figures once per ``log_every`` steps."""
        tc = self.config.train
        n_tokens = sum(b.n_tokens for b in group)
        # The loss is normalised by the target tokens of the whole update, over every batch
        # and every rank; DDP averages gradients over ranks, hence the world size.
        all_tokens: float | Tensor = n_tokens
        if self.dist.enabled:
            all_tokens = self.dist.all_reduce_sum(self._device_scalar(n_tokens))
        per_rank_tokens = all_tokens / self.dist.world_size
        lr = self.schedule.step()
        total = torch.zeros((), device=self.device)
        try:
            for i, batch in enumerate(group):
                defer_sync = self.dist.enabled and i < len(group) - 1  # all-reduce once, after the last batch
                with self.forward_model.no_sync() if defer_sync else contextlib.nullcontext():
                    loss = self.loss_of(batch.src, batch.tgt_in, batch.tgt_out, getattr(batch, "packing", None))
                    self.shapes_seen.add((*batch.src.shape, batch.tgt_in.size(1)))
                    self.scaler.scale(loss / per_rank_tokens).backward()
                total += loss.detach()
        except torch.cuda.OutOfMemoryError:
            # One oversized batch should not end a long run: drop it and go on.
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            self.schedule.step_num -= 1
            self.oom_skipped += 1
            self.log(f"step {self.step + 1}: out of GPU memory on a batch of {n_tokens} target tokens; skipped "
                     f"({self.oom_skipped} so far; lower train.max_tokens if this repeats)")
            return 0
        if self.dist.enabled:
            total = self.dist.all_reduce_sum(total)  # every rank then skips or applies alike
        finite = torch.isfinite(total)
        if tc.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.clip_norm)
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # fp16: the scaler skips non-finite gradients itself
            self.scaler.update()
        else:
            self.optimizer.found_inf = (~finite).float()  # read by the fused kernel: skip on the device
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.stats.add(total, finite, all_tokens)
        self.step += 1
        self._lr = lr
        return n_tokens

    def drain_stats(self) -> tuple[float, float]:
        """Read the device-side figures since the last call (one sync): the summed loss and
        the target tokens (all ranks) of the applied updates. Reports skipped updates and
        stops the run when too many came in a row."""
        tc = self.config.train
        loss_sum, good_tokens, skipped, max_in_row = self.stats.drain()
        if skipped:
            self.nonfinite_total += skipped
            self.log(f"step {self.step}: non-finite loss, update skipped {skipped} time(s) since the last report "
                     f"({self.nonfinite_total} in all)")
        if max_in_row >= tc.max_nonfinite:
            raise XformerError(f"{max_in_row} non-finite losses in a row before step {self.step}; "
                               f"stopped, the last good checkpoint is {self.run_dir / 'last.pt'} "
                               "(lower train.lr_scale or set train.clip_norm)")
        return loss_sum, good_tokens

    def _device_scalar(self, value: float) -> Tensor:
        return torch.tensor(float(value), pin_memory=self.device.type == "cuda").to(self.device, non_blocking=True)

    def _load_group(self, batches: list, start: int) -> list[Batch]:
        bos = self.config.model.bos_id
        group = [self.plan.load(idx).with_start_token(bos) for idx in batches[start : start + self.config.train.update_freq]]
        if self.device.type == "cuda":
            group = [b.pin() for b in group]
        return [b.to(self.device) for b in group]

    def run(self) -> TrainResult:
        """Train until max_steps, the clock, max_epochs, patience or a signal ends the run."""
        tc = self.config.train
        self.started = time.time()
        self.deadline = self.started + tc.max_minutes * 60 if tc.max_minutes else math.inf
        if self.step >= tc.max_steps:
            self.log(f"{self.run_dir} is already at step {self.step} (train.max_steps={tc.max_steps}); "
                     "raise train.max_steps to train on")
            return TrainResult(self.step, self.epoch, 0.0, self.best_bleu, self.run_dir, "already done")
        self.model.train()
        self._lr = self.schedule.lr(max(self.step, 1))
        self.window_tokens = 0.0  # tokens/s is measured from this process's start (or the last log line)
        self.window_start = time.time()
        last_validated = self.step if self.resume_state is not None else -1
        bar = RunProgress(tc.max_steps, tc.max_minutes, self.step, self.progress, self.started)
        reason = ""
        with StopSignals() as signals:
            while not reason:
                batches = self.epoch_batches()
                if batches is None:
                    reason = "epochs"
                    break
                starts = range(self.batches_done, len(batches), tc.update_freq)
                for start, group in prefetch(starts, lambda start: self._load_group(batches, start)):
                    self.batches_done = min(start + tc.update_freq, len(batches))
                    step_before = self.step
                    self.window_tokens += self.train_step(group)
                    if self.step == step_before:  # out of memory: the batch was dropped
                        continue
                    bar.update(self.step)
                    due_to_save = self.step % tc.valid_every == 0 or bool(tc.save_every and self.step % tc.save_every == 0)
                    if self.step % tc.log_every == 0 or due_to_save or self.step >= tc.max_steps:
                        self.read_stats()  # the one read of device figures, before anything is logged or saved
                    if self.step % tc.log_every == 0:
                        self.log_window(bar)
                    reason = self.stop_reason(signals, due_to_save)
                    if not reason and self.step % tc.valid_every == 0:
                        last_validated = self.step
                        if validation.validate(self):
                            reason = "patience"
                    elif not reason and due_to_save:
                        checkpointing.save(self)
                    if reason:
                        break
            bar.close()
            self.drain_stats()  # count any skipped updates since the last read into the checkpoint
            if reason == "interrupted":
                checkpointing.save(self)  # no validation: the user wants out now
                self.log(f"interrupted at step {self.step}: saved {self.run_dir / 'last.pt'}; run the same command to resume")
            elif last_validated != self.step:
                validation.validate(self)
        return self.finish(reason)

    def epoch_batches(self) -> Optional[list]:
        """This epoch's batches (this rank's share), moving to the next epoch when the current
        one is done; None once train.max_epochs are done. (seed, epoch) fix the order, so
        ``batches_done`` is a resumable position."""
        tc = self.config.train
        batches = None
        if self.epoch > 0:
            batches = self._batches_of(self.epoch)
        if batches is None or self.batches_done >= len(batches):
            if tc.max_epochs and self.epoch >= tc.max_epochs:
                return None
            self.epoch += 1
            self.batches_done = 0
            batches = self._batches_of(self.epoch)
        return batches

    def _batches_of(self, epoch: int) -> list:
        tc = self.config.train
        if self._cached_epoch != epoch:
            # corpus and pair weights: this epoch's pairs, drawn per (seed, epoch); all of them by default
            picked, src_lens, tgt_lens = epoch_pairs(self.train_data, self.config.data, tc.seed, epoch)
            batches = to_cache_indices(self.plan.batches(epoch, src_lens, tgt_lens), picked)
            if self.dist.enabled:  # equal shares, so every rank takes the same number of steps
                usable = len(batches) // self.dist.world_size * self.dist.world_size
                batches = shard(batches[:usable], self.dist.rank, self.dist.world_size)
            self._cached_epoch, self._cached_batches = epoch, batches
        return self._cached_batches

    def read_stats(self) -> None:
        """Add the device-side loss figures since the last read to the open logging window."""
        loss_sum, good_tokens = self.drain_stats()
        self.window_loss_sum += loss_sum
        self.window_good_tokens += good_tokens

    def log_window(self, bar: RunProgress) -> None:
        """One train_loss / tokens-per-second line (progress bar and metrics.jsonl); closes the window."""
        tokens = self.dist.sum([self.window_tokens], self.device)[0]
        rate = tokens / max(time.time() - self.window_start, 1e-9)
        avg = self.window_loss_sum / max(self.window_good_tokens, 1)
        bar.update(self.step, loss=f"{avg:.3f}", ppl=f"{math.exp(min(avg, 50)):.1f}", lr=f"{self._lr:.2e}",
                   tok_s=f"{rate:.0f}", epoch=self.epoch)
        compiled = {"compilations": self.compilations()} if self.config.train.compile else {}
        self.metrics.record({"step": self.step, "epoch": self.epoch, "train_loss": round(avg, 6), "lr": self._lr,
                             "tokens_per_s": round(rate, 1), "minutes": round(self.minutes(), 3), **compiled})
        self.window_loss_sum = self.window_good_tokens = self.window_tokens = 0.0
        self.window_start = time.time()

    def compilations(self) -> int:
        """Graphs torch.compile has built for this run's training step so far."""
        return forward_loss.compilations() - self.compiled_before

    def stop_reason(self, signals: StopSignals, due_to_save: bool) -> str:
        """Why the run stops after this step ("" to go on): interrupted, max_steps or time."""
        tc = self.config.train
        # Ranks must agree on stopping (a signal or the clock may reach them a step apart):
        # one collective every few steps, not a host sync on every step.
        interrupted, out_of_time = signals.received is not None, time.time() >= self.deadline
        if self.dist.enabled:
            if self.step % _AGREE_EVERY and not due_to_save and self.step < tc.max_steps:
                interrupted = out_of_time = False
            else:
                interrupted, out_of_time = (v > 0 for v in self.dist.sum([float(interrupted), float(out_of_time)], self.device))
        if interrupted:
            return "interrupted"
        if self.step >= tc.max_steps:
            return "max_steps"
        return "time" if out_of_time else ""

    def finish(self, reason: str) -> TrainResult:
        """After the loop: release the process group, average checkpoints, say how it ended."""
        tc = self.config.train
        self.forward_model = self.model  # the DDP wrapper holds the process group: let it go first
        self.dist.stop()
        if tc.average_last and self.dist.is_main and reason != "interrupted":
            after_training.average_last(self)
        if tc.tune_length_penalty and self.dist.is_main and reason != "interrupted" and self.valid_data is not None:
            after_training.tune_length_penalty(self)
        self.metrics.close()
        if tc.compile:
            self.log(f"torch.compile: {self.compilations()} compilations for {len(self.shapes_seen)} batch shapes "
                     f"({'static' if self.plan.static_shapes else 'dynamic'} shapes)")
        if reason == "patience":
            self.log(f"early stop: no better validation BLEU for {tc.patience} validations")
        self.log(f"done: {self.step} steps, epoch {self.epoch}, {self.minutes():.1f} min; best valid BLEU "
                 f"{self.best_bleu if self.best_bleu is None else round(self.best_bleu, 2)}; checkpoints in {self.run_dir}"
                 + (f"; {self.nonfinite_total} non-finite losses skipped" if self.nonfinite_total else ""))
        return TrainResult(self.step, self.epoch, self.minutes(), self.best_bleu, self.run_dir, reason)


def train(config: Config, overwrite: bool = False, log: Callable[[str], None] = print, progress: bool = True) -> TrainResult:
    return Trainer(config, overwrite, log, progress).run()
