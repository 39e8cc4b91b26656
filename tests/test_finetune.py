"""Fine-tuning: train.init_from (weights only, architecture and tokenizer from the pretrained
model, exact resume without a second import), the fine-tuning schedules, and per-corpus
weights (deterministic per (seed, epoch), resumable)."""

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from xformer_cli.checkpoint_file import load_checkpoint, load_model
from xformer_cli.config import Config, CorpusConfig, TrainConfig, load_config
from xformer_cli.data.batching import make_batches
from xformer_cli.data.encoded import encode_corpus
from xformer_cli.data.sources import load_corpus
from xformer_cli.data.weights import epoch_indices, epoch_pairs, source_untils, to_cache_indices
from xformer_cli.errors import XformerError
from xformer_cli.model.transformer import ModelConfig
from xformer_cli.train import init_from
from xformer_cli.train.schedule import NoamSchedule, constant_lr, inverse_sqrt_lr, make_schedule, noam_lr
from xformer_cli.train.trainer import Trainer, train
from xformer_cli.train.validation import validation_sums

from helpers import assert_one_line_error, head, losses, quiet, tiny_config, write_lines, xformer


# -- schedules ---------------------------------------------------------------------------------

def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.0)


def test_constant_and_inverse_sqrt_warm_up_linearly_to_the_given_lr():
    assert constant_lr(50, 3e-5, 100) == pytest.approx(1.5e-5)
    assert constant_lr(100, 3e-5, 100) == constant_lr(10_000, 3e-5, 100) == pytest.approx(3e-5)
    assert constant_lr(1, 3e-5, 0) == 3e-5  # no warm-up
    assert inverse_sqrt_lr(50, 1e-4, 100) == pytest.approx(5e-5)
    assert inverse_sqrt_lr(100, 1e-4, 100) == pytest.approx(1e-4)
    assert inverse_sqrt_lr(400, 1e-4, 100) == pytest.approx(5e-5)  # sqrt(100 / 400)
    assert max(inverse_sqrt_lr(s, 1e-4, 100) for s in range(1, 5000)) == pytest.approx(1e-4)


def test_make_schedule_follows_train_schedule_and_noam_stays_the_papers():
    noam = make_schedule(_optimizer(), TrainConfig(warmup_steps=10, lr_scale=2.0), d_model=64)
    assert isinstance(noam, NoamSchedule)
    assert [noam.step() for _ in range(20)] == [noam_lr(s, 64, 10, 2.0) for s in range(1, 21)]  # bit for bit
    opt = _optimizer()
    constant = make_schedule(opt, TrainConfig(schedule="constant", lr=3e-5, warmup_steps=4), d_model=64)
    assert [constant.step() for _ in range(6)] == pytest.approx([0.75e-5, 1.5e-5, 2.25e-5, 3e-5, 3e-5, 3e-5])
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-5)
    again = make_schedule(opt, TrainConfig(schedule="inverse_sqrt", lr=1e-4, warmup_steps=4), d_model=64)
    again.load_state_dict({"step_num": 15})
    assert again.step() == pytest.approx(1e-4 * (4 / 16) ** 0.5)


@pytest.mark.parametrize("sets, message", [
    (["train.lr=3e-5"], "config key 'train.lr': is for train.schedule constant or inverse_sqrt; noam's peak is set by train.lr_scale"),
    (["train.schedule=constant"], "config key 'train.lr': must be positive and finite with train.schedule: constant"),
    (["train.schedule=cosine"], "config key 'train.schedule': must be one of noam, constant, inverse_sqrt"),
    (["train.schedule=constant", "train.lr=1e-4", "train.warmup_steps=-1"], "config key 'train.warmup_steps': must be >= 0 (0 = no warm-up)"),
    (["data.train.weight=0"], "config key 'data.train.weight': must be above 0 and at most 1000 (1 = every pair once an epoch)"),
    (["data.valid.weight=0.5"], "config key 'data.valid.weight': only data.train corpora take a weight"),
    (["train.init_from= "], "config key 'train.init_from': give a checkpoint, a MarianMT directory or a Hub id (or leave it out)"),
])
def test_fine_tuning_keys_are_validated(sets, message):
    with pytest.raises(XformerError) as info:
        load_config("configs/multi30k.yaml", sets)
    assert str(info.value) == message


