"""Scoring (sacreBLEU parity, references, significance, warnings) and the pictures of a run."""

import json

import pytest
from PIL import Image
from sacrebleu.metrics import BLEU, CHRF, TER

from xformer_cli.errors import XformerError
from xformer_cli.evaluate import compare_systems, hypothesis_warnings, score_lines
from xformer_cli.plots import REPORT_DPI, REPORT_SIZE

from helpers import assert_one_line_error, head, write_lines, xformer

HYPS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park."]
REF1 = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest im Park ein Buch."]
REF2 = ["Ein Mann radelt.", "Zwei Hunde toben im Schnee.", "Eine Frau liest ein Buch in einem Park."]


@pytest.mark.parametrize("refs", [[REF1], [REF1, REF2]], ids=["one-ref", "two-refs"])
def test_scores_equal_sacrebleu_for_bleu_chrf_and_ter(refs):
    ours = {s.name: s for s in score_lines(HYPS, refs, ("bleu", "chrf", "ter"))}
    for name, metric in (("BLEU", BLEU()), ("chrF2", CHRF()), ("TER", TER())):
        theirs = metric.corpus_score(HYPS, refs)
        assert ours[name].score == theirs.score
        assert ours[name].signature == str(metric.get_signature())
        assert f"nrefs:{len(refs)}" in ours[name].signature


def test_bleu_carries_the_length_ratio_its_brevity_penalty_reads():
    hyps = ["a man rides a red bike .", "two dogs"]
    refs = ["a man rides a bike .", "two dogs play in the snow"]
    score = score_lines(hyps, [refs], ("bleu",))[0]
    assert score.length_ratio == pytest.approx(9 / 12)  # 7 + 2 words against 6 + 6
    assert score_lines(hyps, [refs], ("chrf",))[0].length_ratio is None


def test_lowercase_and_tokenize_pass_through():
    upper = [h.upper() for h in HYPS]
    ours = score_lines(upper, [REF1], ("bleu",), lowercase=True, tokenize="intl")[0]
    assert ours.score == BLEU(lowercase=True, tokenize="intl").corpus_score(upper, [REF1]).score
    assert "case:lc" in ours.signature and "tok:intl" in ours.signature


@pytest.mark.parametrize("failure", [RuntimeError("Japanese tokenization requires extra dependencies"),
                                     OSError("<urlopen error [Errno -2] Name or service not known>")],
                         ids=["an extra not installed", "a tokenizer model offline"])
def test_a_tokenizer_sacrebleu_cannot_set_up_is_one_line(monkeypatch, failure):
    """sacreBLEU lists ja-mecab and flores200, but the one needs an extra package and the other
    downloads its model: one line naming the option, not a traceback."""
    import xformer_cli.evaluate as evaluate

    class Refusing(BLEU):
        def __init__(self, **kw):
            raise failure

    monkeypatch.setattr(evaluate, "BLEU", Refusing)
    with pytest.raises(XformerError, match=r"^--tokenize ja-mecab: sacreBLEU cannot set it up here \(.+\)$"):
        score_lines(["ein Hund"], [["ein Hund"]], tokenize="ja-mecab")


def test_bootstrap_confidence_interval_and_paired_significance():
    score = score_lines(HYPS, [REF1], ("bleu",), bootstrap=100)[0]
    theirs = BLEU().corpus_score(HYPS, [REF1], n_bootstrap=100)  # sacrebleu's resampling is seeded (12345)
    assert (score.mean, score.ci) == (theirs._mean, theirs._ci) and score.ci > 0 and "bs:100" in score.signature
    assert score_lines(HYPS, [REF1], ("bleu",))[0].ci is None  # no bootstrap asked for: no interval
    worse = ["Ein Hund.", "Schnee.", "Ein Buch."]
    rows, signatures = compare_systems([("good", HYPS), ("bad", worse)], [REF1], ("bleu", "chrf"), samples=200)
    assert rows[0][0].p_value is None and rows[1][0].p_value is not None
    assert rows[1][0].score < rows[0][0].score
    assert set(signatures) == {"BLEU", "chrF2"}
    for test, samples in (("bs", -1), ("ar", 1)):  # sacreBLEU would run its default, or one trial: p = 0.5
        with pytest.raises(XformerError, match=rf"resamples \(--samples\) are 0 .* or at least 2, not {samples}$"):
            compare_systems([("good", HYPS), ("bad", worse)], [REF1], ("bleu",), test=test, samples=samples)


