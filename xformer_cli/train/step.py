"""One optimizer update, as the run and the memory probe both take it.

``TrainStep`` owns what a step allocates and calls: the fused Adam(W) optimizer, the loss
scaler (fp16), the half-weight cache (CUDA bf16), the forward-and-loss function (compiled
when asked), and, with several ranks, the gradient buckets (``grad_sync.py``). The probe of
``train.max_tokens: auto`` builds the very same object, so it measures what the run will
hold in memory.

Nothing here waits for the accelerator: the loss stays on the device, and an update is
skipped on the device (the fused optimizer's ``found_inf``) when the summed loss is not
finite or any rank ran out of memory.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

from xformer_cli.config import TrainConfig
from xformer_cli.data.batching import Batch
from xformer_cli.train import forward_loss
from xformer_cli.train.distributed import Distributed
from xformer_cli.train.grad_sync import GradientSync


@dataclass
class StepResult:
    loss: Tensor  # summed label-smoothed loss over every rank's batches (device scalar)
    nonfinite: Tensor  # the loss was not finite: the update was skipped (device bool)
    oom: Tensor  # a rank ran out of memory: the update was skipped on every rank (device bool)
    oom_here: bool  # this rank was the one (known on the host at once)


def make_optimizer(model: torch.nn.Module, tc: TrainConfig) -> torch.optim.Optimizer:
    optimizer_class = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
    # Fused (CPU and CUDA): one kernel per step, and it can skip a non-finite update on the
    # device (found_inf), so the loop never waits to decide.
    return optimizer_class(model.parameters(), lr=0.0, betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps,
                           weight_decay=tc.weight_decay, fused=True)


class TrainStep:
    """Forward and backward over a group of batches, gradients summed over ranks, the update."""

    def __init__(self, model: torch.nn.Module, tc: TrainConfig, device: torch.device, precision: str,
                 dist: Distributed, static_shapes: bool = False, shapes: int = 0, communicate: bool = True,
                 compile: Optional[bool] = None):
        self.model, self.device, self.dist, self.clip_norm = model, device, dist, tc.clip_norm
        compile = tc.compile if compile is None else compile
        self.optimizer = make_optimizer(model, tc)
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a pass-through).
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.half_weights = forward_loss.attach_half_weights(model, self.optimizer, device, precision, compiled=compile)
        self.loss_of = forward_loss.forward_loss(model, device, precision, tc.label_smoothing)
        if compile:
            self.loss_of = forward_loss.compiled(self.loss_of, device, static_shapes, shapes)
        self.sync = GradientSync(model.parameters(), dist if communicate else None) if dist.enabled else None
        self.shapes_seen: set[tuple] = set()  # batch shapes trained on (compiled code specialises on them)

    def zero_grad(self) -> None:
        if self.sync is not None:
            self.sync.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, group: list[Batch], all_tokens: Union[int, Tensor]) -> StepResult:
        """One update over ``group``; the loss is normalised by ``all_tokens``, the target
        tokens of the whole update over every batch and every rank."""
        total = torch.zeros((), device=self.device)
        oom_here = False
        try:
            # What (loss / all_tokens).backward() sends the loss, computed the same way: the loss
            # writes its gradient already scaled (scaler.scale is a pass-through unless fp16).
            grad_scale = torch.ones((), device=self.device) / all_tokens
            for batch in group:
                loss = self.loss_of(batch.src, batch.tgt_in, batch.tgt_out, getattr(batch, "packing", None), grad_scale)
                self.shapes_seen.add((*batch.src.shape, batch.tgt_in.size(1)))
                self.scaler.scale(loss / all_tokens).backward()
                total += loss.detach()
        except torch.cuda.OutOfMemoryError:
            oom_here = True
            self._recover_from_oom()
        figures = torch.stack([total, torch.full((), float(oom_here), device=self.device)])
        if self.sync is not None:
            figures = self.sync.reduce(figures)
        loss, oom = figures[0], figures[1] > 0
        nonfinite = ~torch.isfinite(loss)
        if not (oom_here and self.sync is None):  # alone, a failed step is simply not taken
            self._update(nonfinite | oom)
        self.zero_grad()
        return StepResult(loss, nonfinite & ~oom, oom, oom_here)

    def _update(self, skip: Tensor) -> None:
        if self.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        if self.scaler.is_enabled():
            self.scaler.step(self.optimizer)  # fp16: the scaler skips non-finite gradients itself
            self.scaler.update()
        else:
            self.optimizer.found_inf = skip.float()  # read by the fused kernel: skip on the device
            self.optimizer.step()

    def _recover_from_oom(self) -> None:
        """Drop this rank's partial gradients and hand the memory back. With a loss scaler and
        several ranks, NaN gradients make every rank's scaler skip the update after the sum."""
        if self.sync is not None and self.scaler.is_enabled():
            self.sync.poison()
        else:
            self.zero_grad()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
