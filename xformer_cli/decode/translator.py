"""Checkpoint in, text out: the Python API behind ``xformer translate``.

    from xformer_cli import Translator
    translator = Translator.from_checkpoint("runs/multi30k/best.pt")
    translator.translate(["A man rides a bike."])
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import torch

from xformer_cli.config import Config, DecodeConfig, config_from_dict
from xformer_cli.data.batching import encode_source_batch, pad
from xformer_cli.decode.ensemble import Ensemble
from xformer_cli.decode.search import Hypothesis, beam_search, greedy_search
from xformer_cli.device import pick_device, resolve_decode_precision
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


@dataclass
class SearchOptions(DecodeConfig):
    """How to decode: the checkpoint's decode config (``Translator.options`` fills what is
    not given from it) plus what only a translation run chooses."""

    nbest: int = 1
    sampling_topk: int = 0  # 0: search; k > 0 sample from the k best; -1 from all (beam must be 1)
    temperature: float = 1.0
    seed: Optional[int] = None
    use_cache: bool = True

    def check(self) -> "SearchOptions":
        if self.beam_size < 1:
            raise XformerError("beam size must be at least 1")
        if not 1 <= self.nbest <= self.beam_size:
            raise XformerError(f"--nbest must be between 1 and the beam size ({self.beam_size}), got {self.nbest}")
        if self.sampling_topk and self.beam_size != 1:
            raise XformerError("sampling draws one translation per sentence: use it with --beam-size 1")
        if self.min_len < 0:
            raise XformerError(f"--min-len must be at least 0, got {self.min_len}")
        if self.max_input_len < 0:
            raise XformerError(f"--max-input-len must be >= 0 (0: the default), got {self.max_input_len}")
        if self.batch_size < 1 or self.max_tokens < 1:
            raise XformerError("--batch-size and --max-tokens must be at least 1")
        if self.temperature <= 0:
            raise XformerError(f"temperature must be positive, got {self.temperature}")
        return self


def resolve_options(decode: DecodeConfig, **given) -> SearchOptions:
    """``given`` options (None = unset) over a model's decode defaults, checked."""
    return SearchOptions(**{**asdict(decode), **{k: v for k, v in given.items() if v is not None}}).check()


