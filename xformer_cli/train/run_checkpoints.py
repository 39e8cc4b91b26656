"""What a training run keeps on disk, and taking it up again.

The run directory (``prepare_run_dir``), the training state a checkpoint holds (``state``,
``restore``), which files are written when (``save``: last.pt, best.pt and the newest
``train.keep_checkpoints`` step checkpoints), and which settings a resumed run must share
with the one it continues (``read_last``, ``check_resumable``: called for every run by
``init_from.resolve``, which decides between resuming, fine-tuning and starting afresh).
The file format and its version are ``xformer_cli.checkpoint_file``'s: older checkpoints
reach ``restore`` already upgraded.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import yaml

from xformer_cli.checkpoint_file import kept_checkpoints, load_checkpoint, step_checkpoint
from xformer_cli.config import PLANNED_RULES, Config, config_from_dict, planned_settings, with_setting
from xformer_cli.errors import XformerError
from xformer_cli.fileio import atomic_file
from xformer_cli.tokenizer import Tokenizer
from xformer_cli.train import batch_size
from xformer_cli.train.state import Counters, RunState


def prepare_run_dir(config: Config, overwrite: bool) -> Path:
    """Create (or, with ``overwrite``, clear) the run directory. A fresh run in a directory
    that only logged (its run was stopped before its first save) starts a new metrics.jsonl."""
    run_dir = Path(config.run_dir)
    if overwrite:
        for old in ["last.pt", "best.pt", "average.pt", "metrics.jsonl", *(p.name for p in kept_checkpoints(run_dir))]:
            (run_dir / old).unlink(missing_ok=True)
    elif not (run_dir / "last.pt").is_file():
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def write_config(config: Config, precision: Optional[str] = None) -> None:
    """RUN_DIR/config.yaml: the config as the run trains with it (what the plan worked out
    included), headed by the precision this machine resolved ``train.precision`` to."""
    header = f"# train.precision {config.train.precision} ran as {precision} on this machine\n" if precision else ""
    text = header + yaml.safe_dump(config.to_dict(), sort_keys=False)
    with atomic_file(Path(config.run_dir) / "config.yaml", "w", encoding="utf-8") as f:  # a kill keeps the old one
        f.write(text)


# Settings a resumed run must share with the run it continues: they decide the model, the
# data and its order. Everything else (max_steps, devices, validation cadence...) may change.
RESUME_KEYS = ("train.init_from", "model", "tokenizer", "data", "train.seed", "train.max_tokens", "train.update_freq",
               "train.batching", "train.length_bucket", "train.tokens_per_update")


def _with_defaults(saved: dict, defaults: dict) -> dict:
    """``saved`` with the keys it lacks (added to the config since it was written) at their defaults."""
    out = dict(defaults)
    for key, value in saved.items():
        nested = isinstance(value, dict) and isinstance(defaults.get(key), dict)
        out[key] = _with_defaults(value, defaults[key]) if nested else value
    return out


def _completed(saved: dict) -> dict:
    """A saved config with every key it lacks at its default, corpora included (a corpus key
    added since, such as ``weight``); one this xformer cannot read is completed as far as it goes."""
    try:
        return config_from_dict(saved).to_dict()
    except XformerError:
        return _with_defaults(saved, Config().to_dict())


# Data settings that neither build the model nor order its batches: the test set is read only by
# eval-bleu, and the cache is found by its contents' fingerprint wherever it lives.
_NOT_RESUME_DATA = ("test", "cache_dir")
_PATH_KEYS = ("prefix", "src", "tgt", "data_files")


def _same_files(corpus):
    """A corpus (or list of them) with its file paths spelt one way: "../shared/data/x/train" and
    "/work/shared/data/x/train" name the same files. A dataset name is a path only where one exists
    (else it is a Hub name, which no spelling changes)."""
    if isinstance(corpus, list):
        return [_same_files(item) for item in corpus]
    if not isinstance(corpus, dict):
        return corpus
    out = dict(corpus)
    for key, value in corpus.items():
        path_like = key in _PATH_KEYS or (key in ("dataset", "fallback_dataset") and value and os.path.exists(value))
        if path_like and isinstance(value, str):
            out[key] = os.path.realpath(value)
    return out


def _resume_view(config: dict) -> dict:
    """The part of a config dict a resume compares: data without the test set and cache folder,
    corpus paths resolved."""
    data = {k: v for k, v in config.get("data", {}).items() if k not in _NOT_RESUME_DATA}
    for key in ("train", "valid"):
        data[key] = _same_files(data.get(key))
    data["pairs"] = [{k: _same_files(v) for k, v in pair.items() if k != "test"} if isinstance(pair, dict) else pair
                     for pair in data.get("pairs", [])]
    return {**config, "data": data}


def resume_mismatch(saved: dict, current: dict) -> Optional[str]:
    """The first of RESUME_KEYS (down to the differing inner key) where two configs differ;
    a key the saved config lacks reads as its default. The test set, the cache folder and the
    spelling of a corpus's path are not compared (_resume_view)."""
    saved, current = _resume_view(_completed(saved)), _resume_view(current)
    for key in RESUME_KEYS:
        a, b = saved, current
        for part in key.split("."):
            a, b = a.get(part), b.get(part)
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                inner = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                return f"{key}.{inner}"
            return key
    return None


