"""Several checkpoints decoding as one model: their log-probabilities are averaged each step.

``Ensemble`` offers what search uses of a ``Transformer`` (``cfg``, ``pad_id``, ``padding_mask``,
``encode``, ``decode_step``, ``new_cache``), so greedy and beam search run unchanged.
The members' encoder outputs are concatenated along the feature axis, so the search can
repeat, select and reorder them as one tensor; each member reads back its own slice.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xformer_cli.model.transformer import Transformer


class Ensemble(nn.Module):
    def __init__(self, models: Sequence[Transformer]):
        super().__init__()
        self.models = nn.ModuleList(models)
        self.cfg = models[0].cfg
        self.pad_id = models[0].pad_id
        self._widths = [m.cfg.d_model for m in models]

    def padding_mask(self, src: Tensor) -> Tensor:
        return self.models[0].padding_mask(src)

    def encode(self, src: Tensor, src_mask: Optional[Tensor] = None) -> Tensor:
        return torch.cat([m.encode(src, src_mask) for m in self.models], dim=-1)

    def new_cache(self) -> list[dict]:
        # One flat list of per-layer dicts, so reorder_cache needs no knowledge of members.
        return [layer for m in self.models for layer in m.new_cache()]

    def decode_step(self, last_tokens: Tensor, memory: Tensor, src_mask: Tensor, cache: Optional[list[dict]]) -> Tensor:
        """The members' mean log-probability: the logits of their normalised geometric mean."""
        memories = memory.split(self._widths, dim=-1)
        steps, start = [], 0
        for model, member_memory in zip(self.models, memories):
            layers = len(model.decoder_layers)
            member_cache = None if cache is None else cache[start : start + layers]
            start += layers
            steps.append(F.log_softmax(model.decode_step(last_tokens, member_memory, src_mask, member_cache), dim=-1))
        return torch.stack(steps).mean(dim=0)
