"""Run configuration: its typed dataclasses, the rules by the plan, loading, validation.

A config file mirrors ``Config`` below: top-level sections ``data``, ``tokenizer``,
``model``, ``train`` and ``decode``. Every key is checked: an unknown key, a value of
the wrong type or an impossible combination is an ``XformerError`` naming the key.
String values may use ``${VAR}`` or ``${VAR:-default}`` to read the environment
(the shipped configs find the corpora through ``${XFORMER_DATA:-../shared/data}``); reading
the file and the overrides into these dataclasses is ``settings_file.py``'s.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Optional, Union

from xformer_cli.cpu_cores import too_many_threads
from xformer_cli.errors import XformerError
from xformer_cli.languages import TAG, Languages, tag_for
from xformer_cli.model.config import ACTIVATION_NAMES, ModelConfig  # torch-free: importing config loads no torch
from xformer_cli.precisions import TRAINING_PRECISIONS
from xformer_cli.settings_file import apply_overrides, build_section, dotted_keys, merge_trees, read_tree, require


@dataclass
class CorpusConfig:
    """One parallel corpus, from one of three kinds of source:

    - plain-text files: ``prefix`` (reads prefix.<src_lang> and prefix.<tgt_lang>, or .gz),
      or explicit ``src`` and ``tgt`` paths;
    - a Hugging Face dataset: ``dataset`` is a hub name (with ``dataset_config``, e.g.
      wmt14 / de-en) or a directory written by ``save_to_disk``; ``split`` picks the split;
    - data files (parquet, jsonl/json, tsv, csv): ``data_files``.
    Datasets and data files are read in WMT's schema (a ``translation`` column of
    {lang: text}) or from two columns: ``src_column``/``tgt_column``, else columns named
    after the two language codes.
    """

    prefix: Optional[str] = None
    src: Optional[str] = None
    tgt: Optional[str] = None
    dataset: Optional[str] = None
    dataset_config: Optional[str] = None
    split: Optional[str] = None  # default: train / validation / test by the corpus's role
    data_files: Optional[str] = None
    src_column: Optional[str] = None
    tgt_column: Optional[str] = None
    # With prefix/src+tgt: a dataset (hub name or save_to_disk directory, same split rules)
    # to read instead when the files' folder does not exist (a fresh machine with internet);
    # ignored for a corpus that is itself a dataset or data files.
    fallback_dataset: Optional[str] = None
    # data.train only: how much of this corpus an epoch takes, as a sampling factor. 1 = every
    # pair once (the default); 0.2 = a fifth of its pairs, drawn afresh each epoch; 3 = every
    # pair three times; 2.5 = twice, plus half of its pairs drawn at random. The draw is fixed
    # by (train.seed, epoch), so a resumed run takes the same pairs (data/weights.py). With a
    # small in-domain corpus and a large general one, e.g. weights 1 and 0.05, fine-tuning
    # keeps seeing some general-domain text (less forgetting) without drowning the new domain.
    weight: float = 1.0
    # data.train only: a piece that leads every source line of this corpus, e.g. "<bt>" for
    # back-translated pairs (tagged back-translation, Caswell et al. 2019). It is a control
    # symbol of the tokenizer: text never encodes to it, so a user's input cannot carry it.
    tag: Optional[str] = None
    # data.train only: the share of the run's planned steps this corpus trains in (1 = all of
    # them). At until x the planned steps the epoch under way ends, and every epoch after it
    # leaves the corpus out: with 0.75 on back-translations, the last quarter of the run (the
    # schedule's lowest rates) trains on the real pairs alone, a fine-tuning tail in one run.
    # Fixed by the step count, so a resumed run ends the corpus where an unbroken one does.
    until: float = 1.0
    # The first max_pairs pairs only (after empty ones are dropped); 0 = all of them.
    max_pairs: int = 0


@dataclass
class PairConfig:
    """One translation direction of a multilingual model (``data.pairs``): "en-de" for short,
    or a mapping. What a pair leaves out comes from ``data.train``, ``data.valid`` and
    ``data.test``, read with the pair's languages (prefix + ".en" / ".de", the dataset's
    columns), so one multi-parallel prefix serves every pair."""

    src_lang: str = ""
    tgt_lang: str = ""
    train: Optional[list[CorpusConfig]] = None  # None: data.train
    valid: Optional[CorpusConfig] = None  # None: data.valid
    test: Optional[CorpusConfig] = None  # None: data.test
    # How much of this pair an epoch takes, as a factor of every corpus's own weight (1 = all
    # of it once; 3 = three times; 0.5 = half, drawn per (train.seed, epoch)). Or leave every
    # pair at 1 and set data.sampling_temperature.
    weight: float = 1.0

    @classmethod
    def from_text(cls, text: str, key: str) -> "PairConfig":
        """"en-de" -> PairConfig(src_lang="en", tgt_lang="de")."""
        parts = text.split("-")
        if len(parts) != 2 or not all(part.strip() for part in parts):
            raise XformerError(f"config key '{key}': expected SRC-TGT such as en-de (or a mapping), got {text!r}")
        return cls(src_lang=parts[0].strip(), tgt_lang=parts[1].strip())

    @property
    def name(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"


TARGET_TAGS = ("auto", "source", "none")
CORPUS_TAG = re.compile(r"<[A-Za-z0-9_-]+>")  # data.train[i].tag: a control piece such as <bt>
MAX_NUMBER_COPIES = 8  # data.number_augmentation: more copies would crowd out the sentences without numbers
MAX_JOINED_COPIES = 2  # data.concat_augmentation: more would make long pairs the bulk of the data
MAX_QUOTE_COPIES = 8  # data.quote_augmentation: as for numbers
MAX_WEIGHT = 1000  # data.train[i].weight, data.pairs[i].weight: copies of a corpus an epoch (inf overflowed)
MAX_VOCAB_SIZE = 1_000_000  # tokenizer.vocab_size: sentencepiece's own limit is an int32


@dataclass
class DataConfig:
    src_lang: str = "en"
    tgt_lang: str = "de"
    train: list[CorpusConfig] = field(default_factory=list)  # one corpus or a list
    valid: Optional[CorpusConfig] = None
    test: Optional[CorpusConfig] = None
    # Several directions in one model (docs/multilingual.md): [en-de, en-fr, de-en, ...]; each
    # reads data.train / valid / test (or its own) with its languages. Empty: the one direction
    # src_lang -> tgt_lang, as a bilingual config always had (src_lang and tgt_lang are unused
    # with pairs).
    pairs: list[PairConfig] = field(default_factory=list)
    # Per-pair sampling: an epoch takes from pair i in proportion to n_i ** (1 / T), n_i its
    # pairs (under the corpus weights), as many pairs in all as the data holds. 1 = as the data
    # is; 5 = small pairs drawn far more often (fairseq's temperature sampling). Drawn per
    # (train.seed, epoch), so a resumed run takes the same pairs (data/weights.py).
    sampling_temperature: float = 1.0
    # The target language as the first source token, OPUS-MT's >>deu<<: auto = when the
    # pairs have more than one target language; source = always; none = never.
    target_tag: str = "auto"
    lang_tags: dict[str, str] = field(default_factory=dict)  # tags of codes xformer does not know: {gsw: ">>gsw<<"}
    max_len: int = 256  # training pairs with a side longer than this (in pieces) are dropped
    max_len_ratio: float = 0.0  # drop training pairs whose longer side exceeds this times the shorter; 0 = off
    dedup: bool = False  # drop exact duplicate training pairs
    # Copies, on average, of each training pair with a number on both sides, the number replaced
    # by the same random digits on both (numbers the model learns to copy; docs/pipeline.md):
    # 0.3 = a copy of 30% of them, 2 = two copies of each.
    number_augmentation: float = 0.0
    # Copies, on average, of each training pair joined with another pair of its corpus (longer
    # inputs whose translation the model knows; data/concatenation.py): 0.3 = 30% of the pairs.
    concat_augmentation: float = 0.0
    # Drop training pairs whose numbers disagree: a source number the target lacks, or target
    # digits the source has no number for (eval-bleu's rules; data/number_filter.py). For a
    # teacher's translations, which lose numbers a student would learn to lose.
    drop_number_mismatch: bool = False
    # Copies, on average, of each training pair whose sides quote as many spans ("..." / „...“),
    # each span replaced by the same random words on both sides (quoted text the model learns to
    # copy; data/quote_augmentation.py): 4 = four copies of each.
    quote_augmentation: float = 0.0
    skip_invalid_utf8: bool = False  # drop lines that are not UTF-8 instead of stopping
    valid_max_sentences: int = 0  # 0 = validate on the whole valid set (per direction)
    cache_dir: str = ""  # tokenized-corpus cache; "" = <run_dir>/cache

    def directions(self) -> list[PairConfig]:
        """Every direction with its corpora filled in: data.pairs, else src_lang -> tgt_lang."""
        if not self.pairs:
            return [PairConfig(self.src_lang, self.tgt_lang, list(self.train), self.valid, self.test)]
        return [dataclasses.replace(pair, train=list(self.train) if pair.train is None else pair.train,
                                    valid=pair.valid or self.valid, test=pair.test or self.test)
                for pair in self.pairs]

    def languages(self) -> Languages:
        """The directions as a model knows them, with a tag per target language when it reads tags."""
        return Languages.of([(p.src_lang, p.tgt_lang) for p in self.directions()], self.reads_tags(), self.lang_tags)

    def reads_tags(self) -> bool:
        """Whether the source starts with the target language's tag (data.target_tag)."""
        targets = {p.tgt_lang for p in self.directions()}
        return self.target_tag == "source" or (self.target_tag == "auto" and len(targets) > 1)


