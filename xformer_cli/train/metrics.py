"""The run's figures: summed on the device while training (StepStats), written to
``metrics.jsonl`` and, when tensorboard is installed, to TensorBoard (MetricsLog)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch import Tensor

from xformer_cli.fileio import atomic_file, writing
from xformer_cli.textio import complete_rows

if TYPE_CHECKING:  # tensorboard is optional
    from torch.utils.tensorboard import SummaryWriter


class StepStats:
    """Training figures accumulated on the device, so the loop never waits to read them.
    float32: MPS has no float64, and a logging window's sums stay well inside its precision."""

    def __init__(self, device: torch.device, limit: int = 0):
        self.device, self.limit = device, limit
        self.in_row = torch.zeros((), device=device)  # non-finite updates in a row, across drains
        # The step at which ``limit`` non-finite updates in a row were reached (0: not yet): kept
        # on the device, so the loop learns the very step whenever it reads it (``tripped``).
        self.tripped_at = torch.zeros((), device=device)
        self._reset()

    def _reset(self) -> None:
        zero = lambda: torch.zeros((), device=self.device)  # noqa: E731
        self.loss_sum, self.good_tokens, self.skipped, self.ooms = zero(), zero(), zero(), zero()
        self.max_in_row = self.in_row.clone()

    def add(self, loss: Tensor, nonfinite: Tensor, oom: Tensor, n_tokens: "int | Tensor", step: int = 0) -> None:
        """Step ``step``'s summed loss; ``nonfinite`` / ``oom``: its update was skipped for that reason."""
        applied = ~(nonfinite | oom)
        self.loss_sum += torch.where(applied, loss, 0.0)
        self.good_tokens += applied.float() * n_tokens
        self.skipped += nonfinite.float()
        self.ooms += oom.float()
        self.in_row = torch.where(nonfinite, self.in_row + 1, torch.where(applied, 0.0, self.in_row))
        self.max_in_row = torch.maximum(self.max_in_row, self.in_row)
        if self.limit:
            reached = (self.in_row >= self.limit) & (self.tripped_at == 0)
            self.tripped_at = torch.where(reached, float(step), self.tripped_at)

    def go_on_from(self, loss_sum: float, good_tokens: float) -> None:
        """Start from sums read at a signal before a resume (exact: a float32's value read back)."""
        self.loss_sum.fill_(loss_sum)
        self.good_tokens.fill_(good_tokens)

    def tripped(self) -> int:
        """The step at which ``limit`` non-finite updates in a row were reached (0: not yet).
        One read of the device: a host sync on an accelerator, none on a CPU."""
        return int(self.tripped_at.item())

    def drain(self, keep_sums: bool = False) -> tuple[float, float, int, int, int]:
        """(loss sum, tokens of applied updates, non-finite skips, most in a row, out-of-memory
        skips) since the last drain; resets (``keep_sums``: all but the two sums, which go on
        adding in their order)."""
        values = torch.stack([self.loss_sum, self.good_tokens, self.skipped, self.max_in_row, self.ooms]).tolist()
        sums = (self.loss_sum, self.good_tokens)
        self._reset()
        if keep_sums:
            self.loss_sum, self.good_tokens = sums
        return values[0], values[1], int(values[2]), int(values[3]), int(values[4])


def scalars(entry: dict) -> list[tuple[str, float]]:
    """A metrics.jsonl row as TensorBoard (tag, value) pairs: every number but step and epoch;
    a nested dict's numbers under "key/inner" tags, and a direction's figures under
    "figure/direction" (``{"directions": {"en-de": {"valid_bleu": 21.0}}}`` ->
    ``valid_bleu/en-de``), so TensorBoard shows each direction beside the mean of them all."""
    found: list[tuple[str, float]] = []

    def walk(tag: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{tag}/{key}", inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append((tag, value))

    for key, value in entry.items():
        if key in ("step", "epoch"):
            continue
        if key == "directions" and isinstance(value, dict):
            for direction, figures in value.items():
                for name, figure in figures.items():
                    walk(f"{name}/{direction}", figure)
        else:
            walk(key, value)
    return found


def tensorboard_writer(directory: Path) -> Optional[SummaryWriter]:
    """A TensorBoard SummaryWriter on ``directory``; None without tensorboard."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional: metrics.jsonl has everything
        return None
    return SummaryWriter(log_dir=str(directory))


class MetricsLog:
    """One JSON row per event in ``RUN_DIR/metrics.jsonl``, and its numbers as TensorBoard
    scalars in ``RUN_DIR/tensorboard`` (``scalars``: per direction too). Only the process that
    writes (rank 0) opens either."""

    def __init__(self, run_dir: Path, enabled: bool = True):
        self.run_dir, self.enabled = run_dir, enabled
        self.tensorboard = tensorboard_writer(run_dir / "tensorboard") if enabled else None

    def record(self, entry: dict) -> None:
        """metrics.jsonl always; TensorBoard events too when tensorboard is installed."""
        if not self.enabled:
            return
        metrics = self.run_dir / "metrics.jsonl"
        with writing(metrics, intact=f"the lines written before are intact, and so is {self.run_dir / 'last.pt'}"):
            with metrics.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry) + "\n")
        if self.tensorboard is not None:
            for tag, value in scalars(entry):
                self.tensorboard.add_scalar(tag, value, entry["step"])
            self.tensorboard.flush()

    def keep_until(self, step: int) -> None:
        """Keep the complete lines up to ``step``: a resumed run logs the later steps again, and
        a line cut off by a kill would otherwise be glued to the next."""
        self.keep(lambda row: row.get("step", 0) <= step)

    def keep(self, wanted: Callable[[dict], bool]) -> None:
        """Rewrite metrics.jsonl with its complete rows that ``wanted`` takes, atomically."""
        metrics = self.run_dir / "metrics.jsonl"
        if not self.enabled or not metrics.is_file():
            return
        kept = [line for line, row in complete_rows(metrics) if wanted(row)]
        with writing(metrics, intact=f"{metrics} is as it was"), atomic_file(metrics, "w", encoding="utf-8") as handle:
            handle.writelines(kept)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