def mismatch_error(path: Path, key: str) -> XformerError:
    return XformerError(f"{path} was trained with a different '{key}'; use another run_dir, "
                        "or --overwrite to start afresh")


# What a checkpoint must hold to continue a run (an averaged or exported model has weights only).
TRAINING_STATE = ("model", "optimizer", "schedule", "rng", "step", "config")
COUNTERS = ("step", "epoch", "batches_done")  # what a resume counts on (a hand-edited "12" failed deep in it)


def read_last(config: Config, overwrite: bool) -> Optional[dict]:
    """The run directory's last.pt (None: there is none, or ``overwrite`` starts afresh). A
    directory holding another run's checkpoints but no last.pt is refused: a fresh run there
    would average, prune and overwrite them as its own."""
    run_dir = Path(config.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise XformerError(f"run_dir {run_dir} is a file, not a directory")
    path = run_dir / "last.pt"
    if overwrite:
        return None
    if not path.is_file():
        earlier = [name for name in ("best.pt", "average.pt") if (run_dir / name).is_file()]
        earlier += [p.name for p in kept_checkpoints(run_dir)][-2:]
        if earlier:
            raise XformerError(f"{run_dir} holds an earlier run ({', '.join(earlier)}) but no last.pt to resume it "
                               "from; use another run_dir, or --overwrite to start afresh there")
        return None
    last = load_checkpoint(path)
    missing = [key for key in TRAINING_STATE if key not in last]
    if missing:
        raise XformerError(f"{path} holds no training state to resume from (no '{missing[0]}': an averaged or "
                           "exported model?); put the run's own last.pt back, or --overwrite to start afresh")
    bad = next((key for key in COUNTERS if key in last and not _whole(last[key])), None)
    if bad:
        raise XformerError(f"{path}: '{bad}' must be a whole number, 0 or more, not {last[bad]!r} (an edited file?); "
                           "put the run's own last.pt back, or --overwrite to start afresh")
    return last


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_resumable(config: Config, last: Optional[dict]) -> Optional[dict]:
    """``last`` (read_last), refused when it was trained with other settings that matter (RESUME_KEYS)."""
    if last is None:
        return None
    mismatch = resume_mismatch(last["config"], resumed_config(config, last).to_dict())
    if mismatch:
        raise mismatch_error(Path(config.run_dir) / "last.pt", mismatch)
    return last


def check_same_tokenizer(config: Config, last: Optional[dict], tokenizer: Tokenizer) -> None:
    """A resumed run's tokenizer (the run's, or one trained now from the training data) must be
    the one ``last`` was trained with: the same settings over changed data train another one,
    whose ids the weights do not mean. Checked before the run directory is written."""
    if last is not None and isinstance(last.get("tokenizer"), dict) and \
            _tokenizer_identity(tokenizer.state()) != _tokenizer_identity(last["tokenizer"]):
        raise XformerError(f"{Path(config.run_dir) / 'last.pt'} was trained with another tokenizer than the "
                           "training data gives now (changed since?); use another run_dir, or --overwrite to "
                           "start afresh")


def trained_tokenizer_check(config: Config) -> Callable[[Tokenizer], None]:
    """For ``xformer prepare`` in a run folder that has trained (its last.pt): a tokenizer other
    than the one last.pt was trained with is refused, not written over the run's (train refuses
    the same settings). last.pt is read when the check runs: inside the run folder's lock."""
    path = Path(config.run_dir) / "last.pt"

    def keep(tokenizer: Tokenizer) -> None:
        if not path.is_file():
            return
        try:
            check_same_tokenizer(config, load_checkpoint(path), tokenizer)
        except XformerError:
            raise XformerError(f"{path} was trained with another tokenizer than these settings give, which "
                               "prepare would write over the run's; use another run_dir") from None
    return keep


def check_ids_fit(config: Config, tokenizer: Tokenizer) -> None:
    """``model.bos_id`` must be a piece of the target vocabulary (known once the tokenizer is):
    checked before the run directory is written, not at the first step's lookup."""
    size = tokenizer.tgt_vocab_size
    if config.model.bos_id >= size:
        raise XformerError(f"config key 'model.bos_id': {config.model.bos_id} is not a piece of the target "
                           f"vocabulary ({size} pieces)")


def _tokenizer_identity(state: dict) -> tuple:
    return state.get("src"), state.get("tgt") or None, state.get("vocab"), state.get("tgt_vocab")


def resumed_config(config: Config, state: dict) -> Config:
    """``config`` with what the checkpointed run worked out before its first step: the batch
    size (train.max_tokens: auto, train.tokens_per_update, train.max_tokens_by_planned_epochs)
    and the planned steps and epochs. A resume
    takes them from the checkpoint and never probes or measures again."""
    saved = state["config"]["train"]
    train = batch_size.from_checkpoint(config.train, saved)
    if not train.planned_steps:  # a checkpoint from before planning has none: then max_steps plans
        train = dataclasses.replace(train, planned_steps=saved.get("planned_steps", 0))
    if not train.planned_epochs:
        train = dataclasses.replace(train, planned_epochs=saved.get("planned_epochs", 0.0))
    config = dataclasses.replace(config, train=train)
    if config.model.restrict_output:  # counted in the data before the first step
        counted = state["config"].get("model", {}).get("output_pieces", 0)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, output_pieces=counted))
    if "planned_epochs" not in saved:  # saved before the rules by epochs: the settings its plan gave, as saved
        config = _ruled_settings_as_saved(config, state["config"])
    return planned_settings(config)  # as the plan set it