def test_a_constant_schedule_without_warm_up_validates():
    cfg = load_config("configs/multi30k.yaml", ["train.schedule=constant", "train.lr=1e-4", "train.warmup_steps=0"])
    assert (cfg.train.schedule, cfg.train.lr, cfg.train.warmup_steps) == ("constant", 1e-4, 0)


# -- which keys the user set, and the pretrained architecture ------------------------------------

def _yaml(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump({"data": {"train": {"prefix": "corpus/train"}}, **tree}), encoding="utf-8")
    return path


def test_load_config_records_the_keys_the_file_and_overrides_give(tmp_path):
    cfg = load_config(_yaml(tmp_path / "c.yaml", {"model": {"d_ff": 128}, "train": {"seed": 3}}), ["model.n_heads=2"])
    assert cfg.set_keys == {"data.train.prefix", "model.d_ff", "model.n_heads", "train.seed"}
    assert "set_keys" not in cfg.to_dict()  # never in config.yaml or a checkpoint
    assert Config().set_keys == frozenset()


def _pretrained_config() -> Config:
    return Config(model=ModelConfig(d_model=64, d_ff=128, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0))


def test_the_architecture_comes_from_the_pretrained_model_and_user_keys_must_agree(tmp_path):
    cfg = load_config(_yaml(tmp_path / "c.yaml", {"model": {"d_ff": 128, "dropout": 0.3}}))
    resolved = init_from.take_architecture(cfg, _pretrained_config(), "pre.pt")
    assert (resolved.model.d_model, resolved.model.encoder_layers, resolved.model.d_ff) == (64, 2, 128)
    assert resolved.model.dropout == 0.3  # a training setting: the user's value wins
    assert resolved.model.attention_dropout == 0.0
    cfg = load_config(_yaml(tmp_path / "d.yaml", {"model": {"d_ff": 128}}), ["model.d_model=256"])
    with pytest.raises(XformerError) as info:
        init_from.take_architecture(cfg, _pretrained_config(), "pre.pt")
    assert str(info.value) == ("config key 'model.d_model': 256 contradicts train.init_from pre.pt (64); "
                               "leave it out, the model comes from the pretrained model")
    cfg = load_config(_yaml(tmp_path / "e.yaml", {"tokenizer": {"model": "my.model"}}))
    with pytest.raises(XformerError, match="^config key 'tokenizer.model': 'my.model' contradicts"):
        init_from.take_architecture(cfg, _pretrained_config(), "pre.pt")


def test_a_missing_local_init_from_is_one_line_and_a_hub_id_goes_to_the_importer(tmp_path, monkeypatch):
    for missing in (str(tmp_path / "nope.pt"), "runs/x/best.pt", "./opus-mt-dir"):
        with pytest.raises(XformerError) as info:
            init_from.load_pretrained(missing)
        assert str(info.value) == (f"config key 'train.init_from': {missing} not found "
                                   "(give an xformer checkpoint, a MarianMT directory or a Hub id)")
    asked = []
    fake = types.ModuleType("xformer_cli.importers.marian")
    fake.load_marian = lambda source: asked.append(source) or {"fake": True}
    monkeypatch.setitem(sys.modules, "xformer_cli.importers.marian", fake)
    assert init_from.load_pretrained("Helsinki-NLP/opus-mt-en-de") == {"fake": True}
    (tmp_path / "marian").mkdir()
    init_from.load_pretrained(str(tmp_path / "marian"))
    assert asked == ["Helsinki-NLP/opus-mt-en-de", str(tmp_path / "marian")]

    run = tmp_path / "run"  # an xformer run folder: its checkpoint is meant, not a MarianMT directory
    run.mkdir()
    (run / "last.pt").write_bytes(b"weights")
    (run / "best.pt").write_bytes(b"weights")
    with pytest.raises(XformerError, match=f"^config key 'train.init_from': {run} is an xformer run folder: give "
                                           f"its checkpoint, e.g. {run / 'best.pt'}$"):
        init_from.load_pretrained(str(run))
    assert len(asked) == 2


