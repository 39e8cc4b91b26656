"""The training configs of the pipeline's models, each the model config with the pipeline's
overrides, its own run_dir and its data: the reverse model the same config with the
direction swapped, the teacher the real pairs plus the tagged back-translations, the
student the distilled pairs (and the real ones when asked). Training is ``xformer train``'s
loop, unchanged: a killed stage resumes from its last.pt."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from xformer_cli.config import Config, CorpusConfig, load_config
from xformer_cli.errors import XformerError
from xformer_cli.file_stamps import file_stamp
from xformer_cli.pipeline.record import rebased
from xformer_cli.pipeline.settings import PipelineConfig
from xformer_cli.settings_file import apply_overrides, read_tree

Edit = Callable[[dict], None]


def as_overrides(values: dict[str, Any], prefix: str = "") -> list[str]:
    """{"model.d_model": 256} -> ["model.d_model=256"], each as train's --set takes it (values in
    YAML's flow style: a mapping keeps its number keys, {3500: 0.2}). A nested section under a
    name ({"model": {"d_model": 256}}, what --set model_set.model.d_model=256 makes) is the same;
    a mapping under a dotted key ({"data.train": {"dataset": DIR}}) replaces that key's value, as
    --set 'data.train={dataset: DIR}' does, and so does one with other keys than names ({16.8: 0.2})."""
    found = []
    for key, value in values.items():
        section = isinstance(key, str) and key.isidentifier()
        if section and isinstance(value, dict) and value and all(isinstance(k, str) and k.isidentifier()
                                                                 for k in value):
            found.extend(as_overrides(value, f"{prefix}{key}."))
        else:
            found.append(f"{prefix}{key}={_flow(value)}")
    return found


def _flow(value: Any) -> str:
    """A value as YAML reads it back: JSON for a scalar or a list of them, YAML's flow style for
    what holds a mapping (JSON would make its number keys strings)."""
    if isinstance(value, (dict, list)) and "{" in json.dumps(value):
        return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return json.dumps(value)


def base_config(pc: PipelineConfig) -> Config:
    """The model config as every stage starts from it (model_set applied), checked."""
    config = load_config(pc.model_config_path, as_overrides(pc.model_set))
    if config.data.pairs:
        raise XformerError(f"config key 'model_config': {pc.model_config_path} has data.pairs; the pipeline "
                           "trains one direction (src_lang -> tgt_lang)")
    return config


def stage_config(pc: PipelineConfig, stage: str, stage_set: dict[str, Any], edit: Optional[Edit] = None,
                 folder: Optional[Path] = None) -> Config:
    """The model config for ``stage``: its data edited by ``edit``, model_set and the stage's
    own overrides applied, run_dir ``folder`` (by default <run_dir>/<stage>)."""
    extra = {"run_dir": str(folder or Path(pc.run_dir) / stage)}
    if pc.threads:
        extra["train.threads"] = pc.threads
    overrides = as_overrides(pc.model_set) + as_overrides(stage_set) + as_overrides(extra)
    try:
        tree = read_tree(pc.model_config_path)
        apply_overrides(tree, overrides)  # data.train.max_pairs=... reaches the real corpora before the edit
        data = tree.setdefault("data", {})
        if not isinstance(data, dict):
            raise XformerError(f"{pc.model_config_path}: 'data' must be a mapping")
        if edit is not None:
            edit(data)
        # the rest again through load_config, which lets a key given outright replace a rule's setting
        return load_config(None, [o for o in overrides if not o.startswith("data.")], base=tree)
    except XformerError as exc:
        raise XformerError(f"pipeline stage {stage}: {exc}") from None


def _train_list(data: dict) -> list:
    train = data.get("train") or []
    return list(train) if isinstance(train, list) else [train]


def swapped(base: Config) -> Edit:
    def edit(data: dict) -> None:
        data["src_lang"], data["tgt_lang"] = base.data.tgt_lang, base.data.src_lang
    return edit


def with_corpus(prefix: Path, keep_real: bool, **corpus: Any) -> Edit:
    """data.train: the corpus at ``prefix`` (``corpus``: its weight, tag), after the real
    corpora when ``keep_real``."""
    return with_corpora(keep_real, {"prefix": prefix, **corpus})


def with_corpora(keep_real: bool, *corpora: dict[str, Any]) -> Edit:
    """data.train: ``corpora`` (each a prefix and its weight, tag, ...), after the real corpora
    when ``keep_real``."""
    def edit(data: dict) -> None:
        added = [{**corpus, "prefix": str(corpus["prefix"])} for corpus in corpora]
        data["train"] = (_train_list(data) if keep_real else []) + added
    return edit


# Data options added after the pipeline shipped: out of a stage's stamp while off, so that a
# finished stage of a run made before them stays finished (an option changes nothing until set)
LATER_DATA_OPTIONS = ("quote_augmentation",)
LATER_CORPUS_OPTIONS = {"until": 1.0}  # data.train[i].until


def config_stamp(config: Config, run_dir: Path, every_file: bool = True) -> dict:
    """What a training stage's fingerprint takes of its config: every key (less the later
    options while off), and the stamp (path, size, bytes) of each file it reads outside the
    pipeline's run_dir (those inside come from upstream stages, whose fingerprints stand for them):
    the training corpora's and the valid set's, which picks best.pt and its length penalty.
    ``every_file`` False: as earlier versions stamped them (the training corpora's text files
    alone: no data files, saved datasets or valid set), to recognise their records."""
    d = config.data
    stamps = [stamp for corpus in d.train for stamp in _corpus_files(corpus, config, run_dir, every_file=every_file)]
    if every_file and d.valid is not None:
        stamps += _corpus_files(d.valid, config, run_dir)
    keys = asdict(config)
    for name in LATER_DATA_OPTIONS:
        if not keys["data"][name]:
            del keys["data"][name]
    _drop_later_corpus_options(keys["data"])
    return {"config": keys, "files": stamps}


def corpora_stamp(config: Config, run_dir: Path, every_file: bool = True) -> dict:
    """What a stage that reads the training corpora (not the model) takes of the config: each
    corpus's keys and the files outside the run folder, as config_stamp hashes them."""
    files = [stamp for corpus in config.data.train
             for stamp in _corpus_files(corpus, config, run_dir, every_file=every_file)]
    return {"train": config_stamp(config, run_dir, every_file=False)["config"]["data"]["train"], "files": files}