def test_a_system_equal_to_the_baseline_is_no_different_from_it():
    """Two files of the same lines: sacreBLEU's paired tests said p=0.001 (bs) and 0.0001 (ar),
    'significant'; there is no difference to find."""
    worse = ["Ein Hund.", "Schnee.", "Ein Buch."]
    for test in ("bs", "ar"):
        rows, _ = compare_systems([("base", HYPS), ("copy", list(HYPS)), ("bad", worse)], [REF1], ("bleu", "chrf"),
                                  test=test, samples=100)
        assert [score.p_value for score in rows[1]] == [1.0, 1.0]
        assert rows[2][0].p_value < 1.0  # another system is still tested


def test_a_system_that_differs_from_the_baseline_in_one_line_is_not_significant_by_randomisation():
    """Every AR trial gives that one line's difference or none, never more: sacreBLEU counted
    only trials above the observed difference and said p = 1/(N+1), 'significant'."""
    lines = [f"Ein Hund läuft über die Wiese Nummer {i}." for i in range(40)]
    refs = [f"Ein Hund rennt über die Wiese Nummer {i}." for i in range(40)]
    other = list(lines)
    other[7] = "Eine Katze schläft."
    rows, _ = compare_systems([("base", lines), ("one line", other)], [refs], ("bleu",), test="ar", samples=200)
    assert rows[1][0].p_value > 0.5 and rows[1][0].score != rows[0][0].score
    worse = ["Schnee."] * 40
    rows, _ = compare_systems([("base", lines), ("bad", worse)], [refs], ("bleu",), test="ar", samples=200)
    assert rows[1][0].p_value < 0.05  # a real difference still is one


def test_the_numbers_line_names_words_only_of_a_language_whose_number_words_count():
    from xformer_cli.number_matching import number_accuracy

    assert "as digits or de words" in number_accuracy(["2 dogs"], ["zwei Hunde"], "en", "de").text
    unknown = number_accuracy(["2 dogs"], ["2 xx"], "en", "xx").text
    assert "as digits;" in unknown and "xx words" not in unknown


def test_warnings_for_tokenized_or_unk_hypotheses():
    assert hypothesis_warnings(HYPS, "h") == []
    assert any("sentencepiece" in w for w in hypothesis_warnings(["\u2581Ein \u2581Mann"] * 3, "h"))
    assert any("@@" in w for w in hypothesis_warnings(["Ein Fahr@@ rad"] * 3, "h"))
    assert any("tokenized" in w for w in hypothesis_warnings(["Ein Mann , der fährt ."] * 3, "h"))
    assert any("<unk>" in w for w in hypothesis_warnings(["Ein <unk> Mann"], "h"))