# -- per-corpus weights -------------------------------------------------------------------------

def test_epoch_indices_take_each_corpus_by_its_weight_deterministically_per_seed_and_epoch():
    sizes, weights = [1000, 3000, 10], [1.0, 0.2, 2.5]
    one = epoch_indices(sizes, weights, seed=1, epoch=1)
    assert np.array_equal(one, epoch_indices(sizes, weights, seed=1, epoch=1))
    assert not np.array_equal(one, epoch_indices(sizes, weights, seed=1, epoch=2))
    assert not np.array_equal(one, epoch_indices(sizes, weights, seed=2, epoch=1))
    corpus = np.searchsorted(np.cumsum(sizes), one, side="right")
    assert np.bincount(corpus).tolist() == [1000, 600, 25]
    assert np.array_equal(np.unique(one[corpus == 0]), np.arange(1000))  # weight 1: every pair once
    picked = one[corpus == 1]
    assert len(np.unique(picked)) == 600 and picked.min() >= 1000 and picked.max() < 4000  # no pair twice
    assert np.bincount(one[corpus == 2] - 4000).tolist().count(2) == 10 - 5  # twice each, plus half once more
    assert epoch_indices(sizes, [1.0, 1.0, 1.0], 1, 1) is None
    with pytest.raises(XformerError, match="no pair to train on"):
        epoch_indices([3], [0.1], 1, 1)


def test_over_epochs_a_down_weighted_corpus_is_sampled_evenly():
    counts = np.zeros(500, np.int64)
    for epoch in range(1, 101):
        counts += np.bincount(epoch_indices([500], [0.3], 7, epoch), minlength=500)
    assert counts.sum() == 100 * 150
    assert counts.min() > 10 and counts.max() < 55  # binomial(100, 0.3): mean 30


class _Cache:
    def __init__(self, sizes):
        rng = np.random.default_rng(0)
        n = sum(sizes)
        self.src_lens, self.tgt_lens = rng.integers(1, 40, n), rng.integers(1, 40, n)
        self.source_pairs = sizes


def test_default_weights_leave_the_batches_as_they_were():
    cache = _Cache([300, 200])
    picked, src, tgt = epoch_pairs(cache, [CorpusConfig(), CorpusConfig()], seed=1, epoch=3)
    assert picked is None and src is cache.src_lens and tgt is cache.tgt_lens
    before = make_batches(cache.src_lens, cache.tgt_lens, 500, 1, 3)
    after = to_cache_indices(make_batches(src, tgt, 500, 1, 3), picked)
    assert all(np.array_equal(a, b) for a, b in zip(before, after)) and len(before) == len(after)


def test_weighted_batches_hold_cache_indices_of_the_picked_pairs():
    cache = _Cache([300, 200])
    corpora = [CorpusConfig(), CorpusConfig(weight=0.5)]
    picked, src, tgt = epoch_pairs(cache, corpora, seed=1, epoch=1)
    batches = to_cache_indices(make_batches(src, tgt, 500, 1, 1), picked)
    flat = np.sort(np.concatenate(batches))
    assert np.array_equal(flat, picked)
    width = np.maximum(cache.src_lens, cache.tgt_lens) + 1
    assert all(len(b) * width[b].max() <= 500 for b in batches)  # the budget holds for the pairs the indices name
    nested = to_cache_indices([[np.array([0, 1])], [np.array([2])]], picked)  # packed rows
    assert [r.tolist() for rows in nested for r in rows] == [picked[[0, 1]].tolist(), picked[[2]].tolist()]


