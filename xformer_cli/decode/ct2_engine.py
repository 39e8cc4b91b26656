"""Translation with a model written by ``xformer export`` (CTranslate2), behind the same
``Engine`` interface as the PyTorch ``Translator``.

    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    CTranslate2Translator.from_directory("runs/multi30k/ct2").translate(["A man rides a bike."])
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from xformer_cli.config import DecodeConfig
from xformer_cli.cpu_cores import available_cores
from xformer_cli.data.batching import encode_source_batch
from xformer_cli.decode.engine import Engine
from xformer_cli.decode.inputs import checked_lines, source_batches, still_wanted
from xformer_cli.decode.options import SearchOptions
from xformer_cli.decode.search import Hypothesis, Wanted, length_penalty, max_lengths
from xformer_cli.errors import XformerError
from xformer_cli.export.ctranslate2 import import_ctranslate2
from xformer_cli.export.format import (EXPORT_INFO, JOINT_SPM, MIN_POSITIONS, SOURCE_SPM, TARGET_SPM, export_languages,
                                       piece_list)
from xformer_cli.export.shortlist import VMAP_FILE
from xformer_cli.languages import Languages
from xformer_cli.tokenizer import BOS_ID, PAD_ID, Tokenizer

# The note on beam search. xformer ranks finished hypotheses by GNMT's length penalty,
#   logprob / ((5 + |Y|) / 6) ** alpha      (|Y| counts eos),
# and stops a sentence once no live beam can beat its finished ones. CTranslate2 4.x has
# no GNMT form: its length_penalty divides by |Y| ** length_penalty (|Y| without eos),
# and with a non-zero one it stops as soon as beam_size hypotheses have finished, short
# ones included, which loses long good ones (a memorised sentence came out with a piece
# missing). So we run CTranslate2 with length_penalty 0: scores are plain log-probabilities
# and a sentence ends once its best beam has finished (no longer hypothesis can beat it on
# log-probability). We take all beam_size finished hypotheses and pick the best by GNMT's
# formula. On a tiny test model this matched xformer's beam output on 227 of 230 Multi30k
# sentences (203 when alpha is passed as CTranslate2's own exponent), all memorised ones
# included; equality is not guaranteed, as the stopping rules differ. Greedy search is
# unaffected: it gives exactly xformer's tokens and log-probabilities.
#
# The note on CPU threads. On a CPU the engine runs its threads as parallel batches
# (CTranslate2's inter_threads, one OpenMP thread each) rather than one batch over all
# of them (intra_threads): each engine batch goes to CTranslate2 in jobs of at most
# CPU_JOB_SENTENCES sentences, split so that every worker gets a share, and (unless a
# caller may withdraw lines: ``wanted``) the next batch is queued before the last one's
# results are read, so no worker waits at a batch's end. The operations of a model of this
# project's sizes are too short to share between cores (docs/benchmarks/decoding.md,
# "CTranslate2's threads"). A single short request then runs on one core.

CPU_JOB_SENTENCES = 32  # at most, per CTranslate2 job on a CPU (ibid.: the job sizes measured)


@contextlib.contextmanager
def keeping_torch_threads() -> Iterator[None]:
    """CTranslate2 sets OpenMP's thread count as it loads a model, and PyTorch runs on the same
    OpenMP: without this, PyTorch in the process would run on CTranslate2's count from then on
    (a training stage after a translation stage; one thread chosen for busy cores, then two)."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if torch is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass
class _Queued:
    """An engine batch in CTranslate2's queue: its line numbers, their length limits, a future each."""

    lines: list[int]
    limits: list[int]
    futures: list[Any]

    def wait(self) -> None:
        """Until CTranslate2 has finished every sentence, whatever became of it."""
        for future in self.futures:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - the error that matters is the caller's
                pass


def cpu_workers(threads: int) -> int:
    """Parallel batches on a CPU: ``threads``, or every core this process may use for 0
    (``decode.factory`` passes its own count)."""
    return threads if threads > 0 else available_cores()


# CTranslate2's words for a CUDA library it cannot load ("Library libcublas.so.12 is not found or
# cannot be loaded") or a driver too old for its CUDA: what no retry on this GPU mends
MISSING_CUDA_LIBRARY = re.compile(r"\blibrar(y|ies)\b|cannot be loaded|\blibcu|driver version", re.IGNORECASE)