@dataclass
class TokenizerConfig:
    model: Optional[str] = None  # an existing sentencepiece .model to reuse (joint) instead of training
    tgt_model: Optional[str] = None  # with joint: false, the target-side model to reuse
    joint: bool = True  # one vocabulary for both languages (needed for three-way tying)
    vocab_size: int = 8000
    model_type: str = "unigram"
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sentences sampled to train it (bounded memory)
    split_digits: bool = False  # every digit a piece of its own (numbers copied digit by digit)
    byte_fallback: bool = False  # characters outside the vocabulary as UTF-8 byte pieces, not unk


BATCHINGS = ("dynamic", "packed")
MAX_LENGTH_PENALTY = 10.0  # GNMT alpha: 0.6-2 in use; far above, (5 + length) / 6 ** alpha overflows a float
MAX_BEAM_SIZE = 256  # wider beams do not help (the beam search curse) and a 100k beam ran for hours
MAX_POSITIONS = 100_000  # model.max_positions: a sinusoidal table's initial rows (d_model floats each)
MAX_OUTPUT_PIECES = 10_000  # max_len_a x source pieces + max_len_b: an output past this is a loop, not a sentence
SEED_LIMIT = 2**32  # seeds 0 .. 2**32 - 1: numpy, torch and Python take them all (torch refuses past 2**63)
SCHEDULES = ("noam", "constant", "inverse_sqrt")