def test_a_corpus_whose_until_came_takes_no_pair_and_the_others_keep_theirs():
    cache = _Cache([300, 200])
    corpora = [CorpusConfig(), CorpusConfig(weight=0.5, until=0.75)]
    full, _, _ = epoch_pairs(cache, corpora, seed=1, epoch=2)
    assert len(full) == 400 and (full >= 300).sum() == 100
    picked, src, _ = epoch_pairs(cache, corpora, seed=1, epoch=2, left_out={1})
    assert np.array_equal(picked, np.arange(300)) and np.array_equal(src, cache.src_lens[:300])
    assert source_untils(load_config("configs/multi30k.yaml", ["data.train=[{prefix: a}, {prefix: b, until: 0.75}]"]).data) \
        == [("data.train[0] (a)", 1.0), ("data.train[1] (b)", 0.75)]


# -- fine-tuning runs --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pretrained(small_corpus, tmp_path_factory) -> Path:
    """A training run's last.pt (optimizer state, step 12, a best BLEU): the pretrained model."""
    run_dir = tmp_path_factory.mktemp("pretrained")
    train(tiny_config(small_corpus, run_dir, **{"train.max_steps": 12, "train.valid_every": 6, "model.encoder_layers": 2,
                                                 "model.decoder_layers": 2}), log=quiet, progress=False)
    return run_dir / "last.pt"


def finetune_config(corpus: Path, run_dir: Path, source, *sets: str, train_corpora=None):
    """A fine-tuning config with no model or tokenizer section: both come from ``source``."""
    tree = {
        "run_dir": str(run_dir),
        "data": {"train": train_corpora or {"prefix": f"{corpus}/train"}, "valid": {"prefix": f"{corpus}/valid"},
                 "valid_max_sentences": 50},
        "train": {"init_from": str(source), "schedule": "constant", "lr": 1e-3, "warmup_steps": 5, "max_steps": 30,
                  "valid_every": 30, "max_tokens": 600, "log_every": 1, "threads": 1, "device": "cpu",
                  "precision": "fp32"},
        "decode": {"max_len_a": 0.5, "max_len_b": 3},
    }
    path = _yaml(run_dir.parent / f"{run_dir.name}.yaml", tree)
    return load_config(path, list(sets))


def _valid_loss(model, trainer: Trainer) -> float:
    """Label-smoothed loss per target token, as validation sums it (train/validation.py)."""
    loss, _, tokens = validation_sums(model, trainer.state.valid[0].encoded, 600, torch.device("cpu"), 0.1).tolist()
    return loss / tokens


@pytest.mark.slow
def test_init_from_starts_from_the_pretrained_weights_afresh_and_30_steps_lower_the_valid_loss(
        small_corpus, pretrained, tmp_path):
    trainer = Trainer(finetune_config(small_corpus, tmp_path / "ft", pretrained), log=quiet, progress=False)
    saved = load_checkpoint(pretrained)
    assert saved["step"] == 12 and saved["best_bleu"] is not None and saved["optimizer"]["state"]
    assert (trainer.counters.step, trainer.counters.epoch, trainer.counters.best_bleu, trainer.counters.bad_validations) == (0, 0, None, 0)
    assert trainer.state.schedule.step_num == 0 and not trainer.state.optimizer.state
    assert trainer.config.model == load_model(pretrained)[2].model
    assert trainer.state.tokenizer.src_model_bytes == saved["tokenizer"]["src"]
    for key, value in trainer.state.model.state_dict().items():
        assert torch.equal(value, saved["model"][key]), key
    before = _valid_loss(trainer.state.model, trainer)
    assert before == _valid_loss(load_model(pretrained)[0], trainer)  # step 0 is the pretrained model
    result = trainer.run()
    assert result.steps == 30
    assert _valid_loss(trainer.state.model, trainer) < before - 0.1
    written = yaml.safe_load((tmp_path / "ft" / "config.yaml").read_text())
    assert written["train"]["init_from"] == str(pretrained) and written["model"]["encoder_layers"] == 2


