"""Checkpoint in, text out: the Python API behind ``xformer translate``.

    from xformer_cli import Translator
    translator = Translator.from_checkpoint("runs/multi30k/best.pt")
    translator.translate(["A man rides a bike."])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from xformer_cli.config import Config, DecodeConfig, config_from_dict
from xformer_cli.data.batching import encode_source_batch, pad
from xformer_cli.decode.search import Hypothesis, beam_search, greedy_search
from xformer_cli.device import autocast, pick_device
from xformer_cli.errors import XformerError
from xformer_cli.model.build import build_model
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import BOS_ID, EOS_ID, Tokenizer
from xformer_cli.train.checkpoint import load_checkpoint


@dataclass
class AttentionMap:
    """Encoder-decoder attention for one translated sentence."""

    source: list[str]  # source pieces, then "</s>"
    target: list[str]  # output pieces, then "</s>" (row t is the step that produced target[t])
    weights: torch.Tensor  # (layers, heads, len(target), len(source))


class Translator:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device):
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.decode = decode
        self.device = device

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto") -> "Translator":
        state = load_checkpoint(path)
        try:
            config = config_from_dict(state["config"])
            tok = state["tokenizer"]
            tokenizer = Tokenizer(tok["src"], tok.get("tgt"))
            model = build_model(config, tokenizer)
            model.load_state_dict(state["model"])
        except (KeyError, TypeError, RuntimeError) as exc:
            raise XformerError(f"{path}: checkpoint is incomplete or does not match its config ({type(exc).__name__}: {str(exc)[:120]})") from None
        return cls(model, tokenizer, config.decode, pick_device(device))

    def translate(
        self,
        lines: Sequence[str],
        beam_size: Optional[int] = None,
        length_penalty: Optional[float] = None,
        max_len_a: Optional[float] = None,
        max_len_b: Optional[int] = None,
        batch_size: Optional[int] = None,
    ) -> list[str]:
        """One output line per input line, in input order; blank input gives blank output."""
        hyps = self.translate_ids(lines, beam_size, length_penalty, max_len_a, max_len_b, batch_size)
        return [self.tokenizer.decode_tgt([h.tokens])[0] if h is not None else "" for h in hyps]

    def translate_ids(
        self,
        lines: Sequence[str],
        beam_size: Optional[int] = None,
        length_penalty: Optional[float] = None,
        max_len_a: Optional[float] = None,
        max_len_b: Optional[int] = None,
        batch_size: Optional[int] = None,
    ) -> list[Optional[Hypothesis]]:
        d = self.decode
        beam = d.beam_size if beam_size is None else beam_size
        alpha = d.length_penalty if length_penalty is None else length_penalty
        a = d.max_len_a if max_len_a is None else max_len_a
        b = d.max_len_b if max_len_b is None else max_len_b
        size = d.batch_size if batch_size is None else batch_size
        if beam < 1:
            raise XformerError("beam size must be at least 1")
        # Strip newlines and control line breaks so one input line stays one output line.
        clean = [" ".join(line.split()) for line in lines]
        encoded = self.tokenizer.encode_src(clean)
        results: list[Optional[Hypothesis]] = [None] * len(clean)
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            src = encode_source_batch([encoded[i] for i in chunk]).to(self.device)
            with autocast(self.device):
                if beam == 1:
                    hyps = greedy_search(self.model, src, BOS_ID, EOS_ID, a, b)
                else:
                    hyps = [h[0] for h in beam_search(self.model, src, BOS_ID, EOS_ID, beam, alpha, a, b)]
            for i, hyp in zip(chunk, hyps):
                results[i] = hyp
        return results

    def attention(self, lines: Sequence[str], beam_size: Optional[int] = None) -> list[AttentionMap]:
        """Translate each line, then read the cross-attention the model paid to produce it."""
        maps = []
        for line, hyp in zip(lines, self.translate_ids(lines, beam_size=beam_size)):
            if hyp is None:
                continue
            src_ids = self.tokenizer.encode_src([" ".join(line.split())])[0]
            src = encode_source_batch([src_ids]).to(self.device)
            tgt_in = pad([hyp.tokens], prefix=(BOS_ID,)).to(self.device)
            weights = torch.stack([w[0] for w in self.model.cross_attention(src, tgt_in)]).float().cpu()
            maps.append(AttentionMap(
                source=self.tokenizer.src_pieces(" ".join(line.split())) + ["</s>"],
                target=self.tokenizer.tgt_pieces(hyp.tokens) + ["</s>"],
                weights=weights,
            ))
        return maps