@dataclass
class TrainConfig:
    # Token slots (padding included) per batch, per side; auto = the largest batch that fits in
    # GPU memory, probed once at the start (train/batch_size.py; config.yaml keeps the value).
    max_tokens: Union[int, Literal["auto"]] = 4096
    update_freq: int = 1  # batches accumulated per optimizer step
    # Token slots per optimizer step; > 0 sets update_freq (the fewest batches of at most
    # max_tokens, in place of the value given) and max_tokens (equal shares). 0 = off.
    tokens_per_update: int = 0
    # Static batch shapes: lengths rounded up to a multiple of this, rows fixed per length
    # (data/batching.make_bucketed_batches), so compiled code and CUDA graphs are built once
    # per shape. 0 = off: every batch is as wide as its longest pair.
    length_bucket: int = 0
    # dynamic: batches of similar lengths, as wide as their longest pair (data/batching.py).
    # packed: one (rows, widths) shape for the whole run, several pairs back to back per row,
    # attention kept within each pair (data/packing.py): static shapes with little padding.
    batching: str = "dynamic"
    max_steps: int = 100_000
    max_epochs: int = 0  # 0 = no epoch limit
    max_minutes: float = 0.0  # 0 = no wall-clock limit
    # Start from a pretrained model's weights: an xformer checkpoint (.pt), a MarianMT / OPUS-MT
    # directory, or a Hub id such as Helsinki-NLP/opus-mt-en-de (train/init_from.py). Only the
    # weights are taken: optimizer, schedule, step, best score and early stopping start afresh.
    # The tokenizer and the model section come from the pretrained model: a model.* or
    # tokenizer.* key the config file or --set gives must agree with it (keys left out take the
    # pretrained values; model.dropout, attention_dropout and activation_dropout may differ).
    # A run that resumes from its last.pt does not read init_from again.
    init_from: Optional[str] = None
    # The learning-rate schedule (train/schedule.py):
    #   noam: lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), the paper's, for
    #     training from scratch (its peak at d_model 512 and 4000 warm-up steps is 7e-4);
    #   constant: linear warm-up to train.lr over warmup_steps, then train.lr;
    #   inverse_sqrt: linear warm-up to train.lr, then train.lr * sqrt(warmup_steps / step).
    # Fine-tuning a pretrained model wants a learning rate 10-30 times below a scratch run's
    # peak, e.g. constant or inverse_sqrt with lr 2e-5 to 1e-4 after a warm-up of a few hundred
    # steps (configs/finetune-opus-mt-en-de.yaml); Noam's peak would undo much of the pretraining.
    schedule: str = "noam"
    lr: float = 0.0  # peak learning rate of constant and inverse_sqrt; unused by noam (leave it 0)
    lr_scale: float = 1.0  # the Noam formula's factor
    warmup_steps: int = 4000  # noam: must be positive; constant / inverse_sqrt: 0 = no warm-up
    # > 0: the warm-up is this share of the planned steps instead (train/time_budget.py), so a
    # 25-minute run warms up for the same share of itself on a slow machine as on a fast one.
    warmup_fraction: float = 0.0
    # > 0: the last cooldown x planned steps bring the rate linearly down to ~0 at the planned
    # last step (train/schedule.py). 0 = the schedule alone (the paper's Noam).
    cooldown: float = 0.0
    # The steps this run plans to take: 0 = work them out (train/time_budget.py: from max_minutes,
    # by measuring a few steps once, else max_steps) when cooldown, warmup_fraction or
    # validations need them. The run writes the value into config.yaml and resumes with it.
    planned_steps: int = 0
    # model.dropout by the planned steps: {3500: 0.2} gives a run that plans 3500 steps or more
    # dropout 0.2 (with several thresholds, the largest the plan reaches), so one config serves a
    # fast machine, whose long run overfits, and a slow one. Resolved once with the plan, logged,
    # written to config.yaml; a resume keeps it. {} = model.dropout as given.
    dropout_by_planned_steps: dict[int, float] = field(default_factory=dict)
    # train.label_smoothing by the planned steps, the same way: {3500: 0.2}. Smoothing more, like
    # more dropout, pays only in a run long enough to overfit.
    label_smoothing_by_planned_steps: dict[int, float] = field(default_factory=dict)
    # The same rules counted in planned epochs (passes over the training data, as the batch plan
    # makes them), a unit that does not move with the batch size: {16.8: 0.2}. Give a setting's
    # rule in steps or in epochs, not both.
    dropout_by_planned_epochs: dict[float, float] = field(default_factory=dict)
    label_smoothing_by_planned_epochs: dict[float, float] = field(default_factory=dict)
    # train.max_tokens by the epochs a run plans at train.max_tokens: {10: 2000, 16.8: 3000} gives
    # a run planning 10 to 16.8 epochs 2000-token batches (more, smaller steps), below 10 and from 16.8
    # on the largest threshold's value or train.max_tokens. The run then plans again at the new
    # size (train/run_plan.py). Decided once, logged, written to config.yaml; a resume keeps it.
    max_tokens_by_planned_epochs: dict[float, int] = field(default_factory=dict)
    # The passes over the training data the planned steps make (worked out with them; recorded).
    planned_epochs: float = 0.0
    # > 0: validate this many times, evenly over the planned steps (the last at the end),
    # instead of every valid_every steps.
    validations: int = 0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    optimizer: str = "adam"  # adam (the paper) | adamw (decoupled weight decay); fused kernels on the CPU and CUDA
    # auto (bf16 on CUDA 8.0+ and CPUs with native bf16, fp16 on CUDA 7.x, else fp32) | bf16 | fp16 | fp32
    precision: str = "auto"
    compile: bool = False  # torch.compile the model for training
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 = no gradient clipping
    valid_every: int = 1000  # steps between validations (loss and BLEU); last.pt is saved then too
    save_every: int = 0  # steps between extra last.pt saves; 0 = only at validations
    keep_checkpoints: int = 0  # also keep the last N step checkpoints (checkpoint_STEP.pt) for averaging
    average_last: int = 0  # at the end, average the newest N kept step checkpoints; best.pt if its valid BLEU is higher
    # At the end, decode the valid set (beam decode.beam_size) with best.pt at each GNMT alpha
    # listed; best.pt keeps the best one as its decode.length_penalty. [] = off (train/tune.py).
    tune_length_penalty: list[float] = field(default_factory=list)
    # With several target languages: also pick an alpha per target language (the best mean
    # valid BLEU over the directions into it) and write it to best.pt's
    # decode.length_penalty_by_target; false = one alpha for every direction (the best mean
    # over them all), decode.length_penalty alone. BENCHMARKS.md (issue 27) compares the two.
    length_penalty_by_target: bool = False
    patience: int = 0  # stop after this many validations without a better BLEU; 0 = never
    max_nonfinite: int = 5  # stop after this many non-finite losses in a row (each is skipped)
    valid_beam_size: int = 1  # beam for validation BLEU (1 = greedy, cheapest)
    log_every: int = 50
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # CPU threads for torch; 0 = torch's default
    # Several processes (torchrun): auto = NCCL on CUDA, gloo on a CPU; gloo also runs on CUDA
    # tensors and lets ranks share one GPU (train/distributed.py).
    dist_backend: str = "auto"
    # The longest a rank waits in a collective (the others validating, rank 0 building the
    # data cache) before the run stops with one line instead of hanging.
    dist_timeout_minutes: float = 30.0