@pytest.mark.slow
def test_eval_bleu_cli_with_two_references_and_ter(tmp_path):
    hyp = write_lines(tmp_path / "h.de", HYPS)
    r1, r2 = write_lines(tmp_path / "r1.de", REF1), write_lines(tmp_path / "r2.de", REF2)
    proc = xformer("eval-bleu", "--hyp", hyp, "--ref", r1, "--ref", r2, "--metrics", "bleu,chrf,ter", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    scores = json.loads(proc.stdout)
    assert scores["BLEU"]["score"] == round(BLEU().corpus_score(HYPS, [REF1, REF2]).score, 4)
    assert scores["TER"]["score"] == round(TER().corpus_score(HYPS, [REF1, REF2]).score, 4)
    assert scores["chrF2"]["signature"].startswith("nrefs:2|")


@pytest.mark.slow
def test_eval_bleu_cli_paired_test_table(tmp_path):
    base = write_lines(tmp_path / "base.de", ["Ein Hund.", "Schnee.", "Ein Buch."])
    better = write_lines(tmp_path / "better.de", HYPS)
    ref = write_lines(tmp_path / "r.de", REF1)
    proc = xformer("eval-bleu", "--hyp", base, "--hyp", better, "--ref", ref, "--samples", "100")
    assert proc.returncode == 0, proc.stderr.decode()
    text = proc.stdout.decode()
    assert "(baseline)" in text and "p=" in text and "BLEU signature: nrefs:1|bs:100" in text
    proc = xformer("eval-bleu", "--hyp", base, "--hyp", better, "--ref", ref, "--paired-test", "ar", "--samples", "50", "--json")
    result = json.loads(proc.stdout)
    assert result["test"] == "ar" and [s["name"] for s in result["systems"]] == [str(base), str(better)]
    assert "p_value" in result["systems"][1]["BLEU"] and "p_value" not in result["systems"][0]["BLEU"]


@pytest.mark.slow
def test_eval_bleu_warns_on_tokenized_input(tmp_path):
    hyp = write_lines(tmp_path / "h.de", ["\u2581Ein \u2581Mann"] * 3)
    ref = write_lines(tmp_path / "r.de", REF1)
    proc = xformer("eval-bleu", "--hyp", hyp, "--ref", ref)
    assert proc.returncode == 0 and "warning:" in proc.stderr.decode() and "sentencepiece" in proc.stderr.decode()


@pytest.mark.slow
def test_eval_bleu_bad_inputs(tmp_path):
    ref = write_lines(tmp_path / "r.de", REF1)
    short = write_lines(tmp_path / "short.de", HYPS[:2])
    empty = tmp_path / "empty.de"
    empty.write_text("")
    assert_one_line_error(xformer("eval-bleu", "--hyp", short, "--ref", ref), "line counts differ", "short.de has 2 lines")
    assert_one_line_error(xformer("eval-bleu", "--hyp", empty, "--ref", ref), "empty.de is empty")
    assert_one_line_error(xformer("eval-bleu", "--hyp", short, "--ref", tmp_path / "missing.de"), "file not found", "missing.de")
    good = write_lines(tmp_path / "good.de", HYPS)
    assert_one_line_error(xformer("eval-bleu", "--hyp", good, "--ref", ref, "--metrics", "meteor"), "unknown metric 'meteor'")
    assert_one_line_error(xformer("eval-bleu", "--hyp", good, "--ref", ref, "--tokenize", "moses"), "unknown BLEU tokenizer")


@pytest.mark.slow
def test_validation_bleu_in_training_equals_eval_bleu(trained_run, small_corpus):
    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "valid_bleu" in r and "averaged_steps" not in r][-1]
    assert logged["step"] == 30  # last.pt was written at this validation
    proc = xformer("eval-bleu", "--checkpoint", trained_run / "last.pt", "--src", small_corpus / "valid.en",
                   "--ref", small_corpus / "valid.de", "--beam-size", "1", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    assert round(json.loads(proc.stdout)["BLEU"]["score"], 2) == logged["valid_bleu"]


@pytest.mark.slow
def test_report_writes_a_png_of_the_expected_size(trained_run, tmp_path):
    png = tmp_path / "report.png"
    proc = xformer("report", trained_run, "--output", png)
    assert proc.returncode == 0, proc.stderr.decode()
    assert "steps: 30" in proc.stdout.decode() and "best BLEU" in proc.stdout.decode()
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert image.size == (int(REPORT_SIZE[0] * REPORT_DPI), int(REPORT_SIZE[1] * REPORT_DPI))


@pytest.mark.slow
def test_attention_plot_has_one_panel_per_layer_and_sentence(trained_run, small_corpus, tmp_path):
    png = tmp_path / "attention.png"
    lines = "\n".join(head(small_corpus / "test2016.en", 3)).encode() + b"\n"
    proc = xformer("translate", "-m", trained_run / "best.pt", "--attention", png, "--attention-sentences", "2",
                   "-b", "1", stdin=lines)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout.decode().splitlines()) == 3  # translations still go to stdout
    with Image.open(png) as image:
        width, height = image.size
    # 1 decoder layer x 2 sentences: one column, two rows of square panels.
    assert image.format == "PNG" and height > 1.5 * width