def token_batches(lengths: Sequence[int], order: Sequence[int], max_sentences: int, max_slots: int) -> list[list[int]]:
    """Cut ``order`` (indices sorted by length) into batches of at most ``max_sentences``
    sentences and ``max_slots`` padded source tokens; a longer sentence goes alone."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        width = max(longest, lengths[i] + 1)  # + eos
        if current and (len(current) >= max_sentences or width * (len(current) + 1) > max_slots):
            batches.append(current)
            current, width = [], lengths[i] + 1
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


def normalize_line(line: str) -> str:
    """Whitespace (line breaks of every kind included) collapsed to single spaces, so one
    input line stays one output line."""
    return " ".join(line.split())


DEFAULT_MAX_INPUT_LEN = 1024  # CTranslate2's default, for decode settings that give none


def source_batches(tokenizer: Tokenizer, lines: Sequence[str], opts: SearchOptions) -> tuple[list[list[int]], list[list[int]], int]:
    """Encoded source lines, batches of their indices, and how many lines were cut.

    Lines longer than ``opts.max_input_len`` pieces are cut to it: one garbage line (a
    5000-word paste, 3000 repeated characters) then costs what a long normal line costs,
    and its output, at most max_len_a * max_input_len + max_len_b pieces, is bounded too.
    Blank lines are left out; batches are sorted by length and capped by
    ``opts.batch_size`` sentences and ``opts.max_tokens`` slots x beam."""
    limit = opts.max_input_len or DEFAULT_MAX_INPUT_LEN
    encoded = tokenizer.encode_src([normalize_line(line) for line in lines])
    cut = sum(len(ids) > limit for ids in encoded)
    if cut:
        encoded = [ids[:limit] for ids in encoded]
    lengths = [len(ids) for ids in encoded]
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: lengths[i])
    return encoded, token_batches(lengths, order, opts.batch_size, max(opts.max_tokens // opts.beam_size, 1)), cut


def chunked(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of at most ``size`` lines: what streaming translation holds at once."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def for_inference(model: "Transformer | Ensemble", dtype: torch.dtype) -> "Transformer | Ensemble":
    """``model`` with its weights in ``dtype``: itself when they already are, else a copy, so a
    model still being trained keeps its fp32 weights."""
    if next(model.parameters()).dtype == dtype:
        return model
    return copy.deepcopy(model).to(dtype)


class Translator:
    """Translates with one model or, given several checkpoints, their ensemble.

    ``precision``: fp32, or bf16 (weights and activations in bf16, the search's log-softmax
    in fp32), or auto (bf16 on hardware that computes it natively). int8 runs on the
    CTranslate2 engine: ``Translator.from_checkpoint(..., precision="int8")``."""

    def __init__(self, model: "Transformer | Ensemble", tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device,
                 precision: str = "fp32"):
        self.precision, self.precision_reason = resolve_decode_precision(precision, device)
        if self.precision == "int8":
            raise XformerError("int8 translation runs on CTranslate2: use Translator.from_checkpoint(path, precision='int8')")
        model = model.to(device).eval()
        self.model = for_inference(model, torch.bfloat16 if self.precision == "bf16" else torch.float32)
        self.tokenizer = tokenizer
        self.decode = decode
        self.device = device
        self.truncated_lines = 0  # input lines cut to decode.max_input_len, over this translator's life

    @classmethod
    def from_checkpoint(cls, path: "str | Path | Sequence[str | Path]", device: str = "auto", precision: str = "fp32"):
        """One checkpoint, or a list of them decoded as an ensemble (same tokenizer required);
        decode defaults come from the first. With ``precision`` int8 it returns the CTranslate2
        engine on an int8 export of the checkpoint (same ``translate``)."""
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        if not paths:
            raise XformerError("no checkpoint given")
        if resolve_decode_precision(precision, pick_device(device))[0] == "int8":
            return int8_translator(paths, device)
        loaded = [load_model(p) for p in paths]
        model, tokenizer, config = loaded[0]
        for other_path, (_, other_tokenizer, _) in zip(paths[1:], loaded[1:]):
            if (other_tokenizer.src_model_bytes, other_tokenizer.tgt_model_bytes) != (tokenizer.src_model_bytes, tokenizer.tgt_model_bytes):
                raise XformerError(f"{other_path}: its tokenizer differs from {paths[0]}'s; an ensemble needs one vocabulary")
        if len(loaded) > 1:
            model = Ensemble([m for m, _, _ in loaded])
        return cls(model, tokenizer, config.decode_settings(), pick_device(device), precision)

    def options(self, **given) -> SearchOptions:
        """Search options: the given ones (None = unset), the rest from the checkpoint's decode config."""
        return resolve_options(self.decode, **given)

    def translate(
        self,
        lines: Sequence[str],
        beam_size: Optional[int] = None,
        length_penalty: Optional[float] = None,
        max_len_a: Optional[float] = None,
        max_len_b: Optional[int] = None,
        batch_size: Optional[int] = None,
        **more,
    ) -> list[str]:
        """One output line per input line, in input order; blank input gives blank output.
        ``more``: any other ``SearchOptions`` field (sampling_topk, temperature, seed, ...)."""
        opts = self.options(beam_size=beam_size, length_penalty=length_penalty, max_len_a=max_len_a,
                            max_len_b=max_len_b, batch_size=batch_size, **more)
        return [self.detokenize(hyps[0]) if hyps else "" for hyps in self.search(lines, opts)]

    def detokenize(self, hyp: Hypothesis) -> str:
        return self.tokenizer.decode_tgt([hyp.tokens])[0]

    def search(self, lines: Sequence[str], opts: SearchOptions) -> list[list[Hypothesis]]:
        """The ``opts.nbest`` best hypotheses per line, best first; [] for a blank line."""
        encoded, batches, cut = source_batches(self.tokenizer, lines, opts)
        self.truncated_lines += cut
        results: list[list[Hypothesis]] = [[] for _ in lines]
        generator = None
        if opts.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(opts.seed)
        for chunk in batches:
            src = encode_source_batch([encoded[i] for i in chunk]).to(self.device)
            # The weights' dtype is the precision: no autocast, so no per-step weight casts.
            if opts.beam_size == 1:
                found = [[h] for h in greedy_search(self.model, src, BOS_ID, EOS_ID, opts.max_len_a, opts.max_len_b,
                                                     opts.use_cache, opts.sampling_topk, opts.temperature, generator,
                                                     opts.min_len)]
            else:
                found = beam_search(self.model, src, BOS_ID, EOS_ID, opts.beam_size, opts.length_penalty,
                                    opts.max_len_a, opts.max_len_b, opts.nbest, opts.use_cache, opts.min_len)
            for i, hyps in zip(chunk, found):
                results[i] = hyps
        return results

    def search_stream(self, lines: Iterable[str], opts: SearchOptions, chunk_lines: int = 2000) -> Iterator[list[Hypothesis]]:
        """``search`` over any number of lines in bounded memory: ``chunk_lines`` at a time,
        each chunk sorted by length for batching, results yielded in input order."""
        for chunk in chunked(lines, chunk_lines):
            yield from self.search(chunk, opts)

    def attention(self, lines: Sequence[str], beam_size: Optional[int] = None) -> list[AttentionMap]:
        """Translate each line, then read the cross-attention the model paid to produce it."""
        maps = []
        for line, hyps in zip(lines, self.search(lines, self.options(beam_size=beam_size))):
            if not hyps:
                continue
            hyp = hyps[0]
            src_ids = self.tokenizer.encode_src([normalize_line(line)])[0][: self.decode.max_input_len or DEFAULT_MAX_INPUT_LEN]
            src = encode_source_batch([src_ids]).to(self.device)
            tgt_in = pad([hyp.tokens], prefix=(BOS_ID,)).to(self.device)
            weights = torch.stack([w[0] for w in self.model.cross_attention(src, tgt_in)]).float().cpu()
            maps.append(AttentionMap(
                source=self.tokenizer.src_pieces(normalize_line(line)) + ["</s>"],
                target=self.tokenizer.tgt_pieces(hyp.tokens) + ["</s>"],
                weights=weights,
            ))
        return maps