def _drop_later_corpus_options(tree: Any) -> None:
    """Every corpus's options added later (LATER_CORPUS_OPTIONS), wherever a corpus sits in the
    data section, left out while at their defaults."""
    if isinstance(tree, dict):
        if "prefix" in tree and "weight" in tree:  # a corpus
            for name, default in LATER_CORPUS_OPTIONS.items():
                if tree.get(name) == default:
                    del tree[name]
        for value in tree.values():
            _drop_later_corpus_options(value)
    elif isinstance(tree, list):
        for value in tree:
            _drop_later_corpus_options(value)


def scored_files_stamp(config: Config, run_dir: Path, every_file: bool = True) -> list[str]:
    """The stamps of the valid and test files outside the run folder (every pair's own too):
    what a stage that scores on them takes, so new references score again."""
    d = config.data
    sets = [(corpus, (d.src_lang, d.tgt_lang)) for corpus in (d.valid, d.test)]
    for pair in d.pairs:  # a pair's own sets, or the shared ones read with its languages
        sets += [(corpus, (pair.src_lang, pair.tgt_lang)) for corpus in (pair.valid or d.valid, pair.test or d.test)]
    stamps = [stamp for corpus, langs in sets if corpus is not None
              for stamp in _corpus_files(corpus, config, run_dir, langs, every_file)]
    return list(dict.fromkeys(stamps))  # a set two pairs share, once


def _corpus_files(corpus: CorpusConfig, config: Config, run_dir: Path,
                  langs: Optional[tuple[str, str]] = None, every_file: bool = True) -> list[str]:
    """The stamps of the files ``corpus`` reads outside ``run_dir``: its two text files (read with
    ``langs``, the data's own by default), its data files, or every file of a dataset saved to
    disk (a Hub name and split are in the config). ``every_file`` False: the text files alone."""
    from xformer_cli.data.sources import corpus_paths, data_file_paths

    if corpus.prefix or corpus.src:
        paths = list(corpus_paths(corpus, *(langs or (config.data.src_lang, config.data.tgt_lang))))
    elif every_file and corpus.data_files:
        paths = data_file_paths(corpus.data_files)
    elif every_file and corpus.dataset and Path(corpus.dataset).is_dir():
        paths = sorted(f for f in Path(corpus.dataset).rglob("*") if f.is_file())
    else:
        return []
    inside = run_dir.resolve()
    return [file_stamp(p) for p in paths if p.exists() and inside not in p.resolve().parents]


def trained_model(run_dir: Path) -> Path:
    """The checkpoint a finished training stage hands on: best.pt (averaged and length-penalty
    tuned when the config asks), else last.pt."""
    for name in ("best.pt", "last.pt"):
        if (run_dir / name).is_file():
            return run_dir / name
    raise XformerError(f"{run_dir} holds no best.pt or last.pt")


def follow_a_moved_run(run_dir: Path, home: Path, log: Callable[[str], None]) -> None:
    """A training stage's last.pt written before its pipeline's run folder (``home``) moved names
    the old folder's corpora and tokenizer, and train's resume check compares those paths: its
    config is rewritten to name the same files in the new folder (weights, optimizer and step
    untouched; an atomic write), so the stage resumes where it stopped."""
    from xformer_cli.checkpoint_file import load_checkpoint, read_light, save_checkpoint

    last = run_dir / "last.pt"
    if not last.is_file():
        return
    saved = Path(str(read_light(last).get("config", {}).get("run_dir", "")))  # its weights unread
    inside = run_dir.resolve().relative_to(home.resolve()).parts  # ("teacher",) or ("teacher", "seed-2")
    if saved.resolve() == run_dir.resolve() or saved.parts[-len(inside):] != inside:
        return  # not moved, or not this pipeline's layout: train's own check decides
    old = str(saved.parents[len(inside) - 1])
    state = load_checkpoint(last)
    state["config"] = rebased(state["config"], old, str(home))
    save_checkpoint(state, last)
    log(f"{last}: its run began in {old}; its config now names the same files in {home}")

