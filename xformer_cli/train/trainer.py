"""The training loop: data -> tokenizer -> batches -> model, loss, Adam + Noam -> checkpoints.

``train(config)`` is the whole of ``xformer train``. The run directory ends up holding
``config.yaml`` (the resolved config), ``tokenizer/``, ``metrics.jsonl``, ``last.pt``
and ``best.pt`` (highest validation BLEU).
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, TypeVar

import torch
import yaml
from torch import Tensor

from xformer_cli.checkpoint import (build_model, checkpoint_step, kept_checkpoints, load_checkpoint, save_checkpoint,
                                    step_checkpoint)
from xformer_cli.config import Config
from xformer_cli.data.batching import Batch, make_batches, shard
from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.data.prepare import build_data, check_inputs
from xformer_cli.decode.translator import Translator
from xformer_cli.device import autocast, configure_threads, pick_device, resolve_decode_precision, resolve_precision
from xformer_cli.errors import XformerError, writing
from xformer_cli.evaluate import bleu
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import PAD_ID
from xformer_cli.train.average import average_checkpoints
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.loss import label_smoothed_nll
from xformer_cli.train.progress import RunProgress
from xformer_cli.train.schedule import NoamSchedule
from xformer_cli.train.tune import pick_length_penalty


@dataclass
class TrainResult:
    steps: int
    epochs: int
    minutes: float
    best_bleu: Optional[float]
    run_dir: Path
    stopped_because: str = "finished"  # finished | max_steps | time | epochs | patience | interrupted | already done


def prepare_run_dir(config: Config, overwrite: bool, precision: Optional[str] = None) -> Path:
    """Create (or, with ``overwrite``, clear) the run directory and write config.yaml, headed by
    the precision this machine resolved ``train.precision`` to."""
    run_dir = Path(config.run_dir)
    if overwrite:
        for old in ["last.pt", "best.pt", "average.pt", "metrics.jsonl", *(p.name for p in kept_checkpoints(run_dir))]:
            (run_dir / old).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    header = f"# train.precision {config.train.precision} ran as {precision} on this machine\n" if precision else ""
    (run_dir / "config.yaml").write_text(header + yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    return run_dir


def validation_loss(model: Transformer, data: EncodedCorpus, max_tokens: int, device: torch.device, eps: float,
                    precision: str = "fp32") -> tuple[float, float]:
    """(label-smoothed loss, plain NLL) per target token over the whole set."""
    model.eval()
    total = nll_total = 0.0
    tokens = 0
    with torch.no_grad():
        for idx in make_batches(data.src_lens, data.tgt_lens, max_tokens, shuffle=False):
            batch = data.batch(idx).to(device)
            with autocast(device, precision):
                logits = model(batch.src, batch.tgt_in)
            loss, nll = label_smoothed_nll(logits, batch.tgt_out, eps, PAD_ID)
            total += float(loss)
            nll_total += float(nll)
            tokens += batch.n_tokens
    model.train()
    return total / tokens, nll_total / tokens


def _tensorboard_writer(directory: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional: metrics.jsonl has everything
        return None
    return SummaryWriter(log_dir=str(directory))


_DONE = object()
_AGREE_EVERY = 10  # steps between the ranks' agreement on stopping (a signal, the clock)
T = TypeVar("T")
U = TypeVar("U")


def prefetch(items: Sequence[T], load: Callable[[T], U], depth: int = 2) -> Iterator[tuple[T, U]]:
    """(item, load(item)) in order, with the next ``depth`` loads done by a background thread
    so the accelerator never waits on batch assembly. Errors in the thread surface here."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(value) -> bool:
        while not stop.is_set():
            try:
                ready.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer has gone

    def work() -> None:
        try:
            for item in items:
                if not put((item, load(item))):
                    return
        except BaseException as exc:  # hand it to the consumer
            put(exc)
            return
        put(_DONE)

    thread = threading.Thread(target=work, daemon=True, name="xformer-prefetch")
    thread.start()
    try:
        while True:
            got = ready.get()
            if got is _DONE:
                return
            if isinstance(got, BaseException):
                raise got
            yield got
    finally:
        stop.set()
        thread.join()