def int8_translator(paths: Sequence["str | Path"], device: str = "auto"):
    """The CTranslate2 engine on an int8 export of one checkpoint, made in a temporary
    directory (the engine reads its files when it starts, so they are removed at once)."""
    if len(paths) != 1:
        raise XformerError("int8 translation takes one checkpoint, not an ensemble")
    from xformer_cli.export import CTranslate2Translator, export_ctranslate2

    ct2_device = "cuda" if pick_device(device).type == "cuda" else "cpu"
    with tempfile.TemporaryDirectory(prefix="xformer-int8-") as tmp:
        exported = export_ctranslate2(paths[0], Path(tmp) / "ct2", quantization="int8")
        return CTranslate2Translator.from_directory(exported, device=ct2_device, compute_type="int8")


def load_model(path: "str | Path", state: Optional[dict] = None) -> tuple[Transformer, Tokenizer, Config]:
    """The model (eval mode), tokenizer and config of a checkpoint; one-line errors."""
    state = load_checkpoint(path) if state is None else state
    try:
        config = config_from_dict(state["config"])
        tok = state["tokenizer"]
        tokenizer = Tokenizer(tok["src"], tok.get("tgt"))
        model = build_model(config, tokenizer)
        model.load_state_dict(state["model"])
    except (KeyError, TypeError, RuntimeError) as exc:
        raise XformerError(f"{path}: checkpoint is incomplete or does not match its config ({type(exc).__name__}: {str(exc)[:120]})") from None
    return model.eval(), tokenizer, config


def nbest_lines(line_no: int, hyps: list[Hypothesis], k: int, detokenize) -> list[str]:
    """``--nbest`` output: exactly k lines ``LINE<TAB>RANK<TAB>SCORE<TAB>TRANSLATION`` per input
    line (1-based), best first; SCORE is the length-normalised log-probability the search
    ranks by. A blank input line gives k lines with an empty translation and score 0."""
    rows = []
    for rank in range(1, k + 1):
        if not hyps:
            rows.append(f"{line_no}\t{rank}\t0.0000\t")
        elif rank <= len(hyps):
            rows.append(f"{line_no}\t{rank}\t{hyps[rank - 1].score:.4f}\t{detokenize(hyps[rank - 1])}")
        else:  # fewer finished hypotheses than asked for (tiny vocabularies only)
            rows.append(f"{line_no}\t{rank}\t-inf\t")
    return rows


def translate_lines(translator, lines: Iterable[str], options, chunk_lines: int = 2000) -> Iterator[str]:
    """Output lines for streamed input lines, in order: one per input line, or ``nbest``
    per line. ``translator`` is a ``Translator`` (``options``: SearchOptions) or a
    CTranslate2 translator (``options``: keyword arguments of its ``translate``)."""
    if isinstance(translator, Translator):
        for index, hyps in enumerate(translator.search_stream(lines, options, chunk_lines), start=1):
            if options.nbest > 1:
                yield from nbest_lines(index, hyps, options.nbest, translator.detokenize)
            else:
                yield translator.detokenize(hyps[0]) if hyps else ""
        return
    for chunk in chunked(lines, chunk_lines):
        yield from translator.translate(chunk, **options)
