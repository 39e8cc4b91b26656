"""Every run's start (``resolve``): resume from last.pt, fine-tune (``train.init_from``), or afresh.

The source is an xformer checkpoint, a MarianMT / OPUS-MT directory or a Hub id (the last
two through ``xformer_cli.importers.marian``). Only the weights are taken: the optimizer,
the schedule, the step, the best score and early stopping start afresh (a pretrained
checkpoint's best BLEU would keep best.pt from ever being written).

The tokenizer and the architecture are the pretrained model's: the run's ``model`` and
``tokenizer`` sections are replaced by the pretrained ones, and a key of those sections that
the config file or ``--set`` gives (``Config.set_keys``; keys left out are not compared)
must agree with the pretrained value, or the run is refused naming the key. Dropout and
``restrict_output`` are training settings, not architecture: the user's ``model.dropout``,
``attention_dropout``, ``activation_dropout`` and ``restrict_output`` win where given (the
weights are the same either way: a restricted layer scores rows of the whole one, and this
run counts its own data's pieces).

A run that resumes from its last.pt takes all of this from last.pt and does not read the
pretrained model again (an import can take minutes, or need the network).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from torch import nn

from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.config import Config, config_from_dict
from xformer_cli.errors import XformerError
from xformer_cli.tokenizer import Tokenizer
from xformer_cli.train import run_checkpoints

# May differ from the pretrained model's.
TRAINING_MODEL_KEYS = ("dropout", "attention_dropout", "activation_dropout", "restrict_output")
_SECTIONS = ("model", "tokenizer")


@dataclass
class Pretrained:
    source: str
    tokenizer: Tokenizer
    weights: Optional[dict]  # None when the run resumes: last.pt holds newer weights


def looks_local(source: str) -> bool:
    """Whether ``source`` names a path rather than a Hub id (``owner/name``): it ends in .pt,
    starts like a path ('/', '.', '~') or holds more than one '/'."""
    return source.endswith(".pt") or source.startswith(("/", ".", "~")) or source.count("/") > 1


def load_pretrained(source: str) -> dict:
    """The checkpoint state (``load_checkpoint``'s format) of an xformer checkpoint, a
    MarianMT directory or a Hub id."""
    path = Path(source).expanduser()
    if path.is_file():
        return load_checkpoint(path)
    if not path.exists() and looks_local(source):
        raise XformerError(f"config key 'train.init_from': {source} not found "
                           "(give an xformer checkpoint, a MarianMT directory or a Hub id)")
    run = [path / name for name in ("best.pt", "last.pt") if (path / name).is_file()] if path.is_dir() else []
    if run and not (path / "config.json").is_file():  # an xformer run folder, not a MarianMT directory
        raise XformerError(f"config key 'train.init_from': {source} is an xformer run folder: give its checkpoint, "
                           f"e.g. {run[0]}")
    from xformer_cli.importers.marian import load_marian  # the importer pulls in transformers' file formats

    return load_marian(str(path) if path.is_dir() else source)


def tokenizer_from_state(state: dict) -> Tokenizer:
    """The tokenizer a checkpoint state holds."""
    return Tokenizer.from_state(state)


def take_architecture(config: Config, pretrained: Config, source: str) -> Config:
    """``config`` with the pretrained model and tokenizer sections; a key of those that the
    user gave and that contradicts the pretrained value is refused, naming it."""
    for section in _SECTIONS:
        mine, theirs = getattr(config, section), getattr(pretrained, section)
        for key in sorted(k.split(".", 1)[1] for k in config.set_keys if k.startswith(section + ".")):
            if section == "model" and key in TRAINING_MODEL_KEYS:
                continue
            if getattr(mine, key) != getattr(theirs, key):
                raise XformerError(
                    f"config key '{section}.{key}': {getattr(mine, key)!r} contradicts train.init_from {source} "
                    f"({getattr(theirs, key)!r}); leave it out, the {section} comes from the pretrained model")
    tuned = {key: getattr(config.model, key) for key in TRAINING_MODEL_KEYS if f"model.{key}" in config.set_keys}
    if not tuned.get("restrict_output", True):
        tuned["output_pieces"] = 0  # the whole layer; a restricted run counts its own (plan_run)
    resolved = dataclasses.replace(config, model=dataclasses.replace(pretrained.model, **tuned),
                                   tokenizer=dataclasses.replace(pretrained.tokenizer))
    resolved.set_keys = config.set_keys
    return resolved


def resolve(config: Config, overwrite: bool,
            log: Callable[[str], None]) -> tuple[Config, Optional[Pretrained], Optional[dict]]:
    """(the config to train with, the pretrained model or None, last.pt's state to resume or
    None). Reads last.pt once; imports the pretrained model only when there is none."""
    last = run_checkpoints.read_last(config, overwrite)
    source = config.train.init_from
    if source is None:
        return config, None, run_checkpoints.check_resumable(config, last)
    if last is not None:
        if last["config"].get("train", {}).get("init_from") != source:
            raise run_checkpoints.mismatch_error(Path(config.run_dir) / "last.pt", "train.init_from")
        state, weights = last, None
    else:
        state = load_pretrained(source)
        weights = state["model"]
    try:
        pretrained_config = config_from_dict(state["config"])
    except XformerError as exc:
        raise XformerError(f"config key 'train.init_from': {source}: its config does not load ({exc})") from None
    resolved = take_architecture(config, pretrained_config, source)
    tokenizer = tokenizer_from_state(state["tokenizer"])
    if weights is not None:
        log(f"init_from: {source}: its weights, tokenizer and model section; optimizer, schedule and step start afresh")
    return resolved, Pretrained(source, tokenizer, weights), run_checkpoints.check_resumable(resolved, last)


def for_prepare(config: Config, log: Callable[[str], None]) -> tuple[Config, Optional[Tokenizer]]:
    """What ``xformer prepare`` builds the cache with: with train.init_from, the config and
    tokenizer training will take from the pretrained model, so train finds this very cache."""
    if not config.train.init_from:
        return config, None
    resolved, pretrained, _ = resolve(config, False, log)
    return resolved, pretrained.tokenizer if pretrained is not None else None


def load_weights(model: nn.Module, pretrained: Pretrained) -> None:
    """Put the pretrained weights into ``model`` (built from the pretrained model section),
    then let them go. The output pieces a restricted model scored are its data's: this run
    counts its own (``output_pieces``), so they are not taken."""
    weights = {k: v for k, v in pretrained.weights.items() if k != "output_pieces"}
    try:
        result = model.load_state_dict(weights, strict=False)
        wrong = [k for k in result.missing_keys if k != "output_pieces"] + list(result.unexpected_keys)
        if wrong:
            raise RuntimeError(f"keys missing or unexpected: {', '.join(wrong[:4])}")
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise XformerError(f"config key 'train.init_from': {pretrained.source}: the weights do not fit its "
                           f"model section ({first[:160]})") from None
    pretrained.weights = None