@pytest.mark.slow
def test_a_stopped_fine_tuning_run_resumes_exactly_without_importing_again(small_corpus, pretrained, tmp_path, monkeypatch):
    whole = train(finetune_config(small_corpus, tmp_path / "a", pretrained, "train.max_steps=14"), log=quiet, progress=False)
    assert whole.steps == 14
    real, calls = init_from.load_pretrained, []

    def once(source):
        calls.append(source)
        if len(calls) > 1:
            raise AssertionError("the pretrained model was read again on resume")
        return real(source)

    monkeypatch.setattr(init_from, "load_pretrained", once)
    train(finetune_config(small_corpus, tmp_path / "b", pretrained, "train.max_steps=7"), log=quiet, progress=False)
    resumed = train(finetune_config(small_corpus, tmp_path / "b", pretrained, "train.max_steps=14"), log=quiet, progress=False)
    assert resumed.steps == 14 and calls == [str(pretrained)]
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(1, 15))
    for step in range(8, 15):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step
    wa, wb = load_checkpoint(tmp_path / "a" / "last.pt")["model"], load_checkpoint(tmp_path / "b" / "last.pt")["model"]
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_resuming_with_another_init_from_is_refused(small_corpus, pretrained, tmp_path):
    train(finetune_config(small_corpus, tmp_path / "run", pretrained, "train.max_steps=2"), log=quiet, progress=False)
    with pytest.raises(XformerError) as info:
        Trainer(finetune_config(small_corpus, tmp_path / "run", tmp_path / "other.pt"), log=quiet, progress=False)
    assert str(info.value) == (f"{tmp_path / 'run' / 'last.pt'} was trained with a different 'train.init_from'; "
                               "use another run_dir, or --overwrite to start afresh")


@pytest.mark.slow
def test_a_marian_source_goes_through_the_importer(small_corpus, pretrained, tmp_path, monkeypatch):
    fake = types.ModuleType("xformer_cli.importers.marian")
    fake.load_marian = lambda source: load_checkpoint(pretrained)
    monkeypatch.setitem(sys.modules, "xformer_cli.importers.marian", fake)
    trainer = Trainer(finetune_config(small_corpus, tmp_path / "ft", "Helsinki-NLP/opus-mt-en-de"), log=quiet, progress=False)
    saved = load_checkpoint(pretrained)["model"]
    assert all(torch.equal(value, saved[key]) for key, value in trainer.state.model.state_dict().items())
    assert trainer.config.train.init_from == "Helsinki-NLP/opus-mt-en-de"


@pytest.mark.slow
def test_prepare_builds_the_cache_with_the_pretrained_tokenizer(small_corpus, pretrained, tmp_path):
    from xformer_cli.data.prepare import prepare_data

    config, tokenizer = init_from.for_prepare(finetune_config(small_corpus, tmp_path / "ft", pretrained), quiet)
    prepared = prepare_data(config, log=quiet, tokenizer=tokenizer)  # what `xformer prepare` runs
    assert prepared.tokenizer.src_model_bytes == load_checkpoint(pretrained)["tokenizer"]["src"]
    assert not (tmp_path / "ft" / "tokenizer").exists()


@pytest.mark.slow
def test_init_from_with_a_contradicting_model_key_or_a_missing_path_is_one_line(small_corpus, pretrained, tmp_path):
    config = _yaml(tmp_path / "c.yaml", {"data": {"train": {"prefix": f"{small_corpus}/train"}},
                                         "train": {"init_from": str(pretrained), "device": "cpu"}})
    run_dir = tmp_path / "run"
    proc = xformer("train", "-c", config, "--quiet", "--set", f"run_dir={run_dir}", "--set", "model.d_model=256")
    assert_one_line_error(proc, "config key 'model.d_model': 256 contradicts train.init_from", "(64)")
    missing = tmp_path / "missing.pt"
    proc = xformer("train", "-c", config, "--quiet", "--set", f"run_dir={run_dir}", "--set", f"train.init_from={missing}")
    assert_one_line_error(proc, f"config key 'train.init_from': {missing} not found")
    assert not run_dir.exists()


