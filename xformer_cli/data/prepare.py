"""Everything between a config and batches: sources, tokenizer, tokenized cache, eval sets.

``xformer prepare`` runs ``prepare_data``; ``xformer train`` runs the same two phases itself
(train/run_plan.py, between its own checks of the run folder). Two phases, for safety:
``check_inputs`` opens and checks every input and streams the tokenizer sample (reading every
training line once) without writing anything; only then does the trainer ready its run
directory and ``build_data`` write the tokenizer and the cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from xformer_cli import run_lock
from xformer_cli.config import Config
from xformer_cli.data.cache import Filters, TokenCache, build_or_load
from xformer_cli.data.directions import Direction, check_pairs_kept, eval_sets, tagged_union, train_sources
from xformer_cli.data.encoded import EncodedCorpus, encode_corpus
from xformer_cli.data.sources import ParallelCorpus, PairSource
from xformer_cli.data.tokenizer_plan import TokenizerPlan, check_tags, corpus_tags
from xformer_cli.data.weights import data_weighted, describe as describe_weights, source_weights
from xformer_cli.errors import XformerError
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
    plan: TokenizerPlan
    tokenizer: Tokenizer
    valid_sets: dict[Direction, ParallelCorpus] = field(default_factory=dict)
    test_sets: dict[Direction, ParallelCorpus] = field(default_factory=dict)


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
    return dataclasses.replace(corpus, src=[f"{tag} {line}" for line in corpus.src])


def prepare_data(config: Config, log: Callable[[str], None] = print, write: bool = True,
                 tokenizer: Optional[Tokenizer] = None,
                 keep: Optional[Callable[[Tokenizer], None]] = None) -> PreparedData:
    """``check_inputs`` then ``build_data``: what ``xformer prepare`` runs; ``tokenizer``: a
    given one (a pretrained model's, train.init_from) instead of one trained or loaded;
    ``keep``: a check of the tokenizer before anything is written (a trained run's own)."""
    held = run_lock.holding(config.run_dir, "xformer prepare") if write else contextlib.nullcontext()
    with held:
        inputs = check_inputs(config, log, tokenizer)
        if keep is not None:
            keep(inputs.tokenizer)
        return build_data(inputs, log, write)
