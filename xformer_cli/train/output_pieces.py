"""``model.restrict_output``: the pieces the output layer scores, counted in the training data.

A joint sentencepiece model covers both sides, so an en->de model's output layer also scores
pieces only English uses: on Multi30k 5.5k of the 8000 occur on the German side. Those rows
cost products and loss passes every step and take a share of label smoothing's mass, yet no
target ever asks for them. A fresh run counts the target side's pieces in its token cache
(every direction's, for a multilingual run) and records how many in ``model.output_pieces``;
the ids themselves travel in the model's state (a resume and a checkpoint keep them).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch

from xformer_cli.config import Config
from xformer_cli.data.cache import TokenCache
from xformer_cli.tokenizer import EOS_ID


def target_pieces(tgt_ids: np.ndarray, vocab_size: int) -> torch.Tensor:
    """Sorted ids of the pieces in ``tgt_ids`` (a cache's target side), with the special ids 0..EOS."""
    seen = np.bincount(np.asarray(tgt_ids), minlength=vocab_size)[:vocab_size] > 0
    seen[: EOS_ID + 1] = True  # padding, unknown, start, end: the loss and the search need them
    return torch.from_numpy(np.flatnonzero(seen)).long()


def counted(config: Config, cache: TokenCache, vocab_size: int,
            log: Callable[[str], None]) -> tuple[Config, torch.Tensor]:
    """(``config`` with ``model.output_pieces`` set, the pieces) for a fresh run."""
    pieces = target_pieces(cache.tgt_ids, vocab_size)
    log(f"output layer: {pieces.numel()} of {vocab_size} pieces, those the target side uses (model.restrict_output)")
    return dataclasses.replace(config, model=dataclasses.replace(config.model, output_pieces=pieces.numel())), pieces