def _ruled_settings_as_saved(config: Config, saved: dict) -> Config:
    """``config`` with each setting a rule by planned epochs would set taken from ``saved``
    (a checkpoint without planned epochs, whose plan the rule cannot read)."""
    for rule_key, (setting, unit) in PLANNED_RULES.items():
        section_name, name = setting.split(".")
        if unit == "epochs" and getattr(config.train, rule_key) and name in saved.get(section_name, {}):
            config = with_setting(config, setting, saved[section_name][name])
    return config


def rng_state(device: torch.device) -> dict:
    """This process's random state: the CPU generator, and the CUDA one of its device."""
    rng = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def state(run: RunState, rng_per_rank: Optional[list[dict]] = None) -> dict:
    """Everything to continue exactly; ``rng_per_rank``: every rank's random state
    (``Distributed.gather``), so each resumes its own dropout stream."""
    rng_per_rank = rng_per_rank or [rng_state(run.device)]
    rng = {**rng_per_rank[0], "ranks": rng_per_rank}
    c = run.counters
    return {
        "config": run.config.to_dict(),
        "tokenizer": run.tokenizer.state(),
        "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
        "schedule": run.schedule.state_dict(), "scaler": run.scaler.state_dict(), "rng": rng,
        "step": c.step, "epoch": c.epoch, "batches_done": c.batches_done,
        "best_bleu": c.best_bleu, "bad_validations": c.bad_validations,
        "nonfinite_total": c.nonfinite_total, "oom_total": c.oom_total, "precision": run.precision,
        "log_window": {"loss_sum": c.window_loss_sum, "good_tokens": c.window_good_tokens,
                       "open": list(c.window_open)},
        "train_seconds": round(run.minutes() * 60, 3),
        "corpora_ended": dict(c.corpora_ended),
        "data_key": run.data_key,
    }