class CudaUnusable(XformerError):
    """CTranslate2 loaded a model on CUDA but cannot compute there (its wheel loads the CUDA
    libraries it was built for, CUDA 12's cuBLAS for 4.x: a CUDA 13 machine lacks them)."""

    def __init__(self, path: Path, reason: str):
        self.reason = reason
        super().__init__(f"{path}: CTranslate2 cannot run on CUDA here ({reason}); --device cpu runs it on the CPU")


def _check_runs_on_cuda(translator: Any, path: Path) -> None:
    """One step of one one-piece sentence: the libraries load at the first product, not at load."""
    try:
        translator.translate_batch([["\u2581"]], beam_size=1, max_decoding_length=1)
    except RuntimeError as exc:
        reason = str(exc).strip()[:160]
        if MISSING_CUDA_LIBRARY.search(reason):
            raise CudaUnusable(path, reason) from None
        raise XformerError(f"{path}: the CTranslate2 model cannot run on CUDA ({reason})") from None  # out of memory...


class CTranslate2Translator(Engine):
    """Translate with an exported directory; same input/output conventions as ``Translator``."""

    name = "ctranslate2"
    unsupported = ("sampling_topk", "temperature", "seed", "use_cache")

    def __init__(self, translator: Any, tokenizer: Tokenizer, decode: DecodeConfig, max_positions: int,
                 precision: str = "float32", bos_id: int = BOS_ID, languages: Optional[Languages] = None,
                 shortlist: bool = False, job_sentences: int = 0, workers: int = 1, device: str = "cpu"):
        self.translator = translator
        self.device = device  # cpu | cuda: where it computes (a GPU it cannot compute on gives the CPU)
        self.job_sentences = job_sentences  # at most, per CTranslate2 job (0: an engine batch is one job)
        self.workers = workers  # CTranslate2's parallel batches
        self.shortlist = shortlist  # each step scores only the batch's shortlist candidates (export/shortlist.py)
        self.languages = languages
        self.precision = precision  # the compute type it runs in
        self.tokenizer = tokenizer
        self.decode = decode
        self.max_positions = max_positions
        self.truncated_lines = 0  # input lines cut to decode.max_input_len
        self.src_pieces = piece_list(tokenizer.src)
        self.tgt_ids = {piece: i for i, piece in enumerate(piece_list(tokenizer.tgt))}
        self.suppress = [[tokenizer.tgt.id_to_piece(PAD_ID)], [tokenizer.tgt.id_to_piece(bos_id)]]

    @classmethod
    def from_directory(
        cls, path: str | Path, device: str = "cpu", compute_type: str = "default", threads: int = 0,
        device_index: int = 0,
    ) -> "CTranslate2Translator":
        """Load a directory written by ``export_ctranslate2`` on ``device`` (cpu | cuda) number
        ``device_index``. On a CPU ``threads`` (0: every core) run parallel batches (the note on
        CPU threads); on CUDA they are CTranslate2's ``intra_threads`` (0: its default).
        ``decode.factory.load_engine`` chooses all three by the project's rules."""
        ctranslate2 = import_ctranslate2()
        path = Path(path)
        info_path = path / EXPORT_INFO
        if not path.is_dir():
            raise XformerError(f"CTranslate2 model directory not found: {path}")
        if info_path.is_file() and (path / "model.safetensors").is_file() and not (path / "model.bin").is_file():
            raise XformerError(f"{path} is a Hugging Face export: `xformer import {path} -o model.pt` reads it back "
                               "into a checkpoint (translate reads checkpoints and CTranslate2 exports)")
        if not info_path.is_file() or not (path / "model.bin").is_file():
            raise XformerError(f"{path} is not an xformer CTranslate2 export (no {EXPORT_INFO} or model.bin)")
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            decode = DecodeConfig(**info["decode"])
            vocabularies = info.get("vocabularies") or {}  # an imported MarianMT model's
            if info["joint_vocab"]:
                tokenizer = Tokenizer((path / JOINT_SPM).read_bytes(), None, vocabularies.get("vocab"),
                                      names=(str(path / JOINT_SPM), ""))
            else:
                tokenizer = Tokenizer((path / SOURCE_SPM).read_bytes(), (path / TARGET_SPM).read_bytes(),
                                      vocabularies.get("vocab"), vocabularies.get("tgt_vocab"),
                                      names=(str(path / SOURCE_SPM), str(path / TARGET_SPM)))
            _check_vocabularies(path, tokenizer)
            workers = cpu_workers(threads) if device == "cpu" else 1
            with keeping_torch_threads():
                translator = ctranslate2.Translator(
                    str(path), device=device, device_index=device_index, compute_type=compute_type,
                    inter_threads=workers, intra_threads=1 if device == "cpu" else threads)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise XformerError(f"{path}: cannot load the CTranslate2 model "
                               f"({type(exc).__name__}: {str(exc).strip()[:160]})") from None
        if device == "cuda":
            _check_runs_on_cuda(translator, path)
        weights = compute_type if compute_type not in ("default", "auto") else info.get("quantization") or "float32"
        shortlist = bool(info.get("shortlist")) and (path / VMAP_FILE).is_file()
        return cls(translator, tokenizer, decode, int(info.get("max_positions", MIN_POSITIONS)), weights,
                   int(info.get("bos_id", BOS_ID)), export_languages(info), shortlist,
                   CPU_JOB_SENTENCES if device == "cpu" else 0, workers, device)

    def search(self, lines: Sequence[str], opts: SearchOptions,
               wanted: Optional[Wanted] = None) -> list[list[Hypothesis]]:
        """The ``opts.nbest`` best hypotheses per line, best first ([] for a blank line), like
        ``Translator.search``; a line no longer ``wanted`` is left out of the batches not yet
        started (one CTranslate2 call cannot be stopped halfway).

        ``logprob`` is the sum of token log-probabilities, eos included (pad and bos are
        left out of CTranslate2's softmax, so it is a hair higher than xformer's); ``score``
        is it over GNMT's length penalty, greedy search's too (as xformer's search scores). A
        hypothesis cut at the length limit keeps the log-probability of the uncut one.
        """
        beam, alpha, a, b = opts.beam_size, opts.length_penalty, opts.max_len_a, opts.max_len_b
        lines = checked_lines(lines)
        encoded, batches, cut = source_batches(self.tokenizer, lines, opts, self.source_tag(opts))
        self.truncated_lines += cut
        results: list[list[Hypothesis]] = [[] for _ in lines]
        # One batch queued behind the one being read (the note on CPU threads); none where lines
        # may be withdrawn, so that each batch is filtered after the one before it has finished.
        behind = 0 if wanted is not None else 1
        pending: list[_Queued] = []
        bound: dict[int, int] = {}  # line -> its own limit, where a beam reached it inside a batch run longer
        try:
            for chunk in still_wanted(batches, wanted):
                sources = [encoded[i] for i in chunk]
                # The same per-sentence limits as xformer's search (float32 arithmetic included).
                limits = max_lengths(encode_source_batch(sources), PAD_ID, a, b).tolist()
                pending.append(_Queued(chunk, limits, self._queue(sources, limits, beam, opts.min_len)))
                while len(pending) > behind:
                    self._read(pending[0], results, alpha, opts.nbest, bound)
                    pending.pop(0)
            while pending:
                self._read(pending[0], results, alpha, opts.nbest, bound)
                pending.pop(0)
            bound = {i: limit for i, limit in bound.items() if wanted is None or wanted(i)}
            self._search_bound_again(encoded, results, bound, beam, opts)
        except BaseException:
            for queued in pending:  # what CTranslate2 still runs ends before the error leaves (results dropped)
                queued.wait()
            raise
        return results

    def _search_bound_again(self, encoded: list[list[int]], results: list[list[Hypothesis]], bound: dict[int, int],
                            beam: int, opts: SearchOptions) -> None:
        """Beam search again, in batches of one limit each, for the lines whose own length limit
        bound inside a batch run to a longer one's (``_read`` marks them): their beams had gone on
        past it, so what came back depended on the batch (xformer's search ends each line at its
        own limit). Greedy search's first tokens do not depend on the limit: none is searched again."""
        by_limit: dict[int, list[int]] = {}
        for i, limit in bound.items():
            by_limit.setdefault(limit, []).append(i)
        for limit, lines in sorted(by_limit.items()):
            for start in range(0, len(lines), max(opts.batch_size, 1)):
                chunk = lines[start:start + max(opts.batch_size, 1)]
                limits = [limit] * len(chunk)
                queued = _Queued(chunk, limits, self._queue([encoded[i] for i in chunk], limits, beam, opts.min_len))
                self._read(queued, results, opts.length_penalty, opts.nbest, {})

    def _queue(self, sources: list[list[int]], limits: list[int], beam: int, min_len: int) -> list[Any]:
        """One engine batch handed to CTranslate2 without waiting: a future per sentence."""
        # CTranslate2 takes one max_decoding_length per call, so the batch gets the longest
        # source's limit (a * source length + b, eos counted) and each output is then cut
        # to its own: exact for greedy search, whose first tokens do not depend on the limit
        # (a beam that reached its line's own limit is searched again at it: _search_bound_again). +1 because
        # CTranslate2 counts the eos step in the limit; xformer allows `limit` tokens, then eos.
        # The position table bounds both lengths (xformer grows its table; CTranslate2 cannot).
        max_length = min(max(limits) + 1, self.max_positions)
        return self.translator.translate_batch(
            [[self.src_pieces[t] for t in ids] for ids in sources],
            max_batch_size=self._job_size(len(sources)),  # jobs the parallel workers share (0: one job)
            asynchronous=True,
            beam_size=beam,
            num_hypotheses=beam,
            length_penalty=0.0,  # scores are plain log-probabilities, eos included (the note on beam search)
            max_decoding_length=max_length,
            # pieces before eos, as xformer counts them; capped by the length limit, as xformer caps it
            min_decoding_length=min(min_len, max_length - 1),
            max_input_length=self.max_positions - 1,  # one position left for the added eos
            suppress_sequences=self.suppress,  # xformer never emits pad or bos either
            use_vmap=self.shortlist,
            return_scores=True,
        )

    def _job_size(self, sentences: int) -> int:
        """Sentences per CTranslate2 job: at most ``job_sentences``, and few enough that every
        worker gets a share of a small batch (0: the batch is one job)."""
        if not self.job_sentences:
            return 0
        return max(1, min(self.job_sentences, -(-sentences // self.workers)))

    def _read(self, queued: _Queued, results: list[list[Hypothesis]], alpha: float, nbest: int,
              bound: dict[int, int]) -> None:
        """Wait for a queued batch and put each line's best ``nbest`` hypotheses in ``results``;
        a line of beam search whose hypotheses reached its own limit, below the batch's, goes into
        ``bound`` to be searched again at it (``_search_bound_again``)."""
        batch_limit = max(queued.limits)
        for i, future, limit in zip(queued.lines, queued.futures, queued.limits):
            result = future.result()
            results[i] = self._ranked(result, limit, alpha)[:nbest]
            if limit < batch_limit and len(result.hypotheses) > 1 and \
                    max(len(pieces) for pieces in result.hypotheses) >= limit:
                bound[i] = limit

    def _ranked(self, result: Any, limit: int, alpha: float) -> list[Hypothesis]:
        """The hypotheses, cut to ``limit`` tokens, best first by GNMT's length penalty."""
        hyps = []
        for pieces, logprob in zip(result.hypotheses, result.scores):
            tokens = [self.tgt_ids[piece] for piece in pieces][:limit]
            hyps.append(Hypothesis(tokens, logprob / length_penalty(len(tokens) + 1, alpha), logprob))  # + 1: eos
        return sorted(hyps, key=lambda h: -h.score)


def _check_vocabularies(path: Path, tokenizer: Tokenizer) -> None:
    """The model's vocabulary files hold the tokenizer's pieces in its order (the engine maps ids
    to pieces with the tokenizer): a damaged or foreign one is named here, not a KeyError or a
    ValueError mid-translation."""
    files = {"shared_vocabulary.json": tokenizer.tgt} if (path / "shared_vocabulary.json").is_file() else {
        "source_vocabulary.json": tokenizer.src, "target_vocabulary.json": tokenizer.tgt}
    for name, side in files.items():
        if not (path / name).is_file():
            continue  # an export of an older CTranslate2 (.txt vocabularies): CTranslate2 reads it itself
        pieces = json.loads((path / name).read_text(encoding="utf-8"))
        expected = piece_list(side)
        if pieces != expected:
            raise XformerError(f"{path / name} holds {len(pieces) if isinstance(pieces, list) else 'no list of'} "
                               f"pieces, not the {len(expected)} of the export's sentencepiece model: export the "
                               "checkpoint again")

