"""Where a run's tokenizer comes from: given (a pretrained model's), named in the config,
reused from the run folder (same data and settings), or trained now on a sample of the
training data; and its tags checked. ``TokenizerPlan.save`` writes a trained one into the
run, settings.json last (it says the models beside it are whole and of these settings).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Sequence

from xformer_cli.config import Config, DataConfig
from xformer_cli.data.directions import language_sample, reservoir
from xformer_cli.data.sources import PairSource
from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import stamps_by_time
from xformer_cli.fileio import atomic_file
from xformer_cli.languages import Languages
from xformer_cli.tokenizer import Tokenizer


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
    if config.data.sampling_temperature != 1:  # it balances the sample per language (directions.balance)
        settings["sampling_temperature"] = config.data.sampling_temperature
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
        if settings.is_file() and self._made_with(settings.read_text(encoding="utf-8")):
            self.log(f"tokenizer: reusing {saved} (same data and settings)")
            if tc.joint:
                return Tokenizer.from_files(saved / "joint.model")
            return Tokenizer.from_files(saved / "src.model", saved / "tgt.model")
        started = time.time()
        src, tgt, what = self._sample()
        if not src or not (tgt or tc.joint):
            names = ", ".join(" and ".join(map(str, source.files or [source.name]))
                              for source in self.sources)  # both sides: either may be the empty one
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

    def _made_with(self, saved: str) -> bool:
        """Whether a saved tokenizer's settings are these: as this version writes them, or as one
        before content hashes did (the same files then stamped by size and time; ``save`` then
        writes them anew)."""
        if saved == self.settings:
            return True
        with stamps_by_time():
            return saved == _tokenizer_settings(self.config, self.sources)

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