@dataclass
class DecodeConfig:
    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT alpha
    max_len_a: float = 1.0  # max output length = a * source length + b
    max_len_b: int = 50
    min_len: int = 1  # output pieces before eos at least; 1 = never an empty translation
    batch_size: int = 256  # sentences per decoding batch at most (bigger: fewer, fuller steps)
    max_tokens: int = 16000  # padded source tokens times beam size per decoding batch at most
    max_input_len: int = 0  # source pieces kept per line (longer lines are cut, with a warning); 0 = data.max_len
    # A multilingual model's alpha per target language ({de: 1.0, cs: 1.6}), used in place of
    # length_penalty when that target is asked for (target_lang) and no alpha is given;
    # train.tune_length_penalty writes it with train.length_penalty_by_target.
    length_penalty_by_target: dict[str, float] = field(default_factory=dict)

    def problems(self) -> list[tuple[str, str]]:
        """(field, why) for each impossible setting: the one check behind both config
        validation (``decode.FIELD``) and translation options (``--field``)."""
        found = []
        if not 1 <= self.beam_size <= MAX_BEAM_SIZE:
            found.append(("beam_size", f"must be 1 to {MAX_BEAM_SIZE}"))
        if not 0 <= self.length_penalty <= MAX_LENGTH_PENALTY:
            found.append(("length_penalty", f"must be 0 to {MAX_LENGTH_PENALTY:g} (GNMT alpha; the paper: 0.6)"))
        if not 0 <= self.max_len_a <= MAX_OUTPUT_PIECES:
            found.append(("max_len_a", f"must be 0 to {MAX_OUTPUT_PIECES}"))
        elif not 0 <= self.max_len_b <= MAX_OUTPUT_PIECES:
            found.append(("max_len_b", f"must be 0 to {MAX_OUTPUT_PIECES}"))
        elif self.max_len_a == 0 and self.max_len_b == 0:
            found.append(("max_len_b", "max_len_a and max_len_b cannot both be 0"))
        if self.min_len < 0:
            found.append(("min_len", "must be >= 0"))
        if self.batch_size < 1:
            found.append(("batch_size", "must be at least 1"))
        if self.max_tokens < 1:
            found.append(("max_tokens", "must be at least 1"))
        if self.max_input_len < 0:
            found.append(("max_input_len", "must be >= 0 (0 = data.max_len)"))
        if not all(0 <= alpha <= MAX_LENGTH_PENALTY for alpha in self.length_penalty_by_target.values()):
            found.append(("length_penalty_by_target", f"every alpha must be 0 to {MAX_LENGTH_PENALTY:g}"))
        return found


