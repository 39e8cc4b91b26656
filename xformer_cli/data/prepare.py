"""Everything between a config and batches: sources, tokenizer, tokenized cache, eval sets.

``xformer prepare`` runs this alone; ``xformer train`` runs it first. Two phases, for
safety: ``check_inputs`` opens and checks every input and streams the tokenizer sample
(reading every training line once) without writing anything; only then does the trainer
ready its run directory and ``build_data`` write the tokenizer and the cache.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from xformer_cli.config import Config
from xformer_cli.data.cache import Filters, TokenCache, build_or_load
from xformer_cli.data.encoded import EncodedCorpus, encode_corpus
from xformer_cli.data.sources import ParallelCorpus, PairSource, load_corpus, open_sources
from xformer_cli.data.weights import describe as describe_weights, weighted
from xformer_cli.errors import XformerError
from xformer_cli.tokenizer import Tokenizer


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train: TokenCache
    cache_reused: bool
    valid: Optional[ParallelCorpus]
    valid_encoded: Optional[EncodedCorpus]  # the valid set as piece ids (loss; BLEU reads ``valid``)
    test: Optional[ParallelCorpus]


@dataclass
class CheckedInputs:
    """Every input opened and checked and the tokenizer resolved; nothing written yet."""

    config: Config
    sources: list[PairSource]
    valid: Optional[ParallelCorpus]
    test: Optional[ParallelCorpus]
    plan: "TokenizerPlan"
    tokenizer: Tokenizer


def sample_pairs(sources: Sequence[PairSource], size: int, seed: int) -> list[tuple[str, str]]:
    """A uniform random sample of ``size`` pairs in one streaming pass (reservoir sampling)."""
    rng = random.Random(seed)
    sample: list[tuple[str, str]] = []
    seen = 0
    for source in sources:
        for pair in source:
            if seen < size:
                sample.append(pair)
            else:
                j = rng.randrange(seen + 1)
                if j < size:
                    sample[j] = pair
            seen += 1
    return sample


def _tokenizer_settings(config: Config, sources: Sequence[PairSource]) -> str:
    tc = asdict(config.tokenizer)
    return json.dumps({"tokenizer": tc, "seed": config.train.seed, "data": [s.fingerprint() for s in sources]}, sort_keys=True)


class TokenizerPlan:
    """Where the tokenizer comes from: given in the config, reused from the run, or trained now."""

    def __init__(self, config: Config, sources: Sequence[PairSource], run_dir: Path, log: Callable[[str], None],
                 given: Optional[Tokenizer] = None):
        self.config, self.sources, self.run_dir, self.log = config, sources, run_dir, log
        self.given = given  # the pretrained model's (train.init_from): never trained or replaced
        self.settings = _tokenizer_settings(config, sources)

    def resolve(self) -> Tokenizer:
        tc = self.config.tokenizer
        if self.given is not None:
            self.log(f"tokenizer: the pretrained model's (train.init_from {self.config.train.init_from})")
            return self.given
        if tc.model:
            if not tc.joint and not tc.tgt_model:
                raise XformerError("config key 'tokenizer.tgt_model': needed with tokenizer.joint: false and tokenizer.model")
            self.log(f"tokenizer: reusing {tc.model}")
            return Tokenizer.from_files(tc.model, tc.tgt_model if not tc.joint else None)
        saved = self.run_dir / "tokenizer"
        settings = saved / "settings.json"
        if settings.is_file() and settings.read_text(encoding="utf-8") == self.settings:
            self.log(f"tokenizer: reusing {saved} (same data and settings)")
            return Tokenizer.from_files(saved / "joint.model") if tc.joint else Tokenizer.from_files(saved / "src.model", saved / "tgt.model")
        started = time.time()
        per_side = tc.input_sentence_size // 2 if tc.joint else tc.input_sentence_size
        sample = sample_pairs(self.sources, max(per_side, 1), self.config.train.seed)
        if not sample:
            names = ", ".join(source.name for source in self.sources)
            dropped = sum(sum(source.dropped.values()) for source in self.sources)
            raise XformerError(f"training corpus {names} is empty ({dropped} pairs dropped: empty side or invalid UTF-8)")
        tokenizer = Tokenizer.train(
            [s for s, _ in sample], [t for _, t in sample], joint=tc.joint, vocab_size=tc.vocab_size,
            model_type=tc.model_type, character_coverage=tc.character_coverage,
            input_sentence_size=tc.input_sentence_size, seed=self.config.train.seed,
            split_digits=tc.split_digits, byte_fallback=tc.byte_fallback,
        )
        self.log(f"tokenizer: trained {'joint' if tc.joint else 'separate'} sentencepiece ({tokenizer.src_vocab_size} pieces) "
                 f"on {len(sample)} sampled pairs in {time.time() - started:.1f}s")
        got = min(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
        if got < tc.vocab_size:
            # sentencepiece shrinks the vocabulary (hard_vocab_limit off) rather than fail
            self.log(f"warning: tokenizer.vocab_size asked for {tc.vocab_size} pieces, got {got}: the "
                     f"{len(sample)} sampled pairs do not hold enough distinct pieces for more")
        return tokenizer

    def save(self, tokenizer: Tokenizer) -> None:
        if self.config.tokenizer.model or self.given is not None:
            return
        directory = self.run_dir / "tokenizer"
        tokenizer.save(directory)
        (directory / "settings.json").write_text(self.settings, encoding="utf-8")


def cache_dir_for(config: Config) -> Path:
    return Path(config.data.cache_dir) if config.data.cache_dir else Path(config.run_dir) / "cache"


def check_inputs(config: Config, log: Callable[[str], None] = print, tokenizer: Optional[Tokenizer] = None) -> CheckedInputs:
    """Open and check every corpus and resolve the tokenizer (``tokenizer`` when given, the
    pretrained model's; else training one if needed, in memory): any bad input fails here,
    before a file is written."""
    d = config.data
    sources = open_sources(d.train, d.src_lang, d.tgt_lang, "train", d.skip_invalid_utf8)
    for source in sources:
        if source.notice:
            log(source.notice)
    valid = load_corpus(d.valid, d.src_lang, d.tgt_lang, "valid", d.skip_invalid_utf8, log)
    test = load_corpus(d.test, d.src_lang, d.tgt_lang, "test", d.skip_invalid_utf8, log)
    if valid is not None and d.valid_max_sentences:
        valid.src, valid.tgt = valid.src[: d.valid_max_sentences], valid.tgt[: d.valid_max_sentences]
    plan = TokenizerPlan(config, sources, Path(config.run_dir), log, tokenizer)
    return CheckedInputs(config, sources, valid, test, plan, plan.resolve())


def build_data(inputs: CheckedInputs, log: Callable[[str], None] = print, write: bool = True) -> PreparedData:
    """Save the tokenizer, build (or reuse) the token cache and encode the valid set.
    ``write=False`` only reads what another process prepared (data-parallel ranks after
    the first)."""
    config, tokenizer, valid, test = inputs.config, inputs.tokenizer, inputs.valid, inputs.test
    d = config.data
    if write:
        inputs.plan.save(tokenizer)
    filters = Filters(d.max_len, d.max_len_ratio, d.dedup)
    train, reused = build_or_load(inputs.sources, tokenizer, filters, cache_dir_for(config), log, config.train.threads,
                                  per_source=weighted(d.train))
    if reused:
        log(f"cache: reusing {train.directory} ({train.meta['pairs']} pairs)")
    if weighted(d.train):
        log(describe_weights(train.source_pairs, d.train, [source.name for source in inputs.sources]))
    valid_encoded = encode_corpus(valid, tokenizer) if valid is not None else None
    for corpus in (valid, test):
        if corpus is not None:
            log(corpus.report())
    return PreparedData(tokenizer, train, reused, valid, valid_encoded, test)


def prepare_data(config: Config, log: Callable[[str], None] = print, write: bool = True,
                 tokenizer: Optional[Tokenizer] = None) -> PreparedData:
    """``check_inputs`` then ``build_data``: what ``xformer prepare`` runs; ``tokenizer``: a
    given one (a pretrained model's, train.init_from) instead of one trained or loaded."""
    return build_data(check_inputs(config, log, tokenizer), log, write)


def checkpoint_test_set(checkpoint: "str | Path", log: Callable[[str], None] = print) -> ParallelCorpus:
    """data.test of the config a checkpoint was trained with (its fallback dataset included):
    what `xformer eval-bleu --checkpoint C` scores when given no --src and --ref."""
    from xformer_cli.config import config_from_dict
    from xformer_cli.checkpoint import load_checkpoint

    cfg = config_from_dict(load_checkpoint(checkpoint)["config"])
    d = cfg.data
    test = load_corpus(d.test, d.src_lang, d.tgt_lang, "test", d.skip_invalid_utf8, log)
    if test is None:
        raise XformerError(f"{checkpoint}: its config names no data.test; give --src and --ref")
    return test
