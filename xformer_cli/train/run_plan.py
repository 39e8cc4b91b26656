"""Everything a run works out before its first step, once: the plan the loop receives.

In this order: the device, its precision and the process group; resume or a fresh start
(last.pt); train.init_from's model and tokenizer sections; the data (every input read and
checked before the run directory is touched, then the tokenizer and the cache); the batch
size (train.max_tokens: auto probes GPU memory, tokens_per_update splits the update); the
planned steps (train/time_budget.py: a max_minutes run times a few steps once). The config as
resolved is written to config.yaml once by the trainer (``Trainer.run``), and a resumed run
takes what its checkpoint recorded (it never probes or measures again), so the values are worked out in one place and
the loop only reads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from xformer_cli.config import BATCH_RULE, Config, TrainConfig, describe_plan, planned_settings, rule_choice
from xformer_cli.data.prepare import PreparedData, build_data, check_inputs
from xformer_cli.device import configure_threads, keep_freed_memory, pick_device, resolve_precision
from xformer_cli.train import batch_size, init_from, output_pieces, run_checkpoints, time_budget
from xformer_cli.train.epoch_batches import widest_pair
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.init_from import Pretrained
from xformer_cli.train.memory_probe import gpu_probe


@dataclass
class RunPlan:
    config: Config  # as the run trains with it: init_from's sections, the resolved batch size
    dist: Distributed
    device: torch.device
    precision: str
    data: PreparedData  # tokenizer, training cache, valid set
    resume: Optional[dict]  # last.pt's state; None = a fresh run
    pretrained: Optional[Pretrained]  # the weights a fresh run starts from (train.init_from)
    log: Callable[[str], None]  # silent on every rank but 0
    valid_seconds: float = 0.0  # a validation's time as the budget plan measured it (0: not measured)
    output_pieces: Optional[torch.Tensor] = None  # a fresh run's, with model.restrict_output


def _silent(_: str) -> None:
    pass


def plan_run(config: Config, overwrite: bool = False, log: Callable[[str], None] = print) -> RunPlan:
    """Work out the run ``config`` describes (see the module's docstring); writes the run
    directory's tokenizer and cache (and with ``overwrite`` clears the old run's checkpoints
    and metrics once they are built: run_checkpoints.prepare_run_dir), nothing else (config.yaml: the
    trainer, once it trains)."""
    dist = Distributed.from_environment()
    if not dist.is_main:  # one voice: rank 0 logs, validates and writes checkpoints
        log = _silent
    device, precision = start_device(config.train, dist, log)
    config, pretrained, resume = init_from.resolve(config, overwrite, log)
    data = _prepare_data(config, overwrite, precision, dist, log, pretrained, resume)
    pieces = None
    if config.model.restrict_output and resume is None:  # a resumed run's are in its checkpoint
        config, pieces = output_pieces.counted(config, data.train, data.tokenizer.tgt_vocab_size, log)
    config = _batch_size(config, resume, data, device, precision, dist, log)
    given_steps = config.train.planned_steps
    config, valid_seconds = _planned_steps(config, resume, data, device, precision, dist, log)
    if resume is None:  # a resumed run's comes with its plan (run_checkpoints.resumed_config)
        config, valid_seconds = _batch_by_plan(config, given_steps, valid_seconds, data, device, precision, dist, log)
        config = planned_settings(config, log)
    return RunPlan(config, dist, device, precision, data, resume, pretrained, log, valid_seconds, pieces)


def start_device(tc: TrainConfig, dist: Distributed, log: Callable[[str], None]) -> tuple[torch.device, str]:
    """Threads, seed, device (this rank's GPU under torchrun), process group; the precision."""
    configure_threads(tc.threads)
    torch.manual_seed(tc.seed)
    device = dist.device_for(pick_device(tc.device))
    if device.type == "cuda":
        if device.index is None:  # "cuda": torch.cuda.set_device refuses a device without an index
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    elif device.type == "cpu" and keep_freed_memory():
        log("memory: freed blocks stay with the process for the next step (glibc malloc: no mmap, no trim)")
    backend = dist.start(device, tc.dist_backend, tc.dist_timeout_minutes)
    if backend:
        log(f"distributed: {dist.world_size} processes over {backend}; a collective waits at most "
            f"{tc.dist_timeout_minutes:g} minutes (train.dist_timeout_minutes)")
    precision, why = resolve_precision(tc.precision, device)
    log(f"precision: {precision} ({why})" if tc.precision != "auto" else f"precision: auto -> {precision} ({why})")
    return device, precision


def _prepare_data(config: Config, overwrite: bool, precision: str, dist: Distributed, log: Callable[[str], None],
                  pretrained: Optional[Pretrained], resume: Optional[dict] = None) -> PreparedData:
    """Tokenizer and encoded corpora. Every input is read and checked before the run
    directory is touched: bad data must not cost the checkpoints of an earlier run."""
    tokenizer = pretrained.tokenizer if pretrained is not None else None
    if dist.is_main:
        inputs = check_inputs(config, log, tokenizer)
        run_checkpoints.check_same_tokenizer(config, resume, inputs.tokenizer)
        run_checkpoints.check_ids_fit(config, inputs.tokenizer)
        run_checkpoints.prepare_run_dir(config, overwrite=False)
        prepared = build_data(inputs, log)  # a corpus its filters leave empty is found here
        if overwrite:  # the earlier run's checkpoints go once the new run's data stands
            run_checkpoints.prepare_run_dir(config, overwrite=True)
        dist.barrier("the data (rank 0 trains the tokenizer and builds the cache)")
        return prepared
    dist.barrier("the data (rank 0 trains the tokenizer and builds the cache)")
    return build_data(check_inputs(config, log, tokenizer), log, write=False)  # rank 0's tokenizer and cache


def _planned_steps(config: Config, resume: Optional[dict], data: PreparedData, device: torch.device, precision: str,
                   dist: Distributed, log: Callable[[str], None]) -> tuple[Config, float]:
    """train.planned_steps as this run trains with them (a resumed run's from its checkpoint),
    and a validation's measured seconds (0 when nothing was measured)."""
    measured: dict[str, float] = {}

    def measure() -> tuple[float, float]:
        step_s, measured["valid_s"] = time_budget.measure_seconds(config, data, device, precision, dist)
        return step_s, measured["valid_s"]

    train = time_budget.planned_train(config.train, None if resume is not None else measure, log)
    if resume is None and train.planned_steps and not train.planned_epochs:  # a resumed run's are in its checkpoint
        train = time_budget.with_epochs(train, time_budget.steps_per_epoch(config, data, dist.world_size), log)
    return dataclasses.replace(config, train=train), measured.get("valid_s", 0.0)


def _batch_by_plan(config: Config, given_steps: int, valid_seconds: float, data: PreparedData, device: torch.device,
                   precision: str, dist: Distributed, log: Callable[[str], None]) -> tuple[Config, float]:
    """train.max_tokens as train.max_tokens_by_planned_epochs gives it for the epochs planned at
    the configured size; a new size is planned again (its steps measured at that size). Decided
    on the first plan only: the second one's epochs do not move the batch again."""
    rule_key, setting = BATCH_RULE
    choice = rule_choice(getattr(config.train, rule_key), config.train.planned_epochs)
    if choice is None or choice[1] == config.train.max_tokens:
        return config, valid_seconds
    log(f"{setting} {config.train.max_tokens} -> {choice[1]}: the run plans "
        f"{describe_plan(config.train.planned_epochs, 'epochs')}, at least {choice[0]:g} (train.{rule_key})")
    again = dataclasses.replace(config.train, max_tokens=choice[1], planned_steps=given_steps, planned_epochs=0.0)
    return _planned_steps(dataclasses.replace(config, train=again), None, data, device, precision, dist, log)


def _batch_size(config: Config, resume: Optional[dict], data: PreparedData, device: torch.device, precision: str,
                dist: Distributed, log: Callable[[str], None]) -> Config:
    """train.max_tokens and update_freq as this run trains with them: a resumed run's from its
    checkpoint; a fresh run's resolved (auto probes GPU memory: every rank, the smallest wins)."""
    if resume is not None:
        return run_checkpoints.resumed_config(config, resume)
    probe = None
    if config.train.max_tokens == "auto":
        probe = gpu_probe(config, data.tokenizer, data.train, device, precision, dist, widest_pair(data.train))
    if probe is not None and dist.enabled:
        rank_probe = probe
        probe = lambda: min(dist.gather(rank_probe(), "the memory probe"))  # noqa: E731
    return dataclasses.replace(config, train=batch_size.resolved(config.train, probe, log))