@pytest.mark.slow
def test_translator_attention_rows_are_distributions(trained_run):
    from xformer_cli import Translator

    maps = Translator.from_checkpoint(trained_run / "best.pt", device="cpu").attention(["A dog runs.", ""], beam_size=1)
    assert len(maps) == 1  # the empty line has nothing to plot
    weights = maps[0].weights
    assert weights.shape[2:] == (len(maps[0].target), len(maps[0].source))
    assert weights.sum(-1).sub(1).abs().max() < 1e-4


@pytest.mark.slow
def test_missing_matplotlib_is_one_clear_line(trained_run, tmp_path):
    hide = "import sys; sys.modules['matplotlib'] = None"
    proc = xformer("report", trained_run, "--output", tmp_path / "r.png", python_prelude=hide)
    assert_one_line_error(proc, "matplotlib", "pip install 'xformer[plot]'")
    assert_one_line_error(xformer("report", tmp_path), "no metrics.jsonl")


def test_the_report_keeps_the_averaged_checkpoint_apart_from_the_runs_validations(tmp_path):
    from xformer_cli.plots import plot_report

    rows = [{"step": s, "epoch": 1, "train_loss": 5.0 - s / 100, "lr": 1e-3, "tokens_per_s": 100.0, "minutes": s / 100}
            for s in range(25, 301, 25)]
    rows += [{"step": s, "epoch": 1, "minutes": s / 100, "valid_loss": 3.0 - s / 1000, "valid_ppl": 10.0,
              "valid_bleu": 20.0 + s / 30} for s in (100, 200, 300)]
    rows.append({"step": 300, "epoch": 1, "minutes": 3.1, "averaged_steps": [200, 225, 250, 275, 300],
                 "valid_loss": 2.6, "valid_ppl": 9.0, "valid_bleu": 31.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = plot_report(tmp_path, tmp_path / "report.png")
    assert "BLEU 30.00 at step 300; best BLEU 30.00 at step 300" in summary  # the run's own line
    assert "average of 5 checkpoints (steps 200-300): valid loss 2.600, BLEU 31.50" in summary
    with Image.open(tmp_path / "report.png") as image:
        assert image.size == (int(REPORT_SIZE[0] * REPORT_DPI), int(REPORT_SIZE[1] * REPORT_DPI))


def _rows_before_validation() -> list[dict]:
    return [{"step": s, "epoch": 1, "train_loss": 5.0 - s / 100, "lr": 1e-3, "tokens_per_s": 100.0, "minutes": s / 100}
            for s in range(25, 101, 25)]


def test_a_run_before_its_first_validation_says_so_in_the_bleu_panels(tmp_path, monkeypatch):
    """Its BLEU panels were empty axes of -0.04 to 0.04, and the loss legend listed a valid
    curve with no point."""
    import matplotlib.axes

    from xformer_cli.plots import plot_report

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows_before_validation()))
    texts, labels = [], []
    real_text, real_legend = matplotlib.axes.Axes.text, matplotlib.axes.Axes.legend
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda ax, *a, **k: texts.append(a[2]) or real_text(ax, *a, **k))

    def legend(ax, *a, **k):
        labels.extend(ax.get_legend_handles_labels()[1])
        return real_legend(ax, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "legend", legend)
    plot_report(tmp_path, tmp_path / "report.png")
    assert texts == ["no validation yet"] * 2 and labels == ["train (label-smoothed)"] * 2