@dataclass
class Config:
    run_dir: str = "runs/default"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)  # owned by the model: model/config.py
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    # The dotted keys the config file and --set gave (load_config), defaults left out: what
    # train.init_from checks against the pretrained model. Not a field: never in config.yaml.
    set_keys: ClassVar[frozenset[str]] = frozenset()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def decode_settings(self) -> DecodeConfig:
        """``decode`` with its defaults resolved: max_input_len 0 = the training data.max_len
        (positions the model never saw in training are not trusted to it in translation)."""
        return dataclasses.replace(self.decode, max_input_len=self.decode.max_input_len or self.data.max_len)


# The settings a rule by the plan sets: the rule's key under train -> (the setting, the plan's unit).
PLANNED_RULES = {"dropout_by_planned_steps": ("model.dropout", "steps"),
                 "label_smoothing_by_planned_steps": ("train.label_smoothing", "steps"),
                 "dropout_by_planned_epochs": ("model.dropout", "epochs"),
                 "label_smoothing_by_planned_epochs": ("train.label_smoothing", "epochs")}
BATCH_RULE = ("max_tokens_by_planned_epochs", "train.max_tokens")  # applied by train/run_plan.py, before a second plan


def rule_choice(rule: dict, planned: float) -> Optional[tuple[float, Any]]:
    """(threshold, value) of the largest threshold ``planned`` reaches; None below them all or without a plan."""
    threshold = max((t for t in rule if planned and planned >= t), default=None)
    return None if threshold is None else (threshold, rule[threshold])


def planned_amount(train: "TrainConfig", unit: str) -> float:
    return train.planned_steps if unit == "steps" else train.planned_epochs


def describe_plan(amount: float, unit: str) -> str:
    return f"{amount} steps" if unit == "steps" else f"{amount:.1f} epochs"


def with_setting(config: Config, dotted: str, value: Any) -> Config:
    """``config`` with the setting ``section.name`` at ``value``."""
    section_name, name = dotted.split(".")
    section = dataclasses.replace(getattr(config, section_name), **{name: value})
    return dataclasses.replace(config, **{section_name: section})


def planned_settings(config: Config, log: Callable[[str], None] = lambda _: None) -> Config:
    """``config`` with each setting of PLANNED_RULES as its rule gives it for the planned steps
    or epochs (the largest threshold they reach); unchanged without a plan or a rule that applies."""
    for rule_key, (setting, unit) in PLANNED_RULES.items():
        amount = planned_amount(config.train, unit)
        choice = rule_choice(getattr(config.train, rule_key), amount)
        section_name, name = setting.split(".")
        current = getattr(getattr(config, section_name), name)
        if choice is None or choice[1] == current:
            continue
        log(f"{setting} {current:g} -> {choice[1]:g}: the run plans {describe_plan(amount, unit)}, "
            f"at least {choice[0]:g} (train.{rule_key})")
        config = with_setting(config, setting, choice[1])
    return config


def _clear_replaced_rules(tree: dict, overridden: set[str]) -> None:
    """A setting given on the command line wins over the file's rules for it (tokens_per_update
    sets max_tokens), and a rule given there replaces the file's rule in the other unit."""
    rules = [(f"train.{k}", v[0]) for k, v in PLANNED_RULES.items()] + [(f"train.{BATCH_RULE[0]}", BATCH_RULE[1])]
    # one entry of a rule (train.dropout_by_planned_steps.3500=0.2) gives the rule
    overridden = overridden | {rule for rule, _ in rules if any(key.startswith(rule + ".") for key in overridden)}
    given = overridden | ({BATCH_RULE[1]} if "train.tokens_per_update" in overridden else set())
    for rule, setting in rules:
        replaced = setting in given or any(r in overridden for r, s in rules if s == setting and r != rule)
        section = tree.setdefault("train", {})
        if replaced and rule not in overridden and isinstance(section, dict):  # not a mapping: build_section says so
            section[rule.split(".", 1)[1]] = {}


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None,
                base: Optional[dict] = None) -> Config:
    """Read a YAML file (or start from ``base``), apply ``key=value`` overrides, validate."""
    tree: dict = dict(base or {})
    if path is not None:
        tree = merge_trees(tree, read_tree(path))
    overridden = apply_overrides(tree, overrides or [])
    _clear_replaced_rules(tree, overridden)
    cfg = build_section(Config, tree)
    validate(cfg)
    cfg.set_keys = frozenset(dotted_keys(tree))
    return cfg


