"""train.tune_length_penalty: the valid set picks the length penalty that best.pt carries."""

import json

import pytest

from xformer_cli.checkpoint_file import load_checkpoint
from xformer_cli.decode.translator import Translator
from xformer_cli.train.trainer import train
from xformer_cli.evaluate import bleu
from xformer_cli.train.tune import alphas_by_target, best_alpha

from helpers import assert_one_line_error, tiny_config, xformer

REFS = ["a man rides a red bicycle down the street .", "two dogs play in the fresh snow ."]


def test_the_alpha_whose_translations_score_best_is_picked():
    """As train/after_training.py scores the valid set at each alpha, then picks with best_alpha."""
    outputs = {0.6: ["a man .", "two dogs ."], 1.3: REFS, 2.0: [r + " and more and more" for r in REFS]}
    scores = {alpha: {("en", "de"): bleu(hyps, REFS).score} for alpha, hyps in outputs.items()}
    assert best_alpha(scores, [("en", "de")]) == 1.3 and scores[1.3][("en", "de")] == pytest.approx(100.0)
    assert scores[0.6][("en", "de")] < scores[2.0][("en", "de")] < scores[1.3][("en", "de")]


def test_the_length_penalty_pass_breaks_a_tie_toward_the_smaller_alpha_whatever_the_order():
    """Equal valid BLEU: the smaller alpha (shorter outputs) is chosen, for the shared alpha
    and for each target's own, however train.tune_length_penalty lists them."""
    ende, enfr = ("en", "de"), ("en", "fr")
    scores = {1.3: {ende: 25.0, enfr: 30.0}, 2.0: {ende: 25.0, enfr: 30.0}, 0.6: {ende: 25.0, enfr: 29.0},
              1.0: {ende: 24.0, enfr: 31.0}}
    assert best_alpha(scores, [ende, enfr]) == 1.0  # means 27.5, 27.5, 27.0 and 27.5: the smallest of the three
    assert best_alpha(scores, [ende]) == 0.6  # 25.0 at 1.3, 2.0 and 0.6
    assert alphas_by_target(scores) == {"de": 0.6, "fr": 1.0}
    assert best_alpha({2.0: {ende: 1.0}, 1.3: {ende: 1.0}}, [ende]) == 1.3


@pytest.mark.slow
def test_training_writes_the_valid_pick_into_best_pt_only(small_corpus, tmp_path):
    logged = []
    run = tmp_path / "run"
    train(tiny_config(small_corpus, run, **{"train.max_steps": 12, "train.valid_every": 6,
                                            "train.tune_length_penalty": "[0.6, 1.5, 3.0]"}),
          log=logged.append, progress=False)
    best = load_checkpoint(run / "best.pt")
    scores = best["length_penalty_scores"]
    assert sorted(scores) == [0.6, 1.5, 3.0]
    chosen = best["config"]["decode"]["length_penalty"]
    assert scores[chosen] == max(scores.values())
    # translate and eval-bleu take their default from best.pt ...
    assert Translator.from_checkpoint(run / "best.pt", device="cpu").decode.length_penalty == chosen
    # ... while last.pt (resuming) and the run's config.yaml keep the configured value
    assert load_checkpoint(run / "last.pt")["config"]["decode"]["length_penalty"] == 0.6
    assert "length_penalty: 0.6" in (run / "config.yaml").read_text()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1] == {"step": 12, "epoch": rows[-1]["epoch"], "minutes": rows[-1]["minutes"], "after_training": True}
    tuned = rows[-2]  # the search's row, before the mark that the passes after training finished
    assert tuned["length_penalty"] == chosen and set(tuned["length_penalty_valid_bleu"]) == {"0.6", "1.5", "3"}
    assert any(line.startswith("length penalty: valid BLEU (beam 4) 0.6: ") for line in logged), logged
    ratios = tuned["length_penalty_valid_length_ratio"]  # how long each alpha writes valid
    assert set(ratios) == {"0.6", "1.5", "3"} and all(r > 0 for r in ratios.values())


@pytest.mark.slow
def test_passes_after_training_stopped_by_ctrl_c_run_when_the_run_is_resumed(small_corpus, tmp_path, monkeypatch):
    """Ctrl-C inside the length-penalty search (last.pt already at the last step): the next call
    runs the passes instead of saying the run is already done; the call after that leaves them."""
    from xformer_cli.train import after_training

    run = tmp_path / "run"
    sets = {"train.max_steps": 12, "train.valid_every": 6, "train.save_every": 6, "train.average_last": 2,
            "train.tune_length_penalty": "[0.6, 1.5]"}
    real = after_training.tune_length_penalty

    def interrupted(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(after_training, "tune_length_penalty", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(small_corpus, run, **sets), log=lambda _: None, progress=False)
    assert load_checkpoint(run / "last.pt")["step"] == 12 and "length_penalty_scores" not in load_checkpoint(
        run / "best.pt")
    monkeypatch.setattr(after_training, "tune_length_penalty", real)
    logged: list[str] = []
    resumed = train(tiny_config(small_corpus, run, **sets), log=logged.append, progress=False)
    assert resumed.stopped_because == "already done" and resumed.steps == 12
    assert any("nothing marks its passes after training" in line for line in logged), logged
    assert sorted(load_checkpoint(run / "best.pt")["length_penalty_scores"]) == [0.6, 1.5]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # The stopped call's averaging row is dropped: one row per pass, and the mark that they finished.
    keys = ("averaged_steps", "length_penalty", "after_training")
    assert [[k for k in keys if k in r] for r in rows if r["step"] == 12 and any(k in r for k in keys)] == [
        ["averaged_steps"], ["length_penalty"], ["after_training"]], rows[-6:]
    tuned, written = (run / "best.pt").read_bytes(), (run / "config.yaml").read_bytes()
    logged.clear()
    changed = {**sets, "decode.length_penalty": 1.0}  # a call that is refused leaves config.yaml as it trained
    assert train(tiny_config(small_corpus, run, **changed), log=logged.append, progress=False).steps == 12
    assert any("is already at step 12" in line for line in logged) and (run / "best.pt").read_bytes() == tuned
    assert (run / "config.yaml").read_bytes() == written


@pytest.mark.slow
def test_a_negative_alpha_is_one_line_naming_the_key(tmp_path):
    proc = xformer("train", "-c", "configs/multi30k.yaml", "--set", "train.tune_length_penalty=[0.6, -1]",
                   "--set", f"run_dir={tmp_path / 'run'}")
    assert_one_line_error(proc, "train.tune_length_penalty", "every alpha must be 0 to 10")
    assert not (tmp_path / "run").exists()