def test_a_report_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """savefig wrote over report.png in place: Ctrl-C left 124 bytes no viewer opens, a file
    size limit a traceback and a cut file."""
    import errno

    import matplotlib.figure

    from xformer_cli.plots import plot_report

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows_before_validation()))
    plot_report(tmp_path, tmp_path / "report.png")
    earlier = (tmp_path / "report.png").read_bytes()
    real_savefig = matplotlib.figure.Figure.savefig

    def cut_short(fig, handle, **kw):
        handle.write(b"\x89PNG half")
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut_short)
    with pytest.raises(XformerError, match=r"cannot write .*report.png: File too large; the previous report.png is "
                                           "unchanged$"):
        plot_report(tmp_path, tmp_path / "report.png")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, handle, **kw: handle.write(b"\x89PNG half") and (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        plot_report(tmp_path, tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes() == earlier and sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl", "report.png"]
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", real_savefig)


def test_the_report_reads_a_killed_runs_metrics_and_names_a_damaged_line(tmp_path):
    """A kill -9 while the run logged leaves its last line cut, without its newline: the report
    reads the lines before it; a damaged line anywhere else is named."""
    from xformer_cli.plots import read_metrics

    row = '"epoch": 1, "lr": 0.001, "tokens_per_s": 100.0, "minutes": 0.5'
    whole = f'{{"step": 25, "train_loss": 5.0, {row}}}\n{{"step": 50, "train_loss": 4.5, {row}}}\n'
    (tmp_path / "metrics.jsonl").write_text(whole + '{"step": 75, "train_lo')
    assert [row["step"] for row in read_metrics(tmp_path)] == [25, 50]
    (tmp_path / "metrics.jsonl").write_text('{"step": 25, "train_lo\n' + whole)
    with pytest.raises(XformerError, match=r"metrics.jsonl:1: not a JSON line$"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(whole + "3\n")
    with pytest.raises(XformerError, match=r"metrics.jsonl:3: not a JSON object$"):
        read_metrics(tmp_path)


def test_the_report_names_a_row_without_a_figure_it_draws(tmp_path):
    """A hand-made or foreign metrics.jsonl: the line and the key, not a KeyError or a plot of strings."""
    from xformer_cli.plots import read_metrics

    train = {"step": 25, "epoch": 1, "train_loss": 5.0, "lr": 1e-3, "tokens_per_s": 100.0, "minutes": 0.2}
    valid = {"step": 25, "epoch": 1, "minutes": 0.3, "valid_loss": 3.0, "valid_ppl": 20.0, "valid_bleu": 10.0}
    passes = {"step": 25, "epoch": 1, "minutes": 0.4, "length_penalty": 0.6}  # no figure the report draws

    def write(*rows):
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(train, valid, passes)
    assert len(read_metrics(tmp_path)) == 3
    write(train, {k: v for k, v in train.items() if k != "lr"})
    with pytest.raises(XformerError, match=r"metrics.jsonl:2: a training row without a number for 'lr'$"):
        read_metrics(tmp_path)
    write(train, {**valid, "valid_bleu": "high"})
    with pytest.raises(XformerError, match=r"metrics.jsonl:2: a validation row without a number for 'valid_bleu'$"):
        read_metrics(tmp_path)
    write({**valid, "directions": {"en-de": {"valid_loss": 3.0}}})
    with pytest.raises(XformerError, match=r"metrics.jsonl:1: 'directions' is not each direction's figures"):
        read_metrics(tmp_path)
    write(train, {**passes, "minutes": None})  # the summary's last row: a traceback at its format
    with pytest.raises(XformerError, match=r"metrics.jsonl:2: 'minutes' is not a number$"):
        read_metrics(tmp_path)
    for row in ({}, {"step": None, "valid_bleu": [1]}):  # a report of "steps: None" before
        write(train, row)
        with pytest.raises(XformerError, match=r"metrics.jsonl:2: a row without a number for 'step'$"):
            read_metrics(tmp_path)
    write({**valid, "averaged_steps": []})
    with pytest.raises(XformerError, match=r"metrics.jsonl:1: an averaging row without the list"):
        read_metrics(tmp_path)