def config_from_dict(tree: dict) -> Config:
    cfg = build_section(Config, tree)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    t, d, tok, dec = cfg.train, cfg.data, cfg.tokenizer, cfg.decode
    _check_model(cfg.model)
    _check_tokenizer(tok)
    require(t.max_tokens == "auto" or t.max_tokens > 0, "train.max_tokens", "must be positive, or auto")
    require(t.tokens_per_update >= 0, "train.tokens_per_update", "must be >= 0 (0 = off)")
    require(0 <= t.length_bucket <= d.max_len + 1, "train.length_bucket",
            f"must be 0 (off) to data.max_len + 1 ({d.max_len + 1}): a batch's width is rounded up to a multiple of it")
    require(t.batching in BATCHINGS, "train.batching", f"must be one of {', '.join(BATCHINGS)}")
    require(not (t.batching == "packed" and t.length_bucket), "train.length_bucket",
            "must be 0 with train.batching: packed (packed batches have one shape already)")
    require(t.update_freq >= 1, "train.update_freq", "must be at least 1")
    require(t.max_steps > 0, "train.max_steps", "must be positive")
    require(t.max_epochs >= 0, "train.max_epochs", "must be >= 0")
    require(t.max_minutes >= 0, "train.max_minutes", "must be >= 0")
    _check_schedule(t)
    require(0.0 <= t.label_smoothing < 1.0, "train.label_smoothing", "must be in [0, 1)")
    require(0.0 <= t.adam_beta1 < 1.0, "train.adam_beta1", "must be in [0, 1)")
    require(0.0 <= t.adam_beta2 < 1.0, "train.adam_beta2", "must be in [0, 1)")
    require(0.0 < t.adam_eps < 1.0, "train.adam_eps", "must be in (0, 1) (the paper: 1e-9)")
    require(0.0 <= t.weight_decay < math.inf, "train.weight_decay", "must be >= 0 and finite")
    require(0.0 <= t.clip_norm < math.inf, "train.clip_norm", "must be >= 0 and finite (0 = no clipping)")
    require(t.valid_every > 0, "train.valid_every", "must be positive")
    for name in ("save_every", "keep_checkpoints", "patience", "average_last"):
        require(getattr(t, name) >= 0, f"train.{name}", "must be >= 0")
    require(all(0 <= alpha <= MAX_LENGTH_PENALTY for alpha in t.tune_length_penalty), "train.tune_length_penalty",
            f"every alpha must be 0 to {MAX_LENGTH_PENALTY:g}")
    require(1 <= t.valid_beam_size <= MAX_BEAM_SIZE, "train.valid_beam_size", f"must be 1 to {MAX_BEAM_SIZE}")
    require(t.average_last != 1, "train.average_last", "0 (off) or at least 2: the mean of one checkpoint is itself")
    require(t.average_last <= t.keep_checkpoints, "train.average_last",
            f"averages kept checkpoints: set train.keep_checkpoints to at least {t.average_last}")
    require(t.optimizer in ("adam", "adamw"), "train.optimizer", "must be adam or adamw")
    require(t.precision in TRAINING_PRECISIONS, "train.precision",
            f"must be one of {', '.join(TRAINING_PRECISIONS)}, not {t.precision!r}")
    require(t.max_nonfinite >= 1, "train.max_nonfinite", "must be at least 1")
    require(0 <= t.seed < SEED_LIMIT, "train.seed", f"must be 0 to {SEED_LIMIT - 1}, not {t.seed}")
    require(t.log_every > 0, "train.log_every", "must be positive")
    require(t.threads >= 0, "train.threads", "must be >= 0")
    threads_refused = too_many_threads(t.threads, "it")
    require(not threads_refused, "train.threads", threads_refused)
    require(t.dist_backend in ("auto", "nccl", "gloo"), "train.dist_backend", "must be auto, nccl or gloo")
    require(t.dist_timeout_minutes > 0, "train.dist_timeout_minutes", "must be positive")
    require(re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", t.device) is not None, "train.device",
            "must be auto, cpu, cuda, cuda:N or mps")
    require(bool(cfg.run_dir.strip()), "run_dir", "must name a directory for the run")
    _check_data(d)
    for name, why in dec.problems():
        require(False, f"decode.{name}", why)
    targets = d.languages().targets
    for code in dec.length_penalty_by_target:
        require(code in targets, f"decode.length_penalty_by_target.{code}",
                f"not a target language of this model ({', '.join(targets)})")



def _check_model(m: ModelConfig) -> None:
    for name in ("d_model", "d_ff", "n_heads", "encoder_layers", "decoder_layers", "max_positions"):
        require(getattr(m, name) > 0, f"model.{name}", "must be positive")
    require(m.max_positions <= MAX_POSITIONS, "model.max_positions",
            f"must be at most {MAX_POSITIONS:,} (the table grows past it when a longer line comes)")
    require(m.d_model % m.n_heads == 0, "model.d_model", f"{m.d_model} is not divisible by model.n_heads={m.n_heads}")
    require(m.d_model % 2 == 0, "model.d_model", f"{m.d_model} must be even (sines and cosines take half each)")
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        require(0.0 <= getattr(m, name) < 1.0, f"model.{name}", "must be in [0, 1)")
    require(m.activation in ACTIVATION_NAMES, "model.activation", f"must be one of {', '.join(ACTIVATION_NAMES)}")
    require(m.bos_id >= 0, "model.bos_id", "must be a token id (>= 0)")
    require(m.output_pieces == 0 or m.restrict_output, "model.output_pieces",
            "is counted by the trainer with model.restrict_output: true; leave it out")
    require(m.output_pieces >= 0, "model.output_pieces", "must be >= 0")


def _check_tokenizer(tok: TokenizerConfig) -> None:
    require(16 <= tok.vocab_size <= MAX_VOCAB_SIZE, "tokenizer.vocab_size", f"must be 16 to {MAX_VOCAB_SIZE:,}")
    require(tok.input_sentence_size >= 1, "tokenizer.input_sentence_size",
            "must be at least 1 (sentences sampled to train the tokenizer)")
    require(tok.model_type in ("unigram", "bpe", "char", "word"), "tokenizer.model_type",
            "must be unigram, bpe, char or word")
    require(0.0 < tok.character_coverage <= 1.0, "tokenizer.character_coverage", "must be in (0, 1]")
    require(not tok.tgt_model or bool(tok.model), "tokenizer.tgt_model",
            "the target side of tokenizer.model: give both (without tokenizer.model both sides are trained)")
    require(not (tok.tgt_model and tok.joint), "tokenizer.tgt_model", "only used with tokenizer.joint: false")