@pytest.mark.slow
def test_weighted_corpora_mix_by_weight_deterministically_and_resume_exactly(small_corpus, tmp_path):
    general = tmp_path / "general"
    general.mkdir()
    for lang in ("en", "de"):  # Multi30k's valid set stands in for a general-domain corpus
        write_lines(general / f"valid.{lang}", head(small_corpus / f"valid.{lang}", 100))
    corpora = [f"{{prefix: {small_corpus}/train}}", f"{{prefix: {general}/valid, weight: 0.3}}"]
    sets = {"data.train": f"[{', '.join(corpora)}]", "train.max_steps": 14}
    trainer = Trainer(tiny_config(small_corpus, tmp_path / "a", **sets), log=quiet, progress=False)
    kept = trainer.train_data.source_pairs
    assert len(kept) == 2 and kept[1] == 100
    epochs = [np.concatenate(trainer._batches_of(epoch)) for epoch in (1, 2)]
    for flat in epochs:
        from_general = int((flat >= kept[0]).sum())
        assert from_general == 30 and len(flat) == kept[0] + 30 and len(set(flat.tolist())) == len(flat)
    assert set(epochs[0][epochs[0] >= kept[0]]) != set(epochs[1][epochs[1] >= kept[0]])  # drawn afresh per epoch
    again = Trainer(tiny_config(small_corpus, tmp_path / "c", **sets), log=quiet, progress=False)
    assert all(np.array_equal(x, y) for x, y in zip(trainer._batches_of(1), again._batches_of(1)))
    trainer.run()
    train(tiny_config(small_corpus, tmp_path / "b", **{**sets, "train.max_steps": 7}), log=quiet, progress=False)
    train(tiny_config(small_corpus, tmp_path / "b", **sets), log=quiet, progress=False)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(1, 15))
    for step in range(8, 15):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step


@pytest.mark.slow
def test_a_corpus_until_ends_its_epoch_there_is_left_out_after_and_resumes_exactly(small_corpus, tmp_path):
    general = tmp_path / "general"
    general.mkdir()
    for lang in ("en", "de"):
        write_lines(general / f"valid.{lang}", head(small_corpus / f"valid.{lang}", 100))
    corpora = [f"{{prefix: {small_corpus}/train}}", f"{{prefix: {general}/valid, until: 0.3}}"]
    sets = {"data.train": f"[{', '.join(corpora)}]", "train.max_steps": 14, "train.planned_steps": 14}
    said: list[str] = []
    trainer = Trainer(tiny_config(small_corpus, tmp_path / "a", **sets), log=said.append, progress=False)
    first = np.concatenate(trainer._batches_of(1))
    kept = trainer.train_data.source_pairs
    assert (first >= kept[0]).sum() == 100 and len(first) == sum(kept)
    trainer.run()
    assert f"step 4: data.train[1] ({general}/valid) ends here (until 0.3 of 14 planned steps): epoch 1 stops, " \
           "the epochs from 2 on leave it out" in said
    assert trainer.counters.corpora_ended == {1: 2} and trainer.counters.epoch == 2
    events = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [e for e in events if "corpus_ended" in e] == [{"step": 4, "epoch": 1, "minutes": pytest.approx(0, abs=5),
                                                        "corpus_ended": f"data.train[1] ({general}/valid)", "until": 0.3}]
    assert trainer.counters.batches_done == 10  # epoch 2's batches from step 5 on: a 3000-pair epoch is far longer
    assert (np.concatenate(trainer._batches_of(2)) < kept[0]).all()
    train(tiny_config(small_corpus, tmp_path / "b", **{**sets, "train.max_steps": 7}), log=quiet, progress=False)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["corpora_ended"] == {1: 2}
    train(tiny_config(small_corpus, tmp_path / "b", **sets), log=quiet, progress=False)
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(b) == list(range(1, 15))
    for step in range(8, 15):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step


