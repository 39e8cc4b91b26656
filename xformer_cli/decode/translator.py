"""Checkpoint in, text out: xformer's PyTorch engine, and the Python API for translating.
(``xformer translate`` builds its engine through ``decode.factory.load_engine``, which may
pick the CTranslate2 engine instead: greedy search on a CPU with AMX or without bf16.)

    from xformer_cli import Translator
    translator = Translator.from_checkpoint("runs/multi30k/best.pt")
    translator.translate(["A man rides a bike."])
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from xformer_cli.checkpoint_file import load_model
from xformer_cli.config import DecodeConfig
from xformer_cli.data.batching import encode_source_batch, pad
from xformer_cli.decode.engine import Engine
from xformer_cli.decode.ensemble import Ensemble
from xformer_cli.decode.inputs import (SourceTag, checked_lines, encode_lines, normalize_line, source_batches,
                                      still_wanted)
from xformer_cli.decode.options import SearchOptions
from xformer_cli.decode.search import Hypothesis, Wanted, search_batch
from xformer_cli.device import pick_device, resolve_decode_precision
from xformer_cli.errors import XformerError
from xformer_cli.languages import Languages, plain_code
from xformer_cli.model.transformer import Transformer
from xformer_cli.tokenizer import Tokenizer

INT8_ELSEWHERE = "int8 translation runs on the CTranslate2 engine: decode.factory.load_engine(path, precision='int8')"
# The weights' dtype per precision. fp16 (chosen on CUDA 7.x: fp16 tensor cores, no bf16 ones)
# is safe for the search: decode_step hands it fp32 logits, and on CUDA LayerNorm and softmax
# accumulate in fp32; tests/test_precision.py checks it translates as fp32 does.
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class AttentionMap:
    """Encoder-decoder attention for one translated sentence."""

    source: list[str]  # source pieces, then "</s>"
    target: list[str]  # output pieces, then "</s>" (row t is the step that produced target[t])
    weights: torch.Tensor  # (layers, heads, len(target), len(source))


def for_inference(model: "Transformer | Ensemble", dtype: torch.dtype) -> "Transformer | Ensemble":
    """``model`` with its weights in ``dtype``: itself when they already are, else a copy, so a
    model still being trained keeps its fp32 weights."""
    if next(model.parameters()).dtype == dtype:
        return model
    return copy.deepcopy(model).to(dtype)


def _spelled_alike(languages: Languages) -> tuple:
    """A model's directions and target tags with each code in one spelling (en and eng alike)."""
    return (tuple((plain_code(src), plain_code(tgt)) for src, tgt in languages.pairs),
            tuple((plain_code(code), tag) for code, tag in languages.tags))