def _check_plan_rules(t: TrainConfig) -> None:
    """The rules by planned steps or epochs (PLANNED_RULES, BATCH_RULE); _coerce has checked the types."""
    for rule_key, (setting, unit) in PLANNED_RULES.items():
        for amount, value in getattr(t, rule_key).items():
            require(amount > 0 and 0.0 <= value < 1.0, f"train.{rule_key}.{amount}",
                    f"needs a positive {unit[:-1]} count and a {setting.split('.')[1]} in [0, 1)")
    for setting in sorted({setting for setting, _ in PLANNED_RULES.values()}):
        given = [k for k, (ruled, _) in PLANNED_RULES.items() if ruled == setting and getattr(t, k)]
        if len(given) > 1:
            require(False, f"train.{given[-1]}", f"give {setting}'s rule in steps or in epochs, not both")
    for amount, value in t.max_tokens_by_planned_epochs.items():
        require(amount > 0 and value > 0, f"train.{BATCH_RULE[0]}.{amount}",
                "needs a positive epoch count and a positive whole number of tokens")
    require(not t.max_tokens_by_planned_epochs or (t.max_tokens != "auto" and not t.tokens_per_update),
            f"train.{BATCH_RULE[0]}", "needs a number in train.max_tokens and no train.tokens_per_update")


