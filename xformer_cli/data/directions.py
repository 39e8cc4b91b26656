"""A config's translation directions as data: the training sources of every pair (with its
target-language tag), the valid and test sets per direction, and the tokenizer's sample
balanced across languages; the test sets of the config a checkpoint was trained with.

A bilingual config is one direction, read as before. With ``data.pairs`` every pair reads its
corpora with its own languages, so one multi-parallel prefix (Multi30k's train.{en,de,fr,cs})
serves en-de, en-fr and de-fr alike. The sources lie in the token cache pair by pair, corpus
by corpus (``data/weights.py`` finds each source's pair in the same order).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, TypeVar

from xformer_cli.config import Config, DataConfig
from xformer_cli.data.sources import ParallelCorpus, PairSource, load_corpus, open_sources
from xformer_cli.errors import XformerError

Direction = tuple[str, str]
T = TypeVar("T")


def train_sources(d: DataConfig, log: Callable[[str], None]) -> list[PairSource]:
    """Every pair's training sources, opened and checked, each knowing its pair and tag."""
    languages = d.languages()
    sources = []
    for index, pair in enumerate(d.directions()):
        opened = open_sources(pair.train, pair.src_lang, pair.tgt_lang, "train", d.skip_invalid_utf8)
        for source in opened:
            source.pair, source.tag = index, languages.tag(pair.tgt_lang)
            if d.pairs:  # one file may serve several pairs: say which
                source.name = f"{pair.name} {source.name}"
            if source.notice:
                log(source.notice)
        sources.extend(opened)
    return sources


def training_pairs(d: DataConfig, log: Callable[[str], None]) -> Iterator[tuple[str, str]]:
    """Every training pair of every corpus, as training reads them (cleaned), without their
    tags: what a model learned from (``export/shortlist.py`` counts them). The corpora take
    turns, a pair each, so that the first N pairs sample every corpus and direction."""
    streams = [iter(source) for source in train_sources(d, log)]
    while streams:
        for stream in list(streams):
            pair = next(stream, None)
            if pair is None:
                streams.remove(stream)
            else:
                yield pair


def eval_sets(d: DataConfig, role: str, log: Optional[Callable[[str], None]] = None) -> dict[Direction, ParallelCorpus]:
    """The valid or test set (``role``) of every direction that has one, read whole; the
    valid sets cut to data.valid_max_sentences each."""
    sets = {}
    for pair in d.directions():
        corpus = load_corpus(getattr(pair, role), pair.src_lang, pair.tgt_lang, role, d.skip_invalid_utf8, log)
        if corpus is None:
            continue
        if d.pairs:
            corpus.name = f"{role} {pair.name}"
        if role == "valid" and d.valid_max_sentences:
            corpus.src, corpus.tgt = corpus.src[: d.valid_max_sentences], corpus.tgt[: d.valid_max_sentences]
        sets[(pair.src_lang, pair.tgt_lang)] = corpus
    unvalidated = [f"{pair.name} (data.pairs[{i}].valid)" for i, pair in enumerate(d.directions())
                   if (pair.src_lang, pair.tgt_lang) not in sets]
    if role == "valid" and sets and unvalidated and log is not None:
        log(f"warning: no valid set for {', '.join(unvalidated)}: not validated, and best.pt is picked on the "
            "others' scores")
    return sets


def tagged_union(sets: dict[Direction, ParallelCorpus], d: DataConfig, role: str) -> Optional[ParallelCorpus]:
    """Every direction's set as one corpus, each source line led by its target's tag when the
    model reads tags (what validation scores until it scores per direction); the one set of a
    bilingual config as it is."""
    languages = d.languages()
    if len(sets) <= 1 and not languages.tagged:
        return next(iter(sets.values()), None)
    src, tgt, dropped = [], [], Counter()
    for (_, target), corpus in sets.items():
        tag = languages.tag(target)
        src.extend(f"{tag} {line}" if tag else line for line in corpus.src)
        tgt.extend(corpus.tgt)
        dropped.update(corpus.dropped)
    if not sets:
        return None
    origin = ", ".join(corpus.origin for corpus in sets.values())
    files = tuple(path for corpus in sets.values() for path in corpus.files)
    return ParallelCorpus(src, tgt, dropped, f"{role} ({len(sets)} direction{'s' if len(sets) > 1 else ''})", origin,
                          files)


def language_sample(sources: Sequence[PairSource], d: DataConfig, size: int, seed: int) -> dict[str, list[str]]:
    """Sentences per language for the tokenizer: ``size`` in all, shared equally by the
    languages, each drawn uniformly from its text; a language with fewer sentences than the
    largest is repeated up to the share ``data.sampling_temperature`` gives it (``balance``).
    A file read by several pairs (the English side of en-de and en-fr) counts once."""
    directions = d.directions()
    streams: dict[str, dict[str, tuple[PairSource, int]]] = {}  # language -> {side key: (source, side)}
    for source in sources:
        pair = directions[source.pair]
        for side, lang in ((0, pair.src_lang), (1, pair.tgt_lang)):
            streams.setdefault(lang, {}).setdefault(source.side_key(side), (source, side))
    quota = max(size // max(len(streams), 1), 1)
    drawn = {lang: reservoir((line for source, side in by_key.values() for line in source.side(side)), quota, seed)
             for lang, by_key in streams.items()}
    return balance(drawn, d.sampling_temperature, seed)


def balance(drawn: dict[str, list[str]], temperature: float, seed: int) -> dict[str, list[str]]:
    """Each language's sentences repeated up to n_max * (n / n_max)^(1/T) (n: its sentences, n_max:
    the largest language's): the share training sampling by temperature T gives a small pair, so
    its words get pieces of their own instead of being spelled in fragments. T = 1 keeps the
    sample as drawn; a large T makes every language as large as the largest. The repeats are
    whole copies and a seeded subset of one more."""
    largest = max((len(lines) for lines in drawn.values()), default=0)
    balanced = {}
    for lang, lines in drawn.items():
        wanted = round(largest * (len(lines) / largest) ** (1 / temperature)) if lines else 0
        copies, extra = divmod(max(wanted, len(lines)), max(len(lines), 1))
        balanced[lang] = lines * copies + random.Random(seed).sample(lines, extra)
    return balanced


def reservoir(items: Iterable[T], size: int, seed: int) -> list[T]:
    """A uniform random sample of ``size`` items in one streaming pass (reservoir sampling)."""
    rng = random.Random(seed)
    sample: list[T] = []
    seen = 0
    for item in items:
        if seen < size:
            sample.append(item)
        else:
            j = rng.randrange(seen + 1)
            if j < size:
                sample[j] = item
        seen += 1
    return sample


def check_pairs_kept(source_pairs: Sequence[int], sources: Sequence[PairSource], d: DataConfig) -> None:
    """A pair left without training data (its files empty, or every line filtered out)
    stops the run in one line: its tag would never be learnt."""
    kept = Counter()
    for source, n in zip(sources, source_pairs):
        kept[source.pair] += n
    for index, pair in enumerate(d.directions()):
        if not kept[index]:
            where = f"data.pairs[{index}]" if d.pairs else "data.train"
            raise XformerError(f"{where} ({pair.name}): no training pair left (the files are empty, or data.max_len "
                               "and data.max_len_ratio drop every line)")


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
