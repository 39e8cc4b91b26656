"""Validation of a multilingual run (issue 27, phase 2): each direction scored on its own valid
set (sharded across ranks), the mean over directions as the run's BLEU, per-direction figures
in metrics.jsonl, TensorBoard and the report, and the length penalty shared or per target.
Unit tier: synthetic multi-parallel files and random weights (tests/multilingual_fixture.py);
the slow test trains a tiny model on them."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import quiet
from multilingual_fixture import corpus, checkpoint  # noqa: F401 (module fixtures)
from multilingual_fixture import multilingual_config
from xformer_cli.errors import XformerError
from xformer_cli.evaluate import bleu
from xformer_cli.train.validation import DirectionScore, ValidScores

CPU = torch.device("cpu")


def run_state(checkpoint: Path, dist=None):
    """What score_valid reads of a RunState: the checkpoint's model and config, the valid set of
    each direction (its text, and its ids led by the tag), the validation engine."""
    from xformer_cli.checkpoint_file import load_model
    from xformer_cli.data.directions import eval_sets
    from xformer_cli.data.encoded import encode_corpus
    from xformer_cli.data.prepare import tagged
    from xformer_cli.decode.factory import engine_for_model
    from xformer_cli.train.distributed import Distributed
    from xformer_cli.train.state import ValidSet

    model, tokenizer, config = load_model(checkpoint)
    languages = config.data.languages()
    valid = [ValidSet(d, c, encode_corpus(tagged(c, languages.tag(d[1])), tokenizer))
             for d, c in eval_sets(config.data, "valid").items()]
    engine = lambda: engine_for_model(model, tokenizer, config.decode_settings(), CPU, "fp32", languages)  # noqa: E731
    return SimpleNamespace(config=config, dist=dist or Distributed(), model=model, device=CPU, precision="fp32",
                           valid=valid, valid_engine=engine, tokenizer=tokenizer)


# -- what is logged ----------------------------------------------------------------------------------

def test_a_bilingual_validation_logs_the_keys_it_always_has_and_several_directions_add_theirs():
    one = ValidScores(3.14159, 23.1234, 20.456, {"en-de": DirectionScore(3.14159, 23.1234, 20.456)})
    assert one.figures() == {"valid_loss": 3.1416, "valid_ppl": 23.123, "valid_bleu": 20.46}
    assert one.describe() == "valid loss 3.142 ppl 23.12 BLEU 20.46"
    two = ValidScores(3.0, 20.0, 25.0, {"en-de": DirectionScore(3.2, 24.5, 20.0), "en-fr": DirectionScore(2.8, 16.4, 30.0)})
    assert two.figures() == {"valid_loss": 3.0, "valid_ppl": 20.0, "valid_bleu": 25.0, "directions": {
        "en-de": {"valid_loss": 3.2, "valid_ppl": 24.5, "valid_bleu": 20.0},
        "en-fr": {"valid_loss": 2.8, "valid_ppl": 16.4, "valid_bleu": 30.0}}}
    assert two.describe().endswith("BLEU 25.00 (mean of en-de 20.00, en-fr 30.00)")


def test_validation_scores_each_direction_on_its_own_and_the_mean_of_their_bleu(checkpoint):
    from xformer_cli import Translator
    from xformer_cli.train.validation import score_valid, validation_sums

    run = run_state(checkpoint)
    scores = score_valid(run)
    reference = Translator.from_checkpoint(checkpoint, device="cpu")
    assert list(scores.directions) == ["en-de", "en-fr"]
    sums = []
    for valid in run.valid:
        target = valid.direction[1]
        expected = bleu(reference.translate(valid.corpus.src, beam_size=1, target_lang=target), valid.corpus.tgt).score
        assert scores.directions[valid.name].bleu == pytest.approx(expected)
        assert valid.encoded.src[0][0] == run.tokenizer.tag_id({"de": ">>deu<<", "fr": ">>fra<<"}[target])  # the loss reads the tag
        sums.append(validation_sums(run.model, valid.encoded, 4096, CPU, run.config.train.label_smoothing).tolist())
        assert scores.directions[valid.name].loss == pytest.approx(sums[-1][0] / sums[-1][2])
    # the directions translate differently (the tag is read), and the run's BLEU is their mean
    assert scores.bleu == pytest.approx(statistics.fmean(d.bleu for d in scores.directions.values()))
    assert scores.loss == pytest.approx(sum(s[0] for s in sums) / sum(s[2] for s in sums))  # per token of them all


class TwoRanks:
    """Rank ``rank`` of two, the other rank's collectives' contributions given (``other``):
    each call records what this rank put in, so the other rank can be run with it."""

    world_size, enabled = 2, True

    def __init__(self, rank: int, other: dict):
        self.rank, self.other, self.sent = rank, other, {}

    def all_reduce_sum(self, tensor):
        self.sent["sum"] = tensor.clone()
        return tensor + self.other.get("sum", torch.zeros_like(tensor))

    def gather(self, value, what=""):
        self.sent["gather"] = value
        theirs = self.other.get("gather", value)
        return [value, theirs] if self.rank == 0 else [theirs, value]


def test_each_rank_translates_and_scores_only_its_share_of_every_direction(checkpoint):
    from xformer_cli.train.validation import score_valid

    alone = score_valid(run_state(checkpoint))
    second = run_state(checkpoint, TwoRanks(1, {}))
    seen: list[list[str]] = []
    engine = second.valid_engine
    second.valid_engine = lambda: _recording(engine(), seen)
    score_valid(second)
    assert seen == [v.corpus.src[1::2] for v in second.valid]  # every other line of each direction
    first = run_state(checkpoint, TwoRanks(0, second.dist.sent))
    together = score_valid(first)
    assert together.bleu == pytest.approx(alone.bleu) and together.loss == pytest.approx(alone.loss)
    for name, figures in alone.directions.items():
        assert together.directions[name].bleu == pytest.approx(figures.bleu)
        assert together.directions[name].loss == pytest.approx(figures.loss)


def _recording(engine, seen: list):
    translate = engine.translate_lines

    def record(lines, opts):
        seen.append(list(lines))
        return translate(lines, opts)

    engine.translate_lines = record
    return engine


# -- TensorBoard ------------------------------------------------------------------------------------

def test_every_number_of_a_row_becomes_a_tensorboard_scalar_per_direction_too():
    from xformer_cli.train.metrics import scalars

    row = {"step": 40, "epoch": 2, "minutes": 1.5, "precision": "bf16", "valid_loss": 3.0, "valid_bleu": 25.0,
           "averaged_steps": [30, 40], "length_penalty_valid_bleu": {"0.6": 24.0, "1": 25.5},
           "directions": {"en-de": {"valid_loss": 3.2, "valid_bleu": 20.0,
                                    "length_penalty_valid_bleu": {"0.6": 19.0}},
                          "en-fr": {"valid_loss": 2.8, "valid_bleu": 30.0}}}
    assert dict(scalars(row)) == {
        "minutes": 1.5, "valid_loss": 3.0, "valid_bleu": 25.0, "length_penalty_valid_bleu/0.6": 24.0,
        "length_penalty_valid_bleu/1": 25.5, "valid_loss/en-de": 3.2, "valid_bleu/en-de": 20.0,
        "length_penalty_valid_bleu/en-de/0.6": 19.0, "valid_loss/en-fr": 2.8, "valid_bleu/en-fr": 30.0}


def test_the_metrics_log_hands_per_direction_scalars_to_tensorboard(tmp_path, monkeypatch):
    from xformer_cli.train import metrics as metrics_module

    written = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter
        def __init__(self, log_dir):
            self.log_dir = log_dir

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def flush(self):
            pass

    monkeypatch.setattr(metrics_module, "tensorboard_writer", lambda directory: FakeWriter(directory))
    log = metrics_module.MetricsLog(tmp_path)
    assert log.tensorboard.log_dir == tmp_path / "tensorboard"  # beside metrics.jsonl
    log.record({"step": 7, "epoch": 1, "valid_bleu": 25.0, "directions": {"en-de": {"valid_bleu": 20.0}}})
    assert written == [("valid_bleu", 25.0, 7), ("valid_bleu/en-de", 20.0, 7)]
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["directions"] == {"en-de": {"valid_bleu": 20.0}}


# -- the length penalty ------------------------------------------------------------------------------

def test_the_shared_alpha_has_the_best_mean_and_each_target_gets_its_own_best():
    from xformer_cli.train.tune import alphas_by_target, best_alpha

    ende, enfr, deen = ("en", "de"), ("en", "fr"), ("de", "en")
    scores = {0.6: {ende: 20.0, enfr: 30.0, deen: 10.0}, 1.0: {ende: 22.0, enfr: 29.0, deen: 10.0},
              1.6: {ende: 23.0, enfr: 25.0, deen: 10.0}}
    assert best_alpha(scores, [ende, enfr, deen]) == 1.0  # means 20, 20.33, 19.33
    assert alphas_by_target(scores) == {"de": 1.6, "fr": 0.6, "en": 0.6}  # en: a tie goes to the smaller alpha


def test_a_target_s_own_alpha_applies_unless_an_alpha_is_given(checkpoint):
    from xformer_cli import Translator

    engine = Translator.from_checkpoint(checkpoint, device="cpu")
    engine.decode.length_penalty, engine.decode.length_penalty_by_target = 0.6, {"fr": 1.7}
    assert engine.options(target_lang="fra").length_penalty == 1.7  # fra names fr
    assert engine.options(target_lang="de").length_penalty == 0.6  # no alpha of its own: the shared one
    assert engine.options(target_lang="fr", length_penalty=0.9).length_penalty == 0.9  # asked for: kept
    assert engine.options().length_penalty == 0.6


def test_the_ctranslate2_export_and_a_reloaded_checkpoint_keep_the_alphas_per_target(checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    from xformer_cli import Translator
    from xformer_cli.checkpoint_file import load_checkpoint, save_checkpoint
    from xformer_cli.decode.ct2_engine import CTranslate2Translator
    from xformer_cli.export.ctranslate2 import export_ctranslate2

    state = load_checkpoint(checkpoint)
    state["config"]["decode"]["length_penalty_by_target"] = {"de": 1.2}
    save_checkpoint(state, tmp_path / "tuned.pt")
    for engine in (Translator.from_checkpoint(tmp_path / "tuned.pt", device="cpu"),
                   CTranslate2Translator.from_directory(export_ctranslate2(tmp_path / "tuned.pt", tmp_path / "ct2"))):
        assert engine.options(target_lang="de").length_penalty == 1.2
        assert engine.options(target_lang="fr").length_penalty == state["config"]["decode"]["length_penalty"]


def test_an_alpha_for_a_language_the_model_does_not_write_is_refused_naming_the_key(corpus, tmp_path):
    config = multilingual_config(corpus, tmp_path / "run")
    tree = config.to_dict()
    from xformer_cli.config import config_from_dict

    tree["decode"]["length_penalty_by_target"] = {"cs": 1.0}
    with pytest.raises(XformerError, match=r"decode.length_penalty_by_target.cs': not a target language of this model"
                                           r" \(de, fr\)"):
        config_from_dict(tree)
    tree["decode"]["length_penalty_by_target"] = {"fr": -1.0}
    with pytest.raises(XformerError, match="decode.length_penalty_by_target': every alpha must be 0 to 10"):
        config_from_dict(tree)
    tree["decode"]["length_penalty_by_target"] = {"fr": 1.3}
    assert config_from_dict(tree).decode.length_penalty_by_target == {"fr": 1.3}


# -- the report ---------------------------------------------------------------------------------------

def test_the_report_draws_a_bleu_line_per_direction_and_their_mean(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from xformer_cli import plots

    rows = [{"step": s, "epoch": 1, "train_loss": 5.0 - s / 100, "lr": 1e-3, "tokens_per_s": 900.0, "minutes": s / 10}
            for s in (25, 50, 75, 100)]
    for step, de, fr in ((50, 10.0, 14.0), (100, 16.0, 22.0)):
        rows.append({"step": step, "epoch": 1, "minutes": step / 10, "valid_loss": 4.0, "valid_ppl": 50.0,
                     "valid_bleu": (de + fr) / 2, "directions": {"en-de": {"valid_loss": 4.1, "valid_ppl": 60.0, "valid_bleu": de},
                                                                 "en-fr": {"valid_loss": 3.9, "valid_ppl": 49.0, "valid_bleu": fr}}})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, output: figures.append(fig))
    summary = plots.plot_report(tmp_path, tmp_path / "report.png")
    assert "BLEU 19.00 at step 100" in summary and "valid BLEU by direction (mean above): en-de 16.00, en-fr 22.00" in summary
    bleu_axes = figures[0].axes[1]
    lines = {line.get_label(): list(line.get_ydata()) for line in bleu_axes.get_lines()}
    assert lines == {"en->de": [10.0, 16.0], "en->fr": [14.0, 22.0], "mean of the directions": [12.0, 19.0]}


def test_a_bilingual_report_keeps_its_one_bleu_line(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from xformer_cli import plots

    rows = [{"step": 10, "epoch": 1, "train_loss": 5.0, "lr": 1e-3, "tokens_per_s": 900.0, "minutes": 1.0},
            {"step": 10, "epoch": 1, "minutes": 1.0, "valid_loss": 4.0, "valid_ppl": 50.0, "valid_bleu": 12.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, output: figures.append(fig))
    summary = plots.plot_report(tmp_path, tmp_path / "report.png")
    assert "by direction" not in summary
    assert [line.get_label() for line in figures[0].axes[1].get_lines()] == ["valid, as trained"]


# -- slow: a tiny multilingual run ------------------------------------------------------------------

@pytest.mark.slow
def test_a_multilingual_run_validates_per_direction_and_keeps_best_by_the_mean(corpus, tmp_path, monkeypatch):
    from xformer_cli.checkpoint_file import load_checkpoint
    from xformer_cli.train import metrics as metrics_module
    from xformer_cli.train.trainer import train

    tags = []

    class FakeWriter:
        def __init__(self, log_dir):
            pass

        def add_scalar(self, tag, value, step):
            tags.append(tag)

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(metrics_module, "tensorboard_writer", lambda directory: FakeWriter(directory))
    run = tmp_path / "run"
    config = multilingual_config(corpus, run)
    config.train.max_steps, config.train.valid_every, config.train.log_every = 12, 4, 4
    config.train.save_every, config.train.keep_checkpoints, config.train.average_last = 4, 2, 2
    config.train.tune_length_penalty, config.train.length_penalty_by_target = [0.6, 1.5], True
    config.train.max_tokens, config.decode.beam_size = 400, 2
    result = train(config, log=quiet, progress=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in rows if "valid_loss" in r and "averaged_steps" not in r]
    assert [r["step"] for r in validations] == [4, 8, 12]
    for r in validations + [r for r in rows if "averaged_steps" in r]:
        assert set(r["directions"]) == {"en-de", "en-fr"}
        assert r["valid_bleu"] == pytest.approx(statistics.fmean(d["valid_bleu"] for d in r["directions"].values()), abs=0.01)
    best = load_checkpoint(run / "best.pt")
    top = max(r["valid_bleu"] for r in rows if "valid_bleu" in r)
    assert result.best_bleu == pytest.approx(top, abs=0.006)  # best.pt is picked by the mean
    scores = best["length_penalty_scores_by_direction"]
    assert set(scores) == {0.6, 1.5} and set(scores[0.6]) == {"en-de", "en-fr"}
    by_target = best["config"]["decode"]["length_penalty_by_target"]
    for target in ("de", "fr"):
        assert scores[by_target[target]][f"en-{target}"] == max(scores[a][f"en-{target}"] for a in scores)
    assert {"valid_bleu", "valid_bleu/en-de", "valid_bleu/en-fr", "valid_loss/en-de", "length_penalty_by_target/de",
            "length_penalty_valid_bleu/en-fr/1.5", "train_loss"} <= set(tags)