class StepStats:
    """Training figures accumulated on the device, so the loop never waits to read them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.in_row = torch.zeros((), device=device)  # non-finite updates in a row, across drains
        self._reset()

    def _reset(self) -> None:
        zero = lambda: torch.zeros((), device=self.device, dtype=torch.float64)
        self.loss_sum, self.good_tokens, self.skipped = zero(), zero(), zero()
        self.max_in_row = self.in_row.clone()

    def add(self, loss: Tensor, finite: Tensor, n_tokens: "int | Tensor") -> None:
        self.loss_sum += torch.where(finite, loss, 0.0).double()
        self.good_tokens += finite.double() * n_tokens
        self.skipped += (~finite).double()
        self.in_row = torch.where(finite, 0.0, self.in_row + 1)
        self.max_in_row = torch.maximum(self.max_in_row, self.in_row)

    def drain(self) -> tuple[float, float, int, int]:
        """(loss sum, tokens of applied updates, skipped updates, most skipped in a row); resets."""
        values = torch.stack([self.loss_sum, self.good_tokens, self.skipped, self.max_in_row.double()]).tolist()
        self._reset()
        return values[0], values[1], int(values[2]), int(values[3])


# Settings a resumed run must share with the run it continues: they decide the model, the
# data and its order. Everything else (max_steps, devices, validation cadence...) may change.
_RESUME_KEYS = ("model", "tokenizer", "data", "train.seed", "train.max_tokens", "train.update_freq")


def _resume_mismatch(saved: dict, current: dict) -> Optional[str]:
    for key in _RESUME_KEYS:
        a, b = saved, current
        for part in key.split("."):
            a, b = a.get(part), b.get(part)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                inner = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                return f"{key}.{inner}"
            return key
    return None


class _StopSignals:
    """SIGINT/SIGTERM ask the loop to finish its step, save and exit (a second one kills)."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """Owns the training state and writes it all to checkpoints, so a run continues exactly."""

    def __init__(self, config: Config, overwrite: bool = False, log: Callable[[str], None] = print, progress: bool = True):
        self.dist = Distributed.from_environment()
        if not self.dist.is_main:  # one voice: rank 0 logs, validates and writes checkpoints
            log, progress = (lambda _: None), False
        self.config, self.log, self.progress = config, log, progress
        tc = config.train
        configure_threads(tc.threads)
        torch.manual_seed(tc.seed)
        self.device = pick_device(tc.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(self.device)
        self.dist.start(self.device)
        self.precision, why = resolve_precision(tc.precision, self.device)
        log(f"precision: {self.precision} ({why})" if tc.precision != "auto" else f"precision: auto -> {self.precision} ({why})")
        self.run_dir = Path(config.run_dir)
        resume_from = self.run_dir / "last.pt"
        self.resume_state = None
        if resume_from.is_file() and not overwrite:
            self.resume_state = load_checkpoint(resume_from)
            mismatch = _resume_mismatch(self.resume_state["config"], config.to_dict())
            if mismatch:
                raise XformerError(f"{resume_from} was trained with a different '{mismatch}'; "
                                   "use another run_dir, or --overwrite to start afresh")

        # Every input is read and checked before the run directory is touched:
        # bad data must not cost the checkpoints of an earlier run.
        if self.dist.is_main:
            inputs = check_inputs(config, log)
            prepare_run_dir(config, overwrite, self.precision)
            prepared = build_data(inputs, log)
            self.dist.barrier()
        else:  # wait for rank 0 to train the tokenizer and build the cache, then reuse both
            self.dist.barrier()
            prepared = build_data(check_inputs(config, log), log, write=False)
        self.tokenizer, self.train_data = prepared.tokenizer, prepared.train
        self.valid_corpus, self.valid_data = prepared.valid, prepared.valid_encoded

        self.model = build_model(config, self.tokenizer).to(self.device)
        self.forward_model = self.model
        if self.dist.enabled:
            self.forward_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            torch.manual_seed(tc.seed + self.dist.rank)  # same initial weights, different dropout per rank
        log(f"model: {self.model.count_parameters():,} parameters on {self.device}"
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
        if tc.compile:
            self.forward_model = torch.compile(self.forward_model, dynamic=True)
        self.schedule = NoamSchedule(self.optimizer, config.model.d_model, tc.warmup_steps, tc.lr_scale)
        # Validation decodes the way `xformer translate --precision auto` does on this device.
        self.decode_precision = resolve_decode_precision("auto", self.device)[0]
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
        self.tensorboard = _tensorboard_writer(self.run_dir / "tensorboard") if self.dist.is_main else None
        if self.resume_state is not None:
            self._restore(self.resume_state)

    # -- checkpoints -----------------------------------------------------------------------

    def _rng_state(self) -> dict:
        """This process's random state: the CPU generator, and the CUDA one of its device."""
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return rng

    def state(self, rng_per_rank: Optional[list[dict]] = None) -> dict:
        """Everything to continue exactly; ``rng_per_rank``: every rank's random state
        (``Distributed.gather``), so each resumes its own dropout stream."""
        rng_per_rank = rng_per_rank or [self._rng_state()]
        rng = {**rng_per_rank[0], "ranks": rng_per_rank}
        return {
            "config": self.config.to_dict(),
            "tokenizer": {"src": self.tokenizer.src_model_bytes, "tgt": self.tokenizer.tgt_model_bytes},
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(), "scaler": self.scaler.state_dict(), "rng": rng,
            "step": self.step, "epoch": self.epoch, "batches_done": self.batches_done,
            "best_bleu": self.best_bleu, "bad_validations": self.bad_validations,
            "nonfinite_total": self.nonfinite_total, "precision": self.precision,
            "log_window": {"loss_sum": self.window_loss_sum, "good_tokens": self.window_good_tokens},
        }

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        ranks = state["rng"].get("ranks", [state["rng"]])
        if len(ranks) == self.dist.world_size:  # each rank takes up its own stream again
            rng = ranks[self.dist.rank]
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and self.device.type == "cuda":
                cuda = rng["cuda"]
                # Older checkpoints hold every device's state (a list); newer ones this rank's.
                torch.cuda.set_rng_state(cuda[self.device.index or 0] if isinstance(cuda, list) else cuda, self.device)
        else:  # another number of processes than the run was saved with: fresh, distinct streams
            self.log(f"resuming with {self.dist.world_size} processes, saved with {len(ranks)}: "
                     "data order and weights continue exactly, dropout draws do not")
            torch.manual_seed(self.config.train.seed + self.dist.rank + 1_000_003 * state["step"])
        self.step, self.epoch, self.batches_done = state["step"], state["epoch"], state["batches_done"]
        self.best_bleu, self.bad_validations = state["best_bleu"], state["bad_validations"]
        self.nonfinite_total = state.get("nonfinite_total", 0)
        window = state.get("log_window", {})
        self.window_loss_sum, self.window_good_tokens = window.get("loss_sum", 0.0), window.get("good_tokens", 0.0)
        self.log(f"resuming {self.run_dir / 'last.pt'}: step {self.step}, epoch {self.epoch}, batch {self.batches_done}")

    def save(self, best: bool = False) -> None:
        """Write last.pt (and best.pt) on rank 0; every rank calls it, handing its random state over."""
        rng_per_rank = self.dist.gather(self._rng_state())
        if not self.dist.is_main:
            return
        state = self.state(rng_per_rank)
        save_checkpoint(state, self.run_dir / "last.pt")
        if best:
            save_checkpoint(state, self.run_dir / "best.pt")
        keep = self.config.train.keep_checkpoints
        if keep:
            save_checkpoint(state, step_checkpoint(self.run_dir, self.step))
            kept = kept_checkpoints(self.run_dir)
            for old in kept[:-keep]:
                old.unlink(missing_ok=True)

    # -- the loop ----------------------------------------------------------------------------

    def record(self, entry: dict) -> None:
        """metrics.jsonl always; TensorBoard events too when tensorboard is installed."""
        if not self.dist.is_main:
            return
        metrics = self.run_dir / "metrics.jsonl"
        with writing(metrics, intact=f"the lines written before are intact, and so is {self.run_dir / 'last.pt'}"):
            with metrics.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")
        if self.tensorboard is not None:
            for key, value in entry.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, entry["step"])
            self.tensorboard.flush()

    def validate(self) -> bool:
        """Validate and save (rank 0); returns, on every rank, whether patience ran out."""
        tc = self.config.train
        if not self.dist.is_main:
            self.save()  # only hands this rank's random state to rank 0
            return self.dist.any(False, self.device)
        entry: dict = {"step": self.step, "epoch": self.epoch, "minutes": round(self.minutes(), 3), "precision": self.precision}
        improved = self.valid_data is None  # without a valid set, best.pt is simply the latest
        if self.valid_data is not None:
            loss, ppl, score = self.score_valid()
            entry.update(valid_loss=round(loss, 4), valid_ppl=round(ppl, 3), valid_bleu=round(score, 2))
            self.log(f"step {self.step}: valid loss {loss:.3f} ppl {ppl:.2f} BLEU {score:.2f}")
            improved = self.best_bleu is None or score > self.best_bleu
            if improved:
                self.best_bleu = score
                self.bad_validations = 0
            else:
                self.bad_validations += 1
        if self.device.type == "cuda":
            entry["max_memory_gib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**30, 3)
        self.save(best=improved)
        self.record(entry)
        return self.dist.any(bool(tc.patience) and self.bad_validations >= tc.patience, self.device)

    def score_valid(self) -> tuple[float, float, float]:
        """(label-smoothed loss, perplexity, BLEU) of the current weights on the valid set;
        BLEU decodes the way `xformer translate --precision auto` does on this device."""
        tc = self.config.train
        loss, nll = validation_loss(self.model, self.valid_data, tc.max_tokens, self.device, tc.label_smoothing,
                                    self.precision)
        self.model.eval()
        hyps = self.valid_translator().translate(self.valid_corpus.src, beam_size=tc.valid_beam_size)
        self.model.train()
        return loss, math.exp(min(nll, 50)), bleu(hyps, self.valid_corpus.tgt).score

    def valid_translator(self) -> Translator:
        """The model decoding the way `xformer translate --precision auto` does on this device."""
        return Translator(self.model, self.tokenizer, self.config.decode_settings(), self.device,
                          precision=self.decode_precision)

    @contextlib.contextmanager
    def other_weights(self, weights: dict) -> Iterator[None]:
        """The model holds ``weights`` inside the block and its trained weights again after it."""
        trained = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(weights)
        try:
            yield
        finally:
            self.model.load_state_dict(trained)

    def average_last(self) -> None:
        """train.average_last: average the newest step checkpoints (the paper's checkpoint
        averaging), validate the mean, and make it best.pt when its BLEU is higher. last.pt
        keeps the trained weights, so resuming is unaffected."""
        n = self.config.train.average_last
        kept = kept_checkpoints(self.run_dir)[-n:]
        if len(kept) < 2 or self.valid_data is None:
            self.log(f"average_last: {len(kept)} step checkpoint(s) kept, nothing to average")
            return
        averaged = average_checkpoints(kept, self.run_dir / "average.pt")
        steps = [checkpoint_step(p) for p in kept]
        # Saved inside the block: a state dict shares the parameters' storage, which the
        # trained weights overwrite on the way out.
        with self.other_weights(averaged["model"]):
            loss, ppl, score = self.score_valid()
            better = self.best_bleu is None or score > self.best_bleu
            self.log(f"average of steps {', '.join(map(str, steps))}: valid loss {loss:.3f} ppl {ppl:.2f} BLEU {score:.2f}"
                     f" ({'better than' if better else 'not above'} best {self.best_bleu or 0:.2f})")
            self.record({"step": self.step, "epoch": self.epoch, "minutes": round(self.minutes(), 3), "precision": self.precision,
                         "averaged_steps": steps, "valid_loss": round(loss, 4), "valid_ppl": round(ppl, 3),
                         "valid_bleu": round(score, 2)})
            if better:
                self.best_bleu = score
                save_checkpoint({**self.state(), "averaged_steps": steps}, self.run_dir / "best.pt")

    def tune_length_penalty(self) -> None:
        """train.tune_length_penalty: decode the valid set with best.pt's weights at each alpha
        (beam decode.beam_size, the precision validation uses) and write the best alpha into
        best.pt's decode.length_penalty; the run's config.yaml and last.pt stay as they were."""
        alphas = self.config.train.tune_length_penalty
        path = self.run_dir / "best.pt"
        best = load_checkpoint(path)
        beam = self.config.decode.beam_size
        started = time.time()
        with self.other_weights(best["model"]):
            self.model.eval()
            translator = self.valid_translator()
            alpha, scores = pick_length_penalty(
                lambda a: translator.translate(self.valid_corpus.src, beam_size=beam, length_penalty=a),
                self.valid_corpus.tgt, alphas)
            self.model.train()
        best["config"]["decode"]["length_penalty"] = alpha
        best["length_penalty_scores"] = scores
        save_checkpoint(best, path)
        self.log(f"length penalty: valid BLEU (beam {beam}) "
                 + ", ".join(f"{a:g}: {s:.2f}" for a, s in scores.items())
                 + f" -> {alpha:g} in best.pt (decode.length_penalty; {time.time() - started:.0f} s)")
        self.record({"step": self.step, "epoch": self.epoch, "minutes": round(self.minutes(), 3),
                     "length_penalty": alpha, "length_penalty_valid_bleu": {f"{a:g}": round(s, 2) for a, s in scores.items()}})

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
                    with autocast(self.device, self.precision):
                        logits = self.forward_model(batch.src, batch.tgt_in)
                    loss, _ = label_smoothed_nll(logits, batch.tgt_out, tc.label_smoothing, PAD_ID)
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
        group = [self.train_data.batch(idx) for idx in batches[start : start + self.config.train.update_freq]]
        if self.device.type == "cuda":
            group = [b.pin() for b in group]
        return [b.to(self.device) for b in group]

    def run(self) -> TrainResult:
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
        with _StopSignals() as signals:
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
                        if self.validate():
                            reason = "patience"
                    elif not reason and due_to_save:
                        self.save()
                    if reason:
                        break
            bar.close()
            self.drain_stats()  # count any skipped updates since the last read into the checkpoint
            if reason == "interrupted":
                self.save()  # no validation: the user wants out now
                self.log(f"interrupted at step {self.step}: saved {self.run_dir / 'last.pt'}; run the same command to resume")
            elif last_validated != self.step:
                self.validate()
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
            batches = make_batches(self.train_data.src_lens, self.train_data.tgt_lens, tc.max_tokens, tc.seed, epoch)
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
        self.record({"step": self.step, "epoch": self.epoch, "train_loss": round(avg, 6), "lr": self._lr,
                     "tokens_per_s": round(rate, 1), "minutes": round(self.minutes(), 3)})
        self.window_loss_sum = self.window_good_tokens = self.window_tokens = 0.0
        self.window_start = time.time()

    def stop_reason(self, signals: _StopSignals, due_to_save: bool) -> str:
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
            self.average_last()
        if tc.tune_length_penalty and self.dist.is_main and reason != "interrupted" and self.valid_data is not None:
            self.tune_length_penalty()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if reason == "patience":
            self.log(f"early stop: no better validation BLEU for {tc.patience} validations")
        self.log(f"done: {self.step} steps, epoch {self.epoch}, {self.minutes():.1f} min; best valid BLEU "
                 f"{self.best_bleu if self.best_bleu is None else round(self.best_bleu, 2)}; checkpoints in {self.run_dir}"
                 + (f"; {self.nonfinite_total} non-finite losses skipped" if self.nonfinite_total else ""))
        return TrainResult(self.step, self.epoch, self.minutes(), self.best_bleu, self.run_dir, reason)


def train(config: Config, overwrite: bool = False, log: Callable[[str], None] = print, progress: bool = True) -> TrainResult:
    return Trainer(config, overwrite, log, progress).run()
