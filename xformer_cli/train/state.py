"""What the training loop and the modules beside it share: one ``RunState``, below them all.

The loop (trainer.py) owns the run; run_checkpoints.py saves and restores this state,
validation.py scores it and after_training.py works on it after the loop. None of them
imports the trainer: they read and write this object, so the imports of the train package
go one way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from xformer_cli.config import Config
from xformer_cli.data.encoded import EncodedCorpus
from xformer_cli.data.sources import ParallelCorpus
from xformer_cli.decode.factory import engine_for_model
from xformer_cli.train.background_save import CheckpointWriter
from xformer_cli.tokenizer import Tokenizer
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.metrics import MetricsLog

if TYPE_CHECKING:
    from xformer_cli.decode.translator import Translator
    from xformer_cli.model.transformer import Transformer


@dataclass
class Counters:
    """Where the run is, beside its weights: saved in every checkpoint, so a run continues exactly."""

    step: int = 0
    epoch: int = 0
    batches_done: int = 0  # of this epoch's batches (on this rank)
    best_bleu: Optional[float] = None
    bad_validations: int = 0  # validations in a row without a better BLEU (early stopping)
    nonfinite_total: int = 0  # updates skipped for a non-finite loss
    oom_total: int = 0  # updates skipped because a rank ran out of memory
    # The open logging window's loss: saved, so the first train_loss after a resume
    # averages the same steps an uninterrupted run's would.
    window_loss_sum: float = 0.0
    window_good_tokens: float = 0.0
    # Seconds the run has trained before this process: a resumed run's clock (metrics'
    # minutes, train.max_minutes) goes on from there, as fairseq's --stop-time-hours does.
    train_seconds: float = 0.0
    # data.train corpora whose ``until`` came: cached source index -> the first epoch without it.
    corpora_ended: dict[int, int] = field(default_factory=dict)
    # The logging window's sums since its last regular read, read at a signal: a resumed run's
    # device sums go on from them, so they add up in an uninterrupted run's order (float32 rounds).
    window_open: tuple[float, float] = (0.0, 0.0)


@dataclass
class ValidSet:
    """One direction's valid set. A bilingual run has one; a multilingual run one per
    direction, in config.data.directions() order."""

    direction: tuple[str, str]  # (source, target)
    corpus: ParallelCorpus  # the text without tags, for BLEU (translated with target_lang=target)
    encoded: EncodedCorpus  # the piece ids (the tag first where the model reads tags), for the loss

    @property
    def name(self) -> str:
        return f"{self.direction[0]}-{self.direction[1]}"


@dataclass
class RunState:
    """A training run's model, optimizer state, counters and the means to log and save them."""

    config: Config
    dist: Distributed
    device: torch.device
    precision: str
    tokenizer: Tokenizer
    model: "Transformer"
    optimizer: torch.optim.Optimizer
    schedule: object  # train.schedule.LrSchedule
    scaler: torch.amp.GradScaler
    metrics: MetricsLog
    valid: list[ValidSet]  # [] = no valid set
    log: Callable[[str], None]
    counters: Counters = field(default_factory=Counters)
    started: float = field(default_factory=time.time)
    decode_precision: str = "auto"  # validation decodes as `translate --engine xformer --precision auto` does
    writer: CheckpointWriter = field(default_factory=lambda: CheckpointWriter(background=False))
    data_key: str = ""  # the hash of the token cache's ids: what the run trains on (a resume tells a change)
    valid_cut_said: bool = False  # the valid lines cut to the input length were told once

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    def minutes(self) -> float:
        return (time.time() - self.started) / 60

    def valid_engine(self) -> "Translator":
        """The model decoding the way `xformer translate --engine xformer` does on this device,
        knowing its directions (``translate(lines, target_lang=...)`` leads them with the tag)."""
        return engine_for_model(self.model, self.tokenizer, self.config.decode_settings(), self.device,
                                self.decode_precision, languages=self.config.data.languages())

    def event(self, **figures: Any) -> dict:
        """A metrics.jsonl row for an event of this run (validation, averaging, ...): where and when."""
        c = self.counters
        return {"step": c.step, "epoch": c.epoch, "minutes": round(self.minutes(), 3), **figures}