def restore(run: RunState, state: dict) -> None:
    """Put a (current-format) checkpoint's training state into ``run``."""
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.schedule.load_state_dict(state["schedule"])
    if state["scaler"]:  # empty when the run had no loss scaling
        run.scaler.load_state_dict(state["scaler"])
    _restore_rng(run, state["rng"]["ranks"], state["step"])
    window = state["log_window"]
    run.counters = Counters(state["step"], state["epoch"], state["batches_done"], state["best_bleu"],
                            state["bad_validations"], state["nonfinite_total"], state["oom_total"],
                            window["loss_sum"], window["good_tokens"], state.get("train_seconds", 0.0),
                            dict(state.get("corpora_ended", {})))
    if len(window.get("open", ())) == 2:  # saved at a signal (checkpoints before it have none)
        run.counters.window_open = (float(window["open"][0]), float(window["open"][1]))
    run.metrics.keep_until(run.counters.step)  # lines logged after this save (a kill -9) are logged again
    run.log(f"resuming {run.run_dir / 'last.pt'}: step {run.counters.step}, epoch {run.counters.epoch}, "
            f"batch {run.counters.batches_done}, {run.counters.train_seconds / 60:.1f} min trained")
    if state.get("data_key") and run.data_key and state["data_key"] != run.data_key:
        # The same tokenizer (check_same_tokenizer) over other text: allowed (a corrected corpus), but said.
        run.log("warning: the training data changed since last.pt was saved (other token ids): the run "
                "goes on with the data as it is now, so its batches are not those of an uninterrupted run")


def _restore_rng(run: RunState, ranks: list[dict], step: int) -> None:
    dist, device = run.dist, run.device
    if len(ranks) != dist.world_size:  # another number of processes than the run was saved with
        run.log(f"resuming with {dist.world_size} processes, saved with {len(ranks)}: "
                "data order and weights continue exactly, dropout draws do not")
        torch.manual_seed(run.config.train.seed + dist.rank + 1_000_003 * step)  # fresh, distinct streams
        return
    rng = ranks[dist.rank]  # each rank takes up its own stream again
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and device.type == "cuda":
        cuda = rng["cuda"]
        # Checkpoints of single-process runs before per-rank states hold every device's state (a list).
        torch.cuda.set_rng_state(cuda[device.index or 0] if isinstance(cuda, list) else cuda, device)


def save(run: RunState, best: bool = False, kept: bool = True) -> None:
    """Write last.pt (and best.pt, and with ``kept`` a kept step checkpoint) on rank 0; every
    rank calls it, handing its random state over."""
    rng_per_rank = run.dist.gather(rng_state(run.device), "a checkpoint (every rank's random state)")
    if not run.dist.is_main:
        return
    run_dir, keep = run.run_dir, run.config.train.keep_checkpoints
    # One file written, the other names linked to it: the same state under each name.
    step_name = [step_checkpoint(run_dir, run.counters.step)] if keep and kept else []
    names = [run_dir / "last.pt"] + step_name + ([run_dir / "best.pt"] if best else [])

    def prune() -> None:  # after the new step checkpoint is on disk
        for old in kept_checkpoints(run_dir)[:-keep] if step_name else []:
            old.unlink(missing_ok=True)

    run.writer.write(state(run, rng_per_rank), names[0], names[1:], prune)