def _check_schedule(t: TrainConfig) -> None:
    """The learning-rate schedule, the plan (planned steps and epochs, the rules by them) and
    where the run starts (train.init_from)."""
    require(t.schedule in SCHEDULES, "train.schedule", f"must be one of {', '.join(SCHEDULES)}")
    require(0 < t.lr_scale < math.inf, "train.lr_scale", "must be positive and finite")
    require(0.0 <= t.warmup_fraction < 1.0, "train.warmup_fraction", "must be in [0, 1) (0 = train.warmup_steps)")
    require(0.0 <= t.cooldown <= 1.0, "train.cooldown", "must be in [0, 1] (a share of the planned steps; 0 = none)")
    require(t.planned_steps >= 0, "train.planned_steps", "must be >= 0 (0 = work it out)")
    require(t.planned_epochs >= 0, "train.planned_epochs", "must be >= 0 (worked out with the planned steps)")
    require(t.validations >= 0, "train.validations", "must be >= 0 (0 = every train.valid_every steps)")
    _check_plan_rules(t)
    if t.schedule == "noam":
        require(t.warmup_steps > 0, "train.warmup_steps", "must be positive")
        require(t.lr == 0, "train.lr",
                "is for train.schedule constant or inverse_sqrt; noam's peak is set by train.lr_scale")
    else:
        require(t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0 (0 = no warm-up)")
        require(0 < t.lr < math.inf, "train.lr", f"must be positive and finite with train.schedule: {t.schedule}")
    require(t.init_from is None or bool(t.init_from.strip()), "train.init_from",
            "give a checkpoint, a MarianMT directory or a Hub id (or leave it out)")


def _check_data(d: DataConfig) -> None:
    require(d.max_len > 0, "data.max_len", "must be positive")
    require(d.valid_max_sentences >= 0, "data.valid_max_sentences", "must be >= 0 (0 = the whole valid set)")
    require(d.max_len_ratio == 0 or d.max_len_ratio >= 1, "data.max_len_ratio", "must be 0 (off) or at least 1")
    require(0 <= d.number_augmentation <= MAX_NUMBER_COPIES, "data.number_augmentation",
            f"copies of each pair with numbers, 0 (off) to {MAX_NUMBER_COPIES}, got {d.number_augmentation}")
    require(0 <= d.concat_augmentation <= MAX_JOINED_COPIES, "data.concat_augmentation",
            f"joined copies of each pair, 0 (off) to {MAX_JOINED_COPIES}, got {d.concat_augmentation}")
    require(0 <= d.quote_augmentation <= MAX_QUOTE_COPIES, "data.quote_augmentation",
            f"copies of each pair with quotes, 0 (off) to {MAX_QUOTE_COPIES}, got {d.quote_augmentation}")
    if not d.pairs:
        require(d.src_lang != d.tgt_lang, "data.tgt_lang", "must differ from data.src_lang")
        require(len(d.train) > 0, "data.train", "needs at least one corpus")
    _check_corpora(d.train, "data.train", d.valid, d.test)
    require(d.target_tag in TARGET_TAGS, "data.target_tag", f"must be one of {', '.join(TARGET_TAGS)}")
    # Without a tag nothing tells the model which target to write: --target-lang would do nothing.
    targets = list(dict.fromkeys(p.tgt_lang for p in d.directions()))
    require(d.target_tag != "none" or len(targets) < 2, "data.target_tag",
            f"none leaves a model of several target languages ({', '.join(targets)}) no way to tell which to "
            "write: use auto or source")
    require(d.sampling_temperature > 0, "data.sampling_temperature", "must be positive (1 = as the data is)")
    seen: set[tuple[str, str]] = set()
    for i, pair in enumerate(d.pairs):
        key = f"data.pairs[{i}]"
        require(bool(pair.src_lang) and bool(pair.tgt_lang), key, "needs src_lang and tgt_lang (en-de)")
        require(pair.src_lang != pair.tgt_lang, f"{key}.tgt_lang", f"must differ from its src_lang ({pair.name})")
        require((pair.src_lang, pair.tgt_lang) not in seen, key, f"{pair.name} is listed twice")
        seen.add((pair.src_lang, pair.tgt_lang))
        require(bool(pair.train if pair.train is not None else d.train), f"{key}.train",
                f"{pair.name} has no training data: give {key}.train, or data.train for every pair")
        _check_corpora(pair.train or [], f"{key}.train", pair.valid, pair.test, f"{key}.")
        require(0 < pair.weight <= MAX_WEIGHT, f"{key}.weight",
                f"must be above 0 and at most {MAX_WEIGHT} (1 = all of the pair once an epoch)")
        require(pair.weight == 1 or d.sampling_temperature == 1, f"{key}.weight",
                "give pair weights or data.sampling_temperature, not both")
    _check_shared_corpora(d)
    _check_tags(d)


def _check_shared_corpora(d: DataConfig) -> None:
    """A shared corpus (data.train, valid, test) that several pairs read must follow each pair's
    languages (prefix.<lang>, a translation column, columns named by language): fixed src/tgt
    files or columns gave every pair the same two sides, an en-fr pair German targets."""
    for part in ("train", "valid", "test"):
        readers = [p.name for p in d.pairs if getattr(p, part) is None]
        shared = getattr(d, part)
        corpora = shared if isinstance(shared, list) else [shared] if shared is not None else []
        if len(readers) < 2:
            continue
        for i, corpus in enumerate(corpora):
            fixed = next((k for k in ("src", "tgt", "src_column", "tgt_column") if getattr(corpus, k)), None)
            where = f"data.{part}[{i}]" if len(corpora) > 1 else f"data.{part}"
            require(fixed is None, f"{where}.{fixed}",
                    f"is read the same for every pair that shares it ({', '.join(readers)}): give a prefix "
                    f"(prefix.<lang>) or language-named columns, or each pair its own data.pairs[i].{part}")


def _check_corpora(train: list[CorpusConfig], key: str, valid: Optional[CorpusConfig], test: Optional[CorpusConfig],
                   prefix: str = "data.") -> None:
    for i, corpus in enumerate(train):
        _check_corpus(corpus, f"{key}[{i}]" if len(train) > 1 else key)
        require(0 < corpus.weight <= MAX_WEIGHT, f"{key}[{i}].weight" if len(train) > 1 else f"{key}.weight",
                f"must be above 0 and at most {MAX_WEIGHT} (1 = every pair once an epoch)")
        where = f"{key}[{i}]" if len(train) > 1 else key
        require(corpus.tag is None or CORPUS_TAG.fullmatch(corpus.tag) is not None, f"{where}.tag",
                f"{corpus.tag!r} must look like <xxx> (letters, digits, _ or -; no spaces)")
        require(0 < corpus.until <= 1, f"{where}.until", "must be above 0 and at most 1 (a share of the planned steps)")
    require(not train or any(corpus.until == 1 for corpus in train), key,
            "every corpus has an until below 1: one must train to the end")
    for name, corpus in (("valid", valid), ("test", test)):
        if corpus is not None:
            _check_corpus(corpus, f"{prefix}{name}")
            require(corpus.tag is None, f"{prefix}{name}.tag", f"only {key} corpora take a tag")
            require(corpus.weight == 1, f"{prefix}{name}.weight", f"only {key} corpora take a weight")
            require(corpus.until == 1, f"{prefix}{name}.until", f"only {key} corpora take an until")


def _check_tags(d: DataConfig) -> None:
    """data.lang_tags are tags, and every target language has one when the model reads tags."""
    for code, tag in d.lang_tags.items():
        require(TAG.fullmatch(tag) is not None, f"data.lang_tags.{code}",
                f"{tag!r} must look like >>xxx<< (no spaces)")
    if not d.reads_tags():
        return
    for i, pair in enumerate(d.directions()):
        try:
            tag_for(pair.tgt_lang, d.lang_tags)
        except XformerError as exc:
            raise XformerError(f"config key '{f'data.pairs[{i}]' if d.pairs else 'data'}.tgt_lang': {exc}") from None


def _check_corpus(c: CorpusConfig, key: str) -> None:
    kinds = [bool(c.prefix or c.src or c.tgt), bool(c.dataset), bool(c.data_files)]
    require(sum(kinds) == 1, key, "give exactly one source: prefix (or src + tgt), dataset, or data_files")
    if kinds[0]:
        require(bool(c.prefix) != bool(c.src and c.tgt) and not (bool(c.src) ^ bool(c.tgt)), key,
                "give prefix, or both src and tgt")
    require(bool(c.src_column) == bool(c.tgt_column), key, "give both src_column and tgt_column, or neither")
    # options a kind of source does not read are refused, not ignored (a valid set's split of a data file read it whole)
    require(not (kinds[0] and c.src_column), f"{key}.src_column", "names a column of a dataset or data files; "
            "plain files (prefix, src + tgt) have none")
    require(not (c.data_files and c.split not in (None, "train")), f"{key}.split",
            "data_files are read whole, as the one split 'train' (give each split its own files)")
    require(c.max_pairs >= 0, f"{key}.max_pairs", f"must be 0 (all) or more, got {c.max_pairs}")