def test_the_shipped_fine_tuning_config_takes_any_pretrained_architecture():
    cfg = load_config("configs/finetune-opus-mt-en-de.yaml")
    assert cfg.train.init_from == "Helsinki-NLP/opus-mt-en-de" and cfg.train.schedule == "inverse_sqrt"
    assert not any(key.startswith(("model.", "tokenizer.")) for key in cfg.set_keys)
    resolved = init_from.take_architecture(cfg, _pretrained_config(), cfg.train.init_from)
    assert resolved.model == _pretrained_config().model


@pytest.mark.slow
def test_the_cache_records_pairs_per_corpus_and_an_older_cache_is_rebuilt_for_weights(small_corpus, pretrained, tmp_path):
    import json

    from xformer_cli.data.cache import Filters, build_or_load
    from xformer_cli.data.sources import PairSource

    tokenizer = init_from.tokenizer_from_state(load_checkpoint(pretrained)["tokenizer"])
    sources = [PairSource(CorpusConfig(prefix=f"{small_corpus}/{name}"), "en", "de") for name in ("train", "valid")]
    cache, reused = build_or_load(sources, tokenizer, Filters(max_len=20), tmp_path)
    assert not reused and len(cache.source_pairs) == 2 and sum(cache.source_pairs) == len(cache)
    assert 0 < cache.source_pairs[1] <= 100 < cache.source_pairs[0]  # max_len drops some of each
    meta_path = cache.directory / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["source_pairs"]  # as a cache built before per-corpus weights
    meta_path.write_text(json.dumps(meta))
    old, reused = build_or_load(sources, tokenizer, Filters(max_len=20), tmp_path)
    assert reused and old.source_pairs is None  # enough without weights
    again, reused = build_or_load(sources, tokenizer, Filters(max_len=20), tmp_path, per_source=True)
    assert not reused and again.source_pairs == cache.source_pairs and again.directory == cache.directory
    assert np.array_equal(np.asarray(again.src_ids), np.asarray(cache.src_ids))


@pytest.mark.slow
def test_a_marian_model_fine_tunes_resumes_and_goes_back_to_transformers(small_corpus, tmp_path):
    """A real (tiny, random) MarianMTModel directory as init_from: training starts from pad
    as Marian does, 30 steps lower the valid loss, a stopped run resumes exactly, and the
    fine-tuned model exports to a directory transformers loads and agrees with."""
    transformers = pytest.importorskip("transformers")
    from marian_fixture import make_marian

    from xformer_cli.export.huggingface import export_huggingface

    marian = make_marian(tmp_path / "opus-mt-tiny", dropout=0.0)
    trainer = Trainer(finetune_config(small_corpus, tmp_path / "ft", marian), log=quiet, progress=False)
    assert trainer.config.model.bos_id == 0 and trainer.config.model.activation == "swish"
    batch = trainer._load_group(trainer.epoch_batches(), 0)[0]
    assert (batch.tgt_in[:, 0] == 0).all()  # Marian's decoder starts from pad
    before = _valid_loss(trainer.state.model, trainer)
    assert trainer.run().steps == 30
    assert _valid_loss(trainer.state.model, trainer) < before - 0.1

    train(finetune_config(small_corpus, tmp_path / "b", marian, "train.max_steps=15"), log=quiet, progress=False)
    train(finetune_config(small_corpus, tmp_path / "b", marian), log=quiet, progress=False)
    a, b = losses(tmp_path / "ft"), losses(tmp_path / "b")
    for step in range(16, 31):
        assert b[step] == pytest.approx(a[step], abs=1e-4), step

    exported = export_huggingface(tmp_path / "ft" / "last.pt", tmp_path / "hf")
    hf = transformers.MarianMTModel.from_pretrained(exported).eval()
    model, tokenizer, _ = load_model(tmp_path / "ft" / "last.pt")
    model.eval()
    src = torch.tensor([tokenizer.encode_src(["A man is riding a bike."])[0] + [3]])  # + eos
    start = torch.tensor([[model.cfg.bos_id]])
    with torch.no_grad():
        ours = model(src, start)[0, -1]
        theirs = hf(input_ids=src, decoder_input_ids=start).logits[0, -1]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)  # the export keeps xformer's ids