class Translator(Engine):
    """Translates with one model or, given several checkpoints, their ensemble.

    ``precision``: fp32, or bf16 or fp16 (weights and activations in that type, the search's
    log-softmax in fp32), or auto (``device.resolve_decode_precision``: bf16 on hardware that
    computes it natively, fp16 on CUDA 7.x, else fp32). int8 runs on the
    CTranslate2 engine: ``decode.factory.load_engine(path, precision="int8")``."""

    name = "xformer"

    def __init__(self, model: "Transformer | Ensemble", tokenizer: Tokenizer, decode: DecodeConfig,
                 device: torch.device, precision: str = "fp32", languages: Optional[Languages] = None):
        self.precision, self.precision_reason = resolve_decode_precision(precision, device)
        if self.precision == "int8":
            raise XformerError(INT8_ELSEWHERE)
        model = model.to(device).eval()
        self.model = for_inference(model, WEIGHT_DTYPES[self.precision])
        self.tokenizer = tokenizer
        self.decode = decode
        self.device = device
        self.languages = languages
        self.truncated_lines = 0  # input lines cut to decode.max_input_len, over this translator's life

    @classmethod
    def from_checkpoint(cls, path: "str | Path | Sequence[str | Path]", device: str = "auto",
                        precision: str = "fp32") -> "Translator":
        """One checkpoint, or a list of them decoded as an ensemble (same tokenizer required);
        decode defaults come from the first. ``precision``: fp32, bf16, fp16 or auto (int8 and the
        choice between engines: ``decode.factory.load_engine``). Its ``languages`` and ``config``
        are the first checkpoint's."""
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        if not paths:
            raise XformerError("no checkpoint given")
        if precision == "int8":
            raise XformerError(INT8_ELSEWHERE)
        loaded = [load_model(p) for p in paths]
        model, tokenizer, config = loaded[0]
        for other_path, (_, other_tokenizer, other_config) in zip(paths[1:], loaded[1:]):
            if ((other_tokenizer.src_model_bytes, other_tokenizer.tgt_model_bytes)
                    != (tokenizer.src_model_bytes, tokenizer.tgt_model_bytes)):
                raise XformerError(f"{other_path}: its tokenizer differs from {paths[0]}'s; "
                                   "an ensemble needs one vocabulary")
            # one joint vocabulary serves both directions: en->de and de->en averaged wrote a mix of both
            if _spelled_alike(other_config.data.languages()) != _spelled_alike(config.data.languages()):
                raise XformerError(f"{other_path} translates {other_config.data.languages().describe()}, "
                                   f"{paths[0]} {config.data.languages().describe()}: an ensemble's models "
                                   "translate the same directions")
        if len(loaded) > 1:
            model = Ensemble([m for m, _, _ in loaded])
        translator = cls(model, tokenizer, config.decode_settings(), pick_device(device), precision,
                         config.data.languages())
        translator.config = config  # its languages and test sets, so no caller reads the file again
        return translator

    def search(self, lines: Sequence[str], opts: SearchOptions,
               wanted: Optional[Wanted] = None) -> list[list[Hypothesis]]:
        """The ``opts.nbest`` best hypotheses per line, best first; [] for a blank line and
        for a line that stops being ``wanted`` (asked before each batch and at every step)."""
        lines = checked_lines(lines)
        encoded, batches, cut = source_batches(self.tokenizer, lines, opts, self.source_tag(opts))
        self.truncated_lines += cut
        results: list[list[Hypothesis]] = [[] for _ in lines]
        generator = None
        if opts.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(opts.seed)
        for chunk in still_wanted(batches, wanted):
            src = encode_source_batch([encoded[i] for i in chunk]).to(self.device)
            # The weights' dtype is the precision: no autocast, so no per-step weight casts.
            found = search_batch(self.model, src, opts, generator,
                                 None if wanted is None else lambda row, chunk=chunk: wanted(chunk[row]))
            for i, hyps in zip(chunk, found):
                results[i] = hyps
        return results

    def alignment_weights(self, line: str, tokens: list[int], layer: int = -1,
                          target_lang: Optional[str] = None) -> torch.Tensor:
        """Cross-attention of one translation (``tokens``, without bos/eos) of ``line``:
        (target pieces + eos, source pieces + eos), mean over the heads of ``layer`` (the
        top one by default: on the Multi30k model it aligned known word pairs best, the one
        below it often pointed at the neighbouring word: scripts/bench_text.py measures it).
        A multilingual model reads the ``target_lang`` tag first; its column is left out."""
        lead = self.source_tag(self.options(target_lang=target_lang))
        layers = self._cross_attention(line, tokens, lead)
        chosen = layers[max(len(layers) + layer, 0) if layer < 0 else min(layer, len(layers) - 1)]
        return chosen[..., 1 if lead.tag is not None else 0:].float().mean(dim=0).cpu()

    def _cross_attention(self, line: str, tokens: list[int], lead: SourceTag = SourceTag()) -> list[torch.Tensor]:
        """Per decoder layer, (heads, target pieces + eos, source pieces + eos): the model fed
        ``line`` (led by ``lead.tag``) and, teacher-forced, its translation ``tokens``."""
        src_ids = encode_lines(self.tokenizer, [line], self.decode.max_input_len, lead)[0][0]
        src = encode_source_batch([src_ids]).to(self.device)
        tgt_in = pad([tokens], prefix=(self.model.cfg.bos_id,)).to(self.device)
        with torch.no_grad():
            return [w[0] for w in self.model.cross_attention(src, tgt_in)]

    def attention(self, lines: Sequence[str], beam_size: Optional[int] = None,
                  target_lang: Optional[str] = None, search: Optional[SearchOptions] = None) -> list[AttentionMap]:
        """Translate each line (with ``search``, else the model's search at ``beam_size``), then
        read the cross-attention the model paid to produce it (a multilingual model's tag is the
        first source piece)."""
        opts = self.options(beam_size=beam_size, target_lang=target_lang) if search is None else search
        lead = self.source_tag(opts)
        maps = []
        for line, hyps in zip(lines, self.search(lines, opts)):
            if not hyps:
                continue
            hyp = hyps[0]
            weights = torch.stack(self._cross_attention(line, hyp.tokens, lead)).float().cpu()
            maps.append(AttentionMap(
                source=[lead.tag] * (lead.tag is not None) + self.tokenizer.src_pieces(normalize_line(line)) + ["</s>"],
                target=self.tokenizer.tgt_pieces(hyp.tokens) + ["</s>"],
                weights=weights,
            ))
        return maps
