"""Everything between a config and batches: sources, tokenizer, tokenized cache, eval sets.

``xformer prepare`` runs this alone; ``xformer train`` runs it first. Two phases, for
safety: ``check_inputs`` opens and checks every input and streams the tokenizer sample
(reading every training line once) without writing anything; only then does the trainer
ready its run directory and ``build_data`` write the tokenizer and the cache.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from xformer_cli import run_lock
from xformer_cli.config import Config, DataConfig
from xformer_cli.data.cache import Filters, TokenCache, build_or_load
from xformer_cli.data.directions import (Direction, check_pairs_kept, eval_sets, language_sample, reservoir,
                                         tagged_union, train_sources)
from xformer_cli.data.encoded import EncodedCorpus, encode_corpus
from xformer_cli.data.sources import ParallelCorpus, PairSource
from xformer_cli.data.weights import data_weighted, describe as describe_weights, source_weights
from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file
from xformer_cli.languages import Languages
from xformer_cli.tokenizer import Tokenizer


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train: TokenCache
    cache_reused: bool
    # The valid set: a bilingual config's, or every direction's in one, each source line led by
    # its tag (what validation scores until it scores direction by direction: valid_sets).
    valid: Optional[ParallelCorpus]
    valid_encoded: Optional[EncodedCorpus]  # ``valid`` as piece ids (loss; BLEU reads ``valid``)
    test: Optional[ParallelCorpus]
    # Per direction (source, target), source lines without tags: translate them with
    # target_lang=target. A bilingual config's one set is here too.
    valid_sets: dict[Direction, ParallelCorpus] = field(default_factory=dict)
    valid_encoded_sets: dict[Direction, EncodedCorpus] = field(default_factory=dict)  # with their tags
    test_sets: dict[Direction, ParallelCorpus] = field(default_factory=dict)


@dataclass
class CheckedInputs:
    """Every input opened and checked and the tokenizer resolved; nothing written yet."""

    config: Config
    sources: list[PairSource]
    valid: Optional[ParallelCorpus]
    test: Optional[ParallelCorpus]
    plan: "TokenizerPlan"
    tokenizer: Tokenizer
    valid_sets: dict[Direction, ParallelCorpus] = field(default_factory=dict)
    test_sets: dict[Direction, ParallelCorpus] = field(default_factory=dict)


def sample_pairs(sources: Sequence[PairSource], size: int, seed: int) -> list[tuple[str, str]]:
    """A uniform random sample of ``size`` pairs in one streaming pass (reservoir sampling)."""
    return reservoir((pair for source in sources for pair in source), size, seed)


def _tokenizer_settings(config: Config, sources: Sequence[PairSource]) -> str:
    tc = asdict(config.tokenizer)
    settings = {"tokenizer": tc, "seed": config.train.seed, "data": [s.fingerprint() for s in sources]}
    if corpus_tags(config.data):  # control pieces of the vocabulary: another tag is another tokenizer
        settings["corpus_tags"] = corpus_tags(config.data)
    if len(config.data.directions()) > 1 or config.data.reads_tags():  # bilingual runs keep their settings.json
        settings["languages"] = config.data.languages().to_dict()
    return json.dumps(settings, sort_keys=True)


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
                raise XformerError("config key 'tokenizer.tgt_model': needed with tokenizer.joint: false "
                                   "and tokenizer.model")
            self.log(f"tokenizer: reusing {tc.model}")
            return Tokenizer.from_files(tc.model, tc.tgt_model if not tc.joint else None)
        saved = self.run_dir / "tokenizer"
        settings = saved / "settings.json"
        if settings.is_file() and settings.read_text(encoding="utf-8") == self.settings:
            self.log(f"tokenizer: reusing {saved} (same data and settings)")
            if tc.joint:
                return Tokenizer.from_files(saved / "joint.model")
            return Tokenizer.from_files(saved / "src.model", saved / "tgt.model")
        started = time.time()
        src, tgt, what = self._sample()
        if not src or not (tgt or tc.joint):
            names = ", ".join(source.name for source in self.sources)
            dropped = sum(sum(source.dropped.values()) for source in self.sources)
            raise XformerError(f"training corpus {names} is empty "
                               f"({dropped} pairs dropped: empty side or invalid UTF-8)")
        tags = [tag for _, tag in self.config.data.languages().tags]
        tokenizer = Tokenizer.train(
            src, tgt, joint=tc.joint, vocab_size=tc.vocab_size,
            model_type=tc.model_type, character_coverage=tc.character_coverage,
            input_sentence_size=tc.input_sentence_size, seed=self.config.train.seed, user_defined_symbols=tags,
            control_symbols=corpus_tags(self.config.data),
            split_digits=tc.split_digits, byte_fallback=tc.byte_fallback,
        )
        self.log(f"tokenizer: trained {'joint' if tc.joint else 'separate'} sentencepiece "
                 f"({tokenizer.src_vocab_size} pieces"
                 f"{', tags ' + ' '.join(tags) if tags else ''}) on {what} in {time.time() - started:.1f}s")
        got = min(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
        if got < tc.vocab_size:
            # sentencepiece shrinks the vocabulary (hard_vocab_limit off) rather than fail
            self.log(f"warning: tokenizer.vocab_size asked for {tc.vocab_size} pieces, got {got}: the "
                     f"{what} do not hold enough distinct pieces for more")
        return tokenizer

    def _sample(self) -> tuple[list[str], list[str], str]:
        """(source-side, target-side) sentences to train on, and what they are. One direction:
        a uniform sample of its pairs. Several: the same number of sentences per language,
        so English, read by every en-X pair, does not crowd out the others."""
        tc, d = self.config.tokenizer, self.config.data
        if len(d.directions()) == 1:
            per_side = tc.input_sentence_size // 2 if tc.joint else tc.input_sentence_size
            sample = sample_pairs(self.sources, max(per_side, 1), self.config.train.seed)
            return [s for s, _ in sample], [t for _, t in sample], f"{len(sample)} sampled pairs"
        sources, targets = ({p.src_lang for p in d.directions()}, {p.tgt_lang for p in d.directions()})
        by_language = language_sample(self.sources, d, tc.input_sentence_size, self.config.train.seed)
        counts = ", ".join(f"{lang} {len(lines)}" for lang, lines in by_language.items())
        if d.sampling_temperature != 1:
            counts += f"; smaller ones repeated to their share at data.sampling_temperature {d.sampling_temperature:g}"
        if tc.joint:  # one model over every language: all of them on one side
            return [line for lines in by_language.values() for line in lines], [], f"sentences per language ({counts})"
        src = [line for lang, lines in by_language.items() if lang in sources for line in lines]
        tgt = [line for lang, lines in by_language.items() if lang in targets for line in lines]
        return src, tgt, f"sentences per language ({counts})"

    def origin(self) -> str:
        """Where the tokenizer comes from, for an error about it."""
        if self.given is not None:
            return f"config key 'train.init_from' ({self.config.train.init_from})"
        if self.config.tokenizer.model:
            return f"config key 'tokenizer.model' ({self.config.tokenizer.model})"
        return "the trained tokenizer"

    def save(self, tokenizer: Tokenizer) -> None:
        if self.config.tokenizer.model or self.given is not None:
            return
        directory = self.run_dir / "tokenizer"
        # settings.json says the models there are whole and of these settings: gone until they are
        (directory / "settings.json").unlink(missing_ok=True)
        tokenizer.save(directory)
        with atomic_file(directory / "settings.json", "w", encoding="utf-8") as f:
            f.write(self.settings)


def cache_dir_for(config: Config) -> Path:
    return Path(config.data.cache_dir) if config.data.cache_dir else Path(config.run_dir) / "cache"


def check_inputs(config: Config, log: Callable[[str], None] = print,
                 tokenizer: Optional[Tokenizer] = None) -> CheckedInputs:
    """Open and check every corpus and resolve the tokenizer (``tokenizer`` when given, the
    pretrained model's; else training one if needed, in memory): any bad input fails here,
    before a file is written."""
    d = config.data
    sources = train_sources(d, log)
    valid_sets, test_sets = eval_sets(d, "valid", log), eval_sets(d, "test", log)
    plan = TokenizerPlan(config, sources, Path(config.run_dir), log, tokenizer)
    resolved = plan.resolve()
    check_tags(resolved, d.languages(), plan.origin())
    for tag in corpus_tags(d):
        try:
            resolved.tag_id(tag)
        except XformerError:
            raise XformerError(f"{plan.origin()}: the corpus tag {tag} (data.train) is not a control piece of it; "
                               "train a new tokenizer (tokenizer.model: null)") from None
    return CheckedInputs(config, sources, tagged_union(valid_sets, d, "valid"), tagged_union(test_sets, d, "test"),
                         plan, resolved, valid_sets, test_sets)


def corpus_tags(d: DataConfig) -> list[str]:
    """The corpus tags of the training data (data.train[i].tag), in order, each once."""
    tags = [corpus.tag for pair in d.directions() for corpus in pair.train if corpus.tag]
    return list(dict.fromkeys(tags))


def check_tags(tokenizer: Tokenizer, languages: Languages, origin: str) -> None:
    """Every tag of a multilingual model is one piece of ``tokenizer`` (one trained here has
    them as user-defined symbols; a given one may not), else one line naming it."""
    for _, tag in languages.tags:
        try:
            tokenizer.tag_id(tag)
        except XformerError as exc:
            raise XformerError(f"{origin}: {exc}; a multilingual model needs its tags as single pieces "
                               "(leave tokenizer.model out: xformer trains one with them)") from None


def build_data(inputs: CheckedInputs, log: Callable[[str], None] = print, write: bool = True) -> PreparedData:
    """Save the tokenizer, build (or reuse) the token cache and encode the valid sets.
    ``write=False`` only reads what another process prepared (data-parallel ranks after
    the first)."""
    config, tokenizer, valid, test = inputs.config, inputs.tokenizer, inputs.valid, inputs.test
    d = config.data
    if write:
        inputs.plan.save(tokenizer)
    filters = Filters(d.max_len, d.max_len_ratio, d.dedup, d.number_augmentation, config.train.seed,
                      d.concat_augmentation, d.drop_number_mismatch, d.quote_augmentation)
    train, reused = build_or_load(inputs.sources, tokenizer, filters, cache_dir_for(config), log, config.train.threads,
                                  per_source=data_weighted(d) or len(d.directions()) > 1)
    if reused:
        log(f"cache: reusing {train.directory} ({train.meta['pairs']} pairs)")
    if train.source_pairs is not None:
        check_pairs_kept(train.source_pairs, inputs.sources, d)
    if data_weighted(d):
        log(describe_weights(train.source_pairs, source_weights(d, train.source_pairs),
                             [source.name for source in inputs.sources]))
    valid_encoded = encode_corpus(valid, tokenizer) if valid is not None else None
    languages = d.languages()
    if valid is not None and len(inputs.valid_sets) == 1:  # one direction: its set is the valid set, encoded once
        valid_encoded_sets = {direction: valid_encoded for direction in inputs.valid_sets}
    else:
        valid_encoded_sets = {(s, t): encode_corpus(tagged(corpus, languages.tag(t)), tokenizer)
                              for (s, t), corpus in inputs.valid_sets.items()}
    for corpus in [*inputs.valid_sets.values(), *inputs.test_sets.values()]:
        log(corpus.report())
    return PreparedData(tokenizer, train, reused, valid, valid_encoded, test, inputs.valid_sets, valid_encoded_sets,
                        inputs.test_sets)


def tagged(corpus: ParallelCorpus, tag: Optional[str]) -> ParallelCorpus:
    """``corpus`` with every source line led by ``tag`` (itself without one)."""
    if tag is None:
        return corpus
    return ParallelCorpus([f"{tag} {line}" for line in corpus.src], corpus.tgt, corpus.dropped, corpus.name,
                          corpus.origin)


def prepare_data(config: Config, log: Callable[[str], None] = print, write: bool = True,
                 tokenizer: Optional[Tokenizer] = None) -> PreparedData:
    """``check_inputs`` then ``build_data``: what ``xformer prepare`` runs; ``tokenizer``: a
    given one (a pretrained model's, train.init_from) instead of one trained or loaded."""
    held = run_lock.holding(config.run_dir, "xformer prepare") if write else contextlib.nullcontext()
    with held:
        return build_data(check_inputs(config, log, tokenizer), log, write)


def checkpoint_test_set(checkpoint: "str | Path", log: Callable[[str], None] = print,
                        config: Optional[Config] = None) -> ParallelCorpus:
    """data.test of the config a checkpoint was trained with (its fallback dataset included):
    what `xformer eval-bleu --checkpoint C` scores when given no --src and --ref. A
    multilingual checkpoint has one per direction: ``checkpoint_test_sets``."""
    sets = checkpoint_test_sets(checkpoint, log, config)
    if len(sets) > 1:
        raise XformerError(f"{checkpoint} has test sets for {len(sets)} directions; "
                           "score them with checkpoint_test_sets")
    return next(iter(sets.values()))


def checkpoint_test_sets(checkpoint: "str | Path", log: Callable[[str], None] = print,
                         config: Optional[Config] = None) -> dict[Direction, ParallelCorpus]:
    """Every direction's data.test (data.pairs[i].test, else data.test read with the pair's
    languages) in the config a checkpoint was trained with; source lines without tags.
    ``config``: that config when already read (an engine's), so the file is not read again."""
    if config is None:
        from xformer_cli.config import config_from_dict
        from xformer_cli.checkpoint_file import read_light

        config = config_from_dict(read_light(checkpoint).get("config", {}))
    sets = eval_sets(config.data, "test", log)
    if not sets:
        raise XformerError(f"{checkpoint}: its config names no data.test; give --src and --ref")
    return sets
